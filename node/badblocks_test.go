package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// readRecorder records the reads of a disk (fault.Injector; it injects
// nothing).
type readRecorder struct {
	mu    sync.Mutex
	reads [][2]int64
}

func (r *readRecorder) Inject(op fault.Op) fault.Fault {
	if op.Kind == fault.Read {
		r.mu.Lock()
		r.reads = append(r.reads, [2]int64{op.Off, op.Len})
		r.mu.Unlock()
	}
	return fault.Fault{}
}

func (r *readRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = nil
}

// touched reports whether a read since the last reset touched
// [off, off+length).
func (r *readRecorder) touched(off, length int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range r.reads {
		if rd[0] < off+length && off < rd[0]+rd[1] {
			return true
		}
	}
	return false
}

// badBlocksOf is bad_blocks in name's own status of vol0.
func (c *testCluster) badBlocksOf(name string) int64 {
	c.t.Helper()
	for _, lv := range c.nodes[name].nodeStatus(0).Volumes {
		if lv.Name == "vol0" && lv.Integrity != nil {
			return lv.Integrity.BadBlocks
		}
	}
	c.t.Fatalf("%s: no integrity of vol0 in its status", name)
	return 0
}

// unwritable makes block b of name's disk fail every read and write with
// EIO; the returned function lifts it.
func (c *testCluster) unwritable(name string, b int64) (lift func()) {
	d := c.faultDisk(name)
	r := d.Add(fault.On(fault.Read).Range(b*4096, 4096).Err(syscall.EIO))
	w := d.Add(fault.On(fault.Write).Range(b*4096, 4096).Err(syscall.EIO))
	return func() { r(); w() }
}

// badBlockCluster is a cluster of alpha (primary, its disk a fault disk
// whose reads rec records) and beta in sync, with data written at block
// first and flushed.
func badBlockCluster(t *testing.T, rec *readRecorder, ops *opRecorder, data []byte, first int64) *testCluster {
	t.Helper()
	c := newTestCluster(t, 8<<20)
	c.opts["alpha"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) {
		d.Add(rec)
		if ops != nil {
			d.Add(ops)
		}
	})}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	if err := c.vol("alpha").WriteAt(ctx, data, first*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestABlockThatCannotBeRewrittenIsListedAndReadFromThePeer: the
// primary's disk fails to read one block and to write it back. The
// client gets the data written, the disk stays attached, the block is on
// the bad-block list (status, metric, events, the metadata), and a later
// read of it is served from beta without touching the local block; the
// list survives a restart of both nodes.
func TestABlockThatCannotBeRewrittenIsListedAndReadFromThePeer(t *testing.T) {
	const first = 700
	const bad = first + 2
	rec := &readRecorder{}
	data := randomBytes(61, 4*4096)
	c := badBlockCluster(t, rec, nil, data, first)
	v := c.vol("alpha")
	ctx := context.Background()
	c.unwritable("alpha", bad)
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, first*4096); err != nil {
		t.Fatalf("read with a block that cannot be read nor rewritten: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the read returned other data than was written")
	}
	if e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil); e.Offset != bad*4096 || e.Reason != "read-error" {
		t.Fatalf("block-repaired event: %+v", e)
	}
	e := waitForEvent(t, c.nodes["alpha"], "bad-block", nil)
	if e.Offset != bad*4096 || e.Length != 4096 || e.Peer != "beta" || e.Reason != string(reasonWriteBackFailed) {
		t.Fatalf("bad-block event: %+v", e)
	}
	if v.isDetached() {
		t.Fatal("a block that could not be rewritten detached the disk")
	}
	if n := c.badBlocksOf("alpha"); n != 1 {
		t.Fatalf("status says %d bad blocks, want 1", n)
	}
	waitMetric(t, c.nodes["alpha"], "the bad block", metricIs(1), "replvol_bad_blocks", "volume=vol0", "node=alpha")
	if list := v.durable.md.BadBlocks(); !slices.Equal(list, []metadata.BadBlock{{Block: bad, Kind: metadata.BadBlockUnwritable}}) {
		t.Fatalf("the metadata's bad-block list: %v", list)
	}

	// Read again, the whole range and part of the block alone: from beta.
	rec.reset()
	if err := v.ReadAt(ctx, got, first*4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("second read: %v (right data: %v)", err, bytes.Equal(got, data))
	}
	part := make([]byte, 512)
	if err := v.ReadAt(ctx, part, bad*4096+1024); err != nil || !bytes.Equal(part, data[2*4096+1024:][:512]) {
		t.Fatalf("read of part of the listed block: %v", err)
	}
	if rec.touched(bad*4096, 4096) {
		t.Fatal("a read of a listed block touched it on the local disk")
	}
	if _, repaired, _ := c.integrityOf("alpha"); repaired != 1 {
		t.Fatalf("status says %d blocks repaired, want the 1 of the first read", repaired)
	}

	// A restart remembers it (the fault disk's rules are gone: only the
	// list keeps the block from being read here).
	c.stop("alpha")
	c.stop("beta")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if n := c.badBlocksOf("alpha"); n != 1 {
		t.Fatalf("after a restart status says %d bad blocks, want 1", n)
	}
	// The listed block is read from beta, which must be in sync at the
	// read: on a loaded machine its stream may drop and come back after
	// waitInSync, and a read meanwhile fails (no peer in sync) as it
	// should. Read again until beta is there.
	var err error
	if !within(30*time.Second, 50*time.Millisecond, func() bool {
		rec.reset()
		err = c.vol("alpha").ReadAt(ctx, got, first*4096)
		return err == nil
	}) || !bytes.Equal(got, data) {
		t.Fatalf("read after a restart: %v (right data: %v)", err, bytes.Equal(got, data))
	}
	if rec.touched(bad*4096, 4096) {
		t.Fatal("after a restart, a read of the listed block touched it on the local disk")
	}
}

