package node

import (
	"bytes"
	"context"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/multipath/faultpath"
	"github.com/replvol/replvol/replication"
)

// TestLosingEveryPathDetachesTheDiskAndServesFromThePeer: all of alpha's
// paths fail; the primary detaches its disk and goes on serving reads and
// writes through beta with no error; when a path comes back the disk is
// re-attached, catches up from beta, and the replicas end identical.
func TestLosingEveryPathDetachesTheDiskAndServesFromThePeer(t *testing.T) {
	const size = 8 << 20
	c := newTestCluster(t, size)
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	if err := os.Truncate(img, deviceSize(t, size)+multipath.LabelSize); err != nil {
		t.Fatal(err)
	}
	dc := MultiPath(img, img)
	dc.CheckInterval = Duration(50 * time.Millisecond)
	dc.NoPathRetry = -1
	c.cfg.Volumes[0].Disks["alpha"] = dc
	var mu sync.Mutex
	var faults []*faultpath.Path
	c.opts["alpha"] = Options{reattach: reattachPolicy{Probe: 50 * time.Millisecond, Stable: 200 * time.Millisecond}, OpenPath: func(pc PathConfig) (multipath.Path, error) {
		p, err := multipath.OpenFilePath(pc.Name, pc.Path)
		if err != nil {
			return nil, err
		}
		fp := faultpath.New(p)
		mu.Lock()
		faults = append(faults, fp)
		mu.Unlock()
		return fp, nil
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	v := c.vol("alpha")

	before := pattern(1, 64<<10)
	if err := v.WriteAt(ctx, before, 0, false); err != nil {
		t.Fatal(err)
	}
	for _, fp := range faults {
		fp.SetInjector(faultpath.Always(faultpath.Fault{Err: faultpath.ErrInjected}))
	}
	// First a write to a cold extent: its activity-log entry cannot be
	// written, which detaches the disk; the write goes to the peer.
	if err := v.WriteAt(ctx, pattern(4, 4096), 6<<20, false); err != nil {
		t.Fatalf("write to a cold extent with every path gone: %v", err)
	}
	during := pattern(2, 64<<10)
	if err := v.WriteAt(ctx, during, 1<<20, false); err != nil {
		t.Fatalf("write with every path gone: %v", err)
	}
	got := make([]byte, len(before))
	if err := v.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, before) {
		t.Fatalf("read with every path gone: %v, equal %v", err, bytes.Equal(got, before))
	}
	if err := v.ReadAt(ctx, got, 1<<20); err != nil || !bytes.Equal(got, during) {
		t.Fatalf("read back of a write made while detached: %v", err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush while detached: %v", err)
	}
	st := replica(c.status(), "alpha")
	if st.Disk != "Diskless" || st.OutOfSyncBytes != 64<<10+4096 {
		t.Fatalf("alpha while detached: disk %s, out of sync %d", st.Disk, st.OutOfSyncBytes)
	}
	if a := c.disk("alpha")[1<<20 : 1<<20+64<<10]; bytes.Equal(a, during) {
		t.Fatal("the write reached alpha's failed disk")
	}

	for _, fp := range faults {
		fp.SetInjector(nil)
	}
	eventually(t, func() bool {
		r := replica(c.status(), "alpha")
		return r.Disk == "UpToDate" && r.OutOfSyncBytes == 0
	}, "alpha's disk re-attached and caught up")
	c.requireIdentical()
	if err := v.WriteAt(ctx, pattern(3, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	// And after the re-attach the activity log works again.
	if err := v.WriteAt(ctx, pattern(5, 4096), 7<<20, false); err != nil {
		t.Fatal(err)
	}
	if d := replica(c.status(), "alpha").Disk; d != "UpToDate" {
		t.Fatalf("after a write to a cold extent alpha is %s", d)
	}
	c.requireIdentical()
}

// TestDetachNeedsAPeerInSync: with beta disconnected there is nowhere to
// serve from, so the IO error reaches the client.
func TestDetachNeedsAPeerInSync(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.opts["alpha"] = Options{OpenDisk: openFaulty(nil)}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.vol("alpha").setAdminDown(true)
	failReadsAndWrites(c.faultDisk("alpha"))
	if err := c.vol("alpha").WriteAt(context.Background(), pattern(1, 4096), 0, false); err == nil {
		t.Fatal("a write that reached no disk succeeded")
	}
	if c.vol("alpha").isDetached() {
		t.Fatal("detached with no peer in sync")
	}
}

// TestAWriteInFlightAtTheDetachHoldsTheReattachBackAndIsServedByThePeer:
// a write to 1 MiB is at alpha's disk (held there) when another write
// fails and detaches the disk. The disk is not probed, so not re-attached,
// while that write is in flight, however long: a probe writes back what it
// reads, and must never race a client's write. When the held write fails
// too, the peer serves it and the client sees no error; once the disk is
// repaired it is re-attached once and holds both writes.
func TestAWriteInFlightAtTheDetachHoldsTheReattachBackAndIsServedByThePeer(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	fc := clock.NewFake(time.Now())
	c.opts["alpha"] = Options{OpenDisk: openFaulty(nil), reattach: reattachPolicy{clock: fc}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	v := c.vol("alpha")
	fd := c.faultDisk("alpha")

	gate := fault.NewGate()
	t.Cleanup(gate.Open) // before the nodes close, when the test fails early
	fd.Add(fault.On(fault.Write).Range(1<<20, 4096).Hold(gate).Err(syscall.EIO))
	held := make(chan error, 1)
	go func() { held <- v.WriteAt(ctx, pattern(1, 4096), 1<<20, false) }()
	<-gate.Entered // the write is at alpha's disk
	repair := fd.Add(fault.On(fault.Write).Range(3<<20, 4096).Err(syscall.EIO))
	if err := v.WriteAt(ctx, pattern(2, 4096), 3<<20, false); err != nil {
		t.Fatalf("a write that failed on alpha's disk with beta in sync: %v", err)
	}
	if !v.isDetached() {
		t.Fatal("alpha's disk failed a write and is not detached")
	}
	repair()
	// Ten seconds of probe times pass, three times the 3 s a disk must
	// pass its probes for: no probe is made while the write is in flight.
	for i := range 10 {
		// The loop waits on the clock again, or it ended (re-attached).
		if !within(10*time.Second, time.Millisecond, func() bool { return fc.Armed() > 0 || !v.isDetached() }) {
			t.Fatalf("the re-attach loop neither waits on its clock nor re-attached: %+v", replica(c.status(), "alpha"))
		}
		if n := v.dw.probes.Load(); n != 0 || !v.isDetached() {
			t.Fatalf("%d s after the detach, with a write in flight since: %d probes, alpha's disk %s; want none, Diskless", i, n, replica(c.status(), "alpha").Disk)
		}
		fc.Advance(time.Second)
	}

	gate.Open()
	if err := <-held; err != nil {
		t.Fatalf("the write in flight at the detach failed on alpha's disk with beta in sync: %v", err)
	}
	fd.SetInjector(nil) // repaired
	attached := func() bool { return replica(c.status(), "alpha").Disk == "UpToDate" }
	for i := 0; !attached(); i++ {
		if i > 30 || !within(10*time.Second, time.Millisecond, func() bool { return fc.Armed() > 0 || attached() }) {
			t.Fatalf("alpha's disk not re-attached after %d s of probes: %+v", i, replica(c.status(), "alpha"))
		}
		if !attached() {
			fc.Advance(time.Second)
		}
	}
	c.waitInSync()
	c.requireIdentical()
	if a := c.disk("alpha"); !bytes.Equal(a[1<<20:1<<20+4096], pattern(1, 4096)) || !bytes.Equal(a[3<<20:3<<20+4096], pattern(2, 4096)) {
		t.Fatal("alpha's disk does not hold the two writes made while it failed")
	}
	if kinds := c.eventKinds("alpha"); kinds["detached"] != 1 || kinds["attached"] != 1 {
		t.Fatalf("alpha's events: %d detached, %d attached; want 1 and 1", kinds["detached"], kinds["attached"])
	}
}

// TestALocalReadThatFailsIsServedByThePeerAndItsBlocksAreCopiedBack: a
// read fails on alpha's disk while beta is in sync: the client gets
// beta's data, and the disk is detached. The blocks that could not be
// read come back from the repair holding other data (a drive that
// remapped them reads zeroes): the re-attach copies them from beta, as md
// rewrites a bad sector, and the replicas end identical.
func TestALocalReadThatFailsIsServedByThePeerAndItsBlocksAreCopiedBack(t *testing.T) {
	c, v, fd := startReattaching(t)
	ctx := context.Background()
	want := pattern(7, 1<<20)
	if err := v.WriteAt(ctx, want, 2<<20, false); err != nil {
		t.Fatal(err)
	}

	reads := fault.On(fault.Read).Range(2<<20, 1<<20).Err(syscall.EIO)
	fd.Add(reads)
	got := make([]byte, len(want))
	if err := v.ReadAt(ctx, got, 2<<20); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read that failed on alpha's disk with beta in sync: %v, the data written %v", err, bytes.Equal(got, want))
	}
	if !v.isDetached() {
		t.Fatal("alpha's disk failed a read and is not detached")
	}
	// The probes read where the read failed: the disk stays detached.
	eventually(t, func() bool { return reads.Hits() >= 3 }, "alpha's disk probed where it failed")
	if !v.isDetached() {
		t.Fatal("alpha's disk re-attached while it fails to read where it failed")
	}
	c.scribble("alpha", 2<<20, 0)
	fd.SetInjector(nil) // repaired
	eventually(t, func() bool {
		r := replica(c.status(), "alpha")
		return r.Disk == "UpToDate" && r.OutOfSyncBytes == 0
	}, "alpha's disk re-attached")
	c.waitInSync()
	c.requireIdentical()
}

// startReattaching starts alpha, on a fault disk whose re-attach probes
// run every 10 ms and pass after 50 ms, and beta, in sync: alpha's volume
// and its disk.
func startReattaching(t *testing.T) (*testCluster, *Volume, *fault.Disk) {
	t.Helper()
	c := newTestCluster(t, 8<<20)
	c.opts["alpha"] = Options{OpenDisk: openFaulty(nil), reattach: reattachPolicy{Probe: 10 * time.Millisecond, Stable: 50 * time.Millisecond}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	return c, c.vol("alpha"), c.faultDisk("alpha")
}

// TestAReattachEndsOnlyOnceNothingIsMissing: alpha's disk is being
// re-attached, and its copy back has passed every block it missed, when
// a block is marked missing (as a write admitted while the disk was
// detached marks it). The re-attach does not end then: the rules decide
// its end as it is stepped, on the blocks missing by then, so the copy
// goes again, and the disk is UpToDate only once it holds that block too.
func TestAReattachEndsOnlyOnceNothingIsMissing(t *testing.T) {
	c, v, fd := startReattaching(t)
	ctx := context.Background()
	if err := v.WriteAt(ctx, pattern(3, 1<<20), 5<<20, false); err != nil {
		t.Fatal(err)
	}
	// The copy back's last flush, once it copied every block missed, is
	// held.
	gate := fault.NewGate()
	t.Cleanup(gate.Open) // before the nodes close, when the test fails early
	var held atomic.Bool
	fd.Add(fault.InjectorFunc(func(op fault.Op) fault.Fault {
		if op.Kind == fault.Sync && v.state().st.Disk == replication.Inconsistent && v.durable.localMissing.Count() == 0 && held.CompareAndSwap(false, true) {
			return fault.Fault{Hold: gate}
		}
		return fault.Fault{}
	}))
	repair := fd.Add(fault.On(fault.Write).Range(1<<20, 4096).Err(syscall.EIO))
	if err := v.WriteAt(ctx, pattern(1, 4096), 1<<20, false); err != nil {
		t.Fatalf("a write that failed on alpha's disk with beta in sync: %v", err)
	}
	if !v.isDetached() {
		t.Fatal("alpha's disk failed a write and is not detached")
	}
	repair()
	<-gate.Entered
	// The copy passed it: alpha's disk holds other data at 5 MiB now,
	// and that is marked missing.
	c.scribble("alpha", 5<<20, 9)
	v.mu.Lock()
	v.durable.localMissing.SetRange(5<<20, 1<<20)
	v.mu.Unlock()
	gate.Open()
	eventually(t, func() bool { return replica(c.status(), "alpha").Disk == "UpToDate" }, "alpha's disk re-attached")
	if n := v.durable.localMissing.Count(); n != 0 {
		t.Fatalf("alpha's disk UpToDate with %d blocks marked missing", n)
	}
	c.waitInSync()
	c.requireIdentical()
	if a := c.disk("alpha"); !bytes.Equal(a[5<<20:6<<20], pattern(3, 1<<20)) {
		t.Fatal("alpha's disk does not hold the block marked missing after the copy passed it")
	}
}
