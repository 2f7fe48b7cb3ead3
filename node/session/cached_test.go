package session

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/mdtest"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// A peer acknowledges a write that is not FUA from its page cache; only
// its ack of a later flush says the write is durable there. These tests
// pin what the session does when the stream ends between the two: the
// volume tracks the peer (StartTracking) and the writes are marked in the
// peer's bitmap, durably, BEFORE a flush waiting on the peer completes;
// what a flush ack covered is not marked.

const (
	cacheTestVolume = 64 << 20
	cacheTestSelf   = 1
	cacheTestPeer   = 2
)

// scriptedPeer is the far end of a stream that a test drives: it hands
// the test every entry the session sends and acknowledges what the test
// says, until the test cuts the link.
type scriptedPeer struct {
	ctx     context.Context
	entries chan replication.Entry
	acks    chan replication.Ack
	cut     chan struct{}
}

func newScriptedPeer(ctx context.Context) *scriptedPeer {
	return &scriptedPeer{ctx: ctx, entries: make(chan replication.Entry, 64), acks: make(chan replication.Ack), cut: make(chan struct{})}
}

func (p *scriptedPeer) SendMsg(m any) error {
	entries, err := replication.DecodeBatch(m.(*transport.Frame).AppendContents(nil), nil)
	if err != nil {
		return err
	}
	for _, e := range entries {
		select {
		case p.entries <- e:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
	return nil
}

func (p *scriptedPeer) RecvMsg(m any) error {
	select {
	case a := <-p.acks:
		m.(*transport.Frame).SetBytes(replication.AppendAck(nil, a))
		return nil
	case <-p.cut:
		return errors.New("link cut")
	case <-p.ctx.Done():
		return p.ctx.Err()
	}
}

func (p *scriptedPeer) Context() context.Context { return p.ctx }

// trackingPeer is a Peer whose StartTracking records that it ran, and what
// the bitmap held then: the volume tracks the peer BEFORE anything is
// marked.
type trackingPeer struct {
	loosePeer
	bm          *metadata.PeerBitmap
	fail        error
	hold        chan struct{} // StartTracking waits for it to close (nil: it does not)
	tracked     int
	markedFirst int64
	published   atomic.Int64 // PublishLag's calls
}

func (p *trackingPeer) PublishLag() { p.published.Add(1) }

func (p *trackingPeer) StartTracking() error {
	if p.hold != nil {
		<-p.hold
	}
	p.tracked++
	p.markedFirst = p.bm.Count()
	return p.fail
}

// cacheSession runs a session of a trackingPeer over a scriptedPeer, with
// a bitmap on metadata of an in-memory device. The entries it starts with
// go out in one frame, numbered from 1 (a batch, as under load).
type cacheSession struct {
	s    *Session
	far  *scriptedPeer
	peer *trackingPeer
	dev  *mdtest.Device
	opts metadata.MDOptions
	done chan error
}

func startCacheSession(t *testing.T, entries ...replication.Entry) (*cacheSession, []*Pending) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	bm, dev, opts := testBitmap(t)
	far := newScriptedPeer(ctx)
	p := &trackingPeer{bm: bm}
	cfg := looseConfig(time.Hour)
	cfg.Bitmap = bm
	s := New(ctx, p, transport.NewReplStream(far, cancel), cfg)
	c := &cacheSession{s: s, far: far, peer: p, dev: dev, opts: opts, done: make(chan error, 1)}
	var pds []*Pending
	for _, e := range entries {
		pd := NewPending(e)
		s.Preload(pd)
		pds = append(pds, pd)
	}
	go func() { c.done <- s.Run(nil) }()
	t.Cleanup(func() {
		s.Cancel()
		<-c.done
	})
	c.arrive(t, len(entries))
	return c, pds
}

// arrive waits until the far end received n more entries (the session
// has at most maxFramesInFlight frames unacknowledged).
func (c *cacheSession) arrive(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-c.far.entries:
		case <-time.After(10 * time.Second):
			t.Fatal("the session did not send the entries")
		}
	}
}