// TestAWriteOverAListedBlockClearsIt: once the disk writes the block
// again, a client write over it takes it off the list, durably, only
// after the data is synced; it is read from the local disk again.
func TestAWriteOverAListedBlockClearsIt(t *testing.T) {
	const first = 300
	const bad = first + 1
	rec := &readRecorder{}
	ops := &opRecorder{}
	data := randomBytes(62, 2*4096)
	c := badBlockCluster(t, rec, ops, data, first)
	v := c.vol("alpha")
	ctx := context.Background()
	lift := c.unwritable("alpha", bad)
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, first*4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read: %v", err)
	}
	if n := c.badBlocksOf("alpha"); n != 1 {
		t.Fatalf("status says %d bad blocks, want 1", n)
	}
	// A write of part of the block leaves it listed: the rest of it is
	// still what the disk could not rewrite.
	lift()
	if err := v.WriteAt(ctx, randomBytes(63, 512), bad*4096, false); err != nil {
		t.Fatal(err)
	}
	if n := c.badBlocksOf("alpha"); n != 1 {
		t.Fatalf("a write of part of the block: %d bad blocks, want 1", n)
	}
	ops.mu.Lock()
	ops.ops = nil
	ops.mu.Unlock()
	again := randomBytes(64, 4096)
	if err := v.WriteAt(ctx, again, bad*4096, false); err != nil {
		t.Fatal(err)
	}
	if n := c.badBlocksOf("alpha"); n != 0 {
		t.Fatalf("a write over the whole block: %d bad blocks, want 0", n)
	}
	if list := v.durable.md.BadBlocks(); len(list) != 0 {
		t.Fatalf("the metadata still lists %v", list)
	}
	// The order on the disk: the block's data, a sync, then the
	// superblock that drops it.
	size := c.faultDisk("alpha").Size()
	sb := [2]string{fmt.Sprintf("fua@%d", size/4096*4096-8192), fmt.Sprintf("fua@%d", size/4096*4096-4096)}
	ops.mu.Lock()
	seq := slices.Clone(ops.ops)
	ops.mu.Unlock()
	wrote, synced, listed := -1, -1, -1
	for i, op := range seq {
		switch {
		case op == fmt.Sprintf("write@%d", bad*4096) || op == fmt.Sprintf("fua@%d", bad*4096):
			wrote = i
		case op == "sync" && wrote >= 0 && synced < 0:
			synced = i
		case (op == sb[0] || op == sb[1]) && listed < 0:
			listed = i
		}
	}
	if wrote < 0 || synced < wrote || listed < synced {
		t.Fatalf("want the block written, synced, then the superblock written; got %v", seq)
	}
	rec.reset()
	if err := v.ReadAt(ctx, got[:4096], bad*4096); err != nil || !bytes.Equal(got[:4096], again) {
		t.Fatalf("read of the block written again: %v", err)
	}
	if !rec.touched(bad*4096, 4096) {
		t.Fatal("the block off the list is not read from the local disk")
	}
	if v.isDetached() {
		t.Fatal("the disk was detached")
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestAFailedWriteOverAListedBlockDetachesTheDisk: a client write over a
// listed block that the disk fails detaches the disk, as any failed
// write does; the write completes through the peer.
func TestAFailedWriteOverAListedBlockDetachesTheDisk(t *testing.T) {
	const first = 400
	rec := &readRecorder{}
	data := randomBytes(65, 4096)
	c := badBlockCluster(t, rec, nil, data, first)
	v := c.vol("alpha")
	ctx := context.Background()
	c.unwritable("alpha", first)
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, first*4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read: %v", err)
	}
	if n := c.badBlocksOf("alpha"); n != 1 || v.isDetached() {
		t.Fatalf("%d bad blocks, detached %v; want 1, attached", n, v.isDetached())
	}
	again := randomBytes(66, 4096)
	if err := v.WriteAt(ctx, again, first*4096, false); err != nil {
		t.Fatalf("a write the local disk fails, with a peer in sync: %v", err)
	}
	if !v.isDetached() {
		t.Fatal("a failed write over a listed block did not detach the disk")
	}
	if e := waitForEvent(t, c.nodes["alpha"], "detached", nil); e.Reason != string(reasonIOError) {
		t.Fatalf("detached event: %+v", e)
	}
	if err := v.ReadAt(ctx, got, first*4096); err != nil || !bytes.Equal(got, again) {
		t.Fatalf("read through the peer: %v", err)
	}
}

