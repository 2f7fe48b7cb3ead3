package nbd_test

// These tests pin what a client that sends requests and never reads the replies can cost a
// Server. Its requests hold at most its connection budget; all connections' requests hold at
// most the node budget plus a reserve each, and the Server stops reading their requests while
// that is used. Meanwhile a client with small requests is served from its reserve. A client that
// takes no byte of its replies (or of its WRITE payload) for StallTimeout is closed, a slow one
// that keeps reading is not. Once the flood ends every byte of budget comes back, and the pool
// keeps at most MaxPooledBytes.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

const (
	floodExportSize = 64 << 20
	floodReadLength = 8 << 20
)

// floodClient is a connection that pipelines READs and never reads a reply. Its sends run in a
// goroutine, since the server stops reading once the budget is used; close ends them.
type floodClient struct {
	*nbdtest.Client
	sent      chan error
	closeOnce sync.Once
}

func startFlood(t *testing.T, s *testServer, export string, reads int, length uint32) *floodClient {
	t.Helper()
	f := &floodClient{Client: s.dial(t, export), sent: make(chan error, 1)}
	go func() {
		for i := range reads {
			off := uint64(i) * uint64(length) % (floodExportSize - uint64(length) + 1)
			if _, err := f.Send(nbdtest.Request{Type: nbdtest.CmdRead, Offset: off, Length: length}); err != nil {
				f.sent <- err
				return
			}
		}
		f.sent <- nil
	}()
	t.Cleanup(f.close)
	return f
}

// close closes the connection without reading anything and waits for the sends to end.
func (f *floodClient) close() {
	f.closeOnce.Do(func() {
		f.Close()
		<-f.sent
	})
}

