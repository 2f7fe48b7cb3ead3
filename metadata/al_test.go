package metadata

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
)

// opLog records the device operations in order, by region.
type opLog struct {
	mu  sync.Mutex
	ops []string
}

func (l *opLog) record(md *MD) mdtest.Injector {
	return func(op mdtest.Op) mdtest.Fault {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ops = append(l.ops, region(md, op))
		return mdtest.Fault{}
	}
}

func (l *opLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := l.ops
	l.ops = nil
	return ops
}

func region(md *MD, op mdtest.Op) string {
	g := md.geo
	switch {
	case op.Kind == mdtest.OpSync:
		return "sync"
	case op.Off >= g.alOffset && op.Off < g.alOffset+int64(g.alBlocks)*MDBlockSize:
		return op.Kind.String() + " al"
	case g.checksums && op.Off >= g.checksumOffset && op.Off < g.checksumOffset+g.checksumPages*MDBlockSize:
		return op.Kind.String() + " checksums"
	case op.Off >= g.bitmapOffset && op.Off < g.bitmapOffset+int64(g.peerSlots)*g.bitmapPages*MDBlockSize:
		return op.Kind.String() + " bitmap"
	case op.Off == g.sbOffset[0] || op.Off == g.sbOffset[1]:
		return op.Kind.String() + " superblock"
	}
	return op.Kind.String() + " data"
}

func admit(t testing.TB, al *ActivityLog, extent uint64) {
	t.Helper()
	if err := al.Admit(context.Background(), extentStart(extent)+8192, 8192); err != nil {
		t.Fatalf("Admit extent %d: %v", extent, err)
	}
}

func done(al *ActivityLog, extent uint64) { al.Done(extentStart(extent)+8192, 8192) }

// TestALHotExtentCostsNoIO: the first write to an extent costs one AL
// transaction and one sync; later writes to it, in flight or not, cost no
// metadata I/O at all.
func TestALHotExtentCostsNoIO(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			dev, md := newTestMD(t, testOptions(p))
			al := md.ActivityLog()
			var log opLog
			dev.SetInjector(log.record(md))

			admit(t, al, 5)
			if ops := log.take(); !slices.Equal(ops, []string{"write al", "sync"}) {
				t.Fatalf("cold admission: %v, want one AL write then a sync", ops)
			}
			admit(t, al, 5) // a second write in flight in the same extent
			done(al, 5)
			done(al, 5)
			for range 100 {
				admit(t, al, 5)
				done(al, 5)
			}
			if ops := log.take(); len(ops) != 0 {
				t.Fatalf("hot admissions did I/O: %v", ops)
			}
			if s := al.Stats(); s.Hits != 101 || s.Misses != 1 || s.Transactions != 1 || s.Commits != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// TestALGroupCommit: cold admissions that arrive while a transaction is
// being written are batched into ONE next transaction, and none returns
// before that transaction is synced.
func TestALGroupCommit(t *testing.T) {
	dev, md := newTestMD(t, testOptions(External))
	al := md.ActivityLog()
	const n = 40
	queued := make(chan struct{}, n+1)
	al.onEnqueue = func() { queued <- struct{}{} }

	// Hold the first transaction's sync until the others have queued.
	release := make(chan struct{})
	var log opLog
	rec := log.record(md)
	var once sync.Once
	dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
		rec(op)
		if op.Kind == mdtest.OpSync {
			once.Do(func() { <-release })
		}
		return mdtest.Fault{}
	})

	firstDone := make(chan error)
	go func() { firstDone <- al.Admit(context.Background(), extentStart(0), 8192) }()
	<-queued
	results := make(chan error, n)
	for i := range n {
		go func() { results <- al.Admit(context.Background(), extentStart(uint64(1+i)), 8192) }()
	}
	for range n {
		<-queued
	}
	select {
	case err := <-results:
		t.Fatalf("an admission returned before its transaction was written: %v", err)
	default:
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"write al", "sync", "write al", "sync"}
	if ops := log.take(); !slices.Equal(ops, want) {
		t.Fatalf("ops %v, want %v: %d concurrent cold admissions in one transaction", ops, want, n)
	}
	if s := al.Stats(); s.Transactions != 2 || s.Misses != n+1 {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("1 + %d concurrent cold admissions: %d transactions, %d syncs", n, al.Stats().Transactions, al.Stats().Commits)
}

