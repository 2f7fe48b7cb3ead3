package node

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
)

// The "durable first" steps of a volume, each with its state write failed
// on purpose: the step that depends on the write must not happen.

// faultyStore wraps a node's state store; while failIf says so for a
// volume state, PutVolume fails without writing it. block, when set,
// holds every PutVolume until it is closed.
type faultyStore struct {
	stateStore
	mu     sync.Mutex
	failIf func(statefile.VolumeState) bool
	block  chan struct{}
	failed atomic.Int64
	puts   atomic.Int64
}

var errInjectedStore = errors.New("injected state store failure")

func (s *faultyStore) PutVolume(name string, st statefile.VolumeState) error {
	s.mu.Lock()
	failIf, block := s.failIf, s.block
	s.mu.Unlock()
	s.puts.Add(1)
	if block != nil {
		<-block
	}
	if failIf != nil && failIf(st) {
		s.failed.Add(1)
		return errInjectedStore
	}
	return s.stateStore.PutVolume(name, st)
}

func (s *faultyStore) set(failIf func(statefile.VolumeState) bool) {
	s.mu.Lock()
	s.failIf = failIf
	s.mu.Unlock()
}

// wrapStore returns the faultyStore every test cluster node runs on
// (installed at its start; it passes everything through until set).
func wrapStore(n *Node) *faultyStore { return n.store.(*faultyStore) }

func always(statefile.VolumeState) bool { return true }

// TestAWriteAPeerMissesFailsWhenTheNewGenerationCannotBeRecorded: the
// first write beta misses must move alpha to a new generation, durably,
// BEFORE it is acknowledged. When that cannot be written, the write fails
// (and is not written locally either), alpha stops serving IO, and says
// why; nothing changed in its generations.
func TestAWriteAPeerMissesFailsWhenTheNewGenerationCannotBeRecorded(t *testing.T) {
	c := newSyncedCluster(t, 8<<20)
	v := c.vol("alpha")
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return v.peers.byName["beta"].session() == nil }, "alpha's stream to beta ended")
	gensBefore := v.currentGeneration()
	fs := wrapStore(c.nodes["alpha"])
	fs.set(always)
	before := append([]byte(nil), c.disk("alpha")[1<<20:1<<20+4096]...)
	err := v.WriteAt(context.Background(), pattern(9, 4096), 1<<20, false)
	if !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrStateWrite) {
		t.Fatalf("write beta missed, with the new generation not durable: %v, want EIO (ErrStateWrite)", err)
	}
	if !bytes.Equal(c.disk("alpha")[1<<20:1<<20+4096], before) {
		t.Fatal("the failed write reached alpha's disk")
	}
	if g := v.currentGeneration(); g != gensBefore || v.tracking("beta") {
		t.Fatalf("generation %s (was %s), tracking beta %v: a state that is not on disk is in use", g, gensBefore, v.tracking("beta"))
	}
	st := v.status()
	if st.Serving || st.ReasonCode != string(CauseStateWriteFailed) {
		t.Fatalf("after the failed state write: serving %v, reason %q (%s)", st.Serving, st.ReasonCode, st.Reason)
	}
	if err := v.WriteAt(context.Background(), pattern(9, 4096), 2<<20, false); !errors.Is(err, ErrNotServing) {
		t.Fatalf("a later write: %v, want ErrNotServing", err)
	}
}

// TestAPeerIsNotUpToDateUntilItsBitmapIsRetiredDurably: at the end of a
// resync the primary retires the peer's bitmap generation, durably,
// BEFORE the peer counts as UpToDate. While that write fails the peer
// never shows UpToDate; once it works, the next connection finishes.
func TestAPeerIsNotUpToDateUntilItsBitmapIsRetiredDurably(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 8<<20)
	v := c.vol("alpha")
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return v.peers.byName["beta"].session() == nil }, "alpha's stream to beta ended")
	writeRandomBlocks(t, v, 20, 5)
	if !v.tracking("beta") {
		t.Fatal("alpha does not track beta after writes it missed")
	}
	fs := wrapStore(c.nodes["alpha"])
	retiring := func(st statefile.VolumeState) bool { _, ok := st.PeerBitmaps["beta"]; return !ok }
	fs.set(retiring)
	c.vol("beta").setAdminDown(false)
	eventually(t, func() bool { return fs.failed.Load() >= 2 }, "two failed retirements (the connection is retried)")
	if p := v.peers.byName["beta"].status(); p.PeerDisk == string(replication.UpToDate) {
		t.Fatalf("beta shows UpToDate although its bitmap generation is still on alpha's disk: %+v", p)
	}
	if !v.tracking("beta") {
		t.Fatal("alpha stopped tracking beta without writing it down")
	}
	fs.set(nil)
	c.waitInSync()
	if v.tracking("beta") {
		t.Fatal("beta in sync, but alpha still tracks it")
	}
	c.requireIdentical()
}

