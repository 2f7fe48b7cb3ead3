package nbdclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/internal/poll"
	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
	"github.com/replvol/replvol/transport/nbdclient"
)

const exportSize = 8 << 20

// resolver serves fixed exports; any other name is refused in words.
type resolver map[string]nbd.Export

func (r resolver) Lookup(name string) (nbd.Export, error) {
	if e, ok := r[name]; ok {
		return e, nil
	}
	return nil, fmt.Errorf("%s: no such volume here", name)
}

func (r resolver) List() []string { return nil }

// serve runs the project's NBD server on 127.0.0.1:0 with exports until the test ends.
func serve(t *testing.T, exports resolver, configure ...func(*nbd.Config)) (addr string, srv *nbd.Server) {
	t.Helper()
	cfg := nbd.Config{Resolver: exports}
	for _, f := range configure {
		f(&cfg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = nbd.NewServer(cfg)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-served
	})
	return l.Addr().String(), srv
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, addr string, n int, opts nbdclient.Options) *nbdclient.Pool {
	t.Helper()
	p, err := nbdclient.Open(ctx(t), addr, "vol", n, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestManyWritersOverSeveralConnections: writes and reads from many goroutines at once, over
// four connections (the server offers multi-conn), land where they were sent; a flush reaches
// the export; Close sends NBD_CMD_DISC, which the server answers by closing.
func TestManyWritersOverSeveralConnections(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	addr, srv := serve(t, resolver{"vol": mem})
	p := open(t, addr, 4, nbdclient.Options{Timeout: 10 * time.Second})
	if p.Connections() != 4 || !p.Export().CanMultiConn() || p.Size() != exportSize {
		t.Fatalf("%d connections to a %d-byte export with flags %#x; want 4, multi-conn, %d bytes", p.Connections(), p.Size(), p.Export().Flags, exportSize)
	}
	want := make([]byte, exportSize)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			// Each writer owns the 512 KiB area w; writes of 1 byte to 200 KiB.
			base := int64(w) * (512 << 10)
			for range 40 {
				n := 1 + rng.IntN(200<<10)
				off := base + rng.Int64N(512<<10-int64(n))
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				if _, err := p.WriteAt(b, off); err != nil {
					t.Errorf("WriteAt: %v", err)
					return
				}
				copy(want[off:], b)
				got := make([]byte, n)
				if _, err := p.ReadAt(got, off); err != nil || !bytes.Equal(got, b) {
					t.Errorf("ReadAt after WriteAt at %d: %v, equal %v", off, err, bytes.Equal(got, b))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := p.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if mem.Calls(nbdtest.OpFlush) != 1 {
		t.Errorf("%d flushes reached the export, want 1", mem.Calls(nbdtest.OpFlush))
	}
	if !bytes.Equal(mem.Bytes(0, exportSize), want) {
		t.Fatal("the export does not hold what was written")
	}
	// A read longer than a request is cut into several.
	big := make([]byte, exportSize)
	if _, err := p.ReadAt(big, 0); err != nil || !bytes.Equal(big, want) {
		t.Fatalf("ReadAt of the whole export: %v", err)
	}
	// Zeroes and trims reach the export, and zeroes read back as zeroes.
	if err := p.WriteZeroes(4096, 3<<20); err != nil {
		t.Fatalf("WriteZeroes: %v", err)
	}
	if !bytes.Equal(mem.Bytes(4096, 3<<20), make([]byte, 3<<20)) {
		t.Fatal("WriteZeroes left data")
	}
	if err := p.Trim(0, exportSize); err != nil || mem.Calls(nbdtest.OpTrim) == 0 {
		t.Fatalf("Trim: %v, %d trims reached the export", err, mem.Calls(nbdtest.OpTrim))
	}
	if _, err := p.ReadAt(make([]byte, 2), exportSize-1); err == nil {
		t.Error("a read past the end was sent")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Stats().OpenConnections != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.Stats().OpenConnections; n != 0 {
		t.Errorf("%d connections still open on the server after Close", n)
	}
	if _, err := p.ReadAt(make([]byte, 1), 0); !errors.Is(err, nbdclient.ErrClosed) {
		t.Errorf("a read after Close: %v, want ErrClosed", err)
	}
}

// TestTLS: with the cluster's nbd-client certificate the client STARTTLSes and is served; a
// plaintext client of a server that requires TLS gets the server's refusal as an
// *OptionError of ReplyTLSRequired, in the server's words.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	alpha := pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}
	if _, err := pki.Init(dir, []pki.Holder{alpha}, false); err != nil {
		t.Fatal(err)
	}
	server, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, "alpha.crt"), filepath.Join(dir, "alpha.key"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := pki.LoadNBDClient(dir)
	if err != nil {
		t.Fatal(err)
	}
	mem := nbdtest.NewMemExport(exportSize)
	addr, _ := serve(t, resolver{"vol": mem}, func(c *nbd.Config) {
		c.TLS = server.ServerConfig(true, pki.Roles(pki.RoleNBDClient, pki.RoleOperator))
		c.TLSPolicy = nbd.TLSRequired
	})
	p := open(t, addr, 2, nbdclient.Options{TLS: client.ClientConfig(addr, pki.Roles(pki.RoleNode))})
	if _, err := p.WriteAt([]byte("over TLS"), 4096); err != nil {
		t.Fatal(err)
	}
	if got := string(mem.Bytes(4096, 8)); got != "over TLS" {
		t.Fatalf("the export holds %q", got)
	}
	_, err = nbdclient.Open(ctx(t), addr, "vol", 1, nbdclient.Options{})
	var oe *nbdclient.OptionError
	if !errors.As(err, &oe) || oe.Reply != nbdclient.ReplyTLSRequired || oe.Message == "" {
		t.Fatalf("a plaintext client: %v, want the server's TLS-required refusal", err)
	}
	// A client that trusts another CA refuses the server.
	other := t.TempDir()
	if _, err := pki.Init(other, nil, false); err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.LoadNBDClient(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nbdclient.Open(ctx(t), addr, "vol", 1, nbdclient.Options{TLS: stranger.ClientConfig(addr, pki.Roles(pki.RoleNode))}); err == nil {
		t.Fatal("a client of another CA was served")
	}
}

// TestRefusalsAreTyped: an unknown export is an *OptionError of ReplyUnknown with the
// server's words; an error reply to a request is an Errno.
func TestRefusalsAreTyped(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	faulty := &nbdtest.FaultyExport{Device: mem, Injector: nbdtest.FailOn(syscall.ENOSPC, nbdtest.OpWrite)}
	addr, _ := serve(t, resolver{"vol": faulty})
	_, err := nbdclient.Open(ctx(t), addr, "nope", 1, nbdclient.Options{})
	var oe *nbdclient.OptionError
	if !errors.As(err, &oe) || oe.Reply != nbdclient.ReplyUnknown || oe.Message != "nope: no such volume here" {
		t.Fatalf("an unknown export: %v", err)
	}
	p := open(t, addr, 1, nbdclient.Options{})
	_, err = p.WriteAt([]byte{1}, 0)
	var errno nbdclient.Errno
	if !errors.As(err, &errno) || errno.Syscall() != syscall.ENOSPC {
		t.Fatalf("a refused write: %v, want ENOSPC", err)
	}
	// The connection goes on.
	if _, err := p.ReadAt(make([]byte, 10), 0); err != nil {
		t.Fatalf("a read after a refused write: %v", err)
	}
}

// TestAnUnansweredRequestBreaksTheConnection: a request the server holds past the timeout
// fails with ErrTimeout, and so does every request after it, at once; the client never waits
// longer than its timeout.
func TestAnUnansweredRequestBreaksTheConnection(t *testing.T) {
	gate := nbdtest.NewGate(nbdtest.OpRead)
	addr, _ := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: nbdtest.NewMemExport(exportSize), Injector: gate}})
	t.Cleanup(gate.Open) // before the server's shutdown, which waits for the held read
	p := open(t, addr, 1, nbdclient.Options{Timeout: 300 * time.Millisecond})
	began := time.Now()
	_, err := p.ReadAt(make([]byte, 4096), 0)
	var broken *nbdclient.BrokenError
	if !errors.Is(err, nbdclient.ErrTimeout) || !errors.As(err, &broken) {
		t.Fatalf("a held read: %v, want a broken connection by ErrTimeout", err)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("the held read failed after %s", d)
	}
	if _, err := p.WriteAt([]byte{1}, 0); !errors.Is(err, nbdclient.ErrTimeout) {
		t.Errorf("a write after the timeout: %v, want ErrTimeout", err)
	}
	if err := p.Err(); err == nil {
		t.Error("the pool says it works")
	}
}

// TestAClosedExportFailsRequestsAtOnce: when the server closes the export (the node stops
// being primary), requests fail at once with a BrokenError instead of waiting.
func TestAClosedExportFailsRequestsAtOnce(t *testing.T) {
	addr, srv := serve(t, resolver{"vol": nbdtest.NewMemExport(exportSize)})
	p := open(t, addr, 2, nbdclient.Options{})
	if _, err := p.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	srv.CloseExport("vol")
	var err error
	for range 2 * p.Connections() {
		if _, err = p.WriteAt([]byte{1}, 0); err == nil {
			t.Fatal("a write after the export closed succeeded")
		}
	}
	var broken *nbdclient.BrokenError
	if !errors.As(err, &broken) {
		t.Fatalf("a write after the export closed: %v, want a BrokenError", err)
	}
}

// TestOneConnectionWithoutMultiConn: a server that does not offer multi-conn gets one
// connection, whatever was asked.
func TestOneConnectionWithoutMultiConn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan int, 8)
	go func() {
		for n := 1; ; n++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- n
			go fakeServer(c, nbdclient.FlagHasFlags|nbdclient.FlagSendFlush)
		}
	}()
	p := open(t, l.Addr().String(), 4, nbdclient.Options{})
	if p.Connections() != 1 || len(accepted) != 1 {
		t.Fatalf("%d connections (%d accepted), want 1", p.Connections(), len(accepted))
	}
}

