package node

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSplitBrainIsDetectedAndDiscardMyDataRollsBackOnlyTheVictim: alpha
// and beta lose each other, beta is forced to primary, both take writes.
// When they meet again they refuse to sync (StandAlone, split-brain).
// connect --discard-my-data on alpha then resyncs only the blocks either
// side changed since the split, and alpha ends with beta's data.
func TestSplitBrainIsDetectedAndDiscardMyDataRollsBackOnlyTheVictim(t *testing.T) {
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	base := pattern(1, 64<<10)
	if err := c.vol("alpha").WriteAt(ctx, base, 0, false); err != nil {
		t.Fatal(err)
	}
	// Flushed: beta holds it durably (a write beta held only in its
	// cache at the split would be marked for it too).
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	alphaAPI, betaAPI := c.nodes["alpha"].api, c.nodes["beta"].api

	// The split: no stream either way.
	c.vol("alpha").setAdminDown(true)
	c.vol("beta").setAdminDown(true)
	// A forced promotion needs --yes, and is refused while the primary is reachable.
	if _, err := betaAPI.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true}); err == nil || !strings.Contains(err.Error(), "clean switchover") {
		t.Fatalf("forced promotion with alpha reachable: %v", err)
	}
	if _, err := betaAPI.Promote(ctx, &transport.PromoteRequest{Volume: "vol0", Force: true}); err != nil {
		t.Fatal(err)
	}
	// Both write: alpha 4 blocks at 1 MiB, beta 8 blocks at 2 MiB and one at 1 MiB.
	for i := range 4 {
		if err := c.vol("alpha").WriteAt(ctx, pattern(byte(10+i), 4096), 1<<20+int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		if err := c.vol("beta").WriteAt(ctx, pattern(byte(50+i), 4096), 2<<20+int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.vol("beta").WriteAt(ctx, pattern(99, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}

	// They meet again: split brain, no sync either way.
	c.vol("alpha").setAdminDown(false)
	c.vol("beta").setAdminDown(false)
	for _, n := range []string{"alpha", "beta"} {
		eventually(t, func() bool {
			lv := c.vol(n).status()
			return lv.Replication == "StandAlone" && strings.HasPrefix(lv.Reason, "split-brain") && lv.SplitBrainRule == replication.RuleBitmapBoth
		}, n+" StandAlone with reason split-brain")
		// Words for people in the reason; the rule's name is in the JSON.
		if lv := c.vol(n).status(); strings.Contains(lv.Reason, replication.RuleBitmapBoth) || strings.Contains(lv.Reason, "rule=") {
			t.Fatalf("%s's split-brain reason names the rule: %q", n, lv.Reason)
		}
		eventually(t, func() bool {
			lv := c.vol(n).status()
			return strings.Contains(lv.Reason, "both had written since they last met") || strings.Contains(lv.Reason, "nothing says whose changes to keep")
		}, n+" StandAlone with reason split-brain")
	}
	// One writer: alpha, primary at the older epoch, stopped its IO the
	// moment it met beta's newer one; beta goes on.
	if err := c.vol("alpha").WriteAt(ctx, pattern(7, 4096), 3<<20, false); !errors.Is(err, ErrNotServing) {
		t.Fatalf("alpha (older epoch) wrote after meeting beta in a split brain: %v", err)
	}
	if err := c.vol("beta").WriteAt(ctx, pattern(8, 4096), 3<<20+4096, false); err != nil {
		t.Fatalf("beta (newer epoch) stopped serving at the split brain: %v", err)
	}
	alphaBlock := make([]byte, 4096)
	c.vol("alpha").disk.ReadAt(alphaBlock, 1<<20+4096)
	if !bytes.Equal(alphaBlock, pattern(11, 4096)) {
		t.Fatal("alpha's own write was overwritten before anyone chose a victim")
	}

	// The operator asks what discarding alpha's data costs, then does it.
	r, err := betaAPI.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha", DiscardMyData: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Done || r.DiscardBytes != 4*4096 {
		t.Fatalf("dry run: %+v, want 4 blocks to discard and nothing done", r)
	}
	before := replica(c.status(), "alpha").ResyncedBytes
	if r, err = alphaAPI.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha", DiscardMyData: true, Yes: true}); err != nil || !r.Done {
		t.Fatalf("discard: %+v %v", r, err)
	}
	c.waitInSync()
	st := c.status()
	if st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("after the resolution: primary %s, alpha %s", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}
	// Union of both sides' changes: alpha's 4 blocks (one of them also
	// written by beta) and beta's 9, plus the one beta wrote after.
	if moved := replica(st, "alpha").ResyncedBytes - before; moved != 13*4096 {
		t.Fatalf("resolution resynced %d bytes, want the 13 blocks either side changed (%d)", moved, 13*4096)
	}
	c.requireIdentical()
	got := make([]byte, 4096)
	c.vol("beta").ReadAt(ctx, got, 1<<20+4096)
	if !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("alpha's discarded write survived")
	}
}

