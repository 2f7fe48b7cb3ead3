package node

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newRaftCluster is alpha and beta holding vol0 and the witness wit, each
// with raft and gossip on 127.0.0.1 and tight timings: automatic failover.
func newRaftCluster(t *testing.T, size int64) *testCluster {
	t.Helper()
	c := newTestCluster(t, size)
	for i := range c.cfg.Nodes {
		c.cfg.Nodes[i].Raft, c.cfg.Nodes[i].Gossip = freeAddr(t), freeAddr(t)
	}
	w := NodeConfig{Name: "wit", Role: RoleWitness, StateDir: filepath.Join(c.dir, "wit"), Control: freeAddr(t), Raft: freeAddr(t), Gossip: freeAddr(t)}
	c.cfg.Nodes = append(c.cfg.Nodes, w)
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	timing := cluster.Timing{HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaseDuration: 900 * time.Millisecond}
	for _, n := range []string{"alpha", "beta", "wit"} {
		o := c.opts[n]
		o.ClusterTiming = timing
		c.opts[n] = o
	}
	return c
}

// startRaftServing starts newRaftCluster's three nodes and returns once
// alpha serves under its lease (it wrote 64 KiB of pattern 1 at 0) and
// raft knows beta UpToDate.
func startRaftServing(t *testing.T, size int64) *testCluster {
	t.Helper()
	c := newRaftCluster(t, size)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(context.Background(), pattern(1, 64<<10), 0, false) == nil }, "alpha serves under its lease")
	eventually(t, func() bool {
		va, ok := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return ok && va.IsUpToDate("beta")
	}, "raft knows beta UpToDate")
	return c
}

// TestWhenThePrimaryDiesAnUpToDateNodeTakesOver: alpha, the primary, is
// killed; the raft leader promotes beta once alpha's lease has run out,
// beta serves every write alpha acknowledged, and alpha comes back as an
// UpToDate secondary.
func TestWhenThePrimaryDiesAnUpToDateNodeTakesOver(t *testing.T) {
	const size = 8 << 20
	c := startRaftServing(t, size)
	ctx := context.Background()
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 50, 3)
	want := c.disk("alpha")[:size]
	c.crash("alpha")
	killed := time.Now()
	b := c.vol("beta")
	eventually(t, func() bool { return b.status().Role == "Primary" && b.status().Serving }, "beta promoted")
	if err := b.WriteAt(ctx, pattern(2, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: first write on beta %s after alpha was killed", time.Since(killed).Round(time.Millisecond))
	got := make([]byte, size)
	if err := b.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	copy(want[1<<20:], pattern(2, 4096))
	if !bytes.Equal(got, want) {
		t.Fatal("beta does not hold every write alpha acknowledged")
	}
	c.start("alpha")
	c.waitInSync()
	st := c.status()
	if st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("after alpha came back: primary %s, alpha %s", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}
	// Leadership may be moving right after alpha rejoined.
	eventually(t, func() bool {
		cl := c.status().Cluster
		return cl.Failover == "auto" && cl.Leader != ""
	}, "the cluster status names a leader, failover auto")
	c.requireIdentical()
}

// TestAnOutdatedNodeIsNotPromoted: beta misses a write (it is
// disconnected), so raft records it Outdated before the write completes;
// when alpha dies, nobody is promoted and status says why.
func TestAnOutdatedNodeIsNotPromoted(t *testing.T) {
	c := newRaftCluster(t, 8<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(1, 4096), 0, false) == nil }, "alpha serves")
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return a.peers.byName["beta"].session() == nil }, "beta disconnected")
	if err := a.WriteAt(ctx, pattern(2, 4096), 4096, false); err != nil {
		t.Fatal(err)
	}
	// The write completed once raft committed the record: every state
	// machine applies it. (A leader that is the primary hands its
	// leadership off after cluster.LeadershipSettle, and a new leader may
	// not have applied every committed entry yet when it is asked: the
	// witness's state machine is read, until it has.)
	var va replication.VolumeAuthority
	if !within(5*time.Second, 10*time.Millisecond, func() bool {
		va, _ = c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return va.IsOutdated("beta")
	}) {
		t.Fatalf("a write beta missed completed, but raft does not have beta Outdated: %+v", va)
	}
	epoch := va.Epoch
	c.crash("alpha")
	eventually(t, func() bool {
		return c.status().Cluster.Reason != ""
	}, "status says why nobody takes over")
	holdNotPromoted(t, c, "beta", "alpha", epoch)
	t.Logf("cluster: %+v", c.status().Cluster)
}

