package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// The rows of DRBD's generation table (replication.CompareUUIDs), each
// built with real nodes. Rows not here are covered elsewhere with real
// nodes: reconnected (TestCleanRestartOfBothNodesResyncsNothing),
// crashed-primary (TestPrimaryCrashResyncsOnlyTheActivityLog), bitmap-self
// (TestCatchUpAfterDisconnectMovesOnlyTheWrittenBlocks), bitmap-peer
// (TestForcedPrimaryWithoutWritesCopiesTheOldPrimarysWrites), bitmap-both
// (TestSplitBrainIsDetectedAndDiscardMyDataRollsBackOnlyTheVictim) and
// unrelated (TestUnrelatedDataIsNeverOverwritten).
//
// DRBD's missed-start rows are not in replvol's table (see CompareUUIDs):
// their shape arises here only from a rollback, TestUUIDRuleHistoryPeer.

// snapshot copies a stopped node's state directory and backing file, the
// way a VM or SAN snapshot of the whole node would.
func (c *testCluster) snapshot(name string) map[string][]byte {
	c.t.Helper()
	files := map[string][]byte{}
	paths := []string{c.cfg.Volumes[0].Disks[name].Paths[0].Path}
	entries, err := os.ReadDir(filepath.Join(c.dir, name))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, e := range entries {
		paths = append(paths, filepath.Join(c.dir, name, e.Name()))
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			c.t.Fatal(err)
		}
		files[p] = b
	}
	return files
}

// restore puts a snapshot back on a stopped node.
func (c *testCluster) restore(files map[string][]byte) {
	c.t.Helper()
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
}

// newSyncedCluster starts alpha and beta and waits for the initial sync.
func newSyncedCluster(t *testing.T, size int64) *testCluster {
	t.Helper()
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	return c
}

// decided returns the rule and decision of primary's last connection to
// peer.
func (c *testCluster) decided(primary, peer string) (rule, decision string) {
	p := c.vol(primary).peers.byName[peer].status()
	return p.SyncRule, p.SyncDecision
}

func (c *testCluster) requireDecision(primary, peer, rule, decision string) {
	c.t.Helper()
	if r, d := c.decided(primary, peer); r != rule || d != decision {
		c.t.Fatalf("%s decided %q by rule %q toward %s, want %q by rule %q", primary, d, r, peer, decision, rule)
	}
}

// A new volume: the configured primary starts a generation, the other node
// has none and gets everything.
func TestUUIDRuleJustCreatedPeer(t *testing.T) {
	const size = 8 << 20
	c := newSyncedCluster(t, size)
	c.requireDecision("alpha", "beta", replication.RuleJustCreatedPeer, "source-set-bitmap")
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != size {
		t.Fatalf("initial sync moved %d bytes, want %d", moved, size)
	}
	c.requireIdentical()
}

