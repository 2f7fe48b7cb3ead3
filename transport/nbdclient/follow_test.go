package nbdclient_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/poll"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
	"github.com/replvol/replvol/transport/nbdclient"
)

// tcpProxy forwards connections to a server, records what clients send, and can cut every
// connection at once, as a dead server's host does.
type tcpProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	sent  bytes.Buffer
}

func newProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
			go func() { _, _ = io.Copy(recorder{p, s}, c); s.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

type recorder struct {
	p *tcpProxy
	w io.Writer
}

func (r recorder) Write(b []byte) (int, error) {
	r.p.mu.Lock()
	r.p.sent.Write(b)
	r.p.mu.Unlock()
	return r.w.Write(b)
}

func (p *tcpProxy) addr() string { return p.l.Addr().String() }

// cut closes the listener and every connection.
func (p *tcpProxy) cut() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

type wireRequest struct {
	cmd    uint16
	off    uint64
	length uint32
}

// requests are the NBD requests clients sent through the proxy, in the order sent (the
// tests' payloads hold no request magic).
func (p *tcpProxy) requests() []wireRequest {
	p.mu.Lock()
	b := bytes.Clone(p.sent.Bytes())
	p.mu.Unlock()
	magic := []byte{0x25, 0x60, 0x95, 0x13}
	var out []wireRequest
	for {
		i := bytes.Index(b, magic)
		if i < 0 || len(b) < i+28 {
			return out
		}
		h := b[i : i+28]
		r := wireRequest{cmd: binary.BigEndian.Uint16(h[6:]), off: binary.BigEndian.Uint64(h[16:]), length: binary.BigEndian.Uint32(h[24:])}
		out = append(out, r)
		b = b[i+28:]
		if r.cmd == 1 { // a write's payload
			b = b[min(len(b), int(r.length)):]
		}
	}
}

// TestAFollowerSendsWhatWasNotAnsweredToTheNextServer: requests in flight when the first
// server's connection is cut (it took them and never answered, as a primary killed -9) are
// answered by the server the Locator names next, sent to it in the order they were first sent,
// before a request that came while there was no server; none is lost, none answered twice, and
// the write the first server answered is not sent again.
func TestAFollowerSendsWhatWasNotAnsweredToTheNextServer(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize) // both servers serve the same data: every answered write is on the next
	var hold atomic.Bool
	entered := make(chan nbdtest.Op, 16)
	release := make(chan struct{}) // closed before the servers shut down
	dead := nbdtest.InjectorFunc(func(ctx context.Context, op nbdtest.Op, _, _ int64) error {
		if !hold.Load() {
			return nil
		}
		entered <- op
		select {
		case <-ctx.Done():
		case <-release:
		}
		return syscall.EIO // never carried out
	})
	addrA, _ := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: mem, Injector: dead}})
	addrB, _ := serve(t, resolver{"vol": mem})
	t.Cleanup(func() { close(release) })
	first, second := newProxy(t, addrA), newProxy(t, addrB)

	var calls atomic.Int32
	secondAsked := make(chan struct{})
	letSecond := make(chan struct{})
	var connected []string
	var connMu sync.Mutex
	locate := func(ctx context.Context) (nbdclient.Target, error) {
		if calls.Add(1) == 1 {
			return nbdclient.Target{Addr: first.addr(), Export: "vol", Name: "a"}, nil
		}
		if calls.Load() == 2 {
			close(secondAsked)
		}
		select {
		case <-letSecond:
		case <-ctx.Done():
			return nbdclient.Target{}, ctx.Err()
		}
		return nbdclient.Target{Addr: second.addr(), Export: "vol", Name: "b"}, nil
	}
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{IOTimeout: time.Minute, Retry: time.Millisecond,
		Connected: func(t nbdclient.Target) { connMu.Lock(); connected = append(connected, t.Name); connMu.Unlock() },
		Logf:      t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })

	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	if _, err := f.WriteAt(block('0'), 0); err != nil {
		t.Fatalf("the write the first server answers: %v", err)
	}
	hold.Store(true)
	type answer struct {
		name string
		err  error
	}
	answers := make(chan answer, 8)
	read := make([]byte, 4096)
	steps := []struct {
		name string
		op   nbdtest.Op
		do   func() error
	}{
		{"write a", nbdtest.OpWrite, func() error { _, err := f.WriteAt(block('a'), 4096); return err }},
		{"write b", nbdtest.OpWrite, func() error { _, err := f.WriteAt(block('b'), 8192); return err }},
		{"read", nbdtest.OpRead, func() error { _, err := f.ReadAt(read, 0); return err }},
		{"flush", nbdtest.OpFlush, f.Flush},
	}
	for _, s := range steps {
		go func() { answers <- answer{s.name, s.do()} }()
		if op := <-entered; op != s.op {
			t.Fatalf("the first server got %v, want %v", op, s.op)
		}
	}
	first.cut()
	<-secondAsked
	go func() {
		_, err := f.WriteAt(block('c'), 12288)
		answers <- answer{"write c, with no server", err}
	}()
	if !poll.Within(10*time.Second, time.Millisecond, func() bool { return f.Waiting() == 5 }) {
		t.Fatalf("%d requests wait, want the 4 not answered and the one made with no server", f.Waiting())
	}
	close(letSecond)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for range 5 {
		var a answer
		select {
		case a = <-answers:
		case <-timeout.C:
			t.Fatalf("%d requests still wait for their answer", f.Waiting())
		}
		if a.err != nil {
			t.Errorf("%s: %v", a.name, a.err)
		}
	}
	select {
	case a := <-answers:
		t.Fatalf("an answer too many: %s", a.name)
	default:
	}
	if !bytes.Equal(read, block('0')) {
		t.Errorf("the read sent again reads %q..., want the write the first server answered", read[:8])
	}
	for off, want := range map[int64]byte{0: '0', 4096: 'a', 8192: 'b', 12288: 'c'} {
		if got := mem.Bytes(off, 4096); !bytes.Equal(got, block(want)) {
			t.Errorf("at %d the export holds %q..., want %q", off, got[:8], want)
		}
	}
	want := []wireRequest{{1, 4096, 4096}, {1, 8192, 4096}, {0, 0, 4096}, {3, 0, 0}, {1, 12288, 4096}}
	got := second.requests()
	if len(got) != len(want) {
		t.Fatalf("the second server got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("the second server got %v, want %v (in that order)", got, want)
		}
	}
	if cur := f.Current(); cur.Name != "b" {
		t.Errorf("Current is %q, want b", cur.Name)
	}
	connMu.Lock()
	defer connMu.Unlock()
	if len(connected) != 2 || connected[0] != "a" || connected[1] != "b" {
		t.Errorf("connected to %v, want [a b]", connected)
	}
}

