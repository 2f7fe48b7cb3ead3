package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// slowLink is a replication stream whose sends go no faster than rate
// bytes per second (of a frame's whole length, what it carries by
// reference too) while slow is set: a congested link.
type slowLink struct {
	r    *transport.ReplStream
	slow *atomic.Bool
	rate float64
}

func (l slowLink) SendMsg(m any) error {
	f := m.(*transport.Frame)
	if l.slow.Load() {
		time.Sleep(time.Duration(float64(f.Len()) / l.rate * float64(time.Second)))
	}
	return l.r.Send(f)
}

func (l slowLink) RecvMsg(m any) error      { return l.r.Recv(m.(*transport.Frame)) }
func (l slowLink) Context() context.Context { return l.r.Context() }

// TestPullAheadGoesOnAtLocalSpeedAndCatchesUp: protocol A with
// pull-ahead over a congested link. Once the send buffer has stayed full
// for the sustain the primary goes Ahead (beta Behind): writes complete without waiting for
// the link, their blocks are marked and the lag shows them. When the link
// is free again the marked blocks are resynced, beta is UpToDate, the lag
// is zero and the replicas are identical.
func TestPullAheadGoesOnAtLocalSpeedAndCatchesUp(t *testing.T) {
	const size = 64 << 20
	c := newTestCluster(t, size)
	vc := &c.cfg.Volumes[0]
	vc.Protocol, vc.OnCongestion, vc.SendBuffer = "A", "pull-ahead", 1<<20
	slow := &atomic.Bool{}
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(slowLink{r: s, slow: slow, rate: 1 << 20}, s.Close)
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	slow.Store(true)
	sawAhead, maxLag := false, int64(0)
	ctx := context.Background()
	for i := range 256 { // 16 MiB: 16 s on the slow link
		if err := a.WriteAt(ctx, pattern(byte(i), 64<<10), int64(i)*64<<10, false); err != nil {
			t.Fatal(err)
		}
		ps := a.peers.byName["beta"].status()
		if ps.Replication == string(replication.Ahead) && !sawAhead {
			// Ahead lasts the dwell at least: beta shows it meanwhile.
			sawAhead = true
			if st := replica(c.status(), "beta"); st.Replication != string(replication.Behind) || st.LagBytes == 0 {
				t.Fatalf("beta while the primary is Ahead: %s, lag %d bytes; want Behind with a lag", st.Replication, st.LagBytes)
			}
		}
		maxLag = max(maxLag, ps.LagBytes)
	}
	if !sawAhead {
		t.Fatal("the primary never went Ahead of the congested peer")
	}
	t.Logf("lag at most %d bytes while Ahead", maxLag)
	slow.Store(false)
	c.waitInSync()
	if lag := a.peers.byName["beta"].status().LagBytes; lag != 0 {
		t.Fatalf("caught up, but the lag shows %d bytes", lag)
	}
	c.requireIdentical()
}

// pausedLink is a replication stream whose sends wait while gate is shut:
// a link that stops for a moment (the peer's disk, or a busy machine,
// pausing the stream) and then carries everything at once.
type pausedLink struct {
	r    *transport.ReplStream
	gate *fault.Gate
}

func (l pausedLink) SendMsg(m any) error {
	if err := l.gate.Wait(l.r.Context(), fault.Op{}, nil); err != nil {
		return err
	}
	return l.r.Send(m.(*transport.Frame))
}

func (l pausedLink) RecvMsg(m any) error      { return l.r.Recv(m.(*transport.Frame)) }
func (l pausedLink) Context() context.Context { return l.r.Context() }