// The primary's metadata is created afresh (a replaced disk): it stays
// primary, copies everything from its peer, and serves reads from the peer
// meanwhile.
func TestUUIDRuleJustCreatedSelf(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newSyncedCluster(t, size)
	writeRandomBlocks(t, c.vol("alpha"), 50, 71)
	want := c.disk("beta")[:size]
	c.stop("alpha")
	if _, err := CreateMetadata(c.cfg, "alpha", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	// Four seconds of copying: time to look at it and to pause it, also
	// on a loaded machine.
	c.cfg.Volumes[0].ResyncRate = 2 << 20
	c.start("alpha")
	// While alpha copies, it serves: reads of what it lacks come from beta.
	// The stream shows SyncTarget a moment before the handshake's end
	// opens alpha's IO (peerAnswered), so the wait is for both.
	eventually(t, func() bool {
		st := c.status()
		return replica(st, "alpha").Replication == string(replication.SyncTarget) &&
			replica(st, "beta").Replication == string(replication.SyncSource) &&
			replica(st, "alpha").Disk == string(replication.Inconsistent) &&
			c.vol("alpha").status().Serving
	}, "alpha SyncTarget from beta, Inconsistent, serving")
	got := make([]byte, size)
	if err := c.vol("alpha").ReadAt(context.Background(), got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("alpha does not read beta's data while copying it (err %v)", err)
	}
	if p := c.vol("alpha").peers.byName["beta"].status(); p.ResyncTotalBytes != size || p.ResyncDoneBytes >= size {
		t.Fatalf("pull progress %d of %d, want part of %d", p.ResyncDoneBytes, p.ResyncTotalBytes, size)
	}
	// replctl resync --pause / --resume hold the copy like any resync.
	api := c.nodes["beta"].api
	if _, err := api.Resync(context.Background(), &transport.ResyncRequest{Volume: "vol0", Pause: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		st := c.status()
		return replica(st, "alpha").Replication == string(replication.PausedSyncT) && replica(st, "beta").Replication == string(replication.PausedSyncS)
	}, "the copy paused")
	done := c.vol("alpha").peers.byName["beta"].status().ResyncDoneBytes
	time.Sleep(300 * time.Millisecond)
	if now := c.vol("alpha").peers.byName["beta"].status().ResyncDoneBytes; now > done+1<<20 {
		t.Fatalf("a paused copy moved from %d to %d bytes", done, now)
	}
	if _, err := api.Resync(context.Background(), &transport.ResyncRequest{Volume: "vol0", Resume: true}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireDecision("alpha", "beta", replication.RuleJustCreatedSelf, "target-set-bitmap")
	st := c.status()
	if st.Volumes[0].Primary != "alpha" {
		t.Fatalf("primary is %q, want alpha to stay primary", st.Volumes[0].Primary)
	}
	if moved := replica(st, "alpha").ResyncedBytes; moved != size {
		t.Fatalf("alpha copied %d bytes, want the whole volume (%d)", moved, size)
	}
	if err := c.vol("alpha").ReadAt(context.Background(), got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("alpha does not read back beta's data (err %v)", err)
	}
	c.requireIdentical()
}

// Both disks are re-initialised: nobody has data to copy. The primary
// refuses and says how to go on; forcing it makes its disk the volume's.
func TestUUIDRuleJustCreatedBoth(t *testing.T) {
	const size = 8 << 20
	c := newSyncedCluster(t, size)
	c.stop("alpha")
	c.stop("beta")
	for _, n := range []string{"alpha", "beta"} {
		if _, err := CreateMetadata(c.cfg, n, "vol0", "", true); err != nil {
			t.Fatal(err)
		}
	}
	c.start("beta")
	c.start("alpha")
	eventually(t, func() bool {
		p := c.vol("alpha").peers.byName["beta"].status()
		return p.Replication == "StandAlone" && p.SyncRule == replication.RuleJustCreatedBoth && !strings.Contains(p.Reason, replication.RuleJustCreatedBoth) && strings.Contains(p.Reason, "--force --yes")
	}, "alpha refuses: neither node holds data")
	if err := c.vol("alpha").WriteAt(context.Background(), pattern(1, 4096), 0, false); err == nil {
		t.Fatal("a primary without data took a write")
	}
	if _, err := c.nodes["beta"].api.Primary(context.Background(), &transport.PrimaryRequest{Volume: "vol0", Node: "alpha", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireDecision("alpha", "beta", replication.RuleJustCreatedPeer, "source-set-bitmap")
	c.requireIdentical()
}

// The primary went down after the secondary recorded the end of a resync
// but before it did: it still holds the bitmap generation. The bitmap is
// empty; the connection finishes the resync without moving a byte.
func TestUUIDRuleSyncSourcePeerMissedFinish(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 16<<20)
	c.vol("alpha").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 20, 73)
	c.stop("alpha")
	before := c.snapshot("alpha") // holds beta's bitmap generation
	c.start("alpha")
	c.waitInSync()
	c.stop("alpha")
	state := filepath.Join(c.dir, "alpha", "state.db")
	c.restore(map[string][]byte{state: before[state]})
	moved := replica(c.status(), "beta").ResyncedBytes
	c.start("alpha")
	c.waitInSync()
	if r, d := c.decided("alpha", "beta"); d != "source-use-bitmap" ||
		(r != replication.RuleSyncSourcePeerMissedFinish && r != replication.RuleSyncSourceMissedFinish) {
		t.Fatalf("decided %q by rule %q, want source-use-bitmap by a sync-source missed-finish rule", d, r)
	}
	if m := replica(c.status(), "beta").ResyncedBytes - moved; m != 0 {
		t.Fatalf("moved %d bytes, want none", m)
	}
	c.requireIdentical()
}

// The secondary is rolled back to a snapshot two generations old: the
// primary's bitmap starts later, so it cannot say what differs. The peer's
// generation is in the primary's history: full resync from the primary.
func TestUUIDRuleHistorySelf(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newSyncedCluster(t, size)
	c.stop("beta")
	old := c.snapshot("beta")
	c.start("beta")
	c.waitInSync()
	for i := range 2 { // two disconnected periods: two new generations
		c.vol("beta").setAdminDown(true)
		// alpha's writes miss beta only once its stream to beta ended.
		eventually(t, func() bool { return !c.vol("alpha").peers.byName["beta"].connected() }, "alpha's stream to beta ended")
		writeRandomBlocks(t, c.vol("alpha"), 10, uint64(80+i))
		if i == 0 {
			c.vol("beta").setAdminDown(false)
			c.waitInSync()
			// The resync's end retired the bitmap's generation: the next
			// period tracks beta from the new one.
			eventually(t, func() bool { return !c.vol("alpha").tracking("beta") }, "alpha no longer tracks beta")
		}
	}
	c.stop("beta")
	c.restore(old)
	c.start("beta")
	c.waitInSync()
	c.requireDecision("alpha", "beta", replication.RuleHistorySelf, "source-set-bitmap")
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != size {
		t.Fatalf("moved %d bytes, want the whole volume", moved)
	}
	c.requireIdentical()
}

// The primary is rolled back to an old snapshot; the secondary holds newer
// data. The primary's generation is in the secondary's history: the
// primary copies everything from it, and nothing the secondary holds is
// overwritten with old data.
func TestUUIDRuleHistoryPeer(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newSyncedCluster(t, size)
	c.stop("alpha")
	old := c.snapshot("alpha")
	c.start("alpha")
	c.waitInSync()
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 30, 91)
	c.vol("beta").setAdminDown(false)
	c.waitInSync()
	want := c.disk("beta")[:size]
	c.stop("alpha")
	c.restore(old)
	c.start("alpha")
	c.waitInSync()
	c.requireDecision("alpha", "beta", replication.RuleHistoryPeer, "target-set-bitmap")
	if !bytes.Equal(c.disk("beta")[:size], want) {
		t.Fatal("beta's newer data was overwritten")
	}
	c.requireIdentical()
}

// Both nodes moved on from a common ancestor their bitmaps no longer
// start from: the secondary rolled back to an old snapshot, was forced to
// primary and wrote, while the primary wrote across two generations. A
// split brain whose extent no bitmap knows: both stay StandAlone.
func TestUUIDRuleHistoryBoth(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 8<<20)
	c.stop("beta")
	old := c.snapshot("beta")
	c.start("beta")
	c.waitInSync()
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 10, 93)
	c.vol("beta").setAdminDown(false)
	c.waitInSync()
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 10, 94)
	c.vol("alpha").setAdminDown(true)
	c.stop("beta")
	c.restore(old)
	c.start("beta")
	c.vol("beta").setAdminDown(true)
	if err := c.vol("beta").forcePromote(); err != nil {
		t.Fatal(err)
	}
	writeRandomBlocks(t, c.vol("beta"), 10, 95)
	c.vol("alpha").setAdminDown(false)
	c.vol("beta").setAdminDown(false)
	for _, n := range []string{"alpha", "beta"} {
		eventually(t, func() bool {
			return c.vol(n).status().SplitBrainRule == replication.RuleHistoryBoth
		}, n+" sees a split brain by rule history-both")
	}
	a, b := c.disk("alpha"), c.disk("beta")
	if bytes.Equal(a, b) {
		t.Fatal("the nodes synced")
	}
}

