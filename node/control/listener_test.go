package control

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/internal/poll"
)

// lockedBuffer is a log's output, written and read from several
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// alphasPort returns the directory of a cluster's certificates, that of
// its node alpha, and a port on 127.0.0.1 for alpha's listener.
func alphasPort(t *testing.T) (dir string, bundle *pki.Bundle, inner net.Listener) {
	t.Helper()
	dir = t.TempDir()
	if _, err := pki.Init(dir, []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}}, false); err != nil {
		t.Fatal(err)
	}
	bundle, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile("alpha")), filepath.Join(dir, pki.KeyFile("alpha")))
	if err != nil {
		t.Fatal(err)
	}
	if inner, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return dir, bundle, inner
}

// TestTheControlPortServesOthersWhileHostsFloodIt: two hosts (127.0.0.2
// and 127.0.0.4) open 100 connections each to a TLS control port and
// start a TLS handshake they never finish. Each keeps at most its share
// of handshakes (8, its PerHost), the rest are closed at once; an
// operator's client at 127.0.0.1 and a node of the cluster at 127.0.0.3
// complete their handshakes meanwhile; each flooding host gets one log
// line for the interval, not a line per connection.
func TestTheControlPortServesOthersWhileHostsFloodIt(t *testing.T) {
	dir, bundle, inner := alphasPort(t)
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	l := NewListener(inner, "control", bundle.AskingServerConfig(),
		Limits{Max: 128, PerHost: 8, Known: connlimit.NewKnown(netip.MustParseAddr("127.0.0.3"))}, log, NewRefusalLog(log, time.Minute, 16))
	defer l.Close()
	served := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			served <- c
		}
	}()

	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for _, host := range []string{"127.0.0.2", "127.0.0.4"} {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}}
		for range 100 {
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				continue // refused so fast that connect saw it
			}
			c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) // a ClientHello's first bytes
			flood = append(flood, c)
		}
	}
	if !poll.Within(30*time.Second, 10*time.Millisecond, func() bool {
		st := l.Admission()
		return st.Admitted+st.Refused() >= 200
	}) {
		t.Fatalf("the flood's connections were not all admitted or refused: %+v", l.Admission())
	}
	if st := l.Admission(); st.StrangerHandshakes > 16 || st.Count(connlimit.SourceOpen)+st.Count(connlimit.SourceHandshakes) < 200-16 {
		t.Fatalf("stats %+v: want at most 8 handshakes from each flooding host, the rest refused", st)
	}

	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(dir, pki.CAFile))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("the CA: %v", err)
	}
	for _, host := range []string{"127.0.0.1", "127.0.0.3"} {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}, Timeout: 10 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", l.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatalf("a client at %s during the flood: %v", host, err)
		}
		defer c.Close()
		select {
		case s := <-served:
			defer s.Close()
		case <-time.After(30 * time.Second):
			t.Fatalf("the connection of %s was never handed out", host)
		}
	}
	for _, host := range []string{"127.0.0.2", "127.0.0.4"} {
		if n := strings.Count(logs.String(), "control: from "+host+","); n != 1 {
			t.Errorf("%d log lines about %s's refused connections, want one for the interval:\n%s", n, host, logs)
		}
	}
}

// TestAPlaintextClientReadsTheAnswerAndAnOrderlyClose: a client that
// speaks plaintext to a TLS control port (replctl without certificates:
// gRPC's preface and its first frames) gets a TLS alert, and the port
// reads what it sent before it closes, so the close is a FIN, not a reset.
// Closed with the client's bytes unread, the socket reset the connection,
// and a client that read after the reset, or still wrote, never saw the
// alert: on a loaded machine replctl said the node "answers nothing"
// instead of "requires TLS". The read after the alert tells a reset
// (ECONNRESET) from an orderly close (EOF).
func TestAPlaintextClientReadsTheAnswerAndAnOrderlyClose(t *testing.T) {
	_, bundle, inner := alphasPort(t)
	log := slog.New(slog.DiscardHandler)
	l := NewListener(inner, "control", bundle.AskingServerConfig(), Limits{Max: 8, PerHost: 8}, log, NewRefusalLog(log, time.Minute, 16))
	defer l.Close()

	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// gRPC's client preface, then frames the port never reads.
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), make([]byte, 4096)...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	answer := make([]byte, len(plainTLSAlert))
	if _, err := io.ReadFull(c, answer); err != nil {
		t.Fatalf("the answer to a plaintext client: %v", err)
	}
	if !bytes.Equal(answer, plainTLSAlert) {
		t.Fatalf("the answer to a plaintext client is % x, want a TLS alert % x", answer, plainTLSAlert)
	}
	// The client reads on (replctl hangs up here); the port, which read
	// everything it was sent, closes in order when its drain ends.
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the answer: %d bytes, %v; want an orderly close (EOF), not a reset", n, err)
	}
}