// TestALEvictionFlushesBitmapFirst: an extent leaves the AL only once no
// write is in flight in it (least recently used first), and its dirty
// bitmap pages are on stable storage BEFORE the transaction that reuses its
// slot.
func TestALEvictionFlushesBitmapFirst(t *testing.T) {
	opts := testOptions(Internal)
	opts.ALExtents = MinALExtents
	dev, md := newTestMD(t, opts)
	al := md.ActivityLog()
	bm, _ := md.Bitmap(nodeBeta)
	for e := range uint64(MinALExtents) {
		admit(t, al, e)
	}
	for e := range uint64(MinALExtents) {
		if e != 0 {
			done(al, e) // extent 0 keeps a write in flight
		}
	}
	bm.SetBits(extentStart(1), 4096) // the peer missed a write in extent 1
	var log opLog
	dev.SetInjector(log.record(md))

	admit(t, al, 100) // evicts extent 1: the oldest with nothing in flight
	want := []string{"write bitmap", "sync", "write al", "sync"}
	if ops := log.take(); !slices.Equal(ops, want) {
		t.Fatalf("eviction: %v, want %v", ops, want)
	}
	active := al.ActiveExtents()
	if slices.Contains(active, 1) || !slices.Contains(active, 0) || !slices.Contains(active, 100) {
		t.Fatalf("active %v: want 0 (in flight) and 100, not 1", active)
	}
	// Evicting a clean extent writes no bitmap page.
	admit(t, al, 101)
	if ops := log.take(); !slices.Equal(ops, []string{"write al", "sync"}) {
		t.Fatalf("clean eviction: %v", ops)
	}
}

// TestALWaitsForAnEvictableExtent: with every slot holding a write in
// flight, a cold admission waits for a Done (or its context).
func TestALWaitsForAnEvictableExtent(t *testing.T) {
	opts := testOptions(External)
	opts.ALExtents = MinALExtents
	_, md := newTestMD(t, opts)
	al := md.ActivityLog()
	for e := range uint64(MinALExtents) {
		admit(t, al, e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := al.Admit(ctx, extentStart(50), 4096); err != context.Canceled {
		t.Fatalf("admission into a full AL with a cancelled context: %v", err)
	}
	got := make(chan error)
	go func() { got <- al.Admit(context.Background(), extentStart(50), 4096) }()
	done(al, 3)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if active := al.ActiveExtents(); slices.Contains(active, 3) || !slices.Contains(active, 50) {
		t.Fatalf("active %v", active)
	}
}

// TestALReconstructionAfterCrash runs random writes (spanning extents,
// overlapping, concurrent) through a small AL whose ring wraps many times,
// crashes at random points, and checks that the reopened AL holds every
// extent that had a write in flight, and, when no commit was running,
// exactly the extents that were in the AL.
func TestALReconstructionAfterCrash(t *testing.T) {
	for _, alExtents := range []int{MinALExtents, 61, 2000} {
		t.Run(fmt.Sprint(alExtents), func(t *testing.T) {
			opts := testOptions(Internal)
			opts.ALExtents = alExtents
			opts.DeviceSize = 64 << 30 // 16384 extents
			dev, md := newTestMD(t, opts)
			al := md.ActivityLog()
			r := rand.New(rand.NewPCG(uint64(alExtents), 7))
			extents := uint64(md.UsableSize() >> ExtentShift)
			type write struct{ off, length int64 }
			var inflight []write
			for round := range 40 {
				for range r.IntN(3 * alExtents) {
					if len(inflight) > alExtents/3 || (len(inflight) > 0 && r.IntN(2) == 0) {
						i := r.IntN(len(inflight))
						al.Done(inflight[i].off, inflight[i].length)
						inflight = slices.Delete(inflight, i, i+1)
						continue
					}
					w := write{int64(r.Uint64N(extents-1))<<ExtentShift + r.Int64N(ExtentSize), 4096 << r.IntN(8)}
					if err := al.Admit(context.Background(), w.off, w.length); err != nil {
						t.Fatal(err)
					}
					inflight = append(inflight, w)
				}
				crashed := dev.Crash()
				md2 := reopen(t, crashed, opts)
				got := md2.ActivityLog().ActiveExtents()
				if r := md2.Report(); r.ALIncomplete {
					t.Fatalf("round %d: AL incomplete: %+v", round, r)
				}
				if want := al.ActiveExtents(); !slices.Equal(got, want) {
					t.Fatalf("round %d: reopened AL %v\nwant %v", round, got, want)
				}
				for _, w := range inflight {
					for e := extentOf(w.off); e <= extentOf(w.off+w.length-1); e++ {
						if !slices.Contains(got, e) {
							t.Fatalf("round %d: extent %d had a write in flight and is not in the reopened AL", round, e)
						}
					}
				}
			}
			t.Logf("al-extents %d: %+v", alExtents, al.Stats())
		})
	}
}

// TestALTornTransactionIgnored: a transaction torn by a power loss (its
// sync never completed, so no data write was issued under it) is ignored;
// the hot set is the one before it.
func TestALTornTransactionIgnored(t *testing.T) {
	dev, md := newTestMD(t, testOptions(Internal))
	al := md.ActivityLog()
	for e := range uint64(10) {
		admit(t, al, e)
	}
	before := al.ActiveExtents()
	dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
		if op.Kind == mdtest.OpSync {
			return mdtest.Fault{Err: mdtest.ErrInjected}
		}
		return mdtest.Fault{}
	})
	if err := al.Admit(context.Background(), extentStart(77), 4096); err == nil {
		t.Fatal("admission with a failing sync succeeded")
	}
	if err := al.Admit(context.Background(), extentStart(78), 4096); err == nil {
		t.Fatal("a failed AL accepts more admissions")
	}
	for _, tear := range []int{1, 7} {
		crashed := dev.CrashKeeping(func(int, int64, int) int { return tear })
		md2 := reopen(t, crashed, testOptions(Internal))
		if got := md2.ActivityLog().ActiveExtents(); !slices.Equal(got, before) {
			t.Fatalf("tear after %d sectors: active %v, want %v", tear, got, before)
		}
		if r := md2.Report(); r.ALInvalid == 0 || r.ALIncomplete {
			t.Fatalf("tear after %d sectors: report %+v", tear, r)
		}
	}
}