// TestInterruptedResyncResumesWhereItStopped: a full resync is cut off
// part way, by a restart of either node. The target recorded the bitmap's
// generation when the resync started, so the reconnection resumes from the
// bitmap (rule bitmap-self) instead of starting over.
func TestInterruptedResyncResumesWhereItStopped(t *testing.T) {
	beside(t)
	for _, restart := range []string{"beta", "alpha"} {
		t.Run(restart+" restarts", func(t *testing.T) {
			const size = 24 << 20
			c := newTestCluster(t, size)
			// 4 MiB/s: from the third done to the end is 4 s, which the
			// stop must beat (at 12 MiB/s a loaded machine's stop came
			// 1.3 s too late: beta was Consistent, the resync over).
			c.cfg.Volumes[0].ResyncRate = 4 << 20
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			ctx := context.Background()
			if err := c.vol("alpha").WriteAt(ctx, pattern(3, size), 0, false); err != nil {
				t.Fatal(err)
			}
			if _, err := c.nodes["alpha"].api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0"}); err != nil {
				t.Fatal(err)
			}
			eventually(t, func() bool {
				p := c.vol("alpha").peers.byName["beta"].status()
				return p.Replication == string(replication.SyncSource) && p.ResyncDoneBytes >= 8<<20
			}, "a third of the resync done")
			c.stop(restart)
			if restart == "alpha" {
				// The SyncTarget can never be promoted mid-resync.
				if d := c.vol("beta").status().Disk; d != "Inconsistent" {
					t.Fatalf("beta's disk is %s mid-resync, want Inconsistent", d)
				}
				if err := c.vol("beta").forcePromote(); err == nil || !strings.Contains(err.Error(), "middle of a resync") {
					t.Fatalf("forced promotion of a SyncTarget: %v", err)
				}
			}
			c.start(restart)
			c.waitInSync()
			c.requireDecision("alpha", "beta", replication.RuleBitmapSelf, "source-use-bitmap")
			if left := c.vol("alpha").peers.byName["beta"].resyncTotal.Load(); left > size-6<<20 {
				t.Fatalf("the resumed resync had %d bytes to move, want what was left (at most %d)", left, size-6<<20)
			}
			c.requireIdentical()
		})
	}
}

