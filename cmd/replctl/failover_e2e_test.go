package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Cluster membership decides the primary: end-to-end tests with replnode
// processes, raft and memberlist on 127.0.0.1 or in network namespaces.

// TestE2EKill9ThePrimaryThreeTimes: two data nodes and a witness. While
// clients write (every acknowledged write recorded) and read and write a
// few registers, the primary is killed with SIGKILL three times in a row,
// alternating nodes. Each time the other node serves within seconds, by
// itself; the killed node comes back as an UpToDate Secondary. At the end
// every acknowledged write reads back and the register history is
// linearizable; on_promote ran on each new primary, on_demote on each old
// one when it came back.
func TestE2EKill9ThePrimaryThreeTimes(t *testing.T) {
	e2e(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 64 << 20, RecordHooks: true})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	rec := newOpRecorder()
	stopClients := startRegisterClients(t, c.targets(), rec, registerOpts{Clients: 2, Blocks: 4, OpTimeout: 3 * time.Second, Think: 3 * time.Millisecond})
	aw := startAckWriter(t, c.targets(), ackWriterOpts{Writers: 2, Base: 8 << 20, Limit: 64 << 20, OpTimeout: 3 * time.Second, Think: time.Millisecond})
	aw.waitAck(t, time.Time{}, 15*time.Second, "a write acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" })

	primary, other := "alpha", "beta"
	var times []time.Duration
	for round := 1; round <= 3; round++ {
		killed := time.Now()
		c.kill(primary)
		first := aw.waitAck(t, killed, 20*time.Second, fmt.Sprintf("round %d: a write acknowledged by %s", round, other),
			func(a ackedWrite) bool { return a.Node == other })
		took := first.At.Sub(killed)
		times = append(times, took)
		t.Logf("round %d: kill -9 %s; first write acknowledged by %s %s later", round, primary, other, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("round %d: failover took %s, want at most 5 s", round, took)
		}
		c.start(primary)
		v := c.waitFor(other, fmt.Sprintf("round %d: %s back as an UpToDate Secondary", round, primary), 60*time.Second, func(v *volumeStatus) bool {
			r := v.replica(primary)
			return v.Primary == other && r != nil && r.Role == "Secondary" && raftInSync(v)
		})
		if sb := splitBrainReason(v); sb != "" {
			t.Fatalf("round %d: split brain reported: %s", round, sb)
		}
		primary, other = other, primary
	}
	stopClients()
	acked, unacked := aw.stop()
	checkLinearizable(t, rec.history(), linearizabilityTimeout)
	verifyAcked(t, c.targets(), acked, unacked, 30*time.Second)
	slices.Sort(times)
	t.Logf("failover (kill -9 → first write on the new primary): median %s, worst %s", times[1].Round(time.Millisecond), times[2].Round(time.Millisecond))

	// Hooks: a promotion on the new primary each round, a demotion on the
	// old one when it came back.
	promoted, demoted := map[string]int{}, map[string]int{}
	for _, h := range c.hookRuns() {
		switch h.Kind {
		case "promote":
			promoted[h.Node]++
		case "demote":
			demoted[h.Node]++
		}
	}
	if promoted["alpha"]+promoted["beta"] < 3 || demoted["alpha"]+demoted["beta"] < 3 {
		t.Fatalf("hooks ran: on_promote %v, on_demote %v; want three of each", promoted, demoted)
	}
}

// TestE2ETwoDataNodesWithoutAWitnessDoNotFailOver: with two raft voters
// the loss of either is the loss of the quorum: failover is off, status
// says so naming the quorum, and killing the primary promotes nobody.
func TestE2ETwoDataNodesWithoutAWitnessDoNotFailOver(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Size: 32 << 20})
	c.startAll()
	v := c.waitInSync("alpha")
	s, _, err := c.status("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if s.Cluster.Failover != "off" || !strings.Contains(s.Cluster.Reason, "quorum") {
		t.Fatalf("two data nodes, no witness: cluster %+v; want failover off, the reason naming the quorum", s.Cluster)
	}
	c.kill("alpha")
	// A failover would be done in about two seconds; give it four.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if _, v, err = c.status("beta"); err == nil && v.replica("beta").Role == "Primary" {
			t.Fatal("beta promoted itself without a quorum")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := v.replica("beta"); r == nil || r.Role != "Secondary" {
		t.Fatalf("beta after alpha died: %+v", r)
	}
}

