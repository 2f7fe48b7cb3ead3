package pki

// FuzzTLSHandshake: whatever bytes arrive on a port that expects a TLS
// handshake (a node's server side), or come back from a port a node dials
// (its client side), the handshake with the configurations of this
// package ends with an error, at once: it never panics, never waits past
// the bytes, and never completes (bytes fixed in advance cannot, against a
// fresh key share). Its committed seed corpus
// (testdata/fuzz/FuzzTLSHandshake) holds what a real client and a real
// server send, other protocols spoken to a TLS port, and damage.
// FuzzIdentityOf's corpus holds the certificates Init writes.
//
//	go test -run '^$' -fuzz '^FuzzTLSHandshake$' ./internal/pki

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fuzzseed"
)

// handshakeTimeout bounds one fuzzed handshake: far more than it takes,
// so that running out of it means the handshake hung.
const handshakeTimeout = 10 * time.Second

// recordingConn records what is written through it.
type recordingConn struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *recordingConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

// handshakeBundles are alpha, the node under test, and beta, its peer, of
// one new CA.
func handshakeBundles(tb testing.TB) (alpha, beta *Bundle) {
	tb.Helper()
	dir := tb.TempDir()
	var hs []Holder
	for _, n := range []string{"alpha", "beta"} {
		hs = append(hs, Holder{Identity: Identity{Role: RoleNode, Name: n}, Hosts: []string{"127.0.0.1"}})
	}
	if _, err := Init(dir, hs, false); err != nil {
		tb.Fatal(err)
	}
	bundle := func(name string) *Bundle {
		b, err := Load(filepath.Join(dir, CAFile), filepath.Join(dir, CertFile(name)), filepath.Join(dir, KeyFile(name)))
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	return bundle("alpha"), bundle("beta")
}

// realHandshake runs beta's client against alpha's server over a pipe and
// returns what each sent.
func realHandshake(tb testing.TB, alpha, beta *Bundle) (client, server []byte) {
	tb.Helper()
	a, b := net.Pipe()
	ca, sb := &recordingConn{Conn: a}, &recordingConn{Conn: b}
	srv := tls.Server(sb, alpha.ServerConfig(true, Exactly(Identity{RoleNode, "beta"})))
	cli := tls.Client(ca, beta.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "alpha"})))
	done := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err == nil {
			_, err = srv.Write([]byte("ok"))
		}
		done <- err
	}()
	if err := cli.Handshake(); err != nil {
		tb.Fatal(err)
	}
	if _, err := io.ReadFull(cli, make([]byte, 2)); err != nil {
		tb.Fatal(err)
	}
	if err := <-done; err != nil {
		tb.Fatal(err)
	}
	a.Close() // not cli.Close: its close_notify would wait for a reader
	b.Close()
	return ca.written(), sb.written()
}

// tlsSeed is one seed of FuzzTLSHandshake: the node's side, and the bytes
// its peer sends.
type tlsSeed struct {
	asClient bool
	peer     []byte
}

func seedTLSHandshakes(tb testing.TB) []tlsSeed {
	alpha, beta := handshakeBundles(tb)
	client, server := realHandshake(tb, alpha, beta)
	record := func(typ byte, body []byte) []byte {
		return append([]byte{typ, 3, 3, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	return []tlsSeed{
		{false, client},
		{true, server},
		{false, client[:len(client)/2]},
		{true, server[:60]},
		{false, []byte("NBDMAGIC\x00\x00\x42\x02\x81\x86\x12\x53")},
		{false, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")},
		{false, []byte("GET /debug/pprof/ HTTP/1.1\r\nHost: alpha\r\n\r\n")},
		{false, record(21, []byte{2, 40})},            // a fatal alert
		{false, []byte{22, 3, 1, 0xff, 0xff}},         // a record header and nothing after
		{false, []byte{0x80, 0x2e, 1, 3, 1, 0, 0x15}}, // SSLv2's ClientHello
		{true, record(22, []byte{2, 0, 0, 2, 3, 3})},  // a ServerHello cut short
		{true, []byte{}},
	}
}

// FuzzTLSHandshake: see the top of the file.
func FuzzTLSHandshake(f *testing.F) {
	for _, s := range seedTLSHandshakes(f) {
		f.Add(s.asClient, s.peer)
	}
	alpha, _ := handshakeBundles(f)
	serverConfig := alpha.ServerConfig(true, Exactly(Identity{RoleNode, "beta"}))
	clientConfig := alpha.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "beta"}))
	f.Fuzz(func(t *testing.T, asClient bool, peer []byte) {
		mine, theirs := net.Pipe()
		var conn *tls.Conn
		if asClient {
			conn = tls.Client(mine, clientConfig)
		} else {
			conn = tls.Server(mine, serverConfig)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // the peer reads whatever the node sends
			defer wg.Done()
			io.Copy(io.Discard, theirs)
		}()
		go func() { // and sends its bytes, then hangs up
			defer wg.Done()
			theirs.Write(peer)
			theirs.Close()
		}()
		began := time.Now()
		conn.SetDeadline(began.Add(handshakeTimeout))
		err := conn.Handshake()
		mine.Close()
		wg.Wait()
		switch {
		case err == nil:
			t.Fatalf("a handshake completed with bytes fixed in advance: %+v", conn.ConnectionState())
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("the handshake hung for %s: %v", time.Since(began), err)
		}
	})
}

// seedIdentities: the certificates Init writes (the CA, a node, the
// operator, an NBD client) and no certificate.
func seedIdentities(tb testing.TB) [][]byte {
	dir := tb.TempDir()
	if _, err := Init(dir, []Holder{{Identity: Identity{RoleNode, "alpha"}, Hosts: []string{"127.0.0.1", "alpha.example"}}}, false); err != nil {
		tb.Fatal(err)
	}
	var seeds [][]byte
	for _, f := range [][3]string{
		{CAFile, CertFile("alpha"), KeyFile("alpha")},
		{CAFile, CertFile("operator"), KeyFile("operator")},
		{NBDClientDir + "/ca-cert.pem", NBDClientDir + "/client-cert.pem", NBDClientDir + "/client-key.pem"},
	} {
		b, err := Load(filepath.Join(dir, f[0]), filepath.Join(dir, f[1]), filepath.Join(dir, f[2]))
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, b.Cert.Certificate[0])
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := pem.Decode(caPEM)
	if ca == nil {
		tb.Fatal("no PEM block in the CA certificate")
	}
	return append(seeds, ca.Bytes, []byte{})
}

// TestFuzzSeedCorpus keeps the committed corpora of FuzzTLSHandshake and
// FuzzIdentityOf in place (go test -run TestFuzzSeedCorpus
// -write-fuzz-seeds writes new ones). Their seeds carry fresh keys and
// randoms at every run, so only their presence is checked.
func TestFuzzSeedCorpus(t *testing.T) {
	var handshakes, identities []fuzzseed.Seed
	for _, s := range seedTLSHandshakes(t) {
		handshakes = append(handshakes, fuzzseed.Seed{s.asClient, s.peer})
	}
	for _, s := range seedIdentities(t) {
		identities = append(identities, fuzzseed.Seed{s})
	}
	fuzzseed.Sync(t, "FuzzTLSHandshake", handshakes, fuzzseed.Present)
	fuzzseed.Sync(t, "FuzzIdentityOf", identities, fuzzseed.Present)
}