// The primary copied newer data from its peer (rule bitmap-peer) and the
// peer, the old primary, went down before it recorded the end: it still
// holds its bitmap generation toward the primary with equal currents
// (DRBD's sync-target-missed-finish). A primary is never the target of
// that shape: it took the generation with its data, so it is the source
// of what either side marks (primary-missed-finish; nothing: the peer's
// bitmap reached the disk), and the peer's bitmap generation ends with
// that resync.
func TestUUIDRulePrimaryMissedFinish(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 16<<20)
	ctx := context.Background()
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 15, 97)
	c.stop("alpha")
	state := filepath.Join(c.dir, "alpha", "state.db")
	before := c.snapshot("alpha")[state] // alpha's bitmap generation toward beta
	c.vol("beta").setAdminDown(false)
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	c.start("alpha")
	c.waitInSync()
	c.requireDecision("beta", "alpha", replication.RuleBitmapPeer, "target-use-bitmap")
	c.stop("alpha")
	c.restore(map[string][]byte{state: before})
	moved := replica(c.status(), "beta").ResyncedBytes
	c.start("alpha")
	c.waitInSync()
	if r, d := c.decided("beta", "alpha"); d != replication.BitmapResyncSource.String() || r != replication.RulePrimaryMissedFinish {
		t.Fatalf("beta decided %q by rule %q, want %s by %s", d, r, replication.BitmapResyncSource, replication.RulePrimaryMissedFinish)
	}
	if m := replica(c.status(), "beta").ResyncedBytes - moved; m != 0 {
		t.Fatalf("beta copied %d bytes again, want none", m)
	}
	if st := c.status(); st.Volumes[0].Primary != "beta" {
		t.Fatalf("primary %s, want beta", st.Volumes[0].Primary)
	}
	c.requireIdentical()
}

// TestWritesDuringAPullEndOnBothNodes: while the primary copies the whole
// volume from its peer, clients write to it; each block ends with the
// client's data, on both nodes.
func TestWritesDuringAPullEndOnBothNodes(t *testing.T) {
	const size = 16 << 20
	c := newSyncedCluster(t, size)
	writeRandomBlocks(t, c.vol("alpha"), 100, 7)
	c.stop("alpha")
	if _, err := CreateMetadata(c.cfg, "alpha", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].ResyncRate = 16 << 20
	c.start("alpha")
	// Pulling, and serving: the pull starts in the handshake, and the
	// volume serves once the handshake is over.
	eventually(t, func() bool {
		v := c.vol("alpha")
		v.mu.Lock()
		serving := v.st.Serving.IsOpen()
		v.mu.Unlock()
		return v.peers.byName["beta"].pulling.Load() && serving
	}, "alpha copying from beta, and serving")
	ctx := context.Background()
	written := map[int64][]byte{}
	for i := range 200 {
		off := int64((i*7919)%(size/4096)) * 4096 // a different block each time
		if i%3 == 0 {
			off += 512 // partial blocks too: the rest must come from beta
		}
		written[off] = pattern(byte(i), 1024)
		if err := c.vol("alpha").WriteAt(ctx, written[off], off, false); err != nil {
			t.Fatal(err)
		}
	}
	if !c.vol("alpha").peers.byName["beta"].pulling.Load() {
		t.Log("note: the pull ended before the writes did")
	}
	c.waitInSync()
	c.requireIdentical()
	disk := c.disk("alpha")
	for off, data := range written {
		if !bytes.Equal(disk[off:off+1024], data) {
			t.Fatalf("the write at %d did not survive the pull", off)
		}
	}
}

