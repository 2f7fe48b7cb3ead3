package node

import (
	"context"
	"testing"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// crash stops a node the way kill -9 would: servers gone, nothing
// flushed, the state not marked clean, the primary indicator left set.
func (c *testCluster) crash(name string) {
	c.t.Helper()
	n := c.nodes[name]
	delete(c.nodes, name)
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.repl.Stop()
	n.ctlGRPC.Stop()
	n.http.Close()
	n.httpUnix.Close()
	n.nbd.Shutdown(canceledContext())
	for _, v := range n.volumes() {
		close(v.stopping)
		v.stopPeers()
		v.detachIncoming()
		v.closeMD()
		v.disk.Close()
	}
	close(n.stopLoop)
	n.endLife()
	if n.cl != nil {
		n.cl.c.Close()
	}
	n.closeListeners()
	n.wg.Wait()
	for _, cl := range n.clients {
		cl.Close()
	}
	n.store.Close()
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// syncedWithThreeExtentsWritten is alpha and beta in sync on a 64 MiB
// volume, after alpha wrote 8 KiB of pattern seed into each of three
// 4 MiB activity-log extents.
func syncedWithThreeExtentsWritten(t *testing.T, seed byte) *testCluster {
	t.Helper()
	c := newTestCluster(t, 64<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	for _, off := range []int64{0, 20 << 20, 40<<20 + 4096} {
		if err := c.vol("alpha").WriteAt(context.Background(), pattern(seed, 8192), off, false); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestPrimaryCrashResyncsOnlyTheActivityLog: the primary crashes after
// writing to three 4 MiB extents; when it comes back, only those extents
// are resynced, not the volume.
func TestPrimaryCrashResyncsOnlyTheActivityLog(t *testing.T) {
	c := syncedWithThreeExtentsWritten(t, 7)
	before := replica(c.status(), "beta").ResyncedBytes
	c.crash("alpha")
	c.start("alpha")
	c.waitInSync()
	moved := replica(c.status(), "beta").ResyncedBytes - before
	c.requireDecision("alpha", "beta", replication.RuleCrashedPrimary, "source-use-bitmap")
	if moved <= 0 || moved > 3*(4<<20) {
		t.Fatalf("after a primary crash resync moved %d bytes, want the 3 activity-log extents (at most %d)", moved, 3*(4<<20))
	}
	c.requireIdentical()
}

// TestSecondaryCrashWhileDisconnectedCatchesUpByBitmap: beta goes down
// hard, alpha keeps writing; when beta returns, only what alpha wrote is
// resynced.
func TestSecondaryCrashWhileDisconnectedCatchesUpByBitmap(t *testing.T) {
	c := newTestCluster(t, 32<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.crash("beta")
	blocks := writeRandomBlocks(t, c.vol("alpha"), 200, 11)
	c.start("beta")
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != int64(blocks)*4096 {
		t.Fatalf("resync moved %d bytes, want the %d written blocks (%d bytes)", moved, blocks, blocks*4096)
	}
	c.requireIdentical()
}

// TestPrimaryRestartKeepsItsBitmap: alpha restarts cleanly while beta is
// disconnected; the bitmap it kept on disk still covers what beta missed.
func TestPrimaryRestartKeepsItsBitmap(t *testing.T) {
	c := newTestCluster(t, 32<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	blocks := writeRandomBlocks(t, c.vol("alpha"), 150, 12)
	c.stop("alpha")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != int64(blocks)*4096 {
		t.Fatalf("resync moved %d bytes, want the %d written blocks (%d bytes)", moved, blocks, blocks*4096)
	}
	c.requireIdentical()
}

// TestCleanRestartOfBothNodesResyncsNothing: the generations match and no
// block is marked: the rule "reconnected" fires.
func TestCleanRestartOfBothNodesResyncsNothing(t *testing.T) {
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	writeRandomBlocks(t, c.vol("alpha"), 30, 61)
	c.stop("alpha")
	c.stop("beta")
	c.start("beta")
	c.start("alpha")
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != 0 {
		t.Fatalf("a clean restart of both nodes resynced %d bytes", moved)
	}
	if p := c.vol("alpha").peers["beta"].status(); p.SyncRule != replication.RuleReconnected || p.SyncDecision != "no-sync" {
		t.Fatalf("rule %q, decision %q", p.SyncRule, p.SyncDecision)
	}
	c.requireIdentical()
}

// TestAPromotionKeepsTheBlocksMarkedForThePeers: alpha crashes as primary
// after writing to three extents, so at its restart it marks those
// activity-log extents for beta (beta may lack what alpha wrote last).
// beta is down, so alpha waits, and the operator forces it: a promotion
// at a new epoch. The marks survive it, and when beta returns those
// extents are resynced. A promotion used to clear every peer's bitmap
// ("this node held every write"), and a write that reached alpha's disk
// but not beta's stayed different on the two while both counted in sync
// (the sim's promotion-clears-marks).
func TestAPromotionKeepsTheBlocksMarkedForThePeers(t *testing.T) {
	c := syncedWithThreeExtentsWritten(t, 9)
	ctx := context.Background()
	c.crash("alpha")
	c.stop("beta")
	c.start("alpha")
	v := c.vol("alpha")
	epoch := v.epoch()
	if _, err := c.nodes["alpha"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "alpha", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	if !v.status().Serving || v.epoch() <= epoch {
		t.Fatalf("forced: serving %v, epoch %d (was %d)", v.status().Serving, v.epoch(), epoch)
	}
	c.start("beta")
	c.waitInSync()
	moved := replica(c.status(), "beta").ResyncedBytes // counted since alpha's restart
	if moved <= 0 || moved > 3*(4<<20) {
		t.Fatalf("after the forced promotion of the crashed primary, resync moved %d bytes; want its 3 activity-log extents (more than 0, at most %d)", moved, 3*(4<<20))
	}
	c.requireIdentical()
}