// TestApplyActivityLogAfterCrashedPrimary: a node that crashed as primary
// marks every extent of its AL out of sync toward every peer, and only
// those: a resync of al-extents × 4 MiB at most, not of the volume.
func TestApplyActivityLogAfterCrashedPrimary(t *testing.T) {
	opts := testOptions(Internal)
	opts.Peers = []uint32{nodeBeta, 3}
	dev, md := newTestMD(t, opts)
	if err := md.SetPrimary(true); err != nil {
		t.Fatal(err)
	}
	al := md.ActivityLog()
	admit(t, al, 3)
	admit(t, al, 10)
	done(al, 3)
	lastExtent := uint64(md.UsableSize()-1) >> ExtentShift // partial
	if err := al.Admit(context.Background(), md.UsableSize()-4096, 4096); err != nil {
		t.Fatal(err)
	}

	crashed := dev.Crash()
	md2 := reopen(t, crashed, opts)
	if !md2.CrashedPrimary() || !md2.UUIDs(nodeBeta).CrashedPrimary {
		t.Fatal("primary indicator lost")
	}
	if got := md2.ActivityLog().ActiveExtents(); !slices.Equal(got, []uint64{3, 10, lastExtent}) {
		t.Fatalf("active %v", got)
	}
	marked, err := md2.ApplyActivityLog()
	if err != nil {
		t.Fatal(err)
	}
	want := 2*int64(ExtentSize) + md.UsableSize() - extentStart(lastExtent)
	if marked != want {
		t.Fatalf("marked %d bytes, want %d", marked, want)
	}
	for _, peer := range opts.Peers {
		b, _ := md2.Bitmap(peer)
		if b.Bytes() != want || !b.Test(3*ExtentSize/4096) || !b.Test(b.Blocks()-1) || b.Test(0) {
			t.Fatalf("peer %d: %d bytes marked", peer, b.Bytes())
		}
	}
	if err := md2.SetPrimary(false); err != nil {
		t.Fatal(err)
	}
	md3 := reopen(t, crashed.Crash(), opts)
	b, _ := md3.Bitmap(3)
	if md3.CrashedPrimary() || b.Bytes() != want {
		t.Fatalf("after apply-al and a clean demotion: crashed %v, %d bytes marked", md3.CrashedPrimary(), b.Bytes())
	}
}