// TestInterruptedPullCopiesThePeersChangesAgain: the forced primary copying the old
// primary's writes restarts part way. It comes back without serving before
// it knows what it misses, and copies again what the old primary's bitmap
// marks (the old primary's changes, not the volume): none is lost.
func TestInterruptedPullCopiesThePeersChangesAgain(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 16<<20)
	ctx := context.Background()
	c.vol("beta").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("alpha"), 400, 99)
	want := c.disk("alpha")
	c.stop("alpha")
	c.vol("beta").setAdminDown(false)
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].ResyncRate = 1 << 20
	c.stop("beta")
	c.start("beta")
	c.start("alpha")
	total := int64(blocks) * 4096
	eventually(t, func() bool {
		p := c.vol("beta").peers.byName["alpha"].status()
		return p.Replication == string(replication.SyncTarget) && p.ResyncDoneBytes >= total/4
	}, "a quarter of the copy done")
	c.stop("beta")
	c.start("beta")
	if err := c.vol("beta").ReadAt(ctx, make([]byte, 4096), 0); err == nil {
		// It may already be copying again; it must not serve stale data
		// before it knows what it misses.
		if p := c.vol("beta").peers.byName["alpha"]; !p.pulling.Load() && !p.inSync() {
			t.Fatal("beta served a read before it knew which blocks it misses")
		}
	}
	eventually(t, func() bool { return c.vol("beta").peers.byName["alpha"].pulling.Load() }, "beta copying again")
	if again := c.vol("beta").peers.byName["alpha"].pullTotal.Load(); again > total {
		t.Fatalf("the copy after the restart had %d bytes to move, want at most alpha's changes (%d)", again, total)
	}
	c.requireDecision("beta", "alpha", replication.RuleBitmapPeer, "target-use-bitmap")
	c.cfg.Volumes[0].ResyncRate = 0
	c.waitInSync()
	size := int(c.cfg.Volumes[0].Size)
	if !bytes.Equal(c.disk("beta")[:size], want[:size]) {
		t.Fatal("beta does not hold alpha's writes")
	}
	c.requireIdentical()
}

// TestAFlushAloneKeepsTheGeneration: a flush while the peer is away
// changes no block: the primary keeps the generation it shares with the
// peer, which reconnects without a resync (a forced primary that only
// flushed still follows an old primary's writes).
func TestAFlushAloneKeepsTheGeneration(t *testing.T) {
	c := newSyncedCluster(t, 8<<20)
	gen := c.vol("alpha").currentGeneration()
	c.vol("beta").setAdminDown(true)
	if err := c.vol("alpha").Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g := c.vol("alpha").currentGeneration(); g != gen {
		t.Fatalf("a flush moved the generation from %s to %s", gen, g)
	}
	c.vol("beta").setAdminDown(false)
	c.waitInSync()
	c.requireDecision("alpha", "beta", replication.RuleReconnected, "no-sync")
}

// TestAWriteAPeerMissesCompletesOnceThePeersInSyncHoldTheNewGeneration:
// alpha, beta and gamma in sync; gamma is disconnected. alpha's first
// write without gamma moves alpha to a new generation, and the write
// completes only once beta, which took the write, holds that generation
// durably: were alpha to crash right then, beta and gamma must not look
// alike (gamma lacks the write). Found by node/sim
// (sim-finding-generation-announce-not-awaited). Every disconnected
// period is tried.
func TestAWriteAPeerMissesCompletesOnceThePeersInSyncHoldTheNewGeneration(t *testing.T) {
	beside(t)
	c := newTestClusterOf(t, 4<<20, "alpha", "beta", "gamma")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	a, b, g := c.vol("alpha"), c.vol("beta"), c.vol("gamma")
	for period := range 6 {
		g.setAdminDown(true)
		eventually(t, func() bool { return a.peers.byName["gamma"].session() == nil }, "gamma disconnected")
		if err := a.WriteAt(context.Background(), pattern(byte(period+1), 4096), int64(period)*4096, false); err != nil {
			t.Fatal(err)
		}
		if ag, bg := a.currentGeneration(), b.currentGeneration(); ag != bg {
			t.Fatalf("period %d: the write gamma missed completed with alpha at generation %s and beta, which took it, still at %s", period, ag, bg)
		}
		g.setAdminDown(false)
		c.waitInSync()
	}
	c.requireIdentical()
}

// syncDoneAckCutter is alpha's stream toward gamma: once cut reports true
// for a frame gamma sent, that frame is dropped and the stream fails, and
// every stream toward gamma fails while blocked is set.
type syncDoneAckCutter struct {
	s       *transport.ReplStream
	cut     func() bool
	blocked *atomic.Bool
}

var errCutByTest = errors.New("stream cut by the test")

func (c syncDoneAckCutter) SendMsg(m any) error {
	if c.blocked.Load() {
		return errCutByTest
	}
	return c.s.Send(m.(*transport.Frame))
}

func (c syncDoneAckCutter) RecvMsg(m any) error {
	if c.blocked.Load() {
		return errCutByTest
	}
	if err := c.s.Recv(m.(*transport.Frame)); err != nil {
		return err
	}
	if c.cut() {
		c.blocked.Store(true)
		return errCutByTest
	}
	return nil
}

func (c syncDoneAckCutter) Context() context.Context { return c.s.Context() }