// holdNotPromoted asserts, on every look, that candidate is not primary
// and that no live node's raft state machine records another primary
// than lost or another epoch than epoch, until the raft leader's own
// inputs can no longer change its decision: gossip declared lost gone
// (dead or left), and the leader has watched lost renew nothing for longer
// than every wait of its failover rules (UnknownGrace plus twice
// StarvedAfter, so several lease periods). Then no promotion may be in
// flight on any node. A promotion that comes only on a later pass of the
// leader fails here, not only one made when status first gives a reason.
func holdNotPromoted(t *testing.T, c *testCluster, candidate, lost string, epoch uint64) {
	t.Helper()
	lease := c.opts[candidate].ClusterTiming.LeaseDuration
	settled := cluster.UnknownGrace + 2*cluster.StarvedAfter(lease)
	began := time.Now()
	looks := 0
	var why string
	// Under load raft's leadership may move a few times before one
	// leader watches the whole settle time: the bound is generous (the
	// assertion is made on every look, however long it takes).
	bound := settled + 90*time.Second
	if !within(bound, 20*time.Millisecond, func() bool {
		looks++
		if st := c.vol(candidate).status(); st.Role == string(replication.Primary) || st.Serving {
			t.Fatalf("%s, Outdated, became primary (serving %v) %s after %s died", candidate, st.Serving, time.Since(began).Round(time.Millisecond), lost)
		}
		leader := ""
		for name, n := range c.nodes {
			if va, ok := n.cl.c.Authority().Volume("vol0"); !ok || va.Primary != lost || va.Epoch != epoch {
				t.Fatalf("%s's raft state machine has primary %s at epoch %d %s after %s died, want %s at %d",
					name, va.Primary, va.Epoch, time.Since(began).Round(time.Millisecond), lost, lost, epoch)
			}
			if !n.cl.c.LeadingSince().IsZero() {
				leader = name
			}
		}
		if why = c.status().Cluster.Reason; why == "" || leader == "" {
			return false
		}
		l := c.nodes[leader].cl.c
		gone := false
		for _, m := range l.Status().Members {
			if m.Name == lost {
				gone = m.State == cluster.Dead || m.State == cluster.Left
			}
		}
		return gone && l.LeaseIdle("vol0") >= settled
	}) {
		t.Fatalf("the raft leader did not watch %s gone for %s within %s (status: %s)", lost, settled, bound, why)
	}
	for name, n := range c.nodes {
		n.cl.mu.Lock()
		busy := n.cl.promoting["vol0"]
		n.cl.mu.Unlock()
		if busy {
			t.Fatalf("%s is proposing a promotion of vol0 %s after %s died", name, time.Since(began).Round(time.Millisecond), lost)
		}
	}
	t.Logf("%s not promoted over %d looks in %s after the first reason; status: %s", candidate, looks, time.Since(began).Round(time.Millisecond), why)
}

// TestThreeDataReplicasResyncOnlyWhatEachMissed: a volume on alpha, beta
// and gamma. gamma goes down while alpha writes; when it returns only the
// blocks it missed move to it, beta (connected throughout) resyncs
// nothing, and an online verify of both finds nothing.
func TestThreeDataReplicasResyncOnlyWhatEachMissed(t *testing.T) {
	c := startThreeInSync(t, 16<<20)
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 20, 41)
	// Flushed: gamma holds them durably (what it held only in its cache
	// when it went down would be marked for it too).
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	betaBefore := c.vol("beta").counters.resynced.Load()
	c.crash("gamma")
	blocks := writeRandomBlocks(t, a, 60, 42)
	if got := a.peers.byName["gamma"].bm.Bytes(); got != int64(blocks)*4096 {
		t.Fatalf("gamma's bitmap marks %d bytes, want the %d blocks it missed", got, blocks)
	}
	if got := a.peers.byName["beta"].bm.Bytes(); got != 0 {
		t.Fatalf("beta, connected, has %d bytes marked", got)
	}
	c.start("gamma")
	c.waitInSync()
	if moved := c.vol("gamma").counters.resynced.Load(); moved != int64(blocks)*4096 {
		t.Fatalf("gamma received %d bytes, want the %d blocks it missed (%d bytes)", moved, blocks, blocks*4096)
	}
	if moved := c.vol("beta").counters.resynced.Load() - betaBefore; moved != 0 {
		t.Fatalf("beta, which missed nothing, received %d bytes", moved)
	}
	if _, err := a.startVerify(false); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		return !a.peers.byName["beta"].verifying.Load() && !a.peers.byName["gamma"].verifying.Load() &&
			a.peers.byName["beta"].verifyDone.Load() == a.size.Load() && a.peers.byName["gamma"].verifyDone.Load() == a.size.Load()
	}, "both verifies finished")
	if f := a.peers.byName["beta"].verifyFound.Load() + a.peers.byName["gamma"].verifyFound.Load(); f != 0 {
		t.Fatalf("verify found %d bytes out of sync", f)
	}
	c.requireIdentical()
}

