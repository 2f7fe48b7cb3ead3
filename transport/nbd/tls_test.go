package nbd_test

// These tests pin NBD over TLS (proto.md, "TLS support") with certificates from the cluster's
// own CA (pki.Init, what replctl certs init runs): with TLSRequired a plaintext client gets
// NBD_REP_ERR_TLS_REQD saying what to do, for every option but STARTTLS and ABORT, and is closed
// on NBD_OPT_EXPORT_NAME; TLSOptional serves both; TLSOff refuses STARTTLS. Only a client with a
// certificate of the CA in an accepted role gets past the TLS handshake. A second STARTTLS is an
// error, the handshake deadline covers the TLS handshake, and in transmission over TLS a client
// that reads nothing is still closed after StallTimeout while a slow one is not.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// testPKI is a cluster CA written by pki.Init, with node alpha's certificate covering 127.0.0.1.
type testPKI struct {
	dir    string
	server *tls.Config // alpha's, accepting NBD clients and the operator
	client *tls.Config // the nbd-client/ files' certificate, trusting the CA
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	dir := t.TempDir()
	alpha := pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}
	if _, err := pki.Init(dir, []pki.Holder{alpha}, false); err != nil {
		t.Fatal(err)
	}
	server, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, "alpha.crt"), filepath.Join(dir, "alpha.key"))
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{
		dir:    dir,
		server: server.ServerConfig(true, pki.Roles(pki.RoleNBDClient, pki.RoleOperator)),
		client: clientTLS(t, dir, "nbd-client/client-cert.pem", "nbd-client/client-key.pem"),
	}
}

// clientTLS is a client configuration trusting dir's CA, presenting the certificate in dir's
// certFile (none if "").
func clientTLS(t testing.TB, dir, certFile, keyFile string) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.NBDClientDir, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in ca-cert.pem")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1"}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// startTLSServer serves one MemExport "vol" with p's server certificate and policy; its dial
// uses STARTTLS with p's client certificate.
func startTLSServer(t *testing.T, p *testPKI, policy nbd.TLSPolicy, configure ...func(*nbd.Config)) *testServer {
	t.Helper()
	s := startServer(t, nil, append([]func(*nbd.Config){func(c *nbd.Config) {
		c.TLS, c.TLSPolicy, c.TLSCertificatesHint = p.server, policy, "DIR/nbd-client"
	}}, configure...)...)
	s.clientTLS = p.client
	return s
}

func wantOptionError(t *testing.T, err error, replyType uint32, message string) {
	t.Helper()
	var oe *nbdtest.OptionError
	if !errors.As(err, &oe) || oe.Type != replyType || !strings.Contains(oe.Message, message) {
		t.Fatalf("got %v, want error reply %#x saying %q", err, replyType, message)
	}
}

func TestTLSRequiredRefusesEveryOptionBeforeSTARTTLS(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSDefault) // TLS set: required
	h := s.greet(t, nbdtest.ClientFixedNewstyle|nbdtest.ClientNoZeroes)

	_, err := h.List()
	wantOptionError(t, err, nbdtest.RepErrTLSReqd, "TLS is required")
	wantOptionError(t, err, nbdtest.RepErrTLSReqd, "nbds://"+s.addr+"/EXPORT?tls-certificates=DIR/nbd-client")
	_, _, err = h.Go("vol")
	wantOptionError(t, err, nbdtest.RepErrTLSReqd, "connect with TLS, e.g. nbds://"+s.addr+"/vol?tls-certificates=DIR/nbd-client")
	_, err = h.Info(nbdtest.OptInfo, "vol")
	wantOptionError(t, err, nbdtest.RepErrTLSReqd, "nbds://"+s.addr+"/vol?")
	for _, option := range []uint32{nbdtest.OptStructuredRepl, 99} {
		if err := h.SendOption(option, nil); err != nil {
			t.Fatal(err)
		}
		if rep, err := h.ReadReply(); err != nil || rep.Type != nbdtest.RepErrTLSReqd {
			t.Fatalf("option %d before TLS: %+v %v, want NBD_REP_ERR_TLS_REQD", option, rep, err)
		}
	}
	// After all that, STARTTLS still works and the same options are answered inside TLS.
	if err := h.StartTLS(p.client); err != nil {
		t.Fatal(err)
	}
	if names, err := h.List(); err != nil || len(names) != 1 || names[0] != "vol" {
		t.Fatalf("LIST inside TLS: %q %v", names, err)
	}
	c, _, err := h.Go("vol")
	if err != nil {
		t.Fatalf("GO inside TLS: %v", err)
	}
	if err := c.Write(4096, pattern(8192, 3), nbdtest.CmdFlagFUA); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Read(4096, 8192); err != nil || !bytes.Equal(got, pattern(8192, 3)) {
		t.Fatalf("read back over TLS: %v", err)
	}
	if _, err := c.Disconnect(); err != nil {
		t.Fatalf("disconnect over TLS: %v", err)
	}
	if st := s.Stats(); st.TLSRequiredRefusals != 5 || st.TLSConnections != 1 || st.TLSHandshakeFailures != 0 {
		t.Errorf("stats: %d TLS-required refusals (want 5), %d TLS connections (want 1), %d TLS failures",
			st.TLSRequiredRefusals, st.TLSConnections, st.TLSHandshakeFailures)
	}
}