// TestAPeerThatMayHoldTheGenerationOfAnUnacknowledgedSyncDoneNeverLooksUpToDate:
// alpha, beta and gamma in sync; gamma misses a write and is resynced.
// gamma commits alpha's generation on the sync-done, but its ack never
// reaches alpha: the stream is cut right then, and stays down (and, in
// the second case, alpha crashes and restarts before it writes again).
// alpha, which still tracks gamma, then writes what gamma misses: gamma
// must not be left at the generation alpha and beta hold (were alpha to
// die, beta would find gamma in sync and resync nothing, and gamma, which
// lacks an acknowledged write, could be promoted). When gamma comes back
// it is resynced. Found by node/sim (sim-finding-lost-sync-done-ack, seed
// 9588).
//
// Since the simulation's finding history-full-resync, gamma is resynced
// from alpha's bitmap, not in full.
func TestAPeerThatMayHoldTheGenerationOfAnUnacknowledgedSyncDoneNeverLooksUpToDate(t *testing.T) {
	beside(t)
	t.Run("stream-cut", func(t *testing.T) { testUnacknowledgedSyncDone(t, false) })
	t.Run("then-primary-crash", func(t *testing.T) { testUnacknowledgedSyncDone(t, true) })
}

func testUnacknowledgedSyncDone(t *testing.T, crash bool) {
	c := newTestClusterOf(t, 4<<20, "alpha", "beta", "gamma")
	var armed, blocked atomic.Bool
	opts := c.opts["alpha"]
	opts.WrapStream = func(peer string, s *transport.ReplStream) *transport.ReplStream {
		if peer != "gamma" {
			return s
		}
		cut := func() bool {
			if !armed.Load() {
				return false
			}
			g := c.vol("gamma").currentGeneration()
			return !g.IsZero() && g == c.vol("alpha").currentGeneration()
		}
		return transport.NewReplStream(syncDoneAckCutter{s: s, cut: cut, blocked: &blocked}, s.Close)
	}
	c.opts["alpha"] = opts
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	a, b, g := c.vol("alpha"), c.vol("beta"), c.vol("gamma")
	ctx := context.Background()

	// gamma misses a write: alpha tracks it and moves on.
	g.setAdminDown(true)
	eventually(t, func() bool { return a.peers.byName["gamma"].session() == nil }, "gamma disconnected")
	if err := a.WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	// gamma is resynced; the sync-done's ack is lost.
	armed.Store(true)
	g.setAdminDown(false)
	eventually(t, func() bool { return blocked.Load() }, "the stream to gamma cut after gamma took the sync-done")
	eventually(t, func() bool { return a.peers.byName["gamma"].session() == nil }, "alpha's stream to gamma ended")
	held := g.currentGeneration()
	if !a.tracking("gamma") || held != a.currentGeneration() {
		t.Fatalf("the scenario did not happen: alpha tracks gamma: %v, gamma at %s, alpha at %s", a.tracking("gamma"), held, a.currentGeneration())
	}
	if crash {
		// What alpha knew of the lost ack is gone with it.
		c.crash("alpha")
		c.start("alpha")
		a = c.vol("alpha")
		eventually(t, func() bool { return a.peers.byName["beta"].inSync() }, "beta back in sync with the restarted alpha")
		// Its copy of its activity log to beta moved its data to a new
		// generation (Generations.CrashedPrimaryCopies): gamma, at held,
		// is behind by the generations already, and still tracked.
		if !a.tracking("gamma") || held == a.currentGeneration() {
			t.Fatalf("after the restart: alpha tracks gamma: %v, gamma at %s, alpha at %s (want a new generation)", a.tracking("gamma"), held, a.currentGeneration())
		}
	}

	// alpha writes what gamma misses.
	if err := a.WriteAt(ctx, pattern(2, 4096), 8192, false); err != nil {
		t.Fatal(err)
	}
	if ag, bg := a.currentGeneration(), b.currentGeneration(); ag == held || bg == held {
		t.Fatalf("a write gamma missed completed with gamma at generation %s, alpha at %s and beta at %s: gamma looks as up to date as the nodes that hold the write", held, ag, bg)
	}
	if u := g.currentGeneration(); u != held {
		t.Fatalf("gamma moved from %s to %s while cut off", held, u)
	}

	// gamma comes back: it is resynced, not taken for in sync, from
	// alpha's bitmap, which tracks it from before the generation it holds
	// (bitmap-self-history): what is marked (the write it missed; after
	// alpha's crash, every block, as a bitmap not written out at a crash
	// is), not the whole volume by the generations.
	armed.Store(false)
	blocked.Store(false)
	before, marked := replica(c.status(), "gamma").ResyncedBytes, a.peers.byName["gamma"].bm.Bytes()
	c.waitInSync()
	c.requireDecision("alpha", "gamma", replication.RuleBitmapSelfHistory, replication.BitmapResyncSource.String())
	if moved := replica(c.status(), "gamma").ResyncedBytes - before; moved > marked {
		t.Fatalf("gamma was copied %d bytes, %d were marked for it", moved, marked)
	}
	if !crash && marked >= 4<<20 {
		t.Fatalf("%d bytes marked for one missed write", marked)
	}
	c.requireIdentical()
}

