package main

// NBD clients that follow the primary across failovers, built on the raw
// client of testenv_test.go: failoverNBD connects to whichever node serves
// the export (a node that is not primary refuses it in the handshake);
// runRegisterClients drives the linearizability workload; ackWriter and
// verifyAcked find lost acknowledged writes.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// nbdTargets says where vol0's export may be served and how to reach it.
type nbdTargets struct {
	nodes []string          // tried in this order
	uris  map[string]string // each node's NBD URI
	dial  dialFunc          // nil: the host's network
}

// targets is every data node's export, reached from the host.
func (c *procCluster) targets() nbdTargets {
	tg := nbdTargets{uris: map[string]string{}}
	for _, n := range c.dataNodes() {
		tg.nodes = append(tg.nodes, n)
		tg.uris[n] = c.uri(n)
	}
	return tg
}

// targetsFrom is targets reached from inside node from's namespace (a
// client next to that node: partitioned with it).
func (c *procCluster) targetsFrom(from string) nbdTargets {
	c.t.Helper()
	c.needLab("targetsFrom")
	tg := c.targets()
	tg.dial = c.lab.dialer(from)
	return tg
}

// dialRawNBDVia connects through dial (nil: the host's network) and
// negotiates export uri within timeout, which then bounds each request.
func dialRawNBDVia(ctx context.Context, dial dialFunc, uri string, dialTimeout, timeout time.Duration) (*rawNBD, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, err
	}
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, err := dial(dctx, "tcp", u.Host)
	cancel()
	if err != nil {
		return nil, err
	}
	c := &rawNBD{conn: conn, timeout: timeout}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	err = c.handshake(strings.TrimPrefix(u.Path, "/"))
	stop()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake with %s: %w", uri, err)
	}
	return c, nil
}

// failoverNBD is one NBD connection to whichever node serves the export.
// After a failed request it drops the connection; connect finds the
// export again. One goroutine uses it.
type failoverNBD struct {
	tg nbdTargets
	// opTimeout bounds each request; dialTimeout each TCP connect and
	// handshakeTimeout each negotiation.
	opTimeout, dialTimeout, handshakeTimeout time.Duration

	conn *rawNBD
	node string // the node conn is on
	next int    // index in tg.nodes where connect starts
}

func newFailoverNBD(tg nbdTargets, opTimeout time.Duration) *failoverNBD {
	return &failoverNBD{tg: tg, opTimeout: opTimeout, dialTimeout: time.Second, handshakeTimeout: 2 * time.Second}
}

// connect returns at once when connected; else it tries each node in
// turn, starting with the last one that served, until one accepts the
// export or ctx ends.
func (f *failoverNBD) connect(ctx context.Context) error {
	if f.conn != nil {
		return nil
	}
	errs := map[string]string{}
	for {
		for i := range f.tg.nodes {
			k := (f.next + i) % len(f.tg.nodes)
			node := f.tg.nodes[k]
			c, err := dialRawNBDVia(ctx, f.tg.dial, f.tg.uris[node], f.dialTimeout, f.handshakeTimeout)
			if err == nil {
				c.timeout = f.opTimeout
				f.conn, f.node, f.next = c, node, k
				return nil
			}
			errs[node] = err.Error()
			if ctx.Err() != nil {
				return fmt.Errorf("no node serves %s (%v): %v", volName, ctx.Err(), errs)
			}
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("no node serves %s (%v): %v", volName, ctx.Err(), errs)
		case <-t.C:
		}
	}
}

// do runs one request on the current connection (connect first): ok, an
// error reply (opFailed) or no reply (opTimedOut). It drops the
// connection after anything but ok.
func (f *failoverNBD) do(ctx context.Context, req func(*rawNBD) (errno uint32, err error)) (node string, outcome opOutcome, err error) {
	if f.conn == nil {
		return "", opFailed, errors.New("not connected")
	}
	node = f.node
	conn := f.conn.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	errno, err := req(f.conn)
	stop()
	switch {
	case err != nil:
		outcome = opTimedOut
	case errno != 0:
		outcome, err = opFailed, fmt.Errorf("errno %d", errno)
	default:
		return node, opOK, nil
	}
	f.drop()
	return node, outcome, err
}