func TestTLSRequiredClosesExportNameAndAllowsAbort(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSRequired)
	_, _, err := s.greet(t, nbdtest.ClientFixedNewstyle).ExportName("vol")
	wantClosed(t, err)

	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.SendOption(nbdtest.OptAbort, nil); err != nil {
		t.Fatal(err)
	}
	if rep, err := h.ReadReply(); err != nil || rep.Type != nbdtest.RepAck {
		t.Fatalf("ABORT before TLS: %+v %v, want NBD_REP_ACK", rep, err)
	}
	// A client without fixed newstyle cannot STARTTLS: it is closed at once.
	_, _, err = s.greet(t, 0).Go("vol")
	wantClosed(t, err)
	if st := s.Stats(); st.TransmittingConnections != 0 || st.TLSRequiredRefusals != 2 {
		t.Errorf("%d in transmission, %d TLS-required refusals; want 0 and 2", st.TransmittingConnections, st.TLSRequiredRefusals)
	}
}

func TestTLSOptionalServesPlaintextAndTLS(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSOptional)
	plain, err := nbdtest.Dial(context.Background(), s.addr, "vol")
	if err != nil {
		t.Fatalf("plaintext client: %v", err)
	}
	defer plain.Close()
	secure := s.dial(t, "vol")
	if err := secure.Write(0, pattern(4096, 9), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := plain.Read(0, 4096); err != nil || !bytes.Equal(got, pattern(4096, 9)) {
		t.Fatalf("plaintext read of what the TLS client wrote: %v", err)
	}
	if st := s.Stats(); st.TLSConnections != 1 || st.TransmittingConnections != 2 {
		t.Errorf("%d TLS connections, %d in transmission; want 1 and 2", st.TLSConnections, st.TransmittingConnections)
	}
}