// TestABurstThePeerKeepsUpWithLeavesItConnected: protocol A with
// pull-ahead, and a link that stops while the primary writes four send
// buffers' worth, then carries everything. The fill crosses high water
// for the length of the burst only: the link can carry the rate, so the
// peer stays Connected (the writes wait for room once the buffer is
// full), nothing is marked, and the replicas end identical. It went
// Ahead, and marked, the moment the fill crossed high water.
func TestABurstThePeerKeepsUpWithLeavesItConnected(t *testing.T) {
	const size = 64 << 20
	const sendBuffer = 4 << 20
	c := newTestCluster(t, size)
	vc := &c.cfg.Volumes[0]
	vc.Protocol, vc.OnCongestion, vc.SendBuffer = "A", "pull-ahead", sendBuffer
	gate := fault.NewGate()
	gate.Open()
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(pausedLink{r: s, gate: gate}, s.Close)
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	// A burst is one that ends before the fill has been high for the
	// sustain: make that certain on a busy machine.
	set := *a.settings()
	set.congestion.Sustain = 10 * time.Minute
	a.set.Store(&set)

	var left atomic.Bool // the peer left Connected, or blocks were marked
	var seen atomic.Value
	watch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			ps := a.peers.byName["beta"].status()
			if (ps.Replication != string(replication.Connected) || ps.OutOfSyncBytes != 0) && left.CompareAndSwap(false, true) {
				seen.Store(fmt.Sprintf("%s with %d bytes marked", ps.Replication, ps.OutOfSyncBytes))
			}
			select {
			case <-watch:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	gate.Shut()
	// Writes of a sixteenth of the buffer: the fill reaches high water
	// before a write finds no room.
	const writeLength, writes = sendBuffer / 16, 4 * 16
	var wg sync.WaitGroup
	errs := make(chan error, writes)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < writes; i += 4 {
				errs <- a.WriteAt(context.Background(), pattern(byte(i), writeLength), int64(i)*writeLength, false)
			}
		})
	}
	if !within(30*time.Second, time.Millisecond, func() bool {
		s := a.peers.byName["beta"].session()
		return left.Load() || s != nil && s.Queued() >= sendBuffer*9/10
	}) {
		t.Fatal("the writes never filled the send buffer while the link stood still")
	}
	gate.Open()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c.waitInSync()
	close(watch)
	<-watched
	if left.Load() {
		t.Fatalf("a burst the link carries made the peer leave Connected: seen %v", seen.Load())
	}
	c.requireIdentical()
}

// TestALinkThatStopsGoesAheadAndReleasesTheWritesItHeld: protocol A with
// pull-ahead, and a link that stops altogether (no ack comes back, and the
// peer timeout is far off). The writes that found the buffer full wait for
// room while the congestion lasts less than the sustain; then the primary
// goes Ahead, and the writes it held are marked and complete, with no ack
// to wake them. When the link carries again, the peer catches up.
func TestALinkThatStopsGoesAheadAndReleasesTheWritesItHeld(t *testing.T) {
	beside(t)
	const size = 64 << 20
	const sendBuffer = 1 << 20
	c := newTestCluster(t, size)
	vc := &c.cfg.Volumes[0]
	vc.Protocol, vc.OnCongestion, vc.SendBuffer = "A", "pull-ahead", sendBuffer
	vc.PeerTimeout = config.Duration(time.Minute)
	gate := fault.NewGate()
	gate.Open()
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(pausedLink{r: s, gate: gate}, s.Close)
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	set := *a.settings()
	set.congestion.Sustain = 200 * time.Millisecond
	a.set.Store(&set)

	gate.Shut()
	done := make(chan error, 1)
	go func() {
		for i := range 2 * sendBuffer / (64 << 10) {
			if err := a.WriteAt(context.Background(), pattern(byte(i), 64<<10), int64(i)*64<<10, false); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the writes held for room never completed: beta %s", a.peers.byName["beta"].status().Replication)
	}
	if ps := a.peers.byName["beta"].status(); ps.Replication != string(replication.Ahead) {
		t.Fatalf("beta once the held writes completed: %s (%s); want Ahead", ps.Replication, ps.Reason)
	}
	gate.Open()
	c.waitInSync()
	c.requireIdentical()
}