// TestMarkActivityLogTowardOnePeer: at a failover a node marks its log's
// extents (hot or not, with a write in flight or done) toward the new
// primary only, durably: another peer's bitmap is untouched, and a crash
// right after keeps the marks.
func TestMarkActivityLogTowardOnePeer(t *testing.T) {
	opts := testOptions(Internal)
	opts.Peers = []uint32{nodeBeta, 3}
	dev, md := newTestMD(t, opts)
	al := md.ActivityLog()
	admit(t, al, 2)
	admit(t, al, 7)
	done(al, 2)
	b, _ := md.Bitmap(nodeBeta)
	marked, err := md.MarkActivityLog(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * int64(ExtentSize); marked != want || b.Bytes() != want || !b.Test(2*ExtentSize/4096) || !b.Test(7*ExtentSize/4096) || b.Test(0) {
		t.Fatalf("marked %d, bitmap %d bytes; want extents 2 and 7 (%d bytes)", marked, b.Bytes(), want)
	}
	if other, _ := md.Bitmap(3); other.Bytes() != 0 {
		t.Fatalf("peer 3's bitmap got %d bytes", other.Bytes())
	}
	md2 := reopen(t, dev.Crash(), opts)
	if b2, _ := md2.Bitmap(nodeBeta); b2.Bytes() != marked {
		t.Fatalf("after a crash beta's bitmap holds %d bytes, want %d", b2.Bytes(), marked)
	}
}

// TestALLargeBatch: a batch larger than one transaction (64 updates) is
// written as several, at most ring − ceil(al-extents/920) − 1 per sync, so
// that a crash tearing or reordering the unsynced ones never destroys what
// a replay needs: the reopened AL is complete and holds at least the
// extents that were hot before the batch.
func TestALLargeBatch(t *testing.T) {
	opts := testOptions(External)
	opts.ALExtents = 2000
	opts.DeviceSize = 64 << 30
	dev, md := newTestMD(t, opts)
	al := md.ActivityLog()
	for e := range uint64(100) {
		admit(t, al, e)
		done(al, e)
	}

	queue := func(first, n uint64) *alBatch { // n admissions arriving at once
		al.mu.Lock()
		defer al.mu.Unlock()
		for e := first; e < first+n; e++ {
			if al.acquire(e) == nil {
				t.Fatal("no slot")
			}
		}
		return al.next
	}
	b := queue(1000, 600)
	if err := al.await(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	s := al.Stats()
	if s.Transactions-100 != 10 || s.Commits-100 != 3 {
		t.Fatalf("600 queued admissions: %d transactions in %d syncs, want 10 in 3 (4 per sync)", s.Transactions-100, s.Commits-100)
	}
	if got := reopen(t, dev.Crash(), opts).ActivityLog().ActiveExtents(); !slices.Equal(got, al.ActiveExtents()) {
		t.Fatalf("reopened %d extents, want %d", len(got), len(al.ActiveExtents()))
	}
	before := al.ActiveExtents()

	// The second sync of the next large batch fails: power is lost with
	// up to four transactions unsynced, which the disk tears or drops in
	// any order.
	syncs := 0
	dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
		if op.Kind == mdtest.OpSync {
			if syncs++; syncs >= 2 {
				return mdtest.Fault{Err: mdtest.ErrInjected}
			}
		}
		return mdtest.Fault{}
	})
	if err := al.await(context.Background(), queue(5000, 600)); err == nil {
		t.Fatal("commit with a failing sync succeeded")
	}
	r := rand.New(rand.NewPCG(8, 9))
	for range 50 {
		crashed := dev.CrashKeeping(func(int, int64, int) int { return r.IntN(10) - 1 })
		md2 := reopen(t, crashed, opts)
		if md2.Report().ALIncomplete {
			t.Fatalf("AL incomplete after a torn batch: %+v", md2.Report())
		}
		got := md2.ActivityLog().ActiveExtents()
		for _, e := range before {
			if !slices.Contains(got, e) {
				t.Fatalf("extent %d, hot before the torn batch, is lost", e)
			}
		}
	}
}