func TestTLSOffRefusesSTARTTLS(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSOff)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	wantOptionError(t, h.StartTLS(p.client), nbdtest.RepErrPolicy, "TLS is off")
	c, _, err := h.Go("vol")
	if err != nil {
		t.Fatalf("plaintext GO after the refused STARTTLS: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestASecondSTARTTLSIsInvalid(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSRequired)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.StartTLS(p.client); err != nil {
		t.Fatal(err)
	}
	wantOptionError(t, h.StartTLS(p.client), nbdtest.RepErrInvalid, "may be sent once")
	c, _, err := h.Go("vol")
	if err != nil {
		t.Fatalf("GO after the second STARTTLS: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	// STARTTLS with data is invalid too, and the plaintext negotiation goes on.
	h = s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.SendOption(nbdtest.OptStartTLS, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if rep, err := h.ReadReply(); err != nil || rep.Type != nbdtest.RepErrInvalid {
		t.Fatalf("STARTTLS with data: %+v %v, want NBD_REP_ERR_INVALID", rep, err)
	}
	if err := h.StartTLS(p.client); err != nil {
		t.Fatalf("STARTTLS after the invalid one: %v", err)
	}
}

func TestTLSRefusesClientsWithoutAnAcceptedCertificate(t *testing.T) {
	p := newTestPKI(t)
	other := newTestPKI(t) // a second cluster's CA
	for _, tc := range []struct {
		name   string
		client *tls.Config
	}{
		{"no client certificate", clientTLS(t, p.dir, "", "")},
		{"a certificate of another CA", func() *tls.Config {
			c := clientTLS(t, other.dir, "nbd-client/client-cert.pem", "nbd-client/client-key.pem")
			c.RootCAs = p.client.RootCAs // it trusts the server, the server does not trust it
			return c
		}()},
		{"a node's certificate (not an NBD client's)", clientTLS(t, p.dir, "alpha.crt", "alpha.key")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logStore{}
			s := startTLSServer(t, p, nbd.TLSRequired, func(c *nbd.Config) { c.Logger = slog.New(recordingHandler{store: logs}) })
			h := s.greet(t, nbdtest.ClientFixedNewstyle)
			remote := h.Conn.LocalAddr().String()
			// In TLS 1.3 the client's handshake ends before the server checks its certificate:
			// the refusal arrives as an alert on the next read.
			err := h.StartTLS(tc.client)
			if err == nil {
				_, _, err = h.Go("vol")
			}
			if err == nil {
				t.Fatal("entered transmission")
			}
			var oe *nbdtest.OptionError
			if errors.As(err, &oe) {
				t.Fatalf("got an option reply %v, want the TLS handshake refused", err)
			}
			t.Logf("client saw: %v", err)
			waitUntil(t, "the TLS handshake failure counted", func() (bool, string) {
				st := s.Stats()
				return st.TLSHandshakeFailures == 1 && st.OpenConnections == 0,
					fmt.Sprintf("%d failures, %d open", st.TLSHandshakeFailures, st.OpenConnections)
			})
			if st := s.Stats(); st.TLSConnections != 0 || st.TransmittingConnections != 0 {
				t.Fatalf("stats %+v", st)
			}
			if !logs.has(slog.LevelWarn, "remote", remote) || !strings.Contains(logs.String(), "TLS refused") {
				t.Errorf("no Warn saying TLS was refused for %s; got:\n%s", remote, logs)
			}
		})
	}
}

func TestTheHandshakeDeadlineCoversTheTLSHandshake(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSRequired, func(c *nbd.Config) { c.HandshakeTimeout = 100 * time.Millisecond })
	// STARTTLS acknowledged, then no ClientHello: the server hangs up on its own.
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.SendOption(nbdtest.OptStartTLS, nil); err != nil {
		t.Fatal(err)
	}
	if rep, err := h.ReadReply(); err != nil || rep.Type != nbdtest.RepAck {
		t.Fatalf("STARTTLS: %+v %v", rep, err)
	}
	start := time.Now()
	if n, err := h.Conn.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("closed after %v", waited)
	}
	if got := s.Stats().TLSHandshakeFailures; got != 1 {
		t.Errorf("TLSHandshakeFailures %d, want 1", got)
	}
}

func TestBytesSentBeforeTheSTARTTLSReplyClose(t *testing.T) {
	p := newTestPKI(t)
	s := startTLSServer(t, p, nbd.TLSRequired)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	// STARTTLS and, in the same segment, an option that would be read as if it came through
	// TLS (proto.md: the client MUST NOT send anything until the reply).
	option := func(id uint32) []byte {
		b := make([]byte, 16)
		copy(b, "IHAVEOPT")
		b[11] = byte(id)
		return b
	}
	if _, err := h.Conn.Write(append(option(nbdtest.OptStartTLS), option(nbdtest.OptList)...)); err != nil {
		t.Fatal(err)
	}
	_, err := h.ReadReply()
	wantClosed(t, err)
	if got := s.Stats().TLSConnections; got != 0 {
		t.Errorf("TLSConnections %d", got)
	}
}

