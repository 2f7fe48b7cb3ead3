package node

import (
	"bytes"
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/node/multipath"
	"github.com/replvol/replvol/node/multipath/faultpath"
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
	c.opts["alpha"] = Options{OpenPath: func(pc PathConfig) (multipath.Path, error) {
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