// fakeServer negotiates one export of exportSize bytes with flags and closes at the first
// request.
func fakeServer(c net.Conn, flags uint16) {
	defer c.Close()
	be := func(n int, v uint64) []byte {
		b := make([]byte, n)
		for i := range n {
			b[n-1-i] = byte(v >> (8 * i))
		}
		return b
	}
	w := func(parts ...[]byte) { _, _ = c.Write(bytes.Join(parts, nil)) }
	w(be(8, 0x4e42444d41474943), be(8, 0x49484156454f5054), be(2, 1))
	buf := make([]byte, 4+16)
	if _, err := readFull(c, buf); err != nil {
		return
	}
	n := int(buf[16])<<24 | int(buf[17])<<16 | int(buf[18])<<8 | int(buf[19])
	if _, err := readFull(c, make([]byte, n)); err != nil {
		return
	}
	info := append(be(2, 0), be(8, exportSize)...)
	info = append(info, be(2, uint64(flags))...)
	w(be(8, 0x3e889045565a9), be(4, 7), be(4, 3), be(4, uint64(len(info))), info)
	w(be(8, 0x3e889045565a9), be(4, 7), be(4, 1), be(4, 0))
	_, _ = readFull(c, make([]byte, 28))
}

func readFull(c net.Conn, b []byte) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestParseURI: the URIs replvol writes, and what the client refuses.
func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     nbdclient.URI
		local    string
	}{
		{"plaintext", "nbd://127.0.0.1:7802/vol0", nbdclient.URI{Addr: "127.0.0.1:7802", Export: "vol0"}, "127.0.0.1:7802"},
		{"TLS with libnbd's certificates query", "nbds://10.0.0.1:7802/vol0?tls-certificates=/etc/x", nbdclient.URI{TLS: true, Addr: "10.0.0.1:7802", Export: "vol0"}, "10.0.0.1:7802"},
		{"no port", "nbd://host/vol0", nbdclient.URI{Addr: "host:10809", Export: "vol0"}, "host:10809"},
		{"a wildcard listening address", "nbd://0.0.0.0:7802/vol0", nbdclient.URI{Addr: "0.0.0.0:7802", Export: "vol0"}, "127.0.0.1:7802"},
		{"no host before the port", "nbds://:7802/vol0", nbdclient.URI{TLS: true, Addr: ":7802", Export: "vol0"}, "127.0.0.1:7802"},
		{"the IPv6 wildcard", "nbd://[::]:7802/vol0", nbdclient.URI{Addr: "[::]:7802", Export: "vol0"}, "[::1]:7802"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nbdclient.ParseURI(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseURI(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if l := got.Local().Addr; l != tc.local {
				t.Errorf("Local() dials %s, want %s", l, tc.local)
			}
		})
	}
	for _, bad := range []string{"http://x/vol0", "nbd+unix:///vol0?socket=/s", "nbd:///vol0", "::"} {
		if _, err := nbdclient.ParseURI(bad); !errors.Is(err, nbdclient.ErrBadURI) {
			t.Errorf("ParseURI(%q): %v, want ErrBadURI", bad, err)
		}
	}
}

