package session

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/repltest"
)

// The node's stream is a Stream: the session itself links no transport
// (only its frame), so the check lives here.
var _ Stream = (*transport.ReplStream)(nil)

// loosePeer is a Peer with no volume behind it: its state changes go
// nowhere and nothing it misses is tracked. It serves tests whose entries
// change no block (the session then never touches the bitmap).
type loosePeer struct{}

func (loosePeer) Stream(volstate.StreamEvent)                         {}
func (loosePeer) SyncDoneAcked(*Session, replication.Generation) bool { return false }
func (loosePeer) Ended(*Session)                                      {}
func (loosePeer) StartTracking() error                                { return nil }
func (loosePeer) PublishLag()                                         {}
func (loosePeer) CatchUp(*Session) bool                               { return false }
func (loosePeer) Congestion() replication.CongestionConfig            { return replication.CongestionConfig{} }

// looseConfig is a Config for a loosePeer named beta.
func looseConfig(timeout time.Duration) Config {
	return Config{
		Name: "beta", Timeout: timeout, Lag: &replication.Lag{}, WriteSeq: &atomic.Uint64{},
		Counters: Counters{
			FramesSent: &atomic.Uint64{}, EntriesSent: &atomic.Uint64{},
			ResyncDone: &atomic.Int64{}, ChecksumsSkipped: &atomic.Int64{}, VerifyDone: &atomic.Int64{}, VerifyFound: &atomic.Int64{},
		},
		Log: slog.Default(), FreeBuffer: func(*[]byte) {},
	}
}

// TestAnEntryQueuedDuringAHeartbeatIsSent: a write queued while an idle
// stream's heartbeat is on the wire waits for the one sending goroutine,
// which sends it as soon as the heartbeat is out (an earlier design left
// the sending to "whoever finds nobody sending", and once nobody did).
func TestAnEntryQueuedDuringAHeartbeatIsSent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := repltest.NewGateStream(ctx)
	s := New(ctx, loosePeer{}, transport.NewReplStream(g, cancel), looseConfig(400*time.Millisecond))
	go func() { _ = s.Run(nil) }()
	<-g.Entered // the heartbeat is out (an idle stream probes every timeout/4)
	pd := NewPending(replication.Entry{Op: replication.OpFlush})
	if !s.Enqueue(pd) {
		t.Fatal("a running session refused an entry")
	}
	close(g.Gate)
	if n := <-g.Sent; n != 0 {
		t.Fatalf("first frame carried %d entries, want the empty heartbeat", n)
	}
	select {
	case n := <-g.Sent:
		if n != 1 {
			t.Fatalf("the next frame carried %d entries, want the queued flush", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the entry queued during the heartbeat was never sent")
	}
}

// waitArmed waits until f has n timers armed, failing the test after a
// deadline (a session that never arms its ticker on f keeps real time).
func waitArmed(t *testing.T, f *clock.Fake, n int) {
	t.Helper()
	armed := make(chan struct{})
	go func() { f.WaitArmed(n); close(armed) }()
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the session armed no ticker on the injected clock")
	}
}

// TestThePeersSilenceIsCountedOnTheInjectedClock: a session ticks, probes
// and judges the peer's silence on Config.Clock. Against a peer that
// answers nothing, with a timeout of an hour, the session stands through
// an hour of the fake clock (its tick then still sends a heartbeat) and
// ends with ErrPeerTimeout at the next tick, whatever the real time.
func TestThePeersSilenceIsCountedOnTheInjectedClock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := repltest.NewGateStream(ctx)
	close(g.Gate)
	cfg := looseConfig(time.Hour)
	cfg.Clock = fake
	s := New(ctx, loosePeer{}, transport.NewReplStream(g, cancel), cfg)
	ended := make(chan error, 1)
	go func() { ended <- s.Run(nil) }()
	waitArmed(t, fake, 1)

	fake.Advance(time.Hour) // one tick: silent for the timeout, not past it
	select {
	case n := <-g.Sent:
		if n != 0 {
			t.Fatalf("the tick sent a frame of %d entries, want the empty heartbeat", n)
		}
	case err := <-ended:
		t.Fatalf("the session ended after a silence of exactly its timeout: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat after a tick of the injected clock")
	}
	select {
	case err := <-ended:
		t.Fatalf("the session ended after a silence of exactly its timeout: %v", err)
	default:
	}

	fake.Advance(maxHeartbeatInterval) // the next tick: past the timeout
	select {
	case err := <-ended:
		if !errors.Is(err, ErrPeerTimeout) {
			t.Fatalf("the session ended with %v, want ErrPeerTimeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its timeout on the injected clock")
	}
}

// TestARestingStreamShedsTheRoomOfItsBurst: a stream that rests (another
// stream of the pair carries the probe) after a burst deeper than a
// connection's queue keeps none of the room the burst grew, so that a
// thousand idle volumes' streams hold none; the next burst goes out as
// before.
func TestARestingStreamShedsTheRoomOfItsBurst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	beat := &PairBeat{}
	beat.carrier.Store(&Session{}) // another volume's stream carries
	cfg := looseConfig(time.Hour)
	cfg.Bitmap, _, _ = testBitmap(t)
	cfg.Clock = clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg.Beat = beat
	st := NewStepper(ctx, loosePeer{}, &stepStream{}, cfg)
	s := st.Session()
	// burst queues n flushes, a full inbox at a time, then has the peer
	// take and acknowledge each frame until none is left; it returns the
	// entries the frames carried.
	burst := func(n int) (sent int) {
		for n > 0 {
			k := min(n, inboxSize)
			for range k {
				if !s.Enqueue(NewPending(replication.Entry{Op: replication.OpFlush})) {
					t.Fatal("a running session refused an entry")
				}
			}
			n -= k
			st.Inbox()
		}
		for f := st.Frame(); f != nil; f = st.Frame() {
			entries, err := replication.DecodeBatch(f.AppendContents(nil), nil)
			f.Release()
			if err != nil {
				t.Fatal(err)
			}
			sent += len(entries)
			ack := &transport.Frame{}
			ack.SetBytes(replication.AppendAck(nil, replication.Ack{Seq: entries[len(entries)-1].Seq, Status: replication.AckOK}))
			if err := st.Received(ack); err != nil {
				t.Fatal(err)
			}
		}
		return sent
	}
	if sent := burst(4 * restingCap); sent != 4*restingCap {
		t.Fatalf("the burst sent %d entries, want %d", sent, 4*restingCap)
	}
	if !s.Resting() || !s.idle() {
		t.Fatal("the stream does not rest after its burst")
	}
	if cap(s.queue) > restingCap || cap(s.inflight) > restingCap {
		t.Fatalf("the resting stream keeps room for %d entries queued and %d in flight, want at most %d", cap(s.queue), cap(s.inflight), restingCap)
	}
	if sent := burst(1); sent != 1 || !s.Resting() {
		t.Fatalf("the next burst sent %d entries (want 1), resting after: %v", sent, s.Resting())
	}
}
