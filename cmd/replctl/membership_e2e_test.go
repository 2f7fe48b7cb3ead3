package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestE2EAReplacedNodeJoinsAsAVoterWithAFullResync: three data nodes, each
// a raft voter. gamma's host is replaced: replctl node remove gamma, its
// state and its disk are gone; the new gamma starts with --join (it does
// not found a raft cluster of its own), replctl node add gamma makes it a
// voter, and the primary gives its empty disk a full resync while the
// volume serves writes. Then gamma counts in the majority: with alpha
// killed, beta and gamma elect a leader and fail the volume over.
func TestE2EAReplacedNodeJoinsAsAVoterWithAFullResync(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 64 << 20
	c := newProcClusterN(t, clusterOpts{DataNodes: 3, Raft: true, Size: size})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows every replica UpToDate", syncTimeout, raftInSync)
	voters := func(node string) []string {
		st, _, err := c.status(node)
		if err != nil {
			return nil
		}
		v := slices.Clone(st.Cluster.Voters)
		slices.Sort(v)
		return v
	}
	if got := voters("alpha"); !slices.Equal(got, []string{"alpha", "beta", "gamma"}) {
		t.Fatalf("voters at the start: %v", got)
	}

	// gamma's host dies for good; the operator takes it out of raft.
	c.kill("gamma")
	out := c.mustCtl("beta", "node", "remove", "gamma")
	if !strings.Contains(out, "voters: ") || strings.Contains(out, "gamma") {
		t.Fatalf("replctl node remove gamma: %q", out)
	}
	if got := voters("alpha"); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Fatalf("voters after node remove gamma: %v", got)
	}
	qemuIO(t, c.uri("alpha"), "write -P 0x5a 0 1M", "write -P 0x6b 40M 512k", "flush")

	// The replacement: no state, an empty disk of the same size.
	if err := os.RemoveAll(filepath.Join(c.dir, "gamma")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(c.disk("gamma"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(c.disk("gamma"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(c.disk("gamma"), fi.Size()); err != nil {
		t.Fatal(err)
	}
	c.start("gamma", "--join")
	c.waitListening("gamma", 30*time.Second)
	out = c.mustCtl("alpha", "node", "add", "gamma")
	if !strings.Contains(out, "gamma") {
		t.Fatalf("replctl node add gamma: %q", out)
	}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if !within(20*time.Second, 200*time.Millisecond, func() bool {
			return slices.Equal(voters(n), []string{"alpha", "beta", "gamma"})
		}) {
			t.Fatalf("%s counts voters %v after node add gamma", n, voters(n))
		}
	}
	v := c.waitFor("alpha", "the new gamma in sync, and UpToDate in raft", syncTimeout, raftInSync)
	if r := v.replica("gamma"); r.Resynced != size {
		t.Fatalf("the empty gamma received %d bytes, want a full resync of %d", r.Resynced, size)
	}
	if out := c.mustCtl("alpha", "verify", volName, "--wait"); !strings.Contains(out, " 0B out of sync") {
		t.Fatalf("verify: %s", out)
	}
	compareFiles(t, c.disk("alpha"), c.disk("gamma"), size)

	// gamma votes: with alpha gone, beta and gamma are the majority.
	c.kill("alpha")
	v = c.waitFor("beta", "beta or gamma primary after alpha was killed", 30*time.Second, func(v *volumeStatus) bool {
		return v.Primary == "beta" || v.Primary == "gamma"
	})
	qemuIOEventually(t, 20*time.Second, "the data on the new primary "+v.Primary, c.uri(v.Primary), "read -P 0x5a 0 1M", "read -P 0x6b 40M 512k")
}

// TestE2EARemovedWitnessSaysSoAndTwoVotersMeanNoFailover: the witness is
// removed from raft while it runs. It answers status saying that it was
// removed and is no longer a voter, naming the voters, and refuses a
// switchover or a membership change at once instead of timing out. The
// two voters left say failover off, naming themselves: the loss of
// either would be the loss of the quorum.
func TestE2EARemovedWitnessSaysSoAndTwoVotersMeanNoFailover(t *testing.T) {
	e2e(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 16 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	if s, _, err := c.status("alpha"); err != nil || s.Cluster.Failover != "auto" {
		t.Fatalf("status with three voters: %+v, %v; want failover auto", s, err)
	}
	if out := c.mustCtl("alpha", "node", "remove", witnessName); strings.TrimSpace(out) != "voters: alpha beta" {
		t.Fatalf("replctl node remove %s: %q", witnessName, out)
	}

	// The two voters left.
	for _, n := range []string{"alpha", "beta"} {
		s, _, err := c.status(n)
		if err != nil {
			t.Fatal(err)
		}
		if s.Cluster.Failover != "off" || !strings.Contains(s.Cluster.Reason, "2 raft voters (alpha, beta): automatic failover needs three") ||
			!slices.Equal(s.Cluster.Voters, []string{"alpha", "beta"}) {
			t.Fatalf("status from %s with two voters: %+v; want failover off, naming the two voters", n, s.Cluster)
		}
	}
	out := c.mustCtl("alpha", "status")
	if !strings.Contains(out, "cluster: failover off") || !strings.Contains(out, "automatic failover needs three") {
		t.Fatalf("replctl status with two voters:\n%s", out)
	}

	// The removed witness.
	words := "this node (witness) was removed from the cluster; it is no longer a voter; the voters are alpha, beta"
	c.waitFor(witnessName, "the removed witness says so", 10*time.Second, func(*volumeStatus) bool {
		s, _, err := c.status(witnessName)
		return err == nil && s.Cluster.Standing == "removed"
	})
	s, _, err := c.status(witnessName)
	if err != nil {
		t.Fatal(err)
	}
	if s.Cluster.Failover != "off" || !strings.Contains(s.Cluster.Reason, words) || s.Cluster.Leader != "" || !slices.Equal(s.Cluster.Voters, []string{"alpha", "beta"}) {
		t.Fatalf("status from the removed witness: %+v; want failover off, voters alpha and beta, and %q", s.Cluster, words)
	}
	for _, cmd := range [][]string{
		{"primary", volName, "--node", "beta"},
		{"node", "add", witnessName},
	} {
		start := time.Now()
		r := c.ctl(witnessName, cmd...)
		took := time.Since(start)
		if r.ok() || !strings.Contains(r.out, words) {
			t.Fatalf("replctl %s via the removed witness: %s; want it refused, saying %q", strings.Join(cmd, " "), r, words)
		}
		if took > 2*time.Second {
			t.Fatalf("replctl %s via the removed witness was refused after %s, want at once", strings.Join(cmd, " "), took)
		}
		t.Logf("replctl %s via the removed witness: refused in %s", strings.Join(cmd, " "), took.Round(time.Millisecond))
	}
	if v := c.mustStatus("alpha"); v.Primary != "alpha" {
		t.Fatalf("after the refused switchover the primary is %s, want alpha", v.Primary)
	}
}

// TestE2ENodeRemoveRefusesWhatIsNoVoter: replctl node remove nosuch
// exited 0 (raft removes a server it does not have without a word), and
// node remove "" answered "malformed forward request". A name that is no
// node of the cluster is refused naming the nodes, an empty one is a
// usage error, a node that is no longer a voter is refused naming the
// voters; none changes the voters. Removing a voter still works.
func TestE2ENodeRemoveRefusesWhatIsNoVoter(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows every replica UpToDate", syncTimeout, raftInSync)
	voters := func() []string {
		st, _, err := c.status("alpha")
		if err != nil {
			t.Fatal(err)
		}
		v := slices.Clone(st.Cluster.Voters)
		slices.Sort(v)
		return v
	}
	all := []string{"alpha", "beta", "witness"}
	if got := voters(); !slices.Equal(got, all) {
		t.Fatalf("voters at the start: %v", got)
	}
	for _, tc := range []struct {
		name string
		code int
		says string
	}{
		{"nosuch", exitFailed, `no node "nosuch" in the cluster: the nodes are alpha, beta, witness`},
		{"", exitUsage, "NAME is empty: give the node's name"},
	} {
		r := c.ctl("alpha", "node", "remove", tc.name)
		if r.code != tc.code || !strings.Contains(r.out, tc.says) {
			t.Fatalf("replctl node remove %q: %s; want exit %d saying %q", tc.name, r, tc.code, tc.says)
		}
		if got := voters(); !slices.Equal(got, all) {
			t.Fatalf("voters after replctl node remove %q: %v", tc.name, got)
		}
	}
	if out := c.mustCtl("beta", "node", "remove", "witness"); !strings.Contains(out, "voters: alpha beta") {
		t.Fatalf("replctl node remove witness: %q", out)
	}
	// alpha hears of the change at the leader's next heartbeat.
	if !within(20*time.Second, 100*time.Millisecond, func() bool { return slices.Equal(voters(), []string{"alpha", "beta"}) }) {
		t.Fatalf("alpha counts voters %v after node remove witness", voters())
	}
	r := c.ctl("alpha", "node", "remove", "witness")
	if r.code != exitFailed || !strings.Contains(r.out, `"witness" is not a raft voter, so there is nothing to remove: the voters are alpha, beta`) {
		t.Fatalf("replctl node remove witness once more: %s; want a refusal naming the voters", r)
	}
}
