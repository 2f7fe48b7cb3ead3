package node

import (
	"context"
	"strings"
	"testing"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// crash stops a node the way kill -9 would: servers gone, nothing
// flushed, the state not marked clean, the primary indicator left set.
func (c *testCluster) crash(name string) {
	c.t.Helper()
	c.crashThen(name, nil)
}

// crashThen is crash for a power cut: the node's state store is closed
// first, so that nothing the node does from there on reaches stable
// storage, then down is called (the cut disks fail what they hold), then
// the node stops as crash stops it (its servers wait for those
// operations to end).
func (c *testCluster) crashThen(name string, down func()) {
	c.t.Helper()
	n := c.nodes[name]
	if down != nil {
		n.store.Close()
		down()
	}
	delete(c.nodes, name)
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.repl.Stop()
	n.ctlGRPC.Stop()
	n.http.Close()
	n.httpUnix.Close()
	n.nbd.Shutdown(canceledContext())
	// What the node does from here on reaches neither raft nor its state
	// store, as after a kill -9: the end of a primary's streams (which
	// tracks a peer and has raft record it Outdated) writes nothing.
	if n.cl != nil {
		n.cl.c.Close()
	}
	n.store.Close()
	for _, v := range n.volumes() {
		close(v.stopping)
		v.stopPeers()
		v.detachIncoming()
		v.durable.closeMD()
		v.disk.Close()
	}
	close(n.stopLoop)
	n.endLife()
	n.closeListeners()
	n.wg.Wait()
	for _, cl := range n.clients {
		cl.Close()
	}
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
// are resynced, not the volume. The copy (decided by the rule
// crashed-primary) changes the peer's data, so it moves the generation on
// first, and the peer holds the new one once it is done.
func TestPrimaryCrashResyncsOnlyTheActivityLog(t *testing.T) {
	beside(t)
	c := syncedWithThreeExtentsWritten(t, 7)
	before := replica(c.status(), "beta").ResyncedBytes
	gen := c.vol("alpha").currentGeneration()
	c.crash("alpha")
	c.start("alpha")
	c.waitInSync()
	moved := replica(c.status(), "beta").ResyncedBytes - before
	c.requireDecision("alpha", "beta", replication.RuleCrashedPrimary, "source-use-bitmap")
	if moved <= 0 || moved > 3*(4<<20) {
		t.Fatalf("after a primary crash resync moved %d bytes, want the 3 activity-log extents (at most %d)", moved, 3*(4<<20))
	}
	if g, b := c.vol("alpha").currentGeneration(), c.vol("beta").currentGeneration(); g == gen || b != g {
		t.Fatalf("after the copy of the crashed primary's log: alpha holds generation %s (%s before the crash), beta %s; want a new one on both", g, gen, b)
	}
	c.requireIdentical()
}

// TestSecondaryCrashWhileDisconnectedCatchesUpByBitmap: beta goes down
// hard, alpha keeps writing; when beta returns, only what alpha wrote is
// resynced.
func TestSecondaryCrashWhileDisconnectedCatchesUpByBitmap(t *testing.T) {
	beside(t)
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
	beside(t)
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
	if p := c.vol("alpha").peers.byName["beta"].status(); p.SyncRule != replication.RuleReconnected || p.SyncDecision != "no-sync" {
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
	beside(t)
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

// TestACrashedPrimaryForgetsItsCrashOnceResynced: alpha crashes as
// primary and beta is forced to primary; alpha comes back as beta's
// secondary and is resynced from it (its activity log's extents too), so
// nothing of the crash is left. A clean disconnect and connect of alpha by
// the operator afterwards is "reconnected", with nothing to resync: the
// crash of a primary counts until a resync has made the two copies alike,
// not for the rest of the process's life (every connection resynced the
// activity log again, and status named a crash that was over). Nor is a
// later crash of alpha, as a secondary, one of a primary: the indicator
// alpha went down with came off its disk when it followed beta.
func TestACrashedPrimaryForgetsItsCrashOnceResynced(t *testing.T) {
	beside(t)
	c := syncedWithThreeExtentsWritten(t, 9)
	c.crash("alpha")
	ctx := context.Background()
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	c.start("alpha")
	c.waitInSync()
	if st := c.status(); st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("primary %s, alpha %s: want beta primary and alpha its secondary", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}
	rule, decision := c.decided("beta", "alpha")
	t.Logf("alpha's return after its crash: %s by rule %s", decision, rule)

	c.vol("alpha").setAdminDown(true)
	eventually(t, func() bool {
		p := c.vol("beta").peers.byName["alpha"].status()
		return p.Replication != string(replication.Connected) && strings.Contains(p.Reason, "by the operator")
	}, "beta sees alpha disconnected by the operator")
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	c.requireDecision("beta", "alpha", replication.RuleReconnected, "no-sync")

	// alpha crashing now, as a secondary, is no crash of a primary when
	// it comes back (what it may have lost of its applied writes is
	// resynced, by the rule of equal generations).
	c.crash("alpha")
	c.start("alpha")
	c.waitInSync()
	if rule, decision := c.decided("beta", "alpha"); rule != replication.RuleReconnected {
		t.Fatalf("after alpha crashed as a secondary, beta decided %q by rule %q, want rule %q", decision, rule, replication.RuleReconnected)
	}
	c.requireIdentical()
}