// TestE2EAnOutdatedNodeIsNotPromotedByItself: beta is disconnected and
// misses writes (raft records it Outdated before they complete); when
// alpha dies nobody is promoted and status says why. The operator can
// still force beta, through raft, knowing what is lost.
func TestE2EAnOutdatedNodeIsNotPromotedByItself(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 32 << 20})
	c.startAll()
	c.waitInSync("alpha")
	c.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	qemuIOEventually(t, 10*time.Second, "with beta disconnected", c.uri("alpha"), "write -P 0x7a 0 1M", "flush")
	c.kill("alpha")
	v := c.waitFor("beta", "status says why nobody takes over", 20*time.Second, func(v *volumeStatus) bool {
		s, _, err := c.status("beta")
		return err == nil && strings.Contains(s.Cluster.Reason, "Outdated")
	})
	if r := v.replica("beta"); r.Role != "Secondary" {
		t.Fatalf("the Outdated beta was promoted by itself: %+v", r)
	}
	if r := c.ctl("beta", "primary", volName, "--node", "beta", "--force", "--yes"); !r.ok() {
		t.Fatalf("forced promotion of the Outdated beta: %s", r)
	}
	qemuIOEventually(t, 15*time.Second, "after the forced promotion", c.uri("beta"), "write -P 0x7b 2M 64k", "read -P 0x7b 2M 64k")
}

// TestE2ESwitchoverToADisconnectedOutdatedNodeIsRefusedAtOnce: beta is
// disconnected and misses writes (raft has it Outdated). replctl primary
// vol0 --node beta cannot succeed however long it waits: it is refused at
// once, saying why and what to do, instead of running into --timeout
// with "the switchover may or may not have happened"; alpha stays
// primary.
func TestE2ESwitchoverToADisconnectedOutdatedNodeIsRefusedAtOnce(t *testing.T) {
	e2e(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 16 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	c.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	qemuIOEventually(t, 10*time.Second, "with beta disconnected", c.uri("alpha"), "write -P 0x7a 0 1M", "flush")
	c.waitFor("alpha", "raft has beta Outdated", 10*time.Second, func(v *volumeStatus) bool { return v.replica("beta").Raft == "Outdated" })
	start := time.Now()
	r := c.ctl(witnessName, "primary", volName, "--node", "beta")
	took := time.Since(start)
	if r.ok() || !strings.Contains(r.out, "beta is not in sync with alpha") || !strings.Contains(r.out, "replctl connect vol0 --node beta") {
		t.Fatalf("replctl primary %s --node beta, beta disconnected and Outdated: %s; want it refused, saying why and what to do", volName, r)
	}
	if took > 2*time.Second {
		t.Fatalf("the switchover was refused after %s, want at once", took)
	}
	t.Logf("refused in %s: %s", took.Round(time.Millisecond), strings.TrimSpace(r.out))
	if v := c.mustStatus("alpha"); v.Primary != "alpha" || v.NBDURI == "" {
		t.Fatalf("after the refused switchover: primary %q, export %q; want alpha, serving", v.Primary, v.NBDURI)
	}
}

// TestE2EThreeDataReplicasResyncOnlyWhatEachMissed: a volume on three
// data nodes. gamma is killed, alpha takes writes, gamma returns: only the
// blocks it missed move to it, beta receives nothing, and an online verify
// finds nothing out of sync.
func TestE2EThreeDataReplicasResyncOnlyWhatEachMissed(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{DataNodes: 3, Size: 64 << 20})
	c.startAll()
	c.waitInSync("alpha")
	betaBefore := c.mustStatus("alpha").replica("beta").Resynced
	c.kill("gamma")
	// 16 × 64 KiB scattered: 1 MiB gamma misses.
	var cmds []string
	for i := range 16 {
		cmds = append(cmds, fmt.Sprintf("write -P 0x%x %d 64k", 0x40+i, int64(i)*3<<20+4096))
	}
	qemuIO(t, c.uri("alpha"), append(cmds, "flush")...)
	c.start("gamma")
	v := c.waitInSync("alpha")
	if got := v.replica("gamma").Resynced; got != 16*64<<10 {
		t.Fatalf("gamma received %d bytes, want the 1 MiB it missed", got)
	}
	if got := v.replica("beta").Resynced - betaBefore; got != 0 {
		t.Fatalf("beta, which missed nothing, received %d bytes", got)
	}
	out := c.mustCtl("alpha", "verify", volName, "--wait")
	if !strings.Contains(out, " 0B out of sync") {
		t.Fatalf("verify: %s", out)
	}
	for _, n := range []string{"beta", "gamma"} {
		compareFiles(t, c.disk("alpha"), c.disk(n), 64<<20)
	}

	// gamma's disk is suspect: resync it alone (DRBD's invalidate on
	// one node). beta keeps streaming and receives nothing.
	if r := c.ctl("beta", "resync", volName, "--node", "alpha"); r.ok() || !strings.Contains(r.out, "alpha is the primary of vol0") {
		t.Fatalf("resync --node of the primary: %s", r)
	}
	before := c.mustStatus("alpha")
	out = c.mustCtl("beta", "resync", volName, "--node", "gamma", "--wait")
	if !strings.Contains(out, "full resync started on alpha for gamma\n") || !strings.Contains(out, "in sync") {
		t.Fatalf("resync --node gamma --wait: %s", out)
	}
	v = c.waitInSync("alpha")
	if got := v.replica("gamma").Resynced - before.replica("gamma").Resynced; got != 64<<20 {
		t.Fatalf("gamma received %d bytes by resync --node gamma, want the whole volume", got)
	}
	if got := v.replica("beta").Resynced - before.replica("beta").Resynced; got != 0 {
		t.Fatalf("beta, not named, received %d bytes", got)
	}
	compareFiles(t, c.disk("alpha"), c.disk("gamma"), 64<<20)
}