// TestForcedPrimaryThenOldPrimaryReturnsWithoutWrites: alpha goes down,
// beta is forced to primary and writes; alpha comes back (as primary, its
// last role) having written nothing. No data diverged (UUID rule
// bitmap-peer on alpha's side): alpha steps down by itself, at beta's newer
// epoch, and only beta's writes move.
func TestForcedPrimaryThenOldPrimaryReturnsWithoutWrites(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	c.stop("alpha")
	betaAPI := c.nodes["beta"].api
	if _, err := betaAPI.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true}); err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("forced promotion without --yes: %v", err)
	}
	forced := time.Now()
	if _, err := betaAPI.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	blocks := writeRandomBlocks(t, c.vol("beta"), 40, 21)
	c.start("alpha")
	c.waitInSync()
	st := c.status()
	// Without raft, the forced node remembers it: the volume's last
	// failover, also once alpha is back.
	if f := st.Volumes[0].LastFailover; f == nil || f.From != "alpha" || f.To != "beta" || !f.Forced || f.Epoch != st.Volumes[0].Epoch ||
		f.At.Before(forced.Add(-time.Second)) || f.At.After(time.Now()) {
		t.Fatalf("last failover %+v, want alpha → beta forced at epoch %d", f, st.Volumes[0].Epoch)
	}
	if st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("primary %s, alpha %s: want beta primary and alpha following it", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}
	if moved := replica(st, "alpha").ResyncedBytes; moved != int64(blocks)*4096 {
		t.Fatalf("moved %d, want beta's %d blocks", moved, blocks)
	}
	if p := c.vol("beta").peers.byName["alpha"].status(); p.SyncRule != replication.RuleBitmapSelf {
		t.Fatalf("beta decided by rule %q (%s), want %s", p.SyncRule, p.SyncDecision, replication.RuleBitmapSelf)
	}
	c.requireIdentical()
}

// TestForcedPrimaryWhileDisconnectedRunsOnOneCopy: beta, disconnected by
// the operator, is forced to primary when alpha is gone. It serves alone
// and stays disconnected (a returning alpha would wait for it), so its
// status keeps the operator's reason and the volume warns that it runs on
// one copy, naming the command; the connect ends the warning.
func TestForcedPrimaryWhileDisconnectedRunsOnOneCopy(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	c.vol("beta").setAdminDown(true)
	c.stop("alpha")
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	st := c.status()
	if b := replica(st, "beta"); b.Role != "Primary" || b.ReasonCode != string(CauseAdminDown) {
		t.Fatalf("beta forced while disconnected: role %s, reason code %q (%s), want Primary and %s", b.Role, b.ReasonCode, b.Reason, CauseAdminDown)
	}
	oneCopy := func(w transport.Warning) bool {
		return w.Kind == transport.WarningOneCopy && w.Node == "beta" && w.Command == "replctl connect vol0 --node beta"
	}
	if !slices.ContainsFunc(st.Warnings, oneCopy) {
		t.Fatalf("warnings %+v, want vol0's one-copy warning naming replctl connect vol0 --node beta", st.Warnings)
	}
	c.vol("beta").setAdminDown(false)
	st = c.status()
	if b := replica(st, "beta"); b.ReasonCode == string(CauseAdminDown) || slices.ContainsFunc(st.Warnings, oneCopy) {
		t.Fatalf("connected again: beta's reason code %q, warnings %+v", b.ReasonCode, st.Warnings)
	}
}

