package session

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/repltest"
)

// TestAJointCompletesWithTheLastOfItsEntries: a write's entries to two
// peers share a Joint; it completes when the second of them completes,
// whichever peer that is, and not with the first. Each stream here ends
// without an ack (its peer hears nothing), which completes its entry: the
// end of a session releases the joint too, or a writer waiting on it
// would hang on a peer that went away.
func TestAJointCompletesWithTheLastOfItsEntries(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var j Joint
	if j.Armed() {
		t.Fatal("a zero Joint is armed")
	}
	j.Arm()
	var sessions [2]*Session
	var pds [2]*Pending
	var runs [2]chan error
	for i := range sessions {
		sctx, scancel := context.WithCancel(ctx)
		g := repltest.NewGateStream(sctx)
		close(g.Gate)
		sessions[i] = New(sctx, loosePeer{}, transport.NewReplStream(g, scancel), looseConfig(time.Hour))
		runs[i] = make(chan error, 1)
		go func() { runs[i] <- sessions[i].Run(nil) }()
		pds[i] = NewPending(replication.Entry{Op: replication.OpFlush})
		pds[i].Joint = &j
		j.Add()
		if !sessions[i].Enqueue(pds[i]) {
			t.Fatalf("session %d refused an entry", i)
		}
	}
	j.Seal()

	// The second peer's stream ends first.
	sessions[1].Cancel()
	<-runs[1]
	<-pds[1].Done()
	select {
	case <-j.Done():
		t.Fatal("the joint completed with one of its two entries in flight")
	case <-time.After(50 * time.Millisecond):
	}
	sessions[0].Cancel()
	<-runs[0]
	select {
	case <-j.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the joint did not complete once both entries had")
	}
	for i, pd := range pds {
		select {
		case <-pd.Done():
		default:
			t.Fatalf("the joint completed before entry %d did", i)
		}
		if pd.Acked() {
			t.Fatalf("entry %d counts as acknowledged by a peer that heard nothing", i)
		}
	}
}

// TestAJointWaitsForItsWritersSeal: entries that completed before the
// writer offered the write to every peer do not complete the joint; the
// writer's seal does, once they did.
func TestAJointWaitsForItsWritersSeal(t *testing.T) {
	var j Joint
	j.Arm()
	j.Add()
	j.Release() // the first peer did not take it
	select {
	case <-j.Done():
		t.Fatal("the joint completed before its writer sealed it")
	default:
	}
	j.Seal()
	select {
	case <-j.Done():
	default:
		t.Fatal("a sealed joint with nothing in flight is not complete")
	}
}

// TestAnAckThatLeavesTheLagAsItWasPublishesNothing: under protocol C a
// write is never counted in its peer's lag (it completes with its ack),
// so the ack leaves the lag as it was and the session does not publish
// it again: a publish costs an allocation and wakes the volume's
// watchers, on every ack of every peer. A write counted in the lag
// (protocols A and B: CompletedLocally) is published again when its ack
// takes it out.
func TestAnAckThatLeavesTheLagAsItWasPublishesNothing(t *testing.T) {
	c, _ := startCacheSession(t)
	send := func(seq uint64, off int64) *Pending {
		pd := NewPending(write(off, replication.BlockSize))
		pd.LagSeq = seq
		if !c.s.Enqueue(pd) {
			t.Fatal("a running session refused an entry")
		}
		c.arrive(t, 1)
		return pd
	}
	// The loop publishes after it completed the entries of an ack: Do
	// runs after it.
	published := func() int64 {
		c.s.Do(func() {})
		return c.peer.published.Load()
	}

	pd := send(1, 0)
	before := published()
	c.ack(t, pd)
	if n := published() - before; n != 0 {
		t.Fatalf("an ack of a write the lag never counted published the lag %d times, want none", n)
	}

	pd = send(2, replication.BlockSize)
	c.s.CompletedLocally(2, replication.BlockSize, time.Now())
	before = published()
	c.ack(t, pd)
	if n := published() - before; n != 1 {
		t.Fatalf("the ack of a write counted in the lag published it %d times, want once", n)
	}
	var lag int64
	c.s.Do(func() { lag = c.s.lag.Bytes() })
	if lag != 0 {
		t.Fatalf("the lag holds %d bytes after every write was acknowledged", lag)
	}
}