// TestRepeatedSwitchoversThroughRaft: the planned switchover, committed
// through raft, back and forth: each one completes and the new primary
// serves.
func TestRepeatedSwitchoversThroughRaft(t *testing.T) {
	c := newRaftCluster(t, 8<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	api := c.nodes["wit"].api
	to := "beta"
	for i := range 10 {
		eventually(t, func() bool {
			st := c.status()
			return replica(st, "alpha").Raft == "UpToDate" && replica(st, "beta").Raft == "UpToDate"
		}, "raft knows both UpToDate")
		r, err := api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: to, Timeout: 10 * time.Second})
		if err != nil {
			for _, n := range []string{"alpha", "beta"} {
				t.Logf("%s: %+v", n, c.vol(n).status())
			}
			t.Fatalf("switchover %d to %s: %v", i, to, err)
		}
		if err := c.vol(to).WriteAt(ctx, pattern(byte(i), 4096), int64(i)*4096, false); err != nil {
			t.Fatalf("write on %s after switchover %d (%+v): %v", to, i, r, err)
		}
		to = map[string]string{"alpha": "beta", "beta": "alpha"}[to]
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestResyncOfOneSecondary: `replctl resync VOL --node gamma` (DRBD's
// invalidate on one node) copies the whole volume to gamma only; beta
// goes on streaming and receives nothing. Naming the primary or a node
// with no replica is refused and starts nothing.
func TestResyncOfOneSecondary(t *testing.T) {
	c := startThreeInSync(t, 8<<20)
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 20, 43)
	betaBefore, gammaBefore := c.vol("beta").counters.resynced.Load(), c.vol("gamma").counters.resynced.Load()
	api := c.nodes["beta"].api // forwarded to the primary
	ctx := context.Background()
	for _, tc := range []struct {
		node string
		code codes.Code
		want string
	}{
		{"alpha", codes.FailedPrecondition, "alpha is the primary of vol0"},
		{"delta", codes.NotFound, "its secondaries are beta, gamma"},
	} {
		_, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", Node: tc.node})
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resync --node %s: %v, want %s with %q", tc.node, err, tc.code, tc.want)
		}
	}
	r, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", Node: "gamma"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Primary != "alpha" || !slices.Equal(r.Peers, []string{"gamma"}) {
		t.Fatalf("resync --node gamma: %+v, want gamma resynced by alpha", r)
	}
	c.waitInSync()
	if moved := c.vol("gamma").counters.resynced.Load() - gammaBefore; moved != a.size.Load() {
		t.Fatalf("gamma received %d bytes, want the whole volume (%d)", moved, a.size.Load())
	}
	if moved := c.vol("beta").counters.resynced.Load() - betaBefore; moved != 0 {
		t.Fatalf("beta, not named, received %d bytes", moved)
	}
	c.requireIdentical()
}

// startThreeInSync starts a volume on alpha (primary), beta and gamma and
// waits until both secondaries are in sync.
func startThreeInSync(t *testing.T, size int64) *testCluster {
	t.Helper()
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	return c
}