// write writes data at off through the current connection.
func (f *failoverNBD) write(ctx context.Context, off uint64, data []byte) (string, opOutcome, error) {
	return f.do(ctx, func(c *rawNBD) (uint32, error) { return c.write(off, data) })
}

// read reads n bytes at off through the current connection.
func (f *failoverNBD) read(ctx context.Context, off uint64, n int) ([]byte, string, opOutcome, error) {
	var data []byte
	node, outcome, err := f.do(ctx, func(c *rawNBD) (uint32, error) {
		errno, b, err := c.request(nbdCmdRead, 0, off, uint32(n), nil, n)
		data = b
		return errno, err
	})
	return data, node, outcome, err
}

func (f *failoverNBD) drop() {
	if f.conn != nil {
		f.conn.conn.Close()
		f.conn = nil
	}
}

// close ends the connection politely (NBD_CMD_DISC).
func (f *failoverNBD) close() {
	if f.conn != nil {
		f.conn.close()
		f.conn = nil
	}
}

// ---------------------------------------------------------------------------
// the linearizability workload

// registerStride separates the blocks of the register workload (block b
// is at Base + b × 1 MiB): the volume must hold Base + Blocks MiB.
const registerStride = 1 << 20

type registerOpts struct {
	Clients int // goroutines, one NBD connection each (default 3)
	Blocks  int // registers (default 4)
	// Base is the offset of block 0 (4 KiB aligned). Every block must
	// read as zeroes when the recorder starts (the model's first state):
	// a second workload on one volume needs blocks of its own.
	Base      uint64
	ReadPct   int           // share of reads in percent (default 50)
	OpTimeout time.Duration // per request (default 5 s)
	// Think is a client's pause between two operations (default none):
	// it bounds the history, and so the time of the check.
	Think time.Duration
	Seed  uint64
}