// TestForcedPrimaryWithoutWritesCopiesTheOldPrimarysWrites: alpha writes
// while beta is away, then goes down; beta is forced to primary and has
// written nothing when alpha comes back. The acknowledged writes exist only
// on alpha: beta must not overwrite them. Rule bitmap-peer makes beta, the
// primary, the SyncTarget: alpha steps down, beta copies exactly alpha's
// changes and serves them meanwhile from alpha.
func TestForcedPrimaryWithoutWritesCopiesTheOldPrimarysWrites(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	c.vol("beta").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("alpha"), 25, 23)
	want := c.disk("alpha")
	c.stop("alpha")
	before := replica(c.status(), "beta").ResyncedBytes
	c.vol("beta").setAdminDown(false)
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	c.start("alpha")
	c.waitInSync()
	st := c.status()
	if st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("primary %s, alpha %s: want beta primary and alpha following it", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}
	if p := c.vol("beta").peers.byName["alpha"].status(); p.SyncRule != replication.RuleBitmapPeer || p.SyncDecision != "target-use-bitmap" {
		t.Fatalf("beta decided %q by rule %q, want target-use-bitmap by %s", p.SyncDecision, p.SyncRule, replication.RuleBitmapPeer)
	}
	if moved := replica(st, "beta").ResyncedBytes - before; moved != int64(blocks)*4096 {
		t.Fatalf("beta copied %d bytes, want alpha's %d blocks", moved, blocks)
	}
	// Every byte alpha acknowledged is on beta, read through beta's NBD
	// export path.
	size := int(c.cfg.Volumes[0].Size)
	got := make([]byte, size)
	if err := c.vol("beta").ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[:size]) {
		t.Fatal("beta does not hold alpha's writes")
	}
	c.requireIdentical()
}

// TestSplitBrainPoliciesPickTheVictimThemselves: with an after_sb policy,
// the nodes resolve the split brain without the operator.
func TestSplitBrainPoliciesPickTheVictimThemselves(t *testing.T) {
	beside(t)
	for _, tc := range []struct {
		policy     string
		alphaWrite int // blocks alpha writes after coming back
		victim     string
	}{
		{"discard-zero-changes", 0, "alpha"},
		{"discard-least-changes", 3, "alpha"},
		{"discard-younger-primary", 30, "beta"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			c := newTestCluster(t, 16<<20)
			c.cfg.Volumes[0].AfterSB = tc.policy
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			ctx := context.Background()
			// Split: beta is forced to primary while alpha cannot see it.
			c.vol("alpha").setAdminDown(true)
			c.vol("beta").setAdminDown(true)
			if _, err := c.nodes["beta"].api.Promote(ctx, &transport.PromoteRequest{Volume: "vol0", Force: true}); err != nil {
				t.Fatal(err)
			}
			writeRandomBlocks(t, c.vol("beta"), 10, 41)
			for i := range tc.alphaWrite {
				if err := c.vol("alpha").WriteAt(ctx, pattern(byte(i), 4096), int64(i)*4096, false); err != nil {
					t.Fatal(err)
				}
			}
			c.vol("alpha").setAdminDown(false)
			c.vol("beta").setAdminDown(false)
			c.waitInSync()
			st := c.status()
			survivor := map[string]string{"alpha": "beta", "beta": "alpha"}[tc.victim]
			if st.Volumes[0].Primary != survivor || replica(st, tc.victim).Role != "Secondary" {
				t.Fatalf("primary %s, %s is %s; want %s to have given up", st.Volumes[0].Primary, tc.victim, replica(st, tc.victim).Role, tc.victim)
			}
			c.requireIdentical()
		})
	}
}

