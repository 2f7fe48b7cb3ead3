package node

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestAResyncNeverShipsABlockThatFailsItsChecksum: beta misses a write
// (disconnected), and the block it would get rots on alpha, the only
// replica that holds it. The resync does not ship it as good: beta is
// never UpToDate while the block is bad, alpha's event names the block
// and the peer's reason is source-unrecoverable; beta's copy of the
// block never becomes the rotten bytes. A write of the block lets the
// resync finish, and the replicas are equal.
func TestAResyncNeverShipsABlockThatFailsItsChecksum(t *testing.T) {
	const block = 300
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	ctx := context.Background()
	a.setAdminDown(true)
	data := randomBytes(71, 4*4096)
	if err := a.WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	flipFileBytes(t, img, (block+2)*4096+100, 4)
	rotten := fileBytes(t, img, (block+2)*4096, 4096)
	a.setAdminDown(false)

	e := waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", nil)
	if e.Offset != (block+2)*4096 || e.Length != 4096 {
		t.Fatalf("block-unrecoverable event: %+v; want the block at %d", e, (block+2)*4096)
	}
	eventually(t, func() bool {
		for _, p := range a.status().Peers {
			if p.Node == "beta" && p.ReasonCode == string(CauseSourceUnrecoverable) {
				return true
			}
		}
		return false
	}, "beta's reason is source-unrecoverable")
	betaImg := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r := replica(c.status(), "beta"); r.Disk == "UpToDate" && r.OutOfSyncBytes == 0 {
			t.Fatalf("beta is UpToDate although alpha holds a block bad that beta lacks: %+v", r)
		}
		if bytes.Equal(fileBytes(t, betaImg, (block+2)*4096, 4096), rotten) {
			t.Fatal("the resync shipped the rotten block to beta")
		}
		time.Sleep(50 * time.Millisecond)
	}

	fresh := randomBytes(72, 4096)
	if err := a.WriteAt(ctx, fresh, (block+2)*4096, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
	if got := fileBytes(t, betaImg, (block+2)*4096, 4096); !bytes.Equal(got, fresh) {
		t.Fatal("beta does not hold the block written after the rot")
	}
}
