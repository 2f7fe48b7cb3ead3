package node

import (
	"context"
	"os"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestOnlineVerifyFindsSilentDivergenceAndRepairsIt: blocks of beta's
// disk change behind replvol's back; verify, run while writes go on,
// reports exactly those blocks, and --repair makes the replicas equal.
func TestOnlineVerifyFindsSilentDivergenceAndRepairsIt(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	if err := c.vol("alpha").WriteAt(ctx, pattern(3, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	// Silent corruption of 3 blocks on beta.
	f, err := os.OpenFile(c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{4096, 300 << 10, 9 << 20} {
		f.WriteAt([]byte("bit rot"), off+100)
	}
	f.Sync()
	f.Close()

	api := c.nodes["beta"].api
	r, err := api.Verify(ctx, &transport.VerifyRequest{Volume: "vol0"})
	if err != nil || r.Primary != "alpha" {
		t.Fatalf("verify: %+v %v", r, err)
	}
	// Writes go on during the verify; they are not reported.
	writeRandomBlocks(t, c.vol("alpha"), 50, 31)
	eventually(t, func() bool {
		b := replica(c.status(), "beta")
		return b.VerifyTotalBytes > 0 && b.VerifyDoneBytes == b.VerifyTotalBytes && b.Replication == "Connected"
	}, "verify finished")
	if b := replica(c.status(), "beta"); b.VerifyFoundBytes != 3*4096 || b.OutOfSyncBytes != 3*4096 {
		t.Fatalf("verify found %d bytes, out of sync %d; want the 3 corrupted blocks (%d)", b.VerifyFoundBytes, b.OutOfSyncBytes, 3*4096)
	}
	if _, err := api.Verify(ctx, &transport.VerifyRequest{Volume: "vol0", Repair: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		b := replica(c.status(), "beta")
		return b.OutOfSyncBytes == 0 && b.Disk == "UpToDate" && b.Replication == "Connected" && !c.vol("alpha").peers.byName["beta"].verifying.Load()
	}, "repair finished")
	c.requireIdentical()
}