// TestAFollowerGivesUpAfterIOTimeoutWithoutServer: with no server for IOTimeout, the requests
// held fail with ErrNoServer, and so does every later one, at once.
func TestAFollowerGivesUpAfterIOTimeoutWithoutServer(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	var hold atomic.Bool
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	dead := nbdtest.InjectorFunc(func(ctx context.Context, _ nbdtest.Op, _, _ int64) error {
		if hold.Load() {
			entered <- struct{}{}
			select {
			case <-ctx.Done():
			case <-release:
			}
			return syscall.EIO
		}
		return nil
	})
	addr, _ := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: mem, Injector: dead}})
	t.Cleanup(func() { close(release) })
	p := newProxy(t, addr)
	var calls atomic.Int32
	locate := func(context.Context) (nbdclient.Target, error) {
		if calls.Add(1) == 1 {
			return nbdclient.Target{Addr: p.addr(), Export: "vol", Name: "a"}, nil
		}
		return nbdclient.Target{}, errors.New("no primary now")
	}
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{IOTimeout: 500 * time.Millisecond, Retry: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	hold.Store(true)
	done := make(chan error, 1)
	go func() { _, err := f.WriteAt([]byte("lost"), 0); done <- err }()
	<-entered
	p.cut()
	if err := <-done; !errors.Is(err, nbdclient.ErrNoServer) {
		t.Fatalf("a write with no server for IOTimeout: %v, want ErrNoServer", err)
	}
	if calls.Load() < 2 {
		t.Errorf("the Locator was asked %d times, want again after the break", calls.Load())
	}
	if _, err := f.ReadAt(make([]byte, 512), 0); !errors.Is(err, nbdclient.ErrNoServer) {
		t.Fatalf("a read after giving up: %v, want ErrNoServer", err)
	}
}