// TestAServerShuttingDownIsASoftDisconnect: while the server drains, a request it reads is
// answered NBD_ESHUTDOWN (ErrShutdown); from then on the connection takes no new request (it
// fails with ErrShutdown, unsent), the request in flight gets its answer, and the client then
// disconnects by itself (NBD_CMD_DISC), as the protocol asks, so the server's Shutdown returns.
func TestAServerShuttingDownIsASoftDisconnect(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	addr, srv := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	t.Cleanup(gate.Open)
	c, err := nbdclient.Dial(ctx(t), addr, "vol", nbdclient.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	held := make(chan error, 1)
	go func() {
		_, err := c.WriteAt([]byte("held"), 0)
		held <- err
	}()
	<-gate.Entered
	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shutdown <- srv.Shutdown(ctx)
	}()
	if !poll.Within(20*time.Second, time.Millisecond, func() bool { return srv.Stats().DrainingConnections == 1 }) {
		t.Fatal("the connection does not drain")
	}
	if _, err := c.WriteAt([]byte("late"), 4096); !errors.Is(err, nbdclient.ErrShutdown) {
		t.Fatalf("a write while the server drains: %v, want ErrShutdown", err)
	}
	sent := srv.Stats().Requests.Write
	if _, err := c.WriteAt([]byte("next"), 8192); !errors.Is(err, nbdclient.ErrShutdown) {
		t.Fatalf("a write after ErrShutdown: %v, want ErrShutdown", err)
	}
	if got := srv.Stats().Requests.Write; got != sent {
		t.Errorf("the write after ErrShutdown was sent (%d writes read, %d before)", got, sent)
	}
	if err := c.Err(); !errors.Is(err, nbdclient.ErrShutdown) {
		t.Errorf("Err: %v, want ErrShutdown", err)
	}
	gate.Open()
	if err := <-held; err != nil {
		t.Fatalf("the write in flight as the drain began: %v", err)
	}
	// The client disconnects once nothing is in flight; the server then closes at once.
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := srv.Stats().Requests.Disconnect; got != 1 {
		t.Errorf("%d NBD_CMD_DISC read, want the client's 1", got)
	}
	if string(mem.Bytes(0, 4)) != "held" || string(mem.Bytes(4096, 4)) == "late" || string(mem.Bytes(8192, 4)) == "next" {
		t.Error("the export does not hold just the write answered OK")
	}
}