// TestAnOldPrimaryIsFencedByANewerEpoch: beta was forced to primary while
// alpha was down. alpha comes back as primary and learns, from beta's
// refusal, that a newer epoch exists: it stops taking writes at once (one
// writer), before beta has reached it, and steps down when beta does.
func TestAnOldPrimaryIsFencedByANewerEpoch(t *testing.T) {
	c := newSyncedCluster(t, 16<<20)
	ctx := context.Background()
	c.stop("alpha")
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	writeRandomBlocks(t, c.vol("beta"), 10, 31)
	c.vol("beta").stopPeers() // beta does not reach alpha yet
	c.start("alpha")
	eventually(t, func() bool { return strings.HasPrefix(c.vol("alpha").status().Reason, "fenced") }, "alpha fenced by beta's newer epoch")
	if err := c.vol("alpha").WriteAt(ctx, pattern(9, 4096), 0, false); err == nil {
		t.Fatal("a fenced old primary took a write")
	}
	b := c.vol("beta")
	b.loop.Ask(func() { // the loop owns the peers' states
		b.mu.Lock()
		b.startPeersLocked()
		b.mu.Unlock()
	})
	c.waitInSync()
	if st := c.status(); st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("primary %s, alpha %s (nodes %+v)", st.Volumes[0].Primary, replica(st, "alpha").Role, st.Nodes)
	}
	c.requireIdentical()
}

// TestSplitBrainUnderRaftIsResolvedByDiscardMyDataAfterTheStepDown: under
// raft, beta goes down and alpha writes alone; then alpha goes down and
// the operator forces beta, Outdated, to primary through raft, and beta
// writes. When alpha comes back, raft has beta primary: alpha steps down
// to Secondary, in a split brain with beta (both changed the data since
// their last common generation). The fix the page and the events give,
// connect --discard-my-data on alpha, works on that Secondary: alpha ends
// UpToDate with beta's data and its own write is gone. A full resync of
// alpha, which cannot cross the split brain, is refused with the reason.
func TestSplitBrainUnderRaftIsResolvedByDiscardMyDataAfterTheStepDown(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	ctx := context.Background()
	a := c.vol("alpha")
	c.crash("beta")
	if err := a.WriteAt(ctx, pattern(11, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	c.crash("alpha")
	c.start("beta")
	eventually(t, func() bool {
		st, err := c.nodes["wit"].clusterStatus(ctx, 0)
		return err == nil && c.nodes["wit"].cl.c.Status().Quorum && replica(st, "beta").Reachable
	}, "beta and the witness hold a raft quorum, beta answers")
	witAPI := c.nodes["wit"].api
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := witAPI.Primary(wctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatalf("forced promotion of beta through raft: %v", err)
	}
	b := c.vol("beta")
	if err := b.WriteAt(ctx, pattern(50, 4096), 2<<20, false); err != nil {
		t.Fatal(err)
	}
	c.start("alpha")
	a = c.vol("alpha")
	eventually(t, func() bool {
		lv := a.status()
		return lv.Role == "Secondary" && lv.ReasonCode == string(CauseSplitBrain) &&
			b.peers.byName["alpha"].status().Replication == string(replication.StandAlone)
	}, "alpha stepped down to Secondary, in a split brain with beta")

	betaAPI := c.nodes["beta"].api
	if _, err := betaAPI.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", Node: "alpha"}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--discard-my-data") {
		t.Fatalf("a full resync of alpha across the split brain: %v; want it refused, naming connect --discard-my-data", err)
	}
	r, err := betaAPI.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha", DiscardMyData: true})
	// alpha's own write, and the activity log's extents it went down with.
	if err != nil || r.Done || r.DiscardBytes < 4096 {
		t.Fatalf("dry run on alpha: %+v %v; want its changes to discard and nothing done", r, err)
	}
	if r, err := betaAPI.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha", DiscardMyData: true, Yes: true}); err != nil || !r.Done {
		t.Fatalf("connect --discard-my-data --node alpha --yes: %+v %v", r, err)
	}
	c.waitInSync()
	st := c.status()
	if st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" || replica(st, "alpha").Disk != "UpToDate" {
		t.Fatalf("after the resolution: primary %s, alpha %s %s", st.Volumes[0].Primary, replica(st, "alpha").Role, replica(st, "alpha").Disk)
	}
	c.requireIdentical()
	got := make([]byte, 4096)
	if err := b.ReadAt(ctx, got, 1<<20); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatalf("alpha's discarded write survived (%v)", err)
	}
}