// TestAFollowerStopsWhenTheLocatorSaysSo: a Locator's ErrStopFollowing (another mount took
// the volume) fails the requests held at once, without waiting for IOTimeout.
func TestAFollowerStopsWhenTheLocatorSaysSo(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	addr, _ := serve(t, resolver{"vol": mem})
	p := newProxy(t, addr)
	var calls atomic.Int32
	locate := func(context.Context) (nbdclient.Target, error) {
		if calls.Add(1) == 1 {
			return nbdclient.Target{Addr: p.addr(), Export: "vol", Name: "a"}, nil
		}
		return nbdclient.Target{}, errors.Join(nbdclient.ErrStopFollowing, errors.New("mounted elsewhere"))
	}
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	p.cut()
	if _, err := f.ReadAt(make([]byte, 512), 0); !errors.Is(err, nbdclient.ErrStopFollowing) {
		t.Fatalf("a read once the Locator says stop: %v, want ErrStopFollowing", err)
	}
}

// TestAFollowerMovesOnWhenTheServerDrains: a server that shuts down (a primary handing over)
// answers the request it was carrying out, and a request that comes during its drain with
// NBD_ESHUTDOWN: that one is not lost but sent to the next server, once the first answered
// everything it took; the caller sees no error.
func TestAFollowerMovesOnWhenTheServerDrains(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	addrA, srvA := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	addrB, _ := serve(t, resolver{"vol": mem})
	t.Cleanup(gate.Open)
	second := newProxy(t, addrB)
	var calls atomic.Int32
	locate := func(context.Context) (nbdclient.Target, error) {
		if calls.Add(1) == 1 {
			return nbdclient.Target{Addr: addrA, Export: "vol", Name: "a"}, nil
		}
		return nbdclient.Target{Addr: second.addr(), Export: "vol", Name: "b"}, nil
	}
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{IOTimeout: time.Minute, Retry: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	held := make(chan error, 1)
	go func() { _, err := f.WriteAt([]byte("held"), 0); held <- err }()
	<-gate.Entered
	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shutdown <- srvA.Shutdown(ctx)
	}()
	if !poll.Within(20*time.Second, time.Millisecond, func() bool { return srvA.Stats().DrainingConnections == 1 }) {
		t.Fatal("the connection does not drain")
	}
	late := make(chan error, 1)
	go func() { _, err := f.WriteAt([]byte("late"), 4096); late <- err }()
	if !poll.Within(20*time.Second, time.Millisecond, func() bool { return srvA.Stats().Requests.Write == 2 }) {
		t.Fatal("the write during the drain did not reach the draining server")
	}
	gate.Open()
	for name, ch := range map[string]chan error{"the write in flight as the drain began": held, "the write during the drain": late} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no answer", name)
		}
	}
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := srvA.Stats().Requests.Disconnect; got != 1 {
		t.Errorf("%d NBD_CMD_DISC read by the draining server, want 1", got)
	}
	if got, want := second.requests(), []wireRequest{{1, 4096, 4}}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("the next server got %v, want just the write the draining one refused, %v", got, want)
	}
	if string(mem.Bytes(0, 4)) != "held" || string(mem.Bytes(4096, 4)) != "late" {
		t.Error("the export does not hold both writes")
	}
}