// TestTwoVotersLeftMeanNoAutomaticFailover: the witness is removed from
// raft at runtime (replctl node remove), leaving two voters: the loss of
// either would be the loss of the quorum, so status says failover off,
// naming the two voters, although the config file started the cluster
// with three; the volume keeps serving.
func TestTwoVotersLeftMeanNoAutomaticFailover(t *testing.T) {
	c := newRaftCluster(t, 4<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	eventually(t, func() bool { return c.status().Cluster.Failover == "auto" }, "failover auto with three voters")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.nodes["alpha"].api.Membership(ctx, &transport.MembershipRequest{Node: "wit", Remove: true})
	if err != nil || !slices.Equal(r.Voters, []string{"alpha", "beta"}) {
		t.Fatalf("remove the witness: %+v, %v", r, err)
	}
	for _, n := range []string{"alpha", "beta"} {
		cl, _ := c.nodes[n].clusterInfo()
		if cl.Failover != "off" || !strings.Contains(cl.Reason, "2 raft voters (alpha, beta): automatic failover needs three") {
			t.Errorf("status from %s with two voters left: failover %q (%s); want off, naming the two voters", n, cl.Failover, cl.Reason)
		}
	}
	eventually(t, func() bool { return c.vol("alpha").WriteAt(ctx, pattern(3, 4096), 0, false) == nil }, "alpha serves with two voters")
}

// TestSwitchoverToADisconnectedOutdatedNodeIsRefusedAtOnce: beta was
// disconnected by the operator and missed writes (raft has it Outdated).
// A switchover to it cannot complete however long it waits: it is refused
// at once, within a second and not at the caller's timeout, saying why
// and what to do, and alpha goes on serving.
func TestSwitchoverToADisconnectedOutdatedNodeIsRefusedAtOnce(t *testing.T) {
	c := newRaftCluster(t, 4<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // replctl's default --timeout
	defer cancel()
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(1, 4096), 0, false) == nil }, "alpha serves under its lease")
	if _, err := c.nodes["wit"].api.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatal(err)
	}
	writeRandomBlocks(t, a, 5, 7)
	eventually(t, func() bool {
		va, _ := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return va.IsOutdated("beta")
	}, "raft has beta Outdated")

	start := time.Now()
	_, err := c.nodes["wit"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	took := time.Since(start)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("switchover to the disconnected, Outdated beta: %v; want FailedPrecondition", err)
	}
	for _, words := range []string{"beta is not in sync with alpha", "not connected", "disk Outdated", "replctl connect vol0 --node beta", "alpha stays primary"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the refusal %q does not say %q", status.Convert(err).Message(), words)
		}
	}
	// At once: not at the command's 10 s timeout, which a wait for a
	// resync nothing will bring would reach. (5 s, not less: a loaded CI
	// machine delays the status round the refusal is made from.)
	if took > 5*time.Second {
		t.Errorf("the refusal came after %s, want at once, well within the command's 10 s timeout", took)
	}
	t.Logf("refused in %s: %s", took.Round(time.Millisecond), status.Convert(err).Message())
	if err := a.WriteAt(ctx, pattern(2, 4096), 4096, false); err != nil {
		t.Fatalf("alpha stopped serving after the refused switchover: %v", err)
	}
	if r := c.vol("beta").status().Role; r != "Secondary" {
		t.Fatalf("beta is %s after the refused switchover", r)
	}
}

// TestACrashedPrimaryRestartedAfterTheFailoverIsNoSplitBrain: alpha, the
// primary, is killed; raft promotes beta, which writes nothing yet; alpha
// restarts as the primary its metadata says it was. Both nodes then hold
// the same generation and alpha crashed as primary, but alpha's epoch is
// older: it is no split brain. alpha follows beta, its activity log's
// extents come from beta, and neither node records a split brain.
func TestACrashedPrimaryRestartedAfterTheFailoverIsNoSplitBrain(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	c.crash("alpha")
	b := c.vol("beta")
	eventually(t, func() bool { return b.status().Role == "Primary" && b.status().Serving }, "beta promoted")
	c.start("alpha")
	c.waitInSync()
	eventually(t, func() bool { return c.vol("alpha").status().Role == "Secondary" }, "alpha follows beta")
	for _, name := range []string{"alpha", "beta"} {
		evs, err := c.nodes[name].store.Events(1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == "split-brain" {
				t.Fatalf("%s recorded a split brain: %s", name, e.Message)
			}
		}
	}
	c.requireIdentical()
}