// TestAServerEndingTheConnectionIsTyped: a server that ends the connection in order (EOF
// between replies) with a request in flight breaks the connection with ErrServerClosed, not a
// bare EOF, so that a caller can tell it from a network failure.
func TestAServerEndingTheConnectionIsTyped(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err == nil {
			fakeServer(c, nbdclient.FlagHasFlags) // reads the first request, closes
		}
	}()
	c, err := nbdclient.Dial(ctx(t), l.Addr().String(), "vol", nbdclient.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.ReadAt(make([]byte, 512), 0)
	var broken *nbdclient.BrokenError
	if !errors.Is(err, nbdclient.ErrServerClosed) || !errors.As(err, &broken) {
		t.Fatalf("a read the server ended the connection on: %v, want a BrokenError of ErrServerClosed", err)
	}
}

// TestAPoolSeesTheExportGrowOnRefresh: a Pool (replctl mount without --follow) keeps the size
// of its handshake until Refresh asks the server (NBD_OPT_INFO); when the export grew it
// connects again, as many connections as before, and the new range is written and read, while
// writes from other goroutines during the refresh are all answered (none fails), and the old
// connections are closed. A Refresh that finds the same size does not reconnect; one that finds
// a smaller export is ErrShrunk, and the size stays.
func TestAPoolSeesTheExportGrowOnRefresh(t *testing.T) {
	const small, big = 1 << 20, 4 << 20
	g := &growingExport{MemExport: nbdtest.NewMemExport(big)}
	g.size.Store(small)
	addr, _ := serve(t, resolver{"vol": g})
	p := open(t, addr, 3, nbdclient.Options{Timeout: 10 * time.Second})
	if p.Connections() != 3 {
		t.Fatalf("%d connections, want 3", p.Connections())
	}
	if size, err := p.Refresh(ctx(t)); err != nil || size != small || p.Size() != small {
		t.Fatalf("Refresh before the growth: %d, %v; want %d", size, err, small)
	}
	if _, err := p.WriteAt(make([]byte, 4096), small); err == nil {
		t.Fatal("a write past the export's end was taken")
	}

	g.size.Store(big)
	if p.Size() != small {
		t.Fatalf("Size before Refresh: %d, want %d", p.Size(), small)
	}
	stop := make(chan struct{})
	writes := make(chan error, 4)
	for w := range 4 {
		go func() {
			buf := bytes.Repeat([]byte{byte(w + 1)}, 4096)
			for i := 0; ; i++ {
				select {
				case <-stop:
					writes <- nil
					return
				default:
				}
				if _, err := p.WriteAt(buf, int64(w*16+i%16)*4096); err != nil {
					writes <- err
					return
				}
			}
		}()
	}
	flushes := g.Calls(nbdtest.OpFlush)
	size, err := p.Refresh(ctx(t))
	close(stop)
	if g.Calls(nbdtest.OpFlush) <= flushes {
		t.Error("the refresh closed the old connections without a flush of the writes answered on them")
	}
	for range 4 {
		if err := <-writes; err != nil {
			t.Errorf("a write during the refresh: %v", err)
		}
	}
	if err != nil || size != big || p.Size() != big || p.Export().Size != big || p.Connections() != 3 {
		t.Fatalf("Refresh after the growth: %d, %v (Size %d, %d connections); want %d over 3", size, err, p.Size(), p.Connections(), big)
	}
	want := bytes.Repeat([]byte{9}, 4096)
	if _, err := p.WriteAt(want, big-4096); err != nil {
		t.Fatalf("a write in the new range: %v", err)
	}
	got := make([]byte, 4096)
	if _, err := p.ReadAt(got, big-4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read in the new range: %v, equal %v", err, bytes.Equal(got, want))
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if string(g.Bytes(big-4096, 1)) != "\x09" {
		t.Fatal("the export does not hold the write in the new range")
	}

	g.size.Store(small)
	if size, err := p.Refresh(ctx(t)); !errors.Is(err, nbdclient.ErrShrunk) || size != big || p.Size() != big {
		t.Fatalf("Refresh of a smaller export: %d, %v (Size %d); want %d, ErrShrunk", size, err, p.Size(), big)
	}
}