// TestTheDiskIsDetachedWhenTheBadBlockListIsFull: with bad_blocks_max 2,
// the first two blocks that cannot be rewritten are listed, and the
// third detaches the disk with the reason bad-blocks-full; every read
// returns the data written.
func TestTheDiskIsDetachedWhenTheBadBlockListIsFull(t *testing.T) {
	const first = 100
	rec := &readRecorder{}
	data := randomBytes(67, 8*4096)
	c := newTestCluster(t, 8<<20)
	two := 2
	c.cfg.Volumes[0].BadBlocksMax = &two
	c.opts["alpha"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(rec) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	if err := v.WriteAt(ctx, data, first*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, b := range []int64{first + 1, first + 3, first + 6} {
		c.unwritable("alpha", b)
		got := make([]byte, 4096)
		if err := v.ReadAt(ctx, got, b*4096); err != nil || !bytes.Equal(got, data[(b-first)*4096:][:4096]) {
			t.Fatalf("read of bad block %d: %v", i+1, err)
		}
		if i < 2 && v.isDetached() {
			t.Fatalf("bad block %d of bad_blocks_max 2 detached the disk", i+1)
		}
	}
	if !v.isDetached() {
		t.Fatal("a third bad block with bad_blocks_max 2 did not detach the disk")
	}
	e := waitForEvent(t, c.nodes["alpha"], "detached", nil)
	if e.Reason != string(reasonBadBlocksFull) {
		t.Fatalf("detached event: %+v, want reason %s", e, reasonBadBlocksFull)
	}
	v.mu.Lock()
	last := v.dw.last
	v.mu.Unlock()
	if !errors.Is(last.err, errBadBlockListFull) || !errors.Is(last.err, syscall.EIO) {
		t.Fatalf("the detach's failure: %v", last)
	}
	if n := c.badBlocksOf("alpha"); n != 2 {
		t.Fatalf("status says %d bad blocks, want 2", n)
	}
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, first*4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read of the whole range through the peer: %v", err)
	}
}

// TestUnrecoverableBlocksSurviveARestart: a block bad on both replicas is
// counted unrecoverable after a restart of both nodes (the bad-block list
// keeps it), and a write over it clears it for good.
func TestUnrecoverableBlocksSurviveARestart(t *testing.T) {
	const block = 640
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	data := randomBytes(68, 4096)
	if err := c.vol("alpha").WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alpha", "beta"} {
		flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, block*4096+9, 2)
	}
	got := make([]byte, 4096)
	if err := c.vol("alpha").ReadAt(ctx, got, block*4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a block bad on both replicas: %v, want EIO", err)
	}
	restart := func() {
		c.stop("alpha")
		c.stop("beta")
		c.start("alpha")
		c.start("beta")
		c.waitInSync()
	}
	restart()
	if _, _, lost := c.integrityOf("alpha"); lost != 1 {
		t.Fatalf("after a restart status says %d blocks unrecoverable, want 1", lost)
	}
	if n := c.badBlocksOf("alpha"); n != 0 {
		t.Fatalf("an unrecoverable block counts in bad_blocks: %d", n)
	}
	again := randomBytes(69, 4096)
	if err := c.vol("alpha").WriteAt(ctx, again, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if list := c.vol("alpha").durable.md.BadBlocks(); len(list) != 0 {
		t.Fatalf("a write over the block left %v in the metadata", list)
	}
	restart()
	if _, _, lost := c.integrityOf("alpha"); lost != 0 {
		t.Fatalf("after a write and a restart status says %d blocks unrecoverable, want 0", lost)
	}
	if err := c.vol("alpha").ReadAt(ctx, got, block*4096); err != nil || !bytes.Equal(got, again) {
		t.Fatalf("read of the block written again: %v", err)
	}
}