// waitUntil polls cond until it reports true; after 20 s the test fails with cond's last
// description of what it saw.
func waitUntil(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached after 20s; last saw %s", what, saw)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDrained waits until no request holds any budget and no connection is open but the n
// expected, then checks the pool against its cap.
func waitDrained(t *testing.T, s *testServer, openConnections int64) {
	t.Helper()
	waitUntil(t, "every byte of budget back", func() (bool, string) {
		st := s.Stats()
		return st.InFlightBytes == 0 && st.NodeBudgetHeld == 0 && st.OpenConnections == openConnections,
			fmt.Sprintf("in flight %d, node budget held %d, open connections %d", st.InFlightBytes, st.NodeBudgetHeld, st.OpenConnections)
	})
	if st := s.Stats(); st.PooledBytes > st.MaxPooledBytes {
		t.Fatalf("pool keeps %d bytes, over its cap of %d", st.PooledBytes, st.MaxPooledBytes)
	}
}

func TestReadFloodHoldsAtMostTheConnectionBudget(t *testing.T) {
	const budget = 32 << 20
	s := startServer(t, map[string]nbd.Export{"vol": nbdtest.NewMemExport(floodExportSize)},
		func(c *nbd.Config) { c.ConnectionBudget = budget })
	f := startFlood(t, s, "vol", 64, floodReadLength) // 512 MiB of replies asked for

	waitUntil(t, "the connection holding its whole budget", func() (bool, string) {
		st := s.Stats()
		return st.InFlightBytes == budget, fmt.Sprintf("in flight %d", st.InFlightBytes)
	})
	clients := s.Clients("vol")
	if len(clients) != 1 || clients[0].InFlightBytes != budget || clients[0].RemoteAddr != f.Conn.LocalAddr().String() {
		t.Fatalf("Clients: %+v, want the flood connection holding %d bytes", clients, budget)
	}
	waitUntil(t, "the reader waiting for budget", func() (bool, string) {
		n := s.Stats().WaitingRequests
		return n == 1, fmt.Sprint(n, " waiting")
	})
	st := s.Stats()
	if st.PeakInFlightBytes != budget {
		t.Fatalf("peak in flight %d, want the connection budget %d", st.PeakInFlightBytes, budget)
	}
	// The reader stopped: the kernel's socket buffers take a reply or two, not 60 of them.
	if st.Requests.Read > budget/floodReadLength+4 {
		t.Fatalf("the server read %d requests with %d bytes of budget for 8 MiB each", st.Requests.Read, budget)
	}
	f.close()
	waitDrained(t, s, 0)
}

func TestReadFloodLeavesSmallClientsServed(t *testing.T) {
	const (
		nodeBudget   = 64 << 20
		connBudget   = 32 << 20
		reserve      = 1 << 20
		maxPooled    = 16 << 20
		floodClients = 4
	)
	mem := nbdtest.NewMemExport(floodExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem}, func(c *nbd.Config) {
		c.NodeBudget, c.ConnectionBudget, c.ConnectionReserve, c.MaxPooledBytes = nodeBudget, connBudget, reserve, maxPooled
	})
	var floods []*floodClient
	for range floodClients {
		floods = append(floods, startFlood(t, s, "vol", 32, floodReadLength))
	}
	waitUntil(t, "the flood holding the whole node budget", func() (bool, string) {
		st := s.Stats()
		return st.NodeBudgetHeld == nodeBudget, fmt.Sprintf("node budget held %d of %d", st.NodeBudgetHeld, st.NodeBudgetBytes)
	})
	for _, c := range s.Clients("vol") {
		if c.InFlightBytes > connBudget {
			t.Fatalf("client %s holds %d bytes, over the connection budget %d", c.RemoteAddr, c.InFlightBytes, connBudget)
		}
	}

	// A well-behaved client, one request at a time, 4 KiB to 1 MiB: served from its reserve.
	good := s.dial(t, "vol")
	sizes := []int{4 << 10, 64 << 10, 512 << 10, 1 << 20}
	var slowest time.Duration
	for i := range 40 {
		size := sizes[i%len(sizes)]
		off := uint64(floodExportSize - 2<<20 - i*4096)
		data := pattern(size, byte(i))
		start := time.Now()
		if err := good.Conn.SetDeadline(start.Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := good.Write(off, data, 0); err != nil {
			t.Fatalf("write %d of %d bytes while the flood holds the node budget: %v", i, size, err)
		}
		got, err := good.Read(off, uint32(size))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d of %d bytes while the flood holds the node budget: %v", i, size, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("well-behaved client: slowest write+read %v", slowest)
	st := s.Stats()
	if st.NodeBudgetHeld != nodeBudget {
		t.Fatalf("node budget held %d during the small client's requests, want all %d still held by the flood", st.NodeBudgetHeld, nodeBudget)
	}
	if limit := int64(nodeBudget + (floodClients+1)*reserve); st.PeakInFlightBytes > limit {
		t.Fatalf("peak in flight %d, over the node budget plus one reserve per connection (%d)", st.PeakInFlightBytes, limit)
	}

	for _, f := range floods {
		f.close()
	}
	waitDrained(t, s, 1)
	if err := good.Write(0, []byte("after"), 0); err != nil {
		t.Fatal(err)
	}
}

func TestStalledClientsAreClosed(t *testing.T) {
	const stall = 300 * time.Millisecond
	logs := &logStore{}
	s := startServer(t, map[string]nbd.Export{"vol": nbdtest.NewMemExport(floodExportSize)}, func(c *nbd.Config) {
		c.StallTimeout = stall
		c.Logger = slog.New(recordingHandler{store: logs})
	})
	// A client that reads nothing of its replies,
	reader := startFlood(t, s, "vol", 16, floodReadLength)
	// one that sends part of a WRITE payload and stops,
	writer := s.dial(t, "vol")
	if _, err := writer.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Length: 1 << 20, Payload: pattern(100<<10, 1)}); err != nil {
		t.Fatal(err)
	}
	// and a slow one that takes a 32 MiB reply 1 MiB every 50 ms, far longer than StallTimeout.
	slow := s.dial(t, "vol")
	handle, err := slow.Send(nbdtest.Request{Type: nbdtest.CmdRead, Length: nbd.MaxRequestLength})
	if err != nil {
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
			t.Fatalf("slow reader cut off after %v: %v", time.Since(start), err)
		}
	}
	t.Logf("slow reader took its reply in %v with StallTimeout %v (handle %d)", time.Since(start), stall, handle)

	waitUntil(t, "both stalled clients closed", func() (bool, string) {
		st := s.Stats()
		return st.StalledConnections == 2 && st.OpenConnections == 1,
			fmt.Sprintf("%d stalled, %d open", st.StalledConnections, st.OpenConnections)
	})
	if clients := s.Clients(""); len(clients) != 1 || clients[0].RemoteAddr != slow.Conn.LocalAddr().String() {
		t.Fatalf("Clients after the stalls: %+v, want only the slow reader", clients)
	}
	for _, c := range []*nbdtest.Client{reader.Client, writer} {
		remote := c.Conn.LocalAddr().String()
		if !logs.has(slog.LevelWarn, "remote", remote) {
			t.Errorf("no Warn logged naming stalled client %s; got:\n%s", remote, logs)
		}
	}
	if _, err := slow.Read(0, 4096); err != nil {
		t.Fatalf("the slow reader's connection after the stalls: %v", err)
	}
	waitDrained(t, s, 1)
}