// TestAPullReadsFromItsSourceAndPassesWhatItCopiesOnToTheOtherPeers:
// gamma, the primary, took writes that neither alpha nor beta has, then
// stopped; beta, forced to primary, streams to alpha, in sync with it.
// When gamma comes back, beta copies gamma's newer data (a pull) while
// alpha stays connected and counted in sync. A read of a block beta
// misses meanwhile is served from gamma, the source, never from alpha,
// whose copy is old; and what beta copies goes to alpha too, in its
// stream, so the three end identical. Found by node/sim (seeds 459 and
// 3801 with the model's pull made like node's): the model read from the
// source and passed pulled blocks on, node did neither.
func TestAPullReadsFromItsSourceAndPassesWhatItCopiesOnToTheOtherPeers(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestClusterOf(t, size, "gamma", "alpha", "beta")
	c.startInSync("alpha", "beta", "gamma")
	ctx := context.Background()
	c.vol("alpha").setAdminDown(true)
	c.vol("beta").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("gamma"), 200, 11)
	want := c.disk("gamma")[:size]
	c.stop("gamma")
	c.vol("alpha").setAdminDown(false)
	c.vol("beta").setAdminDown(false)
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return c.vol("beta").peers.byName["alpha"].inSync() }, "beta in sync with alpha")
	// beta's peers in an order that puts the stale one first (the order
	// is a map's otherwise).
	b := c.vol("beta")
	b.mu.Lock()
	slices.SortFunc(b.peers.list, func(x, y *peer) int { return strings.Compare(x.name, y.name) })
	b.mu.Unlock()

	c.cfg.Volumes[0].ResyncRate = 1 << 20 // the pull takes seconds: reads run beside it
	c.start("gamma")
	eventually(t, func() bool { return b.peers.byName["gamma"].pulling.Load() }, "beta copying gamma's writes")
	if got := b.peers.byName["gamma"].pullTotal.Load(); got < int64(blocks)*4096 {
		t.Fatalf("beta pulls %d bytes, want gamma's %d blocks", got, blocks)
	}
	buf := make([]byte, 4096)
	read := 0
	for off := int64(size) - 4096; off >= 0 && b.peers.byName["gamma"].pulling.Load(); off -= 4096 {
		if !b.durable.localMissing.AnySet(off, 4096) || bytes.Equal(want[off:off+4096], make([]byte, 4096)) {
			continue
		}
		if err := b.ReadAt(ctx, buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want[off:off+4096]) && b.durable.localMissing.AnySet(off, 4096) {
			t.Fatalf("beta served a block it misses at %d from a stale copy while it pulls from gamma", off)
		}
		read++
	}
	if read == 0 {
		t.Fatal("no read ran while beta pulled: the test shows nothing")
	}
	c.waitInSync()
	for _, n := range []string{"alpha", "beta"} {
		if !bytes.Equal(c.disk(n)[:size], want) {
			t.Fatalf("%s does not hold gamma's writes after beta pulled them", n)
		}
	}
	// alpha, in sync through the pull, records the generation it brought
	// (beta announces it after the blocks): left at the one before, which
	// beta's history no longer holds, it would meet beta next as a split
	// brain.
	eventually(t, func() bool {
		st := c.status()
		return replica(st, "alpha").Generation == replica(st, "beta").Generation
	}, "alpha records the generation of beta's pull")
	c.requireIdentical()
}