// TestAPrimaryForcedWithoutAQuorumKeepsItsWritesWhenRaftReturns: with
// the witness and then alpha gone, beta is forced to primary around raft,
// at an epoch raft has not recorded. Its first write misses alpha, so it
// waits for raft to record alpha Outdated. When the witness returns, raft
// answers that beta is not its primary yet: the write waits for beta's
// own record (which makes alpha Outdated with it) and completes; it is
// not failed. Raft ends with beta primary at beta's epoch and alpha
// Outdated.
func TestAPrimaryForcedWithoutAQuorumKeepsItsWritesWhenRaftReturns(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	c.stop("wit")
	c.crash("alpha")
	ctl, err := transport.DialControl(c.nodes["beta"].ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := ctl.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatalf("forced promotion of beta without a quorum: %v", err)
	}
	b := c.vol("beta")
	if st := b.status(); st.Role != string(replication.Primary) || !st.Serving {
		t.Fatalf("beta after the forced promotion: %+v", st)
	}
	wrote := make(chan error, 1)
	go func() { wrote <- b.WriteAt(ctx, pattern(7, 4096), 2<<20, false) }()
	c.start("wit")
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("beta's write once raft answered again: %v; want it completed", err)
		}
	case <-ctx.Done():
		t.Fatal("beta's write did not complete once raft answered again")
	}
	eventually(t, func() bool {
		va, ok := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return ok && va.Primary == "beta" && va.Epoch == b.epoch() && va.IsOutdated("alpha")
	}, "raft records beta primary at its epoch and alpha Outdated")
	got := make([]byte, 4096)
	if err := b.ReadAt(context.Background(), got, 2<<20); err != nil || !bytes.Equal(got, pattern(7, 4096)) {
		t.Fatalf("beta reads back its write: %v", err)
	}
}