func TestCloseExportDoesNotWaitForBudgetOthersHold(t *testing.T) {
	s := startServer(t, map[string]nbd.Export{"a": nbdtest.NewMemExport(floodExportSize), "vol": nbdtest.NewMemExport(floodExportSize)},
		func(c *nbd.Config) { c.NodeBudget = nbd.MaxRequestLength })
	startFlood(t, s, "vol", 8, nbd.MaxRequestLength)
	waitUntil(t, "the flood holding the node budget", func() (bool, string) {
		st := s.Stats()
		return st.NodeBudgetHeld == nbd.MaxRequestLength, fmt.Sprint(st.NodeBudgetHeld, " held")
	})
	a := s.dial(t, "a")
	if _, err := a.Send(nbdtest.Request{Type: nbdtest.CmdRead, Length: nbd.MaxRequestLength}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the READ on a waiting for the node budget", func() (bool, string) {
		n := s.Stats().WaitingRequests
		return n == 2, fmt.Sprint(n, " waiting") // the flood's next request, and a's
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- s.CloseExportContext(ctx, "a") }()
	// The READ never reached the Export, but the server read it: it is answered
	// NBD_ESHUTDOWN, and the connection then ends in order.
	if rep, err := a.Receive(); err != nil || rep.Errno != 108 {
		t.Fatalf("the READ waiting for the node budget as its export closed: %+v, %v; want NBD_ESHUTDOWN", rep, err)
	}
	if err := a.WaitClosed(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := <-closed; err != nil {
		t.Fatalf("CloseExport(a) waited for budget the flood on another export holds: %v", err)
	}
	if st := s.Stats(); st.WaitingRequests != 1 || st.NodeBudgetHeld != nbd.MaxRequestLength {
		t.Fatalf("after CloseExport(a): %d waiting, %d of the node budget held; want the flood's 1 and all of it", st.WaitingRequests, st.NodeBudgetHeld)
	}
}

// lateWriter is an Export whose ReadAt, once its context is cancelled, returns at once but
// leaves a goroutine behind that writes into p later: the contract breach of a read forwarded to
// a peer whose answer arrives after the caller gave up.
type lateWriter struct {
	*nbdtest.MemExport
	entered chan struct{}
	write   chan struct{} // closed to let the late write happen
	written chan struct{} // closed after it
}

func (e *lateWriter) ReadAt(ctx context.Context, p []byte, off int64) error {
	close(e.entered)
	<-ctx.Done()
	go func() {
		<-e.write
		for i := range p {
			p[i] = 0xee
		}
		close(e.written)
	}()
	return ctx.Err()
}

func TestAnExportWritingAfterItsContextEndsCannotCrashTheServer(t *testing.T) {
	e := &lateWriter{MemExport: nbdtest.NewMemExport(4 << 20), entered: make(chan struct{}), write: make(chan struct{}), written: make(chan struct{})}
	s := startServer(t, map[string]nbd.Export{"vol": e}, func(c *nbd.Config) { c.MaxPooledBytes = 1 }) // the pool keeps nothing
	c := s.dial(t, "vol")
	if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdRead, Length: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	<-e.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with an expired context: %v", err)
	}
	waitUntil(t, "the READ's buffer released", func() (bool, string) {
		st := s.Stats()
		return st.InFlightBytes == 0 && st.OpenConnections == 0, fmt.Sprintf("%d bytes in flight, %d open", st.InFlightBytes, st.OpenConnections)
	})
	close(e.write) // into a buffer the server gave back: its memory went, its mapping stayed
	<-e.written
}