func TestTransmissionOverTLS(t *testing.T) {
	p := newTestPKI(t)
	mem := nbdtest.NewMemExport(floodExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem}, func(c *nbd.Config) { c.TLS = p.server })
	s.clientTLS = p.client
	c := s.dial(t, "vol")
	// Pipelined requests of every size class, their replies gathered into TLS records.
	lengths := []uint32{1, 512, 4096, 65536, 1 << 20, nbd.MaxRequestLength}
	var off uint64
	for i, n := range lengths {
		if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: off, Length: n, Payload: pattern(int(n), byte(i))}); err != nil {
			t.Fatal(err)
		}
		off += uint64(n)
	}
	for range lengths {
		if rep, err := c.Receive(); err != nil || rep.Errno != 0 {
			t.Fatalf("write reply %+v %v", rep, err)
		}
	}
	handles := map[uint64]int{}
	off = 0
	for i, n := range lengths {
		h, err := c.Send(nbdtest.Request{Type: nbdtest.CmdRead, Offset: off, Length: n})
		if err != nil {
			t.Fatal(err)
		}
		handles[h] = i
		off += uint64(n)
	}
	for range lengths {
		rep, err := c.Receive()
		if err != nil || rep.Errno != 0 {
			t.Fatalf("read reply %+v %v", rep, err)
		}
		i := handles[rep.Handle]
		if !bytes.Equal(rep.Data, pattern(int(lengths[i]), byte(i))) {
			t.Fatalf("read %d bytes: data differs from what was written", lengths[i])
		}
	}
	if _, err := c.Disconnect(); err != nil {
		t.Fatalf("disconnect: %v (the server ends TLS with close_notify)", err)
	}
}

func TestStalledTLSClientsAreClosed(t *testing.T) {
	const stall = 300 * time.Millisecond
	p := newTestPKI(t)
	s := startServer(t, map[string]nbd.Export{"vol": nbdtest.NewMemExport(floodExportSize)}, func(c *nbd.Config) {
		c.StallTimeout = stall
		c.TLS = p.server
	})
	s.clientTLS = p.client
	// A client that reads nothing of its replies,
	startFlood(t, s, "vol", 16, floodReadLength)
	// and a slow one that takes a 32 MiB reply 1 MiB every 50 ms, far longer than StallTimeout:
	// over TLS a write that hit its deadline could not go on, so progress must renew it.
	slow := s.dial(t, "vol")
	if _, err := slow.Send(nbdtest.Request{Type: nbdtest.CmdRead, Length: nbd.MaxRequestLength}); err != nil {
		t.Fatal(err)
	}
	header := make([]byte, 16)
	if _, err := io.ReadFull(slow.Conn, header); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	chunk := make([]byte, 1<<20)
	for range nbd.MaxRequestLength / len(chunk) {
		time.Sleep(50 * time.Millisecond)
		if _, err := io.ReadFull(slow.Conn, chunk); err != nil {
			t.Fatalf("slow TLS reader cut off after %v: %v", time.Since(start), err)
		}
	}
	waitUntil(t, "the stalled TLS client closed", func() (bool, string) {
		st := s.Stats()
		return st.StalledConnections == 1 && st.OpenConnections == 1,
			fmt.Sprintf("%d stalled, %d open", st.StalledConnections, st.OpenConnections)
	})
	if _, err := slow.Read(0, 4096); err != nil {
		t.Fatalf("the slow reader's connection after the stall: %v", err)
	}
	waitDrained(t, s, 1)
}

func TestTLSConfigIsValidated(t *testing.T) {
	p := newTestPKI(t)
	resolver := &testResolver{}
	optionalClientCert := p.server.Clone()
	optionalClientCert.ClientAuth = tls.VerifyClientCertIfGiven
	for _, tc := range []struct {
		name string
		cfg  nbd.Config
		want string
	}{
		{"required without a TLS config", nbd.Config{Resolver: resolver, TLSPolicy: nbd.TLSRequired}, "needs a TLS config"},
		{"optional without a TLS config", nbd.Config{Resolver: resolver, TLSPolicy: nbd.TLSOptional}, "needs a TLS config"},
		{"client certificates not required", nbd.Config{Resolver: resolver, TLS: optionalClientCert}, "RequireAndVerifyClientCert"},
		{"no server certificate", nbd.Config{Resolver: resolver, TLS: &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}}, "no certificate"},
		{"fewer open connections than in transmission", nbd.Config{Resolver: resolver, MaxConnections: 10, MaxOpenConnections: 5}, "MaxOpenConnections 5 is below MaxConnections 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want it to say %q", err, tc.want)
			}
		})
	}
	for _, cfg := range []nbd.Config{
		{Resolver: resolver},
		{Resolver: resolver, TLS: p.server},
		{Resolver: resolver, TLS: p.server, TLSPolicy: nbd.TLSOff},
		{Resolver: resolver, MaxConnections: 1000},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", cfg, err)
		}
	}
}