// TestASecondaryNeverReadsABlockOnItsList: a block on beta's bad-block
// list is not read from beta's disk for the primary: alpha, whose copy
// is rotten, finds no good copy (EIO) rather than beta's disk being read.
func TestASecondaryNeverReadsABlockOnItsList(t *testing.T) {
	const block = 820
	rec := &readRecorder{}
	c := newTestCluster(t, 8<<20)
	c.opts["beta"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(rec) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	data := randomBytes(70, 4096)
	if err := c.vol("alpha").WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.vol("beta").durable.integ.listBad(block); err != nil {
		t.Fatal(err)
	}
	flipFileBytes(t, c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path, block*4096+100, 1)
	rec.reset()
	got := make([]byte, 4096)
	if err := c.vol("alpha").ReadAt(ctx, got, block*4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a block rotten on alpha and listed on beta: %v, want EIO", err)
	}
	if rec.touched(block*4096, 4096) {
		t.Fatal("beta read a block on its bad-block list for the primary")
	}
}

// TestASecondaryWhoseBadBlockListIsFullDetachesItsDisk: beta's scrub
// finds a block its disk can neither read nor rewrite, and its list
// (bad_blocks_max 0) has no room: beta detaches its disk as a failed
// replicated write does (event detached, reason bad-blocks-full), and
// alpha's next write finds beta's disk failed: alpha counts beta out of
// sync (reason disk-failed) and tracks what it misses. Once the disk
// works again the resync brings beta back, equal.
func TestASecondaryWhoseBadBlockListIsFullDetachesItsDisk(t *testing.T) {
	const block = 120
	c := newTestCluster(t, 8<<20)
	zero := 0
	c.cfg.Volumes[0].BadBlocksMax = &zero
	c.opts["beta"] = Options{OpenDisk: openFaulty(nil)}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(77, 64*4096), 100*4096)
	c.waitInSync()
	lift := c.unwritable("beta", block)
	if _, err := c.vol("beta").scrubCommand(0, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	e := waitForEvent(t, c.nodes["beta"], "detached", nil)
	if e.Reason != string(reasonBadBlocksFull) {
		t.Fatalf("beta's detached event: %+v, want reason %s", e, reasonBadBlocksFull)
	}
	if d := c.vol("beta").state().st.Disk; d != replication.Failed {
		t.Fatalf("beta's disk is %s, want Failed", d)
	}
	writeRandomBlocks(t, c.vol("alpha"), 8, 78)
	eventually(t, func() bool {
		return c.vol("alpha").peers.byName["beta"].status().ReasonCode == string(CauseDiskFailed) && c.vol("alpha").tracking("beta")
	}, "alpha counts beta's disk failed and tracks what it misses")
	lift()
	c.waitInSync()
	c.requireIdentical()
}