func TestClientsListsConnectionsInTransmission(t *testing.T) {
	s := startServer(t, map[string]nbd.Export{"a": nbdtest.NewMemExport(1 << 20), "b": nbdtest.NewMemExport(1 << 20)})
	before := time.Now()
	a1 := s.dial(t, "a")
	a2 := s.dial(t, "a")
	b := s.dial(t, "b")
	after := time.Now()
	s.greet(t, nbdtest.ClientFixedNewstyle) // still negotiating: not a client of any export

	addr := func(c *nbdtest.Client) string { return c.Conn.LocalAddr().String() }
	addrs := func(clients []nbd.ClientInfo) []string {
		var list []string
		for _, c := range clients {
			list = append(list, c.RemoteAddr)
		}
		return list
	}
	got := s.Clients("a")
	if want := []string{addr(a1), addr(a2)}; !slices.Equal(addrs(got), want) {
		t.Fatalf("Clients(a) = %v, want %v, oldest first", addrs(got), want)
	}
	for _, c := range got {
		if c.Export != "a" || c.Since.Before(before) || c.Since.After(after) || c.InFlightBytes != 0 {
			t.Errorf("client %+v: want export a, Since within [%v, %v], nothing in flight", c, before, after)
		}
	}
	if got := addrs(s.Clients("")); !slices.Equal(got, []string{addr(a1), addr(a2), addr(b)}) {
		t.Fatalf("Clients(\"\") = %v", got)
	}
	if got := s.Clients("c"); len(got) != 0 {
		t.Fatalf("Clients(c) = %+v, want none", got)
	}
	if _, err := a1.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the disconnected client gone from the list", func() (bool, string) {
		got := addrs(s.Clients("a"))
		return slices.Equal(got, []string{addr(a2)}), strings.Join(got, ",")
	})
}

func TestMaxConnectionsRefusesTheHandshake(t *testing.T) {
	s := startServer(t, nil, func(c *nbd.Config) { c.MaxConnections = 2 })
	first := s.dial(t, "vol")
	s.dial(t, "vol")
	var oe *nbdtest.OptionError
	_, _, err := s.greet(t, nbdtest.ClientFixedNewstyle).Go("vol")
	if !errors.As(err, &oe) || oe.Type != nbdtest.RepErrPolicy || !strings.Contains(oe.Message, "at most 2 connections") {
		t.Fatalf("third GO: %v, want NBD_REP_ERR_POLICY saying at most 2 connections", err)
	}
	exportName := s.greet(t, nbdtest.ClientFixedNewstyle)
	if _, _, err := exportName.ExportName("vol"); err == nil {
		t.Fatal("third NBD_OPT_EXPORT_NAME entered transmission")
	}
	if st := s.Stats(); st.RefusedConnections != 2 || st.TransmittingConnections != 2 {
		t.Fatalf("stats %+v, want 2 refused and 2 in transmission", st)
	}
	if _, err := first.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a slot free", func() (bool, string) {
		n := s.Stats().TransmittingConnections
		return n == 1, fmt.Sprint(n, " in transmission")
	})
	if _, err := s.dial(t, "vol").Read(0, 512); err != nil {
		t.Fatal(err)
	}
}

// logStore keeps log records, with the attributes their logger was given, for tests to search.
type logStore struct {
	mu      sync.Mutex
	records []slog.Record
}

func (s *logStore) has(level slog.Level, key, value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		found := false
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == key && a.Value.String() == value
			return !found
		})
		if found && r.Level == level {
			return true
		}
	}
	return false
}

func (s *logStore) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, r := range s.records {
		fmt.Fprintf(&b, "%v %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s", a)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

type recordingHandler struct {
	store *logStore
	attrs []slog.Attr
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	h.store.records = append(h.store.records, r)
	return nil
}

func (h recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return recordingHandler{store: h.store, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h recordingHandler) WithGroup(string) slog.Handler { return h }
