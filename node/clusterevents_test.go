package node

import (
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/node/cluster"
)

// TestClusterWatchRule: the cluster statuses a node sees become events: the
// first leader and every change of leader; a leader gone for the grace
// (here 1 s) without a successor; quorum lost after the grace without one (never
// before it was first seen) and regained. A new leader elected within the
// grace is one change, with no loss.
func TestClusterWatchRule(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	type step struct {
		at     time.Duration
		leader string
		quorum bool
		want   string // "kind old->new" of each event, "|"-joined
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"starting up", []step{
			{0, "", false, ""},
			{2 * time.Second, "", false, ""},
			{3 * time.Second, "wit", true, "raft-leader ->wit"},
			{4 * time.Second, "wit", true, ""},
		}},
		{"an election within the grace is one change", []step{
			{0, "wit", true, "raft-leader ->wit"},
			{time.Second, "", false, ""},
			{time.Second + 600*time.Millisecond, "beta", true, "raft-leader wit->beta"},
			{3 * time.Second, "beta", true, ""},
		}},
		{"cut off from the majority, then back", []step{
			{0, "wit", true, "raft-leader ->wit"},
			{time.Second, "", false, ""},
			{time.Second + 900*time.Millisecond, "", false, ""},
			{2 * time.Second, "", false, "raft-leader wit->none|quorum-lost quorum->no quorum"},
			{5 * time.Second, "", false, ""},
			{6 * time.Second, "alpha", true, "raft-leader none->alpha|quorum-regained no quorum->quorum"},
		}},
		{"a follower out of contact with a leader it still names", []step{
			{0, "wit", true, "raft-leader ->wit"},
			{time.Second, "wit", false, ""},
			{2 * time.Second, "wit", false, "quorum-lost quorum->no quorum"},
			{3 * time.Second, "wit", false, ""},
			{4 * time.Second, "wit", true, "quorum-regained no quorum->quorum"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := clusterWatch{grace: time.Second}
			for _, s := range tc.steps {
				var got []string
				for _, e := range w.observe("alpha", cluster.Status{Leader: s.leader, Quorum: s.quorum}, t0.Add(s.at)) {
					if e.Message == "" {
						t.Errorf("%s without a message", e.Kind)
					}
					got = append(got, e.Kind+" "+e.Old+"->"+e.New)
				}
				if strings.Join(got, "|") != s.want {
					t.Fatalf("at %s (leader %q, quorum %v): events %q, want %q", s.at, s.leader, s.quorum, got, s.want)
				}
			}
		})
	}
}

// TestClusterEventsLeaderQuorumAndLease: in a raft cluster, alpha records
// the raft leader; with beta and the witness gone it records the quorum
// lost and, as its lease runs out, the lease lost (IO frozen); with the
// witness back, the quorum and the lease regained.
func TestClusterEventsLeaderQuorumAndLease(t *testing.T) {
	c := newRaftCluster(t, 4<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	has := func(kind string) bool {
		evs, err := c.nodes["alpha"].store.Events(200)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == kind {
				return true
			}
		}
		return false
	}
	eventually(t, func() bool { return has("raft-leader") }, "alpha records the raft leader")
	a := c.vol("alpha")
	eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return time.Now().Before(a.st.LeaseUntil)
	}, "alpha holds its lease")
	c.stop("beta")
	c.stop("wit")
	eventually(t, func() bool { return has("quorum-lost") }, "alpha records the quorum lost")
	eventually(t, func() bool { return has("lease-lost") }, "alpha records its lease lost")
	c.start("wit")
	eventually(t, func() bool { return has("quorum-regained") }, "alpha records the quorum regained")
	eventually(t, func() bool { return has("lease-regained") }, "alpha records its lease regained")
}