// startRegisterClients runs the clients until the returned stop is
// called; stop waits for them (each finishes or abandons its operation
// within OpTimeout) and is safe to call twice. The test's cleanup stops
// them too.
func startRegisterClients(t *testing.T, tg nbdTargets, rec *opRecorder, o registerOpts) (stop func()) {
	t.Helper()
	if o.Clients == 0 {
		o.Clients = 3
	}
	if o.Blocks == 0 {
		o.Blocks = 4
	}
	if o.ReadPct == 0 {
		o.ReadPct = 50
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runRegisterClient(ctx, tg, rec, o, mrand.New(mrand.NewPCG(o.Seed, uint64(i))))
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func runRegisterClient(ctx context.Context, tg nbdTargets, rec *opRecorder, o registerOpts, rng *mrand.Rand) {
	f := newFailoverNBD(tg, o.OpTimeout)
	defer f.close()
	client := rec.newClient()
	for ctx.Err() == nil {
		if err := f.connect(ctx); err != nil {
			return
		}
		b := rng.IntN(o.Blocks)
		off := o.Base + uint64(b)*registerStride
		if rng.IntN(100) < o.ReadPct {
			id := rec.begin(client, opRead, b, 0)
			data, node, outcome, err := f.read(ctx, off, blockSize)
			var v uint64
			if outcome == opOK {
				v = decodeBlock(b, data)
			}
			rec.finish(id, outcome, v, node, err)
		} else {
			v := rec.nextValue(b)
			id := rec.begin(client, opWrite, b, v)
			node, outcome, err := f.write(ctx, off, encodeBlock(v))
			rec.finish(id, outcome, 0, node, err)
			if outcome != opOK {
				client = rec.newClient() // its write is open until the end
			}
		}
		if o.Think > 0 {
			sleepCtx(ctx, o.Think)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ---------------------------------------------------------------------------
// acknowledged writes

// ackedWrite is one write of the ackWriter: 4 KiB at Off, unique to Seq.
type ackedWrite struct {
	Seq  uint64
	Off  uint64
	Node string    // the node whose export took it
	At   time.Time // when its reply (or failure) arrived
	Err  string    // why it was not acknowledged
}

type ackWriterOpts struct {
	Writers   int           // goroutines, one NBD connection each (default 2)
	Base      uint64        // first offset (4 KiB aligned)
	Limit     uint64        // end of the area written (required): writes stop when it is full
	OpTimeout time.Duration // per request (default 5 s)
	Think     time.Duration // pause between a writer's writes (default none)
}

// ackWriter writes a unique pattern to a fresh 4 KiB block per write
// (offsets Base, Base+4K, ... in sequence order) and remembers which
// writes were acknowledged.
type ackWriter struct {
	tg     nbdTargets
	o      ackWriterOpts
	next   atomic.Uint64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu      sync.Mutex
	acked   []ackedWrite
	unacked []ackedWrite // failed or timed out: may be on disk or not
	full    bool
}

// startAckWriter starts the writers; stop (also run by the test's
// cleanup) ends them.
func startAckWriter(t *testing.T, tg nbdTargets, o ackWriterOpts) *ackWriter {
	t.Helper()
	if o.Writers == 0 {
		o.Writers = 2
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 5 * time.Second
	}
	if o.Base%blockSize != 0 || o.Limit < o.Base+blockSize {
		t.Fatalf("startAckWriter: base %d, limit %d: want a 4 KiB aligned base below limit", o.Base, o.Limit)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &ackWriter{tg: tg, o: o, cancel: cancel}
	for range o.Writers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.run(ctx)
		}()
	}
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *ackWriter) run(ctx context.Context) {
	f := newFailoverNBD(w.tg, w.o.OpTimeout)
	defer f.close()
	for ctx.Err() == nil {
		if err := f.connect(ctx); err != nil {
			return
		}
		seq := w.next.Add(1) - 1
		off := w.o.Base + seq*blockSize
		if off+blockSize > w.o.Limit {
			w.mu.Lock()
			w.full = true
			w.mu.Unlock()
			return
		}
		node, outcome, err := f.write(ctx, off, ackPattern(seq, off))
		aw := ackedWrite{Seq: seq, Off: off, Node: node, At: time.Now()}
		w.mu.Lock()
		if outcome == opOK {
			w.acked = append(w.acked, aw)
		} else {
			aw.Err = fmt.Sprintf("%s: %v", outcome, err)
			w.unacked = append(w.unacked, aw)
		}
		w.mu.Unlock()
		if w.o.Think > 0 {
			sleepCtx(ctx, w.o.Think)
		}
	}
}

// stop ends the writers and returns the acknowledged writes and those
// that were not, each in sequence order.
func (w *ackWriter) stop() (acked, unacked []ackedWrite) {
	w.once.Do(func() { w.cancel(); w.wg.Wait() })
	acked, unacked, _ = w.snapshot()
	return acked, unacked
}

// snapshot returns copies of the writes so far, in sequence order, and
// whether the area is full (the writers stopped).
func (w *ackWriter) snapshot() (acked, unacked []ackedWrite, full bool) {
	w.mu.Lock()
	acked = append([]ackedWrite(nil), w.acked...)
	unacked = append([]ackedWrite(nil), w.unacked...)
	full = w.full
	w.mu.Unlock()
	bySeq := func(s []ackedWrite) {
		sort.Slice(s, func(i, j int) bool { return s[i].Seq < s[j].Seq })
	}
	bySeq(acked)
	bySeq(unacked)
	return acked, unacked, full
}

// waitAck polls until a write acknowledged after since satisfies cond
// (nil: any), and returns the first such write (earliest acknowledgement).
func (w *ackWriter) waitAck(t *testing.T, since time.Time, timeout time.Duration, what string, cond func(ackedWrite) bool) ackedWrite {
	t.Helper()
	var found ackedWrite
	var acked, unacked []ackedWrite
	if !within(timeout, 20*time.Millisecond, func() bool {
		var full bool
		acked, unacked, full = w.snapshot()
		var first *ackedWrite
		for i := range acked {
			a := &acked[i]
			if a.At.After(since) && (cond == nil || cond(*a)) && (first == nil || a.At.Before(first.At)) {
				first = a
			}
		}
		if first != nil {
			found = *first
			return true
		}
		if full {
			t.Fatalf("%s: the ack writer filled its area [%d, %d) first", what, w.o.Base, w.o.Limit)
		}
		return false
	}) {
		last := "none"
		if len(unacked) > 0 {
			u := unacked[len(unacked)-1]
			last = fmt.Sprintf("#%d on %s: %s", u.Seq, u.Node, u.Err)
		}
		t.Fatalf("%s: no such acknowledged write after %s (%d acknowledged, %d not; last failure %s)",
			what, timeout, len(acked), len(unacked), last)
	}
	return found
}

// ackPattern is write seq's block: 128 records of (magic, seq, off, ^seq).
func ackPattern(seq, off uint64) []byte {
	b := make([]byte, blockSize)
	for i := 0; i < blockSize; i += 32 {
		copy(b[i:], "rvACKwr\x00")
		binary.LittleEndian.PutUint64(b[i+8:], seq)
		binary.LittleEndian.PutUint64(b[i+16:], off)
		binary.LittleEndian.PutUint64(b[i+24:], ^seq)
	}
	return b
}

// describeBlock says what a block holds instead of an expected pattern.
func describeBlock(b []byte) string {
	if len(b) == blockSize && bytes.Equal(b, make([]byte, blockSize)) {
		return "zeroes"
	}
	if len(b) >= 32 && string(b[:8]) == "rvACKwr\x00" {
		return fmt.Sprintf("the pattern of write #%d for offset %d", binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:]))
	}
	n := min(len(b), 16)
	return fmt.Sprintf("other data (%x...)", b[:n])
}

// lostWrite is an acknowledged write whose block does not read back.
type lostWrite struct {
	ackedWrite
	Found string
}

// verifyAcked reads every acknowledged write back through whichever node
// serves the export now and returns those whose block differs, failing
// the test with a list. It also logs how many unacknowledged writes
// landed (either is allowed). Reads retry across reconnects until timeout.
func verifyAcked(t testing.TB, tg nbdTargets, acked, unacked []ackedWrite, timeout time.Duration) []lostWrite {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	f := newFailoverNBD(tg, 10*time.Second)
	defer f.close()
	servedBy := map[string]int{}
	read := func(off uint64, n int) []byte {
		for {
			if err := f.connect(ctx); err != nil {
				t.Fatalf("verifyAcked: %v", err)
			}
			data, node, outcome, err := f.read(ctx, off, n)
			if outcome == opOK {
				servedBy[node]++
				return data
			}
			if ctx.Err() != nil {
				t.Fatalf("verifyAcked: read %d@%d on %s: %v (%v)", n, off, node, err, ctx.Err())
			}
		}
	}
	check := func(writes []ackedWrite) (differ []lostWrite) {
		const maxRun = 64 // blocks per read
		for i := 0; i < len(writes); {
			// A run of consecutive offsets, read at once.
			j := i + 1
			for j < len(writes) && j-i < maxRun && writes[j].Off == writes[j-1].Off+blockSize {
				j++
			}
			data := read(writes[i].Off, (j-i)*blockSize)
			for k := i; k < j; k++ {
				got := data[(k-i)*blockSize : (k-i+1)*blockSize]
				if !bytes.Equal(got, ackPattern(writes[k].Seq, writes[k].Off)) {
					differ = append(differ, lostWrite{ackedWrite: writes[k], Found: describeBlock(got)})
				}
			}
			i = j
		}
		return differ
	}
	byOff := func(s []ackedWrite) []ackedWrite {
		s = append([]ackedWrite(nil), s...)
		sort.Slice(s, func(i, j int) bool { return s[i].Off < s[j].Off })
		return s
	}
	lost := check(byOff(acked))
	absent := check(byOff(unacked))
	t.Logf("verifyAcked: %d acknowledged writes, %d lost; %d unacknowledged, %d of them landed; read through %v",
		len(acked), len(lost), len(unacked), len(unacked)-len(absent), servedBy)
	if len(lost) > 0 {
		var b strings.Builder
		for i, l := range lost {
			if i == 20 {
				fmt.Fprintf(&b, "\n  ... and %d more", len(lost)-20)
				break
			}
			fmt.Fprintf(&b, "\n  write #%d at offset %d, acknowledged by %s at %s: reads back %s",
				l.Seq, l.Off, l.Node, l.At.Format("15:04:05.000"), l.Found)
		}
		t.Errorf("%d of %d acknowledged writes are lost:%s", len(lost), len(acked), b.String())
	}
	return lost
}
