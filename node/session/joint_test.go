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