// raftInSync: every replica is in sync and raft records each UpToDate
// (so any of them may be promoted).
func raftInSync(v *volumeStatus) bool {
	for _, r := range v.Replicas {
		if r.Raft != "UpToDate" {
			return false
		}
	}
	return v.inSync()
}

// TestE2EAPartitionedPrimaryIsReplaced: each node in its own network
// namespace on one bridge; the clients run in alpha's namespace. alpha, the
// primary, is cut off (its eth0 down): its lease runs out, its IO freezes,
// and the majority (beta and the witness) promotes beta. Nothing alpha
// acknowledged is missing on beta, and alpha acknowledged nothing once
// beta was primary. After the partition heals, alpha is an UpToDate
// Secondary, no split brain is reported, and the clients' register
// history is linearizable.
func TestE2EAPartitionedPrimaryIsReplaced(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Netns: true, Size: 64 << 20})
	c.startAll()
	c.waitFor("beta", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	tg := c.targetsFrom("alpha")
	rec := newOpRecorder()
	stopClients := startRegisterClients(t, tg, rec, registerOpts{Clients: 2, Blocks: 4, OpTimeout: 3 * time.Second, Think: 3 * time.Millisecond})
	aw := startAckWriter(t, tg, ackWriterOpts{Writers: 2, Base: 8 << 20, Limit: 64 << 20, OpTimeout: 3 * time.Second, Think: time.Millisecond})
	aw.waitAck(t, time.Time{}, 15*time.Second, "a write acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" })

	cut := time.Now()
	c.partition("alpha")
	if p := c.waitPrimary("beta", 20*time.Second, "alpha"); p != "beta" {
		t.Fatalf("after alpha was cut off the majority names %q primary, want beta", p)
	}
	promoted := time.Now()
	t.Logf("alpha cut off; status names beta primary %s later", promoted.Sub(cut).Round(time.Millisecond))
	if evs, err := c.eventsSince("beta", "promoted", cut); err == nil && len(evs) > 0 {
		t.Logf("failover after a partition: beta promoted %s after the cut (its event's time)", evs[0].Time.Sub(cut).Round(time.Millisecond))
	}
	// Once gossip has declared alpha dead, status does not wait for it.
	c.waitFor("beta", "status from beta not asking alpha, which gossip reports dead", 10*time.Second, func(*volumeStatus) bool {
		asked := time.Now()
		s, _, err := c.status("beta")
		if err != nil {
			return false
		}
		for _, n := range s.Nodes {
			if n.Name == "alpha" && n.Membership == "dead" && strings.Contains(n.Error, "not asked") {
				t.Logf("status from beta without alpha: %s (%s)", time.Since(asked).Round(time.Millisecond), n.Error)
				return true
			}
		}
		return false
	})
	rec.waitCompleted(t, "alpha", 0, time.Second)
	healAlphaUnderBeta(t, c, aw)
	stopClients()
	acked, unacked := aw.stop()
	noAckAfter(t, acked, "alpha", promoted)
	checkLinearizable(t, rec.history(), linearizabilityTimeout)
	verifyAcked(t, c.targets(), acked, unacked, 30*time.Second)
}

