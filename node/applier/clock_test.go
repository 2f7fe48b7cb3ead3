package applier

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// scriptStream hands the applier the frames of in, then hears nothing
// until its context ends, and passes on every ack the applier sends.
type scriptStream struct {
	ctx  context.Context
	in   chan []byte
	acks chan replication.Ack
}

func (s *scriptStream) RecvMsg(m any) error {
	select {
	case b := <-s.in:
		m.(*transport.Frame).SetBytes(b)
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *scriptStream) SendMsg(m any) error {
	a, err := replication.DecodeAck(m.(*transport.Frame).Bytes())
	if err != nil {
		return err
	}
	select {
	case s.acks <- a:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *scriptStream) Context() context.Context { return s.ctx }

// within fails t unless c is closed or sends within 10 s: what waits.
func within(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("not within 10s: %s", what)
	}
}

// armedOn waits until the stream arms its ticker on fake.
func armedOn(t *testing.T, fake *clock.Fake) {
	t.Helper()
	armed := make(chan struct{})
	go func() { fake.WaitArmed(1); close(armed) }()
	within(t, "the stream arms its ticker on the injected clock", armed)
}

// stallDisk is a memDisk whose writes wait for release.
type stallDisk struct {
	*memDisk
	entered chan struct{}
	release chan struct{}
}

func (d *stallDisk) WriteAt(p []byte, off int64) (int, error) {
	d.entered <- struct{}{}
	<-d.release
	return d.memDisk.WriteAt(p, off)
}

// TestALongApplySaysItIsAliveOnTheInjectedClock: while a batch takes long
// to apply, the stream sends an empty ack every quarter of the peer
// timeout of Volume.Clock. With a timeout of an hour on a clock.Fake, a
// write held on the disk gets an empty ack once the fake moves 15
// minutes, and its own ack once the disk lets it through.
func TestALongApplySaysItIsAliveOnTheInjectedClock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	v, d, _ := newVolume(64 << 10)
	disk := &stallDisk{memDisk: d, entered: make(chan struct{}, 1), release: make(chan struct{})}
	v.Disk, v.PeerTimeout, v.Clock = disk, time.Hour, fake
	s := &scriptStream{ctx: ctx, in: make(chan []byte, 1), acks: make(chan replication.Ack, 8)}
	frame := replication.AppendBatchHeader(nil, 1)
	frame = replication.AppendEntry(frame, &replication.Entry{Op: replication.OpWrite, Seq: 1, Off: 4096, Data: make([]byte, 4096)})
	s.in <- frame
	ended := make(chan error, 1)
	go func() { ended <- NewStream("alpha").Run(transport.NewReplStream(s, cancel), v) }()

	within(t, "the write reaches the disk", disk.entered)
	armedOn(t, fake)
	select {
	case a := <-s.acks:
		t.Fatalf("an ack %+v before the fake clock moved", a)
	default:
	}
	fake.Advance(15 * time.Minute)
	select {
	case a := <-s.acks:
		if a != (replication.Ack{}) {
			t.Fatalf("while the write is held, ack %+v, want the empty one", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no empty ack a quarter of the peer timeout into the apply, on the injected clock")
	}
	close(disk.release)
	select {
	case a := <-s.acks:
		if a.Seq != 1 || a.Status != replication.AckOK {
			t.Fatalf("after the write, ack %+v, want seq 1 OK", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ack of the write")
	}
	cancel()
	<-ended
}

// slowLinkStream is a scriptStream whose long frame is arriving: it says
// so (transport.Arrivals), and each look at how far it came waits for
// the test's answer.
type slowLinkStream struct {
	*scriptStream
	longs  chan struct{}
	asked  chan struct{}
	answer chan arrival
}

type arrival struct {
	now   bool
	bytes int64
}

func (s *slowLinkStream) LongFrames() <-chan struct{} { return s.longs }

func (s *slowLinkStream) Arriving() (bool, int64) {
	s.asked <- struct{}{}
	a := <-s.answer
	return a.now, a.bytes
}

// TestALongFrameOnASlowLinkSaysItIsAlive: a long frame that takes longer
// than the peer timeout to cross a slow link is acknowledged only once it
// is whole; meanwhile the stream sends an empty ack at each quarter of the
// timeout whose tick finds more of its bytes come, none at one that finds
// none come (a stalled sender is the primary's to judge), and its ticker
// stops once no frame arrives.
func TestALongFrameOnASlowLinkSaysItIsAlive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	v, _, _ := newVolume(64 << 10)
	v.PeerTimeout, v.Clock = time.Hour, fake
	s := &slowLinkStream{scriptStream: &scriptStream{ctx: ctx, in: make(chan []byte, 1), acks: make(chan replication.Ack, 8)},
		longs: make(chan struct{}, 1), asked: make(chan struct{}), answer: make(chan arrival)}
	ended := make(chan error, 1)
	go func() { ended <- NewStream("alpha").Run(transport.NewReplStream(s, cancel), v) }()

	noAck := func(when string) {
		t.Helper()
		select {
		case a := <-s.acks:
			t.Fatalf("%s: ack %+v, want none", when, a)
		default:
		}
	}
	// One look at the frame: the test answers it, once the ticker asks.
	look := func(what string, a arrival) {
		t.Helper()
		within(t, what, s.asked)
		s.answer <- a
	}

	s.longs <- struct{}{} // a long frame begins to arrive
	look("the ticker starts on the long frame and notes how far it came", arrival{true, 64 << 10})
	armedOn(t, fake)
	noAck("before the fake clock moved")

	emptyAck := func(when string) {
		t.Helper()
		select {
		case a := <-s.acks:
			if a != (replication.Ack{}) {
				t.Fatalf("%s: ack %+v, want the empty one", when, a)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no empty ack", when)
		}
	}

	fake.Advance(15 * time.Minute)
	look("the first tick", arrival{true, 128 << 10})
	emptyAck("a quarter of the peer timeout into a long frame whose bytes came")

	fake.Advance(15 * time.Minute)
	look("the second tick", arrival{true, 128 << 10}) // nothing more came
	fake.Advance(15 * time.Minute)
	within(t, "the third tick (the second is over)", s.asked)
	noAck("at a tick that found no more bytes come")
	s.answer <- arrival{true, 192 << 10}
	emptyAck("at the tick after more bytes came")

	fake.Advance(15 * time.Minute)
	look("the tick after the frame arrived whole", arrival{false, 192 << 10})
	noAck("once no frame arrives")
	cancel()
	<-ended
}