// TestAFollowerLeavesAServerThatAnswersNothingOnceTheExportMoved: a server whose host is cut
// off keeps its connection open and answers nothing. A request that waits ProbeAfter makes the
// Follower ask the Locator; when it names another server, the request goes there, long before
// IOTimeout. While the Locator names the same server, a slow answer is waited for.
func TestAFollowerLeavesAServerThatAnswersNothingOnceTheExportMoved(t *testing.T) {
	mem := nbdtest.NewMemExport(exportSize)
	var hold atomic.Bool
	release := make(chan struct{})
	slow := nbdtest.InjectorFunc(func(ctx context.Context, _ nbdtest.Op, _, _ int64) error {
		if !hold.Load() {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-release:
		}
		return syscall.EIO
	})
	addrA, _ := serve(t, resolver{"vol": &nbdtest.FaultyExport{Device: mem, Injector: slow}})
	addrB, _ := serve(t, resolver{"vol": mem})
	t.Cleanup(func() { close(release) })
	var moved atomic.Bool
	var probes atomic.Int32
	locate := func(context.Context) (nbdclient.Target, error) {
		probes.Add(1)
		if moved.Load() {
			return nbdclient.Target{Addr: addrB, Export: "vol", Name: "b"}, nil
		}
		return nbdclient.Target{Addr: addrA, Export: "vol", Name: "a"}, nil
	}
	var connections atomic.Int32
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{IOTimeout: 10 * time.Minute, ProbeAfter: 20 * time.Millisecond,
		Connected: func(nbdclient.Target) { connections.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	hold.Store(true)
	done := make(chan error, 1)
	go func() { _, err := f.WriteAt([]byte("moved"), 0); done <- err }()
	// The export has not moved: the Follower asks, and stays.
	if !poll.Within(20*time.Second, time.Millisecond, func() bool { return probes.Load() >= 4 }) {
		t.Fatalf("the Locator was asked %d times while a request waited, want it asked again", probes.Load())
	}
	if n := connections.Load(); n != 1 {
		t.Fatalf("%d connections made while the export stayed, want 1", n)
	}
	moved.Store(true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the write, once the export moved: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write waits on the server that answers nothing")
	}
	if got := string(mem.Bytes(0, 5)); got != "moved" || f.Current().Name != "b" {
		t.Errorf("the export holds %q and the Follower is on %q, want the write through b", got, f.Current().Name)
	}
}

// growingExport is an export whose size grows, as a volume's does in an online resize; its
// bytes are those of a MemExport of the largest size.
type growingExport struct {
	*nbdtest.MemExport
	size atomic.Int64
}

func (g *growingExport) Size() int64 { return g.size.Load() }

// TestAFollowerSeesTheExportGrowOnRefresh: NBD tells no client that an export grew, and a
// connection keeps the size of its handshake. Refresh asks the server (NBD_OPT_INFO), and when
// the export grew it connects again: Size is then the new size and the new range is written
// and read, while a request sent before the refresh is answered (none lost). A Refresh that
// finds the same size does not reconnect; one that finds a smaller export is ErrShrunk and the
// size stays.
func TestAFollowerSeesTheExportGrowOnRefresh(t *testing.T) {
	const small, big = 1 << 20, 4 << 20
	g := &growingExport{MemExport: nbdtest.NewMemExport(big)}
	g.size.Store(small)
	addr, _ := serve(t, resolver{"vol": g})
	var located atomic.Int32
	locate := func(context.Context) (nbdclient.Target, error) {
		located.Add(1)
		return nbdclient.Target{Addr: addr, Export: "vol", Name: "a"}, nil
	}
	f, err := nbdclient.Follow(ctx(t), locate, nbdclient.FollowOptions{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if size, err := f.Refresh(ctx(t)); err != nil || size != small || located.Load() != 1 {
		t.Fatalf("Refresh before the growth: %d, %v, %d locates; want %d, nil, 1 (no new connection)", size, err, located.Load(), small)
	}
	if _, err := f.WriteAt(make([]byte, 4096), small); err == nil {
		t.Fatal("a write past the export's end was taken")
	}

	g.size.Store(big)
	if f.Size() != small {
		t.Fatalf("Size before Refresh: %d, want %d", f.Size(), small)
	}
	// Requests go on while the refresh drains the connection.
	stop := make(chan struct{})
	writes := make(chan error, 1)
	go func() {
		buf := bytes.Repeat([]byte{7}, 4096)
		for i := 0; ; i++ {
			select {
			case <-stop:
				writes <- nil
				return
			default:
			}
			if _, err := f.WriteAt(buf, int64(i%16)*4096); err != nil {
				writes <- err
				return
			}
		}
	}()
	size, err := f.Refresh(ctx(t))
	close(stop)
	if err != nil || size != big || f.Size() != big || f.Export().Size != big {
		t.Fatalf("Refresh after the growth: %d, %v (Size %d, Export().Size %d); want %d", size, err, f.Size(), f.Export().Size, big)
	}
	if err := <-writes; err != nil {
		t.Fatalf("a write during the refresh: %v", err)
	}
	want := bytes.Repeat([]byte{9}, 4096)
	if _, err := f.WriteAt(want, big-4096); err != nil {
		t.Fatalf("a write in the new range: %v", err)
	}
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, big-4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read in the new range: %v, equal %v", err, bytes.Equal(got, want))
	}

	g.size.Store(small)
	if size, err := f.Refresh(ctx(t)); !errors.Is(err, nbdclient.ErrShrunk) || size != big || f.Size() != big {
		t.Fatalf("Refresh of a smaller export: %d, %v (Size %d); want %d, ErrShrunk", size, err, f.Size(), big)
	}
}