// TestE2EAPrimaryCutOffFromRaftButNotGossipIsReplaced: gossip runs on a
// network of its own (each node's eth1), and alpha, the primary, loses
// the other one (eth0 down): raft, control and replication. Gossip still
// sees alpha alive, but alpha renews no lease, so its IO froze; the
// leader notices that nobody renews and promotes beta. Nothing alpha
// acknowledged is lost, and once eth0 is back alpha is beta's UpToDate
// Secondary, with no split brain.
func TestE2EAPrimaryCutOffFromRaftButNotGossipIsReplaced(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Netns: true, GossipNet: true, Size: 32 << 20})
	c.startAll()
	c.waitFor("beta", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	aw := startAckWriter(t, c.targetsFrom("alpha"), ackWriterOpts{Writers: 2, Base: 4 << 20, Limit: 32 << 20, OpTimeout: 3 * time.Second, Think: time.Millisecond})
	aw.waitAck(t, time.Time{}, 15*time.Second, "a write acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" })

	cut := time.Now()
	c.partition("alpha") // eth0 only: gossip goes on over eth1
	if p := c.waitPrimary("beta", 30*time.Second, "alpha"); p != "beta" {
		t.Fatalf("after alpha lost raft but not gossip the majority names %q primary, want beta", p)
	}
	promoted := time.Now()
	s, _, err := c.status("beta")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range s.Nodes {
		if n.Name == "alpha" && n.Membership != "alive" {
			t.Fatalf("gossip reports alpha %q: the test needs it alive, cut off from raft only", n.Membership)
		}
	}
	why := ""
	for _, n := range []string{witnessName, "beta"} {
		if evs, err := c.eventsSince(n, "failover", cut); err == nil && len(evs) > 0 {
			why = evs[0].Message
		}
	}
	if !strings.Contains(why, "renewed no lease") {
		t.Fatalf("the failover event says %q, want the reason: alpha renewed no lease", why)
	}
	t.Logf("alpha cut off from raft, alive to gossip; beta primary %s later: %s", promoted.Sub(cut).Round(time.Millisecond), why)

	healAlphaUnderBeta(t, c, aw)
	acked, unacked := aw.stop()
	noAckAfter(t, acked, "alpha", promoted)
	verifyAcked(t, c.targets(), acked, unacked, 30*time.Second)
}

// healAlphaUnderBeta heals alpha's cut: it must come back as beta's
// UpToDate Secondary with no split brain, and a client in alpha's
// namespace then gets writes acknowledged by beta.
func healAlphaUnderBeta(t *testing.T, c *procCluster, aw *ackWriter) {
	t.Helper()
	c.heal("alpha")
	healed := time.Now()
	v := c.waitFor("beta", "alpha back as an UpToDate Secondary", 60*time.Second, func(v *volumeStatus) bool {
		r := v.replica("alpha")
		return v.Primary == "beta" && r != nil && r.Role == "Secondary" && raftInSync(v)
	})
	if sb := splitBrainReason(v); sb != "" {
		t.Fatalf("split brain after the cut healed: %s", sb)
	}
	aw.waitAck(t, healed, 30*time.Second, "a write acknowledged by beta from alpha's namespace", func(a ackedWrite) bool { return a.Node == "beta" })
}

// noAckAfter fails the test if node acknowledged a write after when.
func noAckAfter(t *testing.T, acked []ackedWrite, node string, when time.Time) {
	t.Helper()
	late := 0
	for _, a := range acked {
		if a.Node == node && a.At.After(when) {
			late++
		}
	}
	if late > 0 {
		t.Fatalf("%s acknowledged %d writes after another node was primary", node, late)
	}
}

