package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
)

func tlsBundles(t *testing.T, names ...string) map[string]*pki.Bundle {
	t.Helper()
	dir := t.TempDir()
	var hs []pki.Holder
	for _, n := range names {
		hs = append(hs, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: n}, Hosts: []string{"127.0.0.1"}})
	}
	if _, err := pki.Init(dir, hs, false); err != nil {
		t.Fatal(err)
	}
	out := map[string]*pki.Bundle{}
	for _, n := range append(names, "operator") {
		b, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile(n)), filepath.Join(dir, pki.KeyFile(n)))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

func nodeID(name string) pki.Identity { return pki.Identity{Role: pki.RoleNode, Name: name} }

// echoServer serves replication streams over TLS on 127.0.0.1 and sends
// each frame back; it records whom each stream's certificate names and
// every failed handshake.
type echoServer struct {
	addr string
	mu   sync.Mutex
	seen []pki.Identity
	fail []error
}

func startEchoServer(t *testing.T, b *pki.Bundle) *echoServer {
	t.Helper()
	e := &echoServer{}
	srv := NewReplServer(func(s *ReplStream) error {
		id, _ := pki.PeerIdentity(s.TLS())
		e.mu.Lock()
		e.seen = append(e.seen, id)
		e.mu.Unlock()
		for {
			f := &Frame{}
			if err := s.Recv(f); err != nil {
				return nil
			}
			if err := s.Send(f); err != nil {
				return err
			}
		}
	}, ReplTLS(b.ServerConfig(true, pki.Roles(pki.RoleNode))), ReplHandshakeFailed(func(_ net.Addr, err error) {
		e.mu.Lock()
		e.fail = append(e.fail, err)
		e.mu.Unlock()
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	e.addr = ln.Addr().String()
	return e
}

// failureOf waits for a handshake failure the server recorded after the
// first before ones that pki.ExplainHandshake puts down to cause (a
// failure of an earlier client may be recorded late).
func (e *echoServer) failureOf(t *testing.T, before int, cause pki.HandshakeCause) *pki.HandshakeError {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.mu.Lock()
		fails := append([]error(nil), e.fail[min(before, len(e.fail)):]...)
		e.mu.Unlock()
		for _, err := range fails {
			if he := pki.ExplainHandshake(err); he != nil && he.Cause == cause {
				return he
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server recorded no failed handshake of cause %s, only %v", cause, fails)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *echoServer) failures() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.fail)
}

// roundTrip opens a stream, sends a frame of n bytes and reads it back.
func roundTrip(t *testing.T, c *ReplClient, n int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.Open(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	f := NewFrame(n)
	f.SetBytes(append(f.Bytes(), make([]byte, n)...))
	if err := s.Send(f); err != nil {
		return err
	}
	got := &Frame{}
	defer got.Release()
	if err := s.Recv(got); err != nil {
		return err
	}
	if len(got.Bytes()) != n {
		t.Fatalf("echoed %d bytes, sent %d", len(got.Bytes()), n)
	}
	return nil
}

// TestReplicationStreamIsMutualTLS: over TLS the stream carries frames up
// to the frame limit, and the server learns whom the client's certificate
// names (the node checks it against the Hello). A client that expected
// another node, a client of another CA and a plaintext client are
// refused; each side says why in words, from values (pki.HandshakeError),
// never gRPC's text.
func TestReplicationStreamIsMutualTLS(t *testing.T) {
	b := tlsBundles(t, "alpha", "beta")
	stranger := tlsBundles(t, "alpha")["alpha"]
	srv := startEchoServer(t, b["beta"])
	dial := func(conf *tls.Config) *ReplClient {
		var opts []ReplOption
		if conf != nil {
			opts = append(opts, ReplTLS(conf))
		}
		c, err := DialRepl(srv.addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	alpha := dial(b["alpha"].ClientConfig(srv.addr, pki.Exactly(nodeID("beta"))))
	if err := roundTrip(t, alpha, 4096); err != nil {
		t.Fatalf("alpha to beta over TLS: %v", err)
	}
	srv.mu.Lock()
	seen := srv.seen[0]
	srv.mu.Unlock()
	if seen != nodeID("alpha") {
		t.Fatalf("the server saw the client as %v, want node alpha", seen)
	}

	t.Run("the frame limit", func(t *testing.T) {
		if err := roundTrip(t, alpha, MaxFrameSize); err != nil {
			t.Fatalf("a frame of the limit: %v", err)
		}
		err := roundTrip(t, alpha, MaxFrameSize+1)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("a frame one byte over the limit: %v", err)
		}
		// A sender that ignores the limit: the server refuses the frame on
		// its header, and says so.
		conn, err := tls.Dial("tcp", srv.addr, b["alpha"].ClientConfig(srv.addr, nil))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		var pre [len(streamPreamble)]byte
		if _, err := conn.Write(streamPreamble[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, pre[:]); err != nil || pre != streamPreamble {
			t.Fatalf("preamble %q: %v", pre, err)
		}
		var hdr [frameHeaderLen]byte
		putHeader(hdr[:], kindFrame, MaxFrameSize+1)
		if _, err := conn.Write(hdr[:]); err != nil {
			t.Fatalf("the unlimited sender could not send: %v", err)
		}
		err = newFrameConn(context.Background(), conn, nil, acceptedReadBuffer).RecvMsg(&Frame{})
		if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "frame too large for the peer") {
			t.Fatalf("the server took a frame over the limit: %v", err)
		}
	})

	for _, tc := range []struct {
		name string
		conf *tls.Config
		// side that explains the refusal, its cause and words.
		side  string
		cause pki.HandshakeCause
		words string
	}{
		{"a client that dialled another node", b["alpha"].ClientConfig(srv.addr, pki.Exactly(nodeID("gamma"))),
			"client", pki.CauseWrongIdentity, "presented a certificate that names node beta, not node gamma"},
		{"an operator where only nodes may come", b["operator"].ClientConfig(srv.addr, nil),
			"client", pki.CauseRefusedByPeer, "refused this side's certificate"},
		{"a client of another CA", func() *tls.Config {
			c := stranger.ClientConfig(srv.addr, nil)
			c.InsecureSkipVerify, c.VerifyConnection = true, nil
			return c
		}(), "server", pki.CauseOtherCA, "alpha presented a certificate of another CA: node alpha"},
		{"a plaintext client", nil, "server", pki.CauseNotTLS, "does not speak TLS"},
		// The server's certificate is of another CA than the client's:
		// told so however far the stream got (gRPC opens it before the
		// handshake ends, so the refusal may come at the first Send).
		{"a client of another cluster", stranger.ClientConfig(srv.addr, nil),
			"client", pki.CauseOtherCA, "presented a certificate of another CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.failures()
			err := roundTrip(t, dial(tc.conf), 16)
			if err == nil {
				t.Fatal("the stream was accepted")
			}
			if strings.Contains(err.Error(), "rpc error") {
				t.Errorf("the client's error reads as gRPC: %v", err)
			}
			var words string
			if tc.side == "client" {
				he := pki.ExplainHandshake(err)
				if he == nil || he.Cause != tc.cause {
					t.Fatalf("client's error %v: explained %v, want %s", err, he, tc.cause)
				}
				words = err.Error()
			} else {
				words = srv.failureOf(t, before, tc.cause).Words("alpha")
			}
			if !strings.Contains(words, tc.words) {
				t.Fatalf("refused with %q, want it to say %q", words, tc.words)
			}
		})
	}
}

// TestAHungPeerOverTLSIsNotAnswering: a node that accepts connections but
// completes no TLS handshake (SIGSTOPped: the kernel still accepts) is
// told apart from a refusal: it answers nothing.
func TestAHungPeerOverTLSIsNotAnswering(t *testing.T) {
	b := tlsBundles(t, "alpha", "beta")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // never accepted: the kernel completes the TCP handshakes
	addr := l.Addr().String()
	c, err := DialRepl(addr, ReplTLS(b["alpha"].ClientConfig(addr, pki.Exactly(nodeID("beta")))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Open(ctx)
	var se *StreamError
	if !errors.As(err, &se) || se.Reach != ReachNoAnswer || !strings.Contains(err.Error(), "completes no TLS handshake") {
		t.Fatalf("Open to a hung peer: %v, want it not answering", err)
	}
	if pki.ExplainHandshake(err) != nil {
		t.Fatalf("a hung peer explained as a TLS refusal: %v", err)
	}
}