// ack has the far end acknowledge every entry up to pd, and waits until
// pd completed.
func (c *cacheSession) ack(t *testing.T, pd *Pending) {
	t.Helper()
	c.far.acks <- replication.Ack{Seq: pd.Entry.Seq, Status: replication.AckOK}
	wait(t, pd)
	if !pd.Acked() {
		t.Fatalf("entry %d completed without its ack", pd.Entry.Seq)
	}
}

// cutLink ends the stream as a dead link does, and waits for the session's
// end.
func (c *cacheSession) cutLink(t *testing.T) {
	t.Helper()
	close(c.far.cut)
	select {
	case <-c.s.Finished():
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end when its link was cut")
	}
}

// durableMarks are the blocks marked in the peer's bitmap as the metadata
// device holds them after a crash of this node: the marks written durably.
func (c *cacheSession) durableMarks(t *testing.T) []int64 {
	t.Helper()
	md, err := metadata.OpenMD(c.dev.Crash(), c.opts)
	if err != nil {
		t.Fatal(err)
	}
	bm, _ := md.Bitmap(cacheTestPeer)
	return markedBlocks(bm)
}

func wait(t *testing.T, pd *Pending) {
	t.Helper()
	select {
	case <-pd.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("entry %d never completed", pd.Entry.Seq)
	}
}

func markedBlocks(bm *metadata.PeerBitmap) []int64 {
	var out []int64
	for b := range bm.Blocks() {
		if bm.Test(b) {
			out = append(out, b)
		}
	}
	return out
}

func write(off, length int64) replication.Entry {
	return replication.Entry{Op: replication.OpWrite, Off: off, Length: length, Data: make([]byte, length)}
}

func flush() replication.Entry { return replication.Entry{Op: replication.OpFlush} }

// TestWritesAckedFromThePeersCacheAreMarkedWhenTheStreamEndsBeforeTheFlushAck:
// the peer acknowledged two writes and then its link died with the flush
// after them sent and not acknowledged. The flush completes unacknowledged
// (the primary's FLUSH goes on without the peer), but only after the
// volume tracked the peer and both writes' blocks were marked in its
// bitmap, durably: the peer may lose them with its cache.
func TestWritesAckedFromThePeersCacheAreMarkedWhenTheStreamEndsBeforeTheFlushAck(t *testing.T) {
	c, pds := startCacheSession(t, write(0, 8192), write(1<<20, 4096), flush())
	c.ack(t, pds[1])
	c.cutLink(t)
	wait(t, pds[2])
	if pds[2].Acked() || pds[2].Err() != nil {
		t.Fatalf("the flush completed acked=%v err=%v; want unacknowledged, without error", pds[2].Acked(), pds[2].Err())
	}
	if c.peer.tracked != 1 || c.peer.markedFirst != 0 {
		t.Fatalf("StartTracking ran %d times, with %d blocks already marked; want once, BEFORE any mark", c.peer.tracked, c.peer.markedFirst)
	}
	want := []int64{0, 1, 256}
	if got := markedBlocks(c.peer.bm); !slices.Equal(got, want) {
		t.Fatalf("marked blocks %v, want %v: the writes the peer held only in its cache", got, want)
	}
	if got := c.durableMarks(t); !slices.Equal(got, want) {
		t.Fatalf("after a crash the bitmap marks %v, want %v: the marks were not durable when the flush completed", got, want)
	}
	if err := c.s.MarkErr(); err != nil {
		t.Fatalf("MarkErr %v after marks that succeeded", err)
	}
}

