package node

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// gateStream is a replication stream whose sends wait at a gate; it
// reports each frame's entry count once sent.
type gateStream struct {
	entered chan struct{} // a send is waiting at the gate
	gate    chan struct{}
	sent    chan int
}

func (g *gateStream) SendMsg(m any) error {
	g.entered <- struct{}{}
	<-g.gate
	var entries []replication.Entry
	entries, err := replication.DecodeBatch(m.(*transport.Frame).Bytes(), entries)
	if err != nil {
		return err
	}
	g.sent <- len(entries)
	return nil
}

func (g *gateStream) RecvMsg(any) error        { select {} }
func (g *gateStream) Context() context.Context { return context.Background() }

// TestAnEntryQueuedDuringAHeartbeatIsSent: a write queued while an idle
// stream's heartbeat is being sent finds the stream busy and leaves the
// sending to it; the heartbeat's sender must then send it, or the write
// waits forever (it did, once in a few dozen pulls under load).
func TestAnEntryQueuedDuringAHeartbeatIsSent(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	p := newPeer(c.vol("alpha"), "beta")
	g := &gateStream{entered: make(chan struct{}, 4), gate: make(chan struct{}), sent: make(chan int, 4)}
	p.stream, p.streaming, p.sendFail = transport.NewReplStream(g), true, func(error) {}
	go func() {
		p.mu.Lock()
		p.heartbeatLocked()
		p.mu.Unlock()
	}()
	<-g.entered // the heartbeat is out
	pd := &pending{e: replication.Entry{Op: replication.OpFlush}, done: make(chan struct{})}
	p.mu.Lock()
	p.enqueueLocked(pd)
	p.sendLocked() // the stream is busy: this returns at once
	p.mu.Unlock()
	close(g.gate)
	if n := <-g.sent; n != 0 {
		t.Fatalf("first frame carried %d entries, want the empty heartbeat", n)
	}
	select {
	case n := <-g.sent:
		if n != 1 {
			t.Fatalf("the next frame carried %d entries, want the queued flush", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the entry queued during the heartbeat was never sent")
	}
}