// TestAResyncDuringAPullEndsWithTheGenerationThePullBrings: beta, forced
// to primary, copies alpha in full (a replaced disk) when gamma comes
// back with newer data and beta starts to copy it (a pull: beta's own
// disk holds no generation meanwhile). alpha's resync sends its last
// block during the pull; its end waits for a generation to hand over
// (the pull's): a target given none would drop the one its resync
// resumes from, and volstate refuses it, failing the stream as an entry
// that failed would. alpha's stream never fails, and the three end
// identical at the pull's generation. (Before, alpha took no generation:
// UpToDate at none, it was copied in full at its next connection.)
func TestAResyncDuringAPullEndsWithTheGenerationThePullBrings(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestClusterOf(t, size, "gamma", "alpha", "beta")
	alphaWrites, gammaReads := fault.NewGate(), fault.NewGate()
	alphaWrites.Open()
	gammaReads.Open()
	t.Cleanup(alphaWrites.Open)
	t.Cleanup(gammaReads.Open)
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	// Data all three hold: alpha's copy below moves it, not holes only.
	writeRandomBlocks(t, c.vol("gamma"), 200, 13)
	c.waitInSync()
	ctx := context.Background()
	c.vol("alpha").setAdminDown(true)
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, c.vol("gamma"), 100, 12)
	c.stop("gamma")
	c.stop("alpha")
	c.vol("beta").setAdminDown(false)
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	b := c.vol("beta")

	// alpha comes back with a new disk: beta copies it all, and the
	// copy waits at alpha's disk.
	if _, err := CreateMetadata(c.cfg, "alpha", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	c.opts["alpha"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(fault.On(fault.Write).Range(0, size).Hold(alphaWrites)) })}
	alphaWrites.Shut()
	c.start("alpha")
	if !within(20*time.Second, 20*time.Millisecond, func() bool { return b.peers.byName["alpha"].status().Replication == string(replication.SyncSource) }) {
		t.Fatalf("beta is not resyncing alpha: %+v", b.peers.byName["alpha"].status())
	}
	// gamma's data waits at gamma's disk: beta's pull runs until the test
	// lets it end.
	c.opts["gamma"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(fault.On(fault.Read).Range(0, size).Hold(gammaReads)) })}
	gammaReads.Shut()
	c.start("gamma")
	eventually(t, func() bool { return b.peers.byName["gamma"].pulling.Load() }, "beta copying gamma's writes")
	alphaWrites.Open()
	eventually(t, func() bool { return b.peers.byName["alpha"].bm.Count() == 0 }, "alpha's resync sent and acknowledged")
	if within(2*time.Second, 20*time.Millisecond, func() bool { return c.eventKinds("alpha")["apply-failed"] > 0 }) {
		t.Fatal("alpha's stream failed at the end of its resync during beta's pull: a sync-done with no generation")
	}
	if !b.peers.byName["gamma"].pulling.Load() {
		t.Fatal("the pull ended before alpha's resync: the test shows nothing")
	}
	gammaReads.Open()
	c.waitInSync()
	c.requireIdentical()
	if a, g := c.vol("alpha").currentGeneration(), b.currentGeneration(); a != g || a.IsZero() {
		t.Fatalf("alpha holds generation %s, beta %s", a, g)
	}
	// So a reconnection finds alpha in sync: nothing is copied again.
	c.vol("alpha").setAdminDown(true)
	eventually(t, func() bool { return !b.peers.byName["alpha"].connected() }, "alpha disconnected")
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	c.requireDecision("beta", "alpha", replication.RuleReconnected, replication.NoResync.String())
}

// TestAPrimaryPullsFromOnePeerAtATime: alpha's metadata is created afresh
// (a replaced disk) while beta and gamma hold the data. alpha copies it
// from the first of them to connect; while it does, it holds no
// generation of its own, so the other would look newer too
// (just-created-self) and a second full pull would start beside the
// first, from a peer that may hold less (the sim's seed 54612: one raft
// had Outdated). The other is refused for the time of the pull (cause
// pulling), is connected again once it ends, and nothing is copied from
// it: alpha copies the volume once.
func TestAPrimaryPullsFromOnePeerAtATime(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	writeRandomBlocks(t, c.vol("alpha"), 50, 72)
	c.waitInSync()
	want := c.disk("beta")[:size]
	c.stop("alpha")
	if _, err := CreateMetadata(c.cfg, "alpha", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].ResyncRate = 4 << 20 // two seconds of copying
	c.start("alpha")
	a := c.vol("alpha")
	var src, other string
	eventually(t, func() bool {
		for _, n := range []string{"beta", "gamma"} {
			if a.peers.byName[n].pulling.Load() {
				src, other = n, map[string]string{"beta": "gamma", "gamma": "beta"}[n]
				return true
			}
		}
		return false
	}, "alpha copying from beta or gamma")
	refused := false
	for a.peers.byName[src].pulling.Load() {
		if a.peers.byName[other].pulling.Load() {
			t.Fatalf("alpha copies from %s and %s at once", src, other)
		}
		if st := a.peers.byName[other].status(); st.ReasonCode == string(CausePulling) {
			refused = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !refused {
		t.Errorf("alpha never said it held %s off while it copied from %s (cause %s)", other, src, CausePulling)
	}
	c.waitInSync()
	if moved := replica(c.status(), "alpha").ResyncedBytes; moved != size {
		t.Fatalf("alpha copied %d bytes, want the volume once (%d)", moved, size)
	}
	if got := c.disk("alpha")[:size]; !bytes.Equal(got, want) {
		t.Fatal("alpha does not hold the data after its pull")
	}
	c.requireIdentical()
}