// TestWhatAFlushAckCoveredIsNotMarked: a flush's ack makes durable what
// the peer applied before the flush, not what came after it in the same
// ack: a write acked together with the flush but queued after it is still
// in the peer's cache, and a FUA write is durable at its own ack.
func TestWhatAFlushAckCoveredIsNotMarked(t *testing.T) {
	t.Run("writes before the flush, and a FUA write after it", func(t *testing.T) {
		fua := write(2<<20, 4096)
		fua.Flags = replication.EntryFUA
		c, pds := startCacheSession(t, write(0, 8192), flush(), fua)
		c.ack(t, pds[2])
		c.cutLink(t)
		if c.peer.tracked != 0 {
			t.Fatalf("StartTracking ran %d times for a peer that holds every write durably", c.peer.tracked)
		}
		if got := markedBlocks(c.peer.bm); len(got) != 0 {
			t.Fatalf("marked blocks %v of writes the peer holds durably", got)
		}
	})
	t.Run("a write after the flush, acknowledged with it", func(t *testing.T) {
		c, pds := startCacheSession(t, write(0, 8192), flush(), write(3<<20, 4096))
		c.ack(t, pds[2])
		c.cutLink(t)
		if c.peer.tracked != 1 {
			t.Fatalf("StartTracking ran %d times, want once: the last write is in the peer's cache", c.peer.tracked)
		}
		if got, want := markedBlocks(c.peer.bm), []int64{768}; !slices.Equal(got, want) {
			t.Fatalf("marked blocks %v, want %v: only the write after the flush", got, want)
		}
	})
}

// TestAFlushFailsWhenWhatThePeerMayLoseCannotBeTracked: the volume cannot
// durably track the peer whose stream ended with writes in its cache, so
// the flush waiting on the peer fails: it must not tell its client the
// writes are durable.
func TestAFlushFailsWhenWhatThePeerMayLoseCannotBeTracked(t *testing.T) {
	c, pds := startCacheSession(t, write(0, 4096), flush())
	c.peer.fail = errors.New("state write failed")
	c.ack(t, pds[0])
	c.cutLink(t)
	wait(t, pds[1])
	if !errors.Is(pds[1].Err(), c.peer.fail) || !errors.Is(c.s.MarkErr(), c.peer.fail) {
		t.Fatalf("flush err %v, MarkErr %v; want the tracking's error", pds[1].Err(), c.s.MarkErr())
	}
}

// TestTheCachedSetCoarsensAndNeverDrops: random small writes past the
// set's bound coarsen it to larger aligned runs; every byte added stays
// covered, the runs stay sorted, disjoint and within the bound, and a
// flush's reset starts fine again.
func TestTheCachedSetCoarsensAndNeverDrops(t *testing.T) {
	var c cachedSet
	r := rand.New(rand.NewPCG(1, 2))
	type ext struct{ off, length int64 }
	var added []ext
	for range 20 * maxCachedRuns {
		e := ext{r.Int64N(1<<30) / 512 * 512, 512 * (1 + r.Int64N(64))}
		c.add(e.off, e.length)
		added = append(added, e)
		if len(c.runs) > maxCachedRuns {
			t.Fatalf("%d runs, past the bound of %d", len(c.runs), maxCachedRuns)
		}
	}
	if c.grain <= replication.BlockSize {
		t.Fatalf("grain %d after %d random writes: the set never coarsened", c.grain, len(added))
	}
	for i, r := range c.runs {
		if r.off >= r.end || r.off%c.grain != 0 || r.end%c.grain != 0 || (i > 0 && c.runs[i-1].end >= r.off) {
			t.Fatalf("run %d %v: not aligned to %d, empty, or not after the one before", i, r, c.grain)
		}
	}
	for _, e := range added {
		i, _ := slices.BinarySearchFunc(c.runs, e.off, func(s span, x int64) int {
			if s.end <= x {
				return -1
			}
			return 1
		})
		if i == len(c.runs) || c.runs[i].off > e.off || c.runs[i].end < e.off+e.length {
			t.Fatalf("extent %d+%d is not covered by the set", e.off, e.length)
		}
	}
	c.reset()
	c.add(5000, 10)
	if want := []span{{4096, 8192}}; !slices.Equal(c.runs, want) {
		t.Fatalf("after a reset the set holds %v, want %v", c.runs, want)
	}
}

