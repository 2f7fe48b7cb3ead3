package cluster

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/replvol/replvol/replication"
)

// TestANodeRenewsAllItsLeasesInFewForwards: a node primary of many
// volumes, renewing each from its own goroutine as the node does, sends
// the leader far fewer requests than renewals, and the leader commits far
// fewer barriers; yet each volume's lease is granted or refused on its
// own: a claim at a stale epoch is refused in the batch it shares with
// granted ones, and a volume with a promotion waiting is refused alone.
func TestANodeRenewsAllItsLeasesInFewForwards(t *testing.T) {
	n, leader := threeNodes(t)
	a := n.node("a")
	ctx := testContext(t, 60*time.Second)
	const volumes = 64
	for i := range volumes {
		if _, err := leader.Propose(ctx, replication.InitCommand(fmt.Sprintf("v%02d", i), "a", 1, []string{"a", "b"})); err != nil {
			t.Fatal(err)
		}
	}
	// v00 moves to b at epoch 2: a's claim at epoch 1 is stale.
	if _, err := leader.Propose(ctx, replication.MarkUpToDateCommand("v00", 1, "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Propose(ctx, replication.PromoteCommand("v00", 1, "b", false)); err != nil {
		t.Fatal(err)
	}

	// Each part counts what one leader, not a, did in one term: a part
	// that saw the leadership move (a loaded machine's raft may miss a
	// heartbeat) is asked again under the next.
	underOneLeader(t, n, func(leader *Cluster, fail func(string, ...any)) {
		barriers0 := leader.raft.Stats()["last_log_index"]
		forwards0 := n.forwards.Load()
		const rounds = 5
		var wg sync.WaitGroup
		errs := make([][]error, volumes)
		for i := range volumes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					_, err := a.RenewLease(ctx, fmt.Sprintf("v%02d", i), 1)
					errs[i] = append(errs[i], err)
				}
			}()
		}
		wg.Wait()
		renewals := int64(volumes * rounds)
		forwards := n.forwards.Load() - forwards0
		var entries int64
		fmt.Sscan(leader.raft.Stats()["last_log_index"], &entries)
		var entries0 int64
		fmt.Sscan(barriers0, &entries0)
		t.Logf("%d renewals of %d volumes: %d forwards, %d raft entries", renewals, volumes, forwards, entries-entries0)
		if forwards > renewals/4 {
			fail("%d renewals took %d forwards, want them batched (at most %d)", renewals, forwards, renewals/4)
		}
		if entries-entries0 > renewals/4 {
			fail("%d renewals took %d raft entries, want shared barriers (at most %d)", renewals, entries-entries0, renewals/4)
		}
		for i, es := range errs {
			for _, err := range es {
				switch {
				case i == 0 && !errors.Is(err, replication.ErrStaleEpoch):
					fail("v00's renewal at its old epoch: %v, want ErrStaleEpoch", err)
				case i != 0 && err != nil:
					fail("v%02d's renewal: %v", i, err)
				}
			}
		}
	})

	// A promotion waiting for v01's lease: only v01's claim is refused.
	underOneLeader(t, n, func(leader *Cluster, fail func(string, ...any)) {
		unfence := leader.leases.fence("v01")
		defer unfence()
		var wg sync.WaitGroup
		for i := 1; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := a.RenewLease(ctx, fmt.Sprintf("v%02d", i), 1)
				if i == 1 && !errors.Is(err, ErrPromotionPending) {
					fail("v01 renewed while a promotion waits: %v", err)
				}
				if i != 1 && err != nil {
					fail("v%02d beside a fenced volume: %v", i, err)
				}
			}()
		}
		wg.Wait()
	})
}

// underOneLeader runs part under the leader, which it makes another node
// than a first. part's failures (fail) count when that leader led in one
// term from before part to after it; when the leadership moved meanwhile
// (raft's doing on a loaded machine, not the code's under test), part runs
// again under the next leader, up to five times.
func underOneLeader(t *testing.T, n *testNet, part func(leader *Cluster, fail func(format string, args ...any))) {
	t.Helper()
	for try := 1; try <= 5; try++ {
		leader := n.waitLeader(t)
		if leader.self == "a" {
			if err := leader.raft.LeadershipTransfer().Error(); err != nil {
				t.Logf("hand the leadership from a on: %v", err)
			}
			continue
		}
		term := leader.raft.Stats()["term"]
		var mu sync.Mutex
		var failures []string
		part(leader, func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, fmt.Sprintf(format, args...))
		})
		if leader.raft.State() != raft.Leader || leader.raft.Stats()["term"] != term {
			t.Logf("the leadership moved from %s (term %s) during the part: it runs again (%d failures set aside: %v)", leader.self, term, len(failures), failures)
			continue
		}
		for _, f := range failures {
			t.Error(f)
		}
		return
	}
	t.Fatal("the leadership moved during each of 5 tries")
}
