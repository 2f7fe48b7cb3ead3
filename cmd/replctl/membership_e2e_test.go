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
	e2e(t)
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
		deadline := time.Now().Add(20 * time.Second)
		for !slices.Equal(voters(n), []string{"alpha", "beta", "gamma"}) {
			if time.Now().After(deadline) {
				t.Fatalf("%s counts voters %v after node add gamma", n, voters(n))
			}
			time.Sleep(200 * time.Millisecond)
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