// TestALConcurrentWrites: many writers, spanning extents, through an AL
// smaller than their working set, never deadlock, and leave an AL that
// reopens to the same hot set.
func TestALConcurrentWrites(t *testing.T) {
	opts := testOptions(External)
	opts.ALExtents = MinALExtents
	dev, md := newTestMD(t, opts)
	al := md.ActivityLog()
	bm, _ := md.Bitmap(nodeBeta)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 10))
			for range 500 {
				off := r.Int64N(40 << ExtentShift)
				length := int64(4096) << r.IntN(11) // up to 4 MiB: may span two extents
				if err := al.Admit(context.Background(), off, length); err != nil {
					t.Error(err)
					return
				}
				bm.SetBits(off, length)
				al.Done(off, length)
			}
		})
	}
	wg.Wait()
	md2 := reopen(t, dev.Crash(), opts)
	active := md2.ActivityLog().ActiveExtents()
	if want := al.ActiveExtents(); !slices.Equal(active, want) {
		t.Fatalf("reopened %v, want %v", active, want)
	}
	// The crash-safety invariant: every bit set in memory is either on
	// disk or inside an extent of the reopened AL (which apply-al marks).
	bm2, _ := md2.Bitmap(nodeBeta)
	for from := int64(0); ; {
		start, n, ok := bm.NextRun(from, 1<<30)
		if !ok {
			break
		}
		for blk := start; blk < start+n; blk++ {
			if !bm2.Test(blk) && !slices.Contains(active, uint64(blk*4096)>>ExtentShift) {
				t.Fatalf("block %d: set in memory, neither on disk nor in the AL", blk)
			}
		}
		from = start + n
	}
	t.Logf("%+v; %d bits set, %d on disk", al.Stats(), bm.Count(), bm2.Count())
}

// TestActivityLogResetAfterTheDiskComesBack: an AL write fails (the disk is
// gone), admissions fail from then on; once the disk works, Reset writes
// the hot set out and admissions go on, and a reopen finds every extent.
func TestActivityLogResetAfterTheDiskComesBack(t *testing.T) {
	opts := testOptions(Internal)
	dev, md := newTestMD(t, opts)
	al := md.ActivityLog()
	ctx := context.Background()
	if err := al.Admit(ctx, 0, 4096); err != nil {
		t.Fatal(err)
	}
	al.Done(0, 4096)
	gone := errors.New("disk gone")
	dev.SetInjector(func(mdtest.Op) mdtest.Fault { return mdtest.Fault{Err: gone} })
	if err := al.Admit(ctx, 10*ExtentSize, 4096); !errors.Is(err, gone) {
		t.Fatalf("admission with the disk gone: %v", err)
	}
	if err := al.Admit(ctx, 20*ExtentSize, 4096); err == nil {
		t.Fatal("the log accepted an admission after failing")
	}
	if err := al.Reset(); err == nil {
		t.Fatal("Reset succeeded with the disk still gone")
	}
	dev.SetInjector(nil)
	if err := al.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := al.Admit(ctx, 30*ExtentSize, 4096); err != nil {
		t.Fatalf("admission after Reset: %v", err)
	}
	al.Done(30*ExtentSize, 4096)
	md2 := reopen(t, dev, opts)
	got := md2.ActivityLog().ActiveExtents()
	for _, want := range []uint64{0, 30} {
		if !slices.Contains(got, want) {
			t.Fatalf("reopened log %v lacks extent %d", got, want)
		}
	}
}

// TestReplicaIndicatorSurvivesACrash: the replica indicator set before a
// secondary applies writes is found after a crash (with the activity log
// it kept), is independent of the primary indicator, and is gone once
// cleared at a clean stop.
func TestReplicaIndicatorSurvivesACrash(t *testing.T) {
	opts := testOptions(Internal)
	dev, md := newTestMD(t, opts)
	if md.CrashedReplica() {
		t.Fatal("a new metadata says it crashed as a replica")
	}
	if err := md.SetReplica(true); err != nil {
		t.Fatal(err)
	}
	admit(t, md.ActivityLog(), 7)
	crashed := dev.Crash()
	md2 := reopen(t, crashed, opts)
	if !md2.CrashedReplica() || md2.CrashedPrimary() {
		t.Fatalf("after a crash: replica %v, primary %v; want the replica indicator only", md2.CrashedReplica(), md2.CrashedPrimary())
	}
	if got := md2.ActivityLog().ActiveExtents(); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("active extents %v, want [7]", got)
	}
	if err := md2.SetReplica(false); err != nil {
		t.Fatal(err)
	}
	if md3 := reopen(t, crashed.Crash(), opts); md3.CrashedReplica() {
		t.Fatal("the replica indicator survived being cleared")
	}
}