// TestAWriteAckedFromACacheLostSinceWaitsForItsTracking: the peer
// acknowledged a write from its cache, and its stream ended before the
// write completed (it waited for another peer). AwaitCacheLoss returns
// only once the stream's end tracked the peer and marked the write,
// durably, and with the tracking's error when that failed: the write must
// then fail. A FUA write, durable at its ack, and a write whose stream is
// still up wait for nothing.
func TestAWriteAckedFromACacheLostSinceWaitsForItsTracking(t *testing.T) {
	ended := func(t *testing.T, c *cacheSession) {
		t.Helper()
		close(c.far.cut)
		select {
		case <-c.s.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end when its link was cut")
		}
	}
	for _, fail := range []error{nil, errors.New("state write failed")} {
		t.Run(fmt.Sprintf("tracking fails: %v", fail != nil), func(t *testing.T) {
			c, pds := startCacheSession(t, write(0, 4096), write(1<<20, 4096))
			for _, pd := range pds {
				pd.Session = c.s
			}
			c.peer.fail = fail
			c.ack(t, pds[1])
			if err := AwaitCacheLoss(pds); err != nil || c.peer.tracked != 0 {
				t.Fatalf("with the stream up: %v, tracked %d times; want nil, untracked", err, c.peer.tracked)
			}
			ended(t, c)
			err := AwaitCacheLoss(pds)
			select {
			case <-c.s.Finished():
			default:
				t.Fatal("AwaitCacheLoss returned before the stream's end marked what the peer held in its cache")
			}
			if !errors.Is(err, fail) || (fail == nil) != (err == nil) {
				t.Fatalf("AwaitCacheLoss: %v, want %v", err, fail)
			}
			if want := []int64{0, 256}; !slices.Equal(c.durableMarks(t), want) {
				t.Fatalf("after a crash the bitmap marks %v, want %v", c.durableMarks(t), want)
			}
		})
	}
	t.Run("FUA", func(t *testing.T) {
		fua := write(0, 4096)
		fua.Flags = replication.EntryFUA
		c, pds := startCacheSession(t, fua)
		pds[0].Session = c.s
		c.peer.fail = errors.New("state write failed")
		c.ack(t, pds[0])
		ended(t, c)
		if err := AwaitCacheLoss(pds); err != nil {
			t.Fatalf("a FUA write, durable at its ack: %v", err)
		}
	})
}

// TestALostAckIsPendingUntilTheStreamsEndTrackedThePeer: CacheLossPending,
// the write's last look under its lease, finds nothing while the stream
// is up, a pending loss while the stream's end still tracks the peer, and
// the tracking's error once it failed.
func TestALostAckIsPendingUntilTheStreamsEndTrackedThePeer(t *testing.T) {
	c, pds := startCacheSession(t, write(0, 4096))
	pds[0].Session = c.s
	c.peer.fail, c.peer.hold = errors.New("state write failed"), make(chan struct{})
	c.ack(t, pds[0])
	if pending, err := CacheLossPending(pds); pending || err != nil {
		t.Fatalf("with the stream up: pending %v, %v; want neither", pending, err)
	}
	close(c.far.cut)
	select {
	case <-c.s.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end when its link was cut")
	}
	if pending, err := CacheLossPending(pds); !pending || err != nil {
		t.Fatalf("while the stream's end tracks the peer: pending %v, %v; want pending", pending, err)
	}
	close(c.peer.hold)
	select {
	case <-c.s.Finished():
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's end did not finish")
	}
	if pending, err := CacheLossPending(pds); pending || !errors.Is(err, c.peer.fail) {
		t.Fatalf("after the tracking failed: pending %v, %v; want the tracking's error", pending, err)
	}
}