// TestE2ENoFailoverWithoutAMajority: with the witness down, killing the
// primary leaves beta alone, one voter of three: nobody is promoted, and
// status says there is no quorum.
func TestE2ENoFailoverWithoutAMajority(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 32 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	c.kill(witnessName)
	c.kill("alpha")
	c.waitFor("beta", "status from beta says there is no quorum", 20*time.Second, func(*volumeStatus) bool {
		s, _, err := c.status("beta")
		return err == nil && !s.Cluster.Quorum && strings.Contains(s.Cluster.Reason, "quorum")
	})
	// A failover would be done in about two seconds; give it four.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if _, v, err := c.status("beta"); err == nil && v.replica("beta").Role == "Primary" {
			t.Fatal("beta promoted itself without a majority")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestE2EAPausedMajorityDoesNotDeposeAHealthyPrimary: alpha is primary;
// beta and the witness, the raft majority with its leader, freeze for 5 s
// (SIGSTOP: a VM pause, a long GC) and come back, three times. alpha never
// stopped: it renews its lease as soon as the majority answers again, so
// it stays primary at its epoch and a write to it is acknowledged within
// seconds of each pause; no leader even tries to fail it over, and no
// acknowledged write is lost. The leader must not count the time it could
// not observe as time alpha renewed nothing.
func TestE2EAPausedMajorityDoesNotDeposeAHealthyPrimary(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 64 << 20})
	c.startAll()
	v := c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	if v.Primary != "alpha" {
		t.Fatalf("primary at the start: %q, want alpha", v.Primary)
	}
	epoch := v.Epoch
	began := time.Now()
	aw := startAckWriter(t, c.targets(), ackWriterOpts{Writers: 2, Base: 4 << 20, Limit: 64 << 20, OpTimeout: 3 * time.Second, Think: 10 * time.Millisecond})
	aw.waitAck(t, time.Time{}, 15*time.Second, "a write acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" })

	majority := []string{"beta", witnessName}
	for round := 1; round <= 3; round++ {
		// The leader must be among the paused: alpha, a primary, hands
		// leadership off itself within a few seconds.
		var leader string
		var s *statusDoc
		var err error
		if !within(20*time.Second, 200*time.Millisecond, func() bool {
			s, _, err = c.status("alpha")
			if err == nil && slices.Contains(majority, s.Cluster.Leader) && s.Cluster.Quorum {
				leader = s.Cluster.Leader
				return true
			}
			return false
		}) {
			t.Fatalf("round %d: the raft leader is not beta or the witness after 20 s: %+v, %v", round, s, err)
		}
		other := majority[0]
		if other == leader {
			other = majority[1]
		}
		t.Logf("round %d: pausing the raft leader %s and %s for 5 s", round, leader, other)
		c.pause(leader)
		c.pause(other)
		time.Sleep(5 * time.Second)
		c.resume(leader)
		c.resume(other)
		resumed := time.Now()
		first := aw.waitAck(t, resumed, 10*time.Second, fmt.Sprintf("round %d: a write acknowledged by alpha after the pause", round),
			func(a ackedWrite) bool { return a.Node == "alpha" })
		t.Logf("round %d: first write acknowledged by alpha %s after the majority resumed", round, first.At.Sub(resumed).Round(time.Millisecond))
		// A wrongful failover comes within a lease or two of the resume:
		// watch for longer than that.
		for time.Since(resumed) < 6*time.Second {
			_, v, err := c.status("alpha")
			if err == nil && (v.Primary != "alpha" || v.Epoch != epoch) {
				t.Fatalf("round %d: after the majority's pause the primary is %s at epoch %d, want alpha at %d", round, v.Primary, v.Epoch, epoch)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	for _, n := range majority {
		if evs, err := c.eventsSince(n, "failover", began); err == nil && len(evs) > 0 {
			t.Fatalf("%s failed the healthy alpha over: %s", n, evs[0].Message)
		}
		// Nor did a leader try to (a proposal refused because beta
		// happened to be Outdated by then is the same misjudgement).
		b, err := os.ReadFile(filepath.Join(c.dir, n+".log"))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, `msg="failover`) {
				t.Fatalf("%s tried to fail the healthy alpha over: %s", n, line)
			}
		}
	}
	v = c.waitFor("alpha", "in sync again, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	if v.Primary != "alpha" || v.Epoch != epoch {
		t.Fatalf("at the end the primary is %s at epoch %d, want alpha at %d", v.Primary, v.Epoch, epoch)
	}
	acked, unacked := aw.stop()
	verifyAcked(t, c.targets(), acked, unacked, 30*time.Second)
}
