package nbd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// testResolver serves a fixed set of exports; Lookup of any other name returns refusal(name).
type testResolver struct {
	mu      sync.Mutex
	exports map[string]nbd.Export
	// beforeLookup, if set, runs at the start of every Lookup.
	beforeLookup func(name string)
}

func (r *testResolver) Lookup(name string) (nbd.Export, error) {
	r.mu.Lock()
	hook := r.beforeLookup
	e, ok := r.exports[name]
	r.mu.Unlock()
	if hook != nil {
		hook(name)
	}
	if !ok {
		return nil, refusal(name)
	}
	return e, nil
}

func (r *testResolver) List() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for n := range r.exports {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// refusal is the error a Secondary node's resolver would give; the client must see its text.
func refusal(name string) error {
	return fmt.Errorf("%s: this node (beta) is Secondary; the primary is alpha at nbd://127.0.0.1:7802/%s", name, name)
}

// testServer is a Server listening on 127.0.0.1:0.
type testServer struct {
	*nbd.Server
	addr     string
	resolver *testResolver
	served   chan error // Serve's result
	// clientTLS, if set, makes dial STARTTLS with it.
	clientTLS *tls.Config
}

const testExportSize = 16 << 20

// startServer serves exports until the test ends; cleanup shuts it down and checks Serve's
// result. With no exports it serves one MemExport named "vol".
func startServer(t *testing.T, exports map[string]nbd.Export, configure ...func(*nbd.Config)) *testServer {
	t.Helper()
	if exports == nil {
		exports = map[string]nbd.Export{"vol": nbdtest.NewMemExport(testExportSize)}
	}
	resolver := &testResolver{exports: exports}
	cfg := nbd.Config{Resolver: resolver, Logger: testLogger(t)}
	for _, f := range configure {
		f(&cfg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{Server: nbd.NewServer(cfg), addr: l.Addr().String(), resolver: resolver, served: make(chan error, 1)}
	go func() { s.served <- s.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-s.served; err != nil {
			t.Errorf("Serve returned %v, want nil after Shutdown", err)
		}
		if n := s.Stats().OpenConnections; n != 0 {
			t.Errorf("%d connections open after Shutdown", n)
		}
		for name, e := range exports {
			if m, ok := e.(*nbdtest.MemExport); ok && m.OutOfRange() != 0 {
				t.Errorf("export %s: %d out-of-range calls reached the Export", name, m.OutOfRange())
			}
		}
	})
	return s
}

func (s *testServer) uri(export string) string { return "nbd://" + s.addr + "/" + export }

// dial connects and selects export with NBD_OPT_GO; the connection is closed when the test ends.
func (s *testServer) dial(t *testing.T, export string) *nbdtest.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbdtest.DialTLS(ctx, s.addr, export, s.clientTLS)
	if err != nil {
		t.Fatalf("dial %s: %v", export, err)
	}
	t.Cleanup(func() { c.Close() })
	setTestDeadline(t, c.Conn)
	return c
}

// greet connects and reads the greeting; the connection is closed when the test ends.
func (s *testServer) greet(t *testing.T, clientFlags uint32) *nbdtest.Handshake {
	t.Helper()
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	setTestDeadline(t, conn)
	h, err := nbdtest.Greet(conn, clientFlags)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// setTestDeadline keeps a broken server from hanging the test: every read and write on conn
// fails after 30 s.
func setTestDeadline(t *testing.T, conn net.Conn) {
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("NBD_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func wantErrno(t *testing.T, err error, want nbdtest.Errno) {
	t.Helper()
	var got nbdtest.Errno
	if !errors.As(err, &got) || got != want {
		t.Fatalf("got error %v, want %v", err, want)
	}
}

// wantClosed checks that err says the server closed the connection.
func wantClosed(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("got %v, want the connection closed by the server", err)
	}
}

func (r *testResolver) setBeforeLookup(f func(name string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.beforeLookup = f
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// port is the port the server listens on.
func (s *testServer) port() string {
	_, port, _ := net.SplitHostPort(s.addr)
	return port
}
