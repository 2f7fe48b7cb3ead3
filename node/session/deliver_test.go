package session

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/repltest"
)

// TestAWriterDoesNotWaitForABusyLoop: an entry handed to a session whose
// loop is busy is taken at once (the inbox holds it), and the loop sends
// it when it comes back: a writer that streams to several peers does not
// wait, and wake, for each busy loop in turn.
func TestAWriterDoesNotWaitForABusyLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := repltest.NewGateStream(ctx)
	close(g.Gate)
	s := New(ctx, loosePeer{}, transport.NewReplStream(g, cancel), looseConfig(time.Hour))
	go func() { _ = s.Run(nil) }()

	inside, release := make(chan struct{}), make(chan struct{})
	go s.Do(func() {
		close(inside)
		<-release
	})
	<-inside // the loop is busy until release
	taken := make(chan bool, 1)
	pd := NewPending(replication.Entry{Op: replication.OpFlush})
	go func() { taken <- s.Enqueue(pd) }()
	select {
	case ok := <-taken:
		if !ok {
			t.Fatal("a running session refused an entry")
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the writer waited for the busy loop to take its entry")
	}
	close(release)
	select {
	case n := <-g.Sent:
		if n != 1 {
			t.Fatalf("the frame after the busy spell carried %d entries, want the one delivered", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the entry delivered while the loop was busy was never sent")
	}
}

// TestEveryEntryDeliveredAsTheStreamEndsIsHandedBack: writers hand a
// session entries while it ends. Each entry Enqueue took completes (its
// end hands back what the peer did not acknowledge: marked, in the
// node), whether the loop or its last drain took it; none it refused
// does: the writer marks those itself. An entry lost between the two
// would leave its write waiting forever.
func TestEveryEntryDeliveredAsTheStreamEndsIsHandedBack(t *testing.T) {
	for round := range 300 {
		ctx, cancel := context.WithCancel(context.Background())
		g := repltest.NewGateStream(ctx)
		close(g.Gate)
		s := New(ctx, loosePeer{}, transport.NewReplStream(g, cancel), looseConfig(time.Hour))
		ran := make(chan error, 1)
		go func() { ran <- s.Run(nil) }()

		const writers = 8
		var wg sync.WaitGroup
		taken := make([][]*Pending, writers)
		refused := make([]*Pending, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					pd := NewPending(replication.Entry{Op: replication.OpFlush})
					if !s.Enqueue(pd) {
						refused[w] = pd
						return
					}
					taken[w] = append(taken[w], pd)
				}
			}()
		}
		// The stream ends after a few frames went out, a different
		// number each round (the peer acks none: at most
		// maxFramesInFlight go out).
		for range round % (maxFramesInFlight + 1) {
			<-g.Sent
		}
		s.Cancel()
		stopped := make(chan struct{})
		go func() { wg.Wait(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a writer still waits to hand over an entry after the stream ended", round)
		}
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the session did not end", round)
		}
		for w := range writers {
			for i, pd := range taken[w] {
				select {
				case <-pd.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: writer %d's entry %d was taken and never completed", round, w, i)
				}
			}
			select {
			case <-refused[w].Done():
				t.Fatalf("round %d: writer %d's refused entry completed", round, w)
			default:
			}
		}
		cancel()
	}
}
