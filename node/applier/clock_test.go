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

	wait := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("not within 10s: %s", what)
		}
	}
	wait("the write reaches the disk", disk.entered)
	armed := make(chan struct{})
	go func() { fake.WaitArmed(1); close(armed) }()
	wait("the stream arms its ticker on the injected clock", armed)
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