// TestASwitchoverTheClusterFinishedFirstSucceeds: alpha hands vol0 over
// to beta, and before the switchover asks raft to record beta, the
// cluster promotes beta itself (as a failover does when alpha's lease
// runs out during the handover; CI's loaded run saw it). The operator
// asked for beta and beta is primary: the switchover succeeds, at the
// cluster's epoch, and does not give the volume back to alpha.
func TestASwitchoverTheClusterFinishedFirstSucceeds(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	ctx := context.Background()
	w := c.nodes["wit"]
	r := &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 10 * time.Second}
	oldAPI, err := w.peerAPI("alpha")
	if err != nil {
		t.Fatal(err)
	}
	d, err := oldAPI.Demote(ctx, &transport.DemoteRequest{Volume: "vol0", To: "beta", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("alpha's handover: %v", err)
	}
	if _, err := w.cl.c.Propose(ctx, replication.MarkUpToDateCommand("vol0", d.Epoch, "beta")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.cl.c.Propose(ctx, replication.PromoteCommand("vol0", d.Epoch, "beta", false)); err != nil {
		t.Fatal(err)
	}
	rep, err := w.switchoverByRaft(ctx, r, "alpha", d, oldAPI)
	if err != nil {
		t.Fatalf("a switchover the cluster finished first: %v", err)
	}
	if rep.Primary != "beta" || rep.Epoch != d.Epoch+1 {
		t.Fatalf("switchover answered %+v; want beta at epoch %d", rep, d.Epoch+1)
	}
	eventually(t, func() bool { return c.vol("beta").WriteAt(ctx, pattern(2, 4096), 0, false) == nil }, "beta serves")
	if st := c.vol("alpha").status(); st.Role == string(replication.Primary) {
		t.Fatalf("alpha took the volume back: %+v", st)
	}
}

// TestAForcedPrimaryNeverPullsFromAPeerThatMissedItsAcknowledgedWrites:
// gamma, forced to primary (raft's record then holds every other node
// Outdated, whatever each holds), copies beta's newer data (a pull). A
// write during that pull completes on gamma and beta, the pull's source,
// while alpha, the old primary, is away: gamma has raft record alpha
// Outdated. The pull is cut off (beta stops) and alpha comes back, with
// data newer than gamma's by the generations (writes of its own term that
// beta and gamma missed). alpha's copy of the block is older than the
// write gamma acknowledged, so gamma must not pull from it: raft's
// Outdated record of alpha is gamma's own word, made in the forced term,
// not the force's blanket one (VolumeAuthority.OutdatedOnRecord). gamma
// waits for beta, ends its pull from it, then resyncs alpha from its
// bitmap (Generations.PullFinishedWithout), and the write is on every
// node. Found by node/sim once its primaries took writes during a pull
// (seed 2682: the forced primary pulled from the peer that missed the
// write and copied its older block over it).
func TestAForcedPrimaryNeverPullsFromAPeerThatMissedItsAcknowledgedWrites(t *testing.T) {
	const size = 16 << 20
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	for i := range c.cfg.Nodes {
		c.cfg.Nodes[i].Raft, c.cfg.Nodes[i].Gossip = freeAddr(t), freeAddr(t)
	}
	// Two witnesses: gamma and they are a quorum with alpha and beta
	// both down.
	for _, w := range []string{"wit1", "wit2"} {
		c.cfg.Nodes = append(c.cfg.Nodes, NodeConfig{Name: w, Role: RoleWitness, StateDir: filepath.Join(c.dir, w), Control: freeAddr(t), Raft: freeAddr(t), Gossip: freeAddr(t)})
	}
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	timing := cluster.Timing{HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaseDuration: 900 * time.Millisecond}
	for _, nc := range c.cfg.Nodes {
		o := c.opts[nc.Name]
		o.ClusterTiming = timing
		c.opts[nc.Name] = o
	}
	for _, n := range []string{"wit1", "wit2", "alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	ctx := context.Background()
	authority := func() replication.VolumeAuthority {
		va, _ := c.nodes["wit1"].cl.c.Authority().Volume("vol0")
		return va
	}
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(1, 4096), 0, false) == nil }, "alpha serves under its lease")
	eventually(t, func() bool { return authority().IsUpToDate("beta") && authority().IsUpToDate("gamma") }, "raft knows beta and gamma UpToDate")

	// alpha writes what gamma misses, then what beta misses too, and stops:
	// raft counts no node UpToDate but alpha, and the operator forces
	// gamma, the oldest copy.
	c.vol("gamma").setAdminDown(true)
	writeRandomBlocks(t, a, 1500, 5)
	c.vol("beta").setAdminDown(true)
	writeRandomBlocks(t, a, 50, 6)
	c.stop("alpha")
	c.stop("beta")
	c.vol("gamma").setAdminDown(false)
	if _, err := c.nodes["gamma"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "gamma", Force: true, Yes: true}); err != nil {
		t.Fatalf("force gamma: %v", err)
	}
	g := c.vol("gamma")

	// beta comes back: gamma pulls its newer data, slowly (its copy's
	// pace), and writes meanwhile.
	slow, unpaced := int64(1<<20), int64(0)
	if _, err := g.adjust("", "", &slow); err != nil {
		t.Fatal(err)
	}
	c.start("beta")
	eventually(t, func() bool { return g.peers.byName["beta"].pulling.Load() }, "gamma copying beta's newer data")
	const off = 12 << 20
	written := pattern(9, 4096)
	if err := g.WriteAt(ctx, written, off, true); err != nil {
		t.Fatalf("a write during the pull: %v", err)
	}
	if !g.peers.byName["beta"].pulling.Load() {
		t.Fatal("the pull ended before the write did: the test shows nothing")
	}
	// (Committed before the write completed; applied on wit1 soon after.)
	eventually(t, func() bool { va := authority(); return va.ForcedAt(va.Epoch) && va.OutdatedOnRecord("alpha") },
		"raft records alpha Outdated on the forced primary's word")
	c.stop("beta")

	// alpha returns, newer than gamma by the generations, without the
	// write: nothing is copied from it while gamma holds no generation.
	if _, err := g.adjust("", "", &unpaced); err != nil {
		t.Fatal(err)
	}
	c.start("alpha")
	onDisk := func(name string) []byte {
		buf := make([]byte, len(written))
		if _, err := c.vol(name).disk.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	ga := g.peers.byName["alpha"]
	var pulled, lost bool
	held := within(10*time.Second, 5*time.Millisecond, func() bool {
		pulled = pulled || ga.pulling.Load()
		lost = lost || !bytes.Equal(onDisk("gamma"), written)
		return pulled || lost || ga.status().ReasonCode == string(CausePulling)
	})
	switch {
	case lost:
		t.Fatal("gamma lost the write it acknowledged during its pull: it copied alpha's older block over it")
	case pulled:
		t.Fatal("gamma pulls from alpha, which missed a write gamma acknowledged")
	case !held:
		t.Fatalf("gamma never held alpha off while its pull from beta is cut off: %+v", ga.status())
	}

	c.start("beta")
	c.waitInSync()
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if !bytes.Equal(onDisk(n), written) {
			t.Fatalf("%s does not hold the write gamma acknowledged during its pull", n)
		}
	}
	c.requireIdentical()
}