// TestADiskIsNotDetachedUnlessTheStoreRecordsIt: detaching a failed disk
// lets writes skip it, so "this disk misses writes" must be in the node's
// store BEFORE. When the store cannot take it, the disk stays attached
// and the client gets the IO error.
func TestADiskIsNotDetachedUnlessTheStoreRecordsIt(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.opts["alpha"] = Options{OpenDisk: openFaulty(nil)}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	fs := wrapStore(c.nodes["alpha"])
	fs.set(func(st statefile.VolumeState) bool { return st.LocalStale })
	failReadsAndWrites(c.faultDisk("alpha"))
	if err := v.WriteAt(context.Background(), pattern(1, 4096), 0, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write to a failed disk that cannot be detached durably: %v, want EIO", err)
	}
	if v.isDetached() {
		t.Fatal("detached although the store did not record it")
	}
	// With the store working the same failure detaches, and the write
	// is served by beta.
	fs.set(nil)
	if err := v.WriteAt(context.Background(), pattern(1, 4096), 0, false); err != nil {
		t.Fatalf("write once the detach can be recorded: %v", err)
	}
	if !v.isDetached() {
		t.Fatal("not detached")
	}
}

// TestStateWritesDoNotHoldUpReads: writing the volume's state (an fsync of
// the store and the superblock) happens without the lock every IO takes:
// while it is slow, reads go on.
func TestStateWritesDoNotHoldUpReads(t *testing.T) {
	c := newSyncedCluster(t, 8<<20)
	v := c.vol("alpha")
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return v.peers.byName["beta"].session() == nil }, "alpha's stream to beta ended")
	fs := wrapStore(c.nodes["alpha"])
	block := make(chan struct{})
	fs.mu.Lock()
	fs.block = block
	fs.mu.Unlock()
	puts := fs.puts.Load()
	wrote := make(chan error, 1)
	go func() { wrote <- v.WriteAt(context.Background(), pattern(2, 4096), 0, false) }()
	eventually(t, func() bool { return fs.puts.Load() > puts }, "the new generation's state write started")
	read := make(chan error, 1)
	go func() { read <- v.ReadAt(context.Background(), make([]byte, 4096), 4<<20) }()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a read waited for a state write")
	}
	st := make(chan struct{})
	go func() { v.status(); close(st) }()
	select {
	case <-st:
	case <-time.After(2 * time.Second):
		t.Fatal("status waited for a state write")
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write completed before its new generation was durable: %v", err)
	default:
	}
	close(block)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

// TestASecondaryOutOfSpaceCatchesUpByBitmap: beta's disk fails writes
// with ENOSPC; alpha goes on and marks what beta missed. Once beta has
// room again it receives those blocks, not a full resync.
func TestASecondaryOutOfSpaceCatchesUpByBitmap(t *testing.T) {
	const size = 16 << 20
	c := newTestCluster(t, size)
	c.opts["beta"] = Options{OpenDisk: openFaulty(nil)}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	roomAgain := c.faultDisk("beta").Add(fault.On(fault.Write).Err(syscall.ENOSPC))
	blocks := writeRandomBlocks(t, c.vol("alpha"), 40, 17)
	eventually(t, func() bool { return c.vol("alpha").tracking("beta") }, "alpha tracks what beta misses")
	eventually(t, func() bool {
		return c.vol("alpha").peers.byName["beta"].status().ReasonCode == string(CauseDiskFailed)
	}, "alpha says beta's disk failed")
	moved := replica(c.status(), "beta").ResyncedBytes
	roomAgain()
	c.waitInSync()
	got := replica(c.status(), "beta").ResyncedBytes - moved
	c.requireDecision("alpha", "beta", replication.RuleBitmapSelf, "source-use-bitmap")
	if got > int64(blocks)*4096 || got == 0 {
		t.Fatalf("after running out of space beta received %d bytes, want the %d blocks it missed at most (%d bytes), not a full resync", got, blocks, blocks*4096)
	}
	c.requireIdentical()
}

// TestASyncDoneOfAnOldStreamIsRefusedWithoutAWrite: beta's stream ended
// and beta connected again when the ack of a sync-done sent on the old
// stream comes. The rules refuse it as the step is taken (that stream is
// not beta's now): beta's bitmap generation stays, nothing is written,
// and the stream that runs goes on. The same ack on the running stream
// retires the bitmap generation, durably.
func TestASyncDoneOfAnOldStreamIsRefusedWithoutAWrite(t *testing.T) {
	c := newSyncedCluster(t, 4<<20)
	v := c.vol("alpha")
	p := v.peers.byName["beta"]
	old := p.session()
	p.restartSession()
	eventually(t, func() bool { s := p.session(); return s != nil && s != old && p.inSync() }, "beta in sync on a new stream")
	now := p.session()
	// beta tracked while its stream runs, as a peer Behind is: a bitmap
	// generation of its own, which a sync-done's ack retires.
	if err := v.track(p, true); err != nil {
		t.Fatal(err)
	}
	if !v.tracking("beta") {
		t.Fatal("alpha does not track beta")
	}
	gen := v.currentGeneration()
	fs := wrapStore(c.nodes["alpha"])
	puts := fs.puts.Load()
	if p.SyncDoneAcked(old, gen) {
		t.Fatal("the ack of a sync-done on beta's old stream made it in sync")
	}
	if n := fs.puts.Load() - puts; n != 0 || !v.tracking("beta") {
		t.Fatalf("after the refused ack: %d state writes, alpha tracks beta %v; want none, true", n, v.tracking("beta"))
	}
	if now.Context().Err() != nil || p.session() != now {
		t.Fatal("the refused ack of beta's old stream ended its running stream")
	}
	if !p.SyncDoneAcked(now, gen) {
		t.Fatal("the ack of a sync-done on beta's running stream was refused")
	}
	if fs.puts.Load() == puts || v.tracking("beta") {
		t.Fatal("the ack on beta's running stream did not retire its bitmap generation durably")
	}
}
