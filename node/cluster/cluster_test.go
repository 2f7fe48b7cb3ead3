package cluster

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/replication"
)

// threeNodes starts two data nodes, a and b, and the witness w, and
// registers volume "vol" with primary a at epoch 1, b UpToDate.
func threeNodes(t *testing.T) (*testNet, *Cluster) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.startAll()
	leader := n.waitLeader(t)
	ctx := testContext(t, 5*time.Second)
	if _, err := leader.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Propose(ctx, replication.MarkUpToDateCommand("vol", 1, "b")); err != nil {
		t.Fatal(err)
	}
	return n, leader
}

// TestProposeFromAFollower: a command proposed on a follower travels to
// the leader, is applied on every node, and the typed error of a refused
// command comes back through the forward.
func TestProposeFromAFollower(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.startAll()
	leader := n.waitLeader(t)
	follower := n.follower(t, leader)
	ctx := testContext(t, 5*time.Second)

	va, err := follower.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"}))
	if err != nil || va.Primary != "a" || va.Epoch != 1 || !slices.Equal(va.Outdated, []string{"b"}) {
		t.Fatalf("init through %s: %+v, %v", follower.self, va, err)
	}
	if n.forwards.Load() == 0 {
		t.Fatal("the follower's proposal was not forwarded")
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" applies the init", 2*time.Second, func() bool {
			got, ok := c.Authority().Volume("vol")
			return ok && reflect.DeepEqual(got, va)
		})
	}

	va, err = follower.Propose(ctx, replication.MarkOutdatedCommand("vol", 0, "b"))
	if !errors.Is(err, replication.ErrStaleEpoch) || va.Epoch != 1 {
		t.Errorf("a stale epoch through the forward: %+v, %v; want ErrStaleEpoch and the current epoch 1", va, err)
	}
	_, err = follower.Propose(ctx, replication.PromoteCommand("vol", 1, "b", false))
	if !errors.Is(err, replication.ErrNotUpToDate) {
		t.Errorf("promoting the Outdated b through the forward: %v, want ErrNotUpToDate", err)
	}

	s := follower.Status()
	if s.Leader != leader.self || !s.Quorum || !slices.Equal(s.Voters, []string{"a", "b", "w"}) {
		t.Errorf("status on %s: %+v", follower.self, s)
	}
}

// TestLeaseRunsOutBeforeLeaseFree: the primary renews its lease; cut off
// from the others, it can renew no more, and the leader says the lease is
// free only after the last lease the primary holds has run out. Then b is
// promoted, and the old primary's renewal at its old epoch is refused.
func TestLeaseRunsOutBeforeLeaseFree(t *testing.T) {
	n, leader := threeNodes(t)
	if leader.self == "a" {
		if err := leader.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
		leader = n.waitLeader(t)
	}
	primary := n.node("a")
	ctx := testContext(t, 10*time.Second)

	var validUntil time.Time
	start := time.Now()
	for range 5 {
		until, err := primary.RenewLease(ctx, "vol", 1)
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
		validUntil = until
	}
	t.Logf("a renewal through the leader %s takes %v", leader.self, time.Since(start)/5)
	if leader.LeaseFree("vol") {
		t.Fatal("the lease is free right after a renewal")
	}
	if idle := leader.LeaseIdle("vol"); idle >= testTiming.LeaseDuration {
		t.Fatalf("the leader finds the lease idle for %v right after a renewal", idle)
	}
	if idle := primary.LeaseIdle("vol"); idle != 0 {
		t.Fatalf("a node that does not lead reports the lease idle for %v, want 0", idle)
	}

	cutAt := time.Now()
	n.partition("a")
	short := testContext(t, 300*time.Millisecond)
	if _, err := primary.RenewLease(short, "vol", 1); err == nil {
		t.Fatal("a primary cut off from the others renewed its lease")
	}
	// b or w: under load the leader may lose its quorum for a moment once
	// a is cut off, and either may lead then. A new leader's fence holds
	// the lease as long as the old one's would.
	waitFor(t, "a leader finds the lease free", 10*time.Second, func() bool {
		for _, c := range []*Cluster{n.node("b"), n.node("w")} {
			if c.LeaseFree("vol") {
				leader = c
				return true
			}
		}
		return false
	})
	freeAt := time.Now()
	t.Logf("cut off %v after the lease's start; lease valid until +%v; LeaseFree at +%v",
		testTiming.LeaseDuration-validUntil.Sub(cutAt), validUntil.Sub(cutAt), freeAt.Sub(cutAt))
	if !validUntil.Before(freeAt) {
		t.Fatalf("LeaseFree turned true %v before the primary's lease ran out", validUntil.Sub(freeAt))
	}
	if idle := leader.LeaseIdle("vol"); idle < testTiming.LeaseDuration {
		t.Fatalf("the lease is free, but the leader finds it idle for only %v", idle)
	}

	va, err := leader.Propose(ctx, replication.PromoteCommand("vol", 1, "b", false))
	if err != nil || va.Primary != "b" || va.Epoch != 2 {
		t.Fatalf("promote b: %+v, %v", va, err)
	}
	n.heal("a")
	// Right after the heal, a's own election may unsettle the leader for
	// a moment (an outcome-unknown barrier): a renewal then fails for
	// that reason. It must never succeed, and once raft settles it is
	// refused for its epoch.
	if !within(5*time.Second, 50*time.Millisecond, func() bool {
		_, err = primary.RenewLease(ctx, "vol", 1)
		if err == nil {
			t.Fatal("the old primary renewed its lease at its old epoch")
		}
		if errors.Is(err, replication.ErrStaleEpoch) {
			return true
		}
		t.Logf("renewal right after the heal: %v; again", err)
		return false
	}) {
		t.Fatalf("the old primary renews at its old epoch: %v, want ErrStaleEpoch", err)
	}
}

// TestPromotionWaitsForTheLease: a switchover proposed while the primary
// keeps renewing completes only after the primary's last lease ran out
// (its renewals are refused meanwhile); one proposed after the primary
// released its lease does not wait for it.
func TestPromotionWaitsForTheLease(t *testing.T) {
	n, leader := threeNodes(t)
	a, b := n.node("a"), n.node("b")
	ctx := testContext(t, 10*time.Second)

	var mu sync.Mutex
	var lastValid time.Time
	var refusal error
	stop := make(chan struct{})
	renewed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { // the primary's renewal loop
		defer close(done)
		for {
			until, err := a.RenewLease(ctx, "vol", 1)
			mu.Lock()
			if err != nil {
				refusal = err
				mu.Unlock()
				return
			}
			lastValid = until
			mu.Unlock()
			select {
			case renewed <- struct{}{}:
			default:
			}
			select {
			case <-stop:
				return
			case <-time.After(testTiming.LeaseDuration / 4):
			}
		}
	}()
	<-renewed
	va, err := b.Propose(ctx, replication.PromoteCommand("vol", 1, "b", false))
	promotedAt := time.Now()
	close(stop)
	<-done
	if err != nil || va.Primary != "b" || va.Epoch != 2 {
		t.Fatalf("switchover to b: %+v, %v", va, err)
	}
	mu.Lock()
	t.Logf("a's last lease ended %v before the promotion; its renewal then: %v", promotedAt.Sub(lastValid), refusal)
	if !lastValid.Before(promotedAt) {
		t.Errorf("b was promoted %v before a's lease ran out", lastValid.Sub(promotedAt))
	}
	if !errors.Is(refusal, ErrPromotionPending) && !errors.Is(refusal, replication.ErrStaleEpoch) {
		t.Errorf("a's renewal during the switchover: %v, want ErrPromotionPending or ErrStaleEpoch", refusal)
	}
	mu.Unlock()

	// Back to a, with b releasing its lease first: no wait for a lease.
	if _, err := b.RenewLease(ctx, "vol", 2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leader has led for a lease's hold", 3*time.Second, func() bool {
		f, leading := leader.leases.fenceOf("none")
		return leading && time.Now().After(f.FreeAt())
	})
	if err := b.ReleaseLease(ctx, "vol", 2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if va, err := a.Propose(ctx, replication.PromoteCommand("vol", 2, "a", false)); err != nil || va.Primary != "a" {
		t.Fatalf("switchover back to a: %+v, %v", va, err)
	}
	if took := time.Since(start); took >= testTiming.LeaseDuration {
		t.Errorf("a switchover after the release took %v, a whole lease", took)
	} else {
		t.Logf("switchover after a release: %v", took)
	}
}

// TestLeaderChange: the leader is killed; the others elect a new one
// quickly, and the new leader finds no lease free until it has led for a
// lease's duration (with the drift margin): it cannot know what the old
// leader granted.
func TestLeaderChange(t *testing.T) {
	n, leader := threeNodes(t)
	old := leader.self
	killedAt := time.Now()
	n.stop(old)

	var next *Cluster
	waitFor(t, "a new leader", 5*time.Second, func() bool {
		for _, c := range n.nodes() {
			if c.raft.State() == raft.Leader {
				next = c
				return true
			}
		}
		return false
	})
	elected := time.Since(killedAt)
	t.Logf("%s killed; %s leads after %v", old, next.self, elected)
	if elected > 2*time.Second {
		t.Errorf("a new leader after %v, want under 2 s", elected)
	}
	waitFor(t, "the new leader's lease view", time.Second, func() bool {
		_, leading := next.leases.fenceOf("vol")
		return leading
	})
	next.leases.mu.Lock()
	since := next.leases.since
	next.leases.mu.Unlock()
	if !since.After(killedAt) {
		t.Fatalf("the new leader counts its office from %v before the old one was killed", killedAt.Sub(since))
	}
	waitFor(t, "the new leader finds the lease free", 5*time.Second, func() bool { return next.LeaseFree("vol") })
	freeAt := time.Now()
	hold := time.Duration(float64(testTiming.LeaseDuration) * (1 + 0.05))
	t.Logf("LeaseFree %v after the new leader took office (hold %v), %v after the kill", freeAt.Sub(since), hold, freeAt.Sub(killedAt))
	if freeAt.Sub(since) < hold || freeAt.Sub(killedAt) < hold {
		t.Errorf("LeaseFree %v after the new leader took office, want at least %v", freeAt.Sub(since), hold)
	}
}

// TestGossipSeesDeathAndReturn: a node that dies is reported dead by the
// others within about a second, and alive again once it restarts; both
// signal Changed.
func TestGossipSeesDeathAndReturn(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.startAll()
	a := n.node("a")
	stateOf := func(c *Cluster, name string) Liveness {
		for _, m := range c.Status().Members {
			if m.Name == name {
				return m.State
			}
		}
		return ""
	}
	waitFor(t, "a sees every node alive", 5*time.Second, func() bool {
		return stateOf(a, "a") == Alive && stateOf(a, "b") == Alive && stateOf(a, "w") == Alive
	})
	if err := n.node("b").SetMeta([]byte("vol:UpToDate")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a learns b's metadata", 5*time.Second, func() bool {
		for _, m := range a.Status().Members {
			if m.Name == "b" {
				return string(m.Meta) == "vol:UpToDate"
			}
		}
		return false
	})
	if err := a.SetMeta(make([]byte, 513)); err == nil {
		t.Error("SetMeta took more than memberlist carries")
	}

	waitChanged := func(what string, cond func() bool) time.Time {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for !cond() {
			select {
			case <-a.Changed():
			case <-timeout:
				t.Fatalf("%s: no Changed signal within 5 s", what)
			}
		}
		return time.Now()
	}
	select { // start from a drained signal
	case <-a.Changed():
	default:
	}
	stoppedAt := time.Now()
	n.stop("w")
	seenDead := waitChanged("a sees w dead", func() bool { return stateOf(a, "w") == Dead })
	detect := seenDead.Sub(stoppedAt)
	t.Logf("w stopped; a reports it dead after %v", detect)
	if detect > 2*time.Second {
		t.Errorf("dead after %v, want about 1 s", detect)
	}

	n.start("w")
	waitChanged("a sees w alive again", func() bool { return stateOf(a, "w") == Alive })
}

// TestRestartKeepsTheAuthority: a node closed and opened again finds its
// state machine on disk (restored from its snapshot before it talks to
// anyone), catches up with what was decided while it was away, and
// rejoins.
func TestRestartKeepsTheAuthority(t *testing.T) {
	n, _ := threeNodes(t)
	ctx := testContext(t, 10*time.Second)
	b := n.node("b")
	waitFor(t, "b applies b UpToDate", 2*time.Second, func() bool {
		va, _ := b.Authority().Volume("vol")
		return va.IsUpToDate("b")
	})
	if err := b.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	atSnapshot := b.Authority()
	n.stop("b")

	a := n.node("a")
	if _, err := a.Propose(ctx, replication.MarkOutdatedCommand("vol", 1, "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Propose(ctx, replication.InitCommand("second", "a", 5, []string{"a", "b"})); err != nil {
		t.Fatal(err)
	}
	want := n.waitLeader(t).Authority() // the leader applied both; a may lag

	n.partition("b") // b reopens cut off: what it holds comes from its disk
	b = n.start("b")
	if got := b.Authority(); !reflect.DeepEqual(got, atSnapshot) {
		t.Errorf("b reopened with %+v, its snapshot held %+v", got, atSnapshot)
	}
	n.heal("b")
	waitFor(t, "b catches up", 5*time.Second, func() bool { return reflect.DeepEqual(b.Authority(), want) })
	if va, _ := want.Volume("vol"); !va.IsOutdated("b") {
		t.Errorf("the state b caught up with: %+v", want)
	}
	waitFor(t, "b sees the leader", 5*time.Second, func() bool { s := b.Status(); return s.Leader != "" && s.Quorum })
}

// TestAddAndRemoveVoter: a node started without bootstrap becomes a voter
// through AddVoter (proposed on a follower) and receives the state
// machine; RemoveVoter takes it out again, and it hears from no leader.
func TestAddAndRemoveVoter(t *testing.T) {
	n, leader := threeNodes(t)
	ctx := testContext(t, 10*time.Second)
	follower := n.follower(t, leader)
	d := n.defineSpare(member("d"))
	dc := n.start("d")
	// Each change answers with the voters the leader committed, whatever
	// the follower that asked has learned yet.
	if voters, err := follower.AddVoter(ctx, d); err != nil || !slices.Equal(voters, []string{"a", "b", "d", "w"}) {
		t.Fatalf("add d: voters %v, %v; want a b d w", voters, err)
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" counts d a voter", 5*time.Second, func() bool {
			return slices.Equal(c.Status().Voters, []string{"a", "b", "d", "w"})
		})
	}
	waitFor(t, "d receives the state machine", 5*time.Second, func() bool {
		return reflect.DeepEqual(dc.Authority(), leader.Authority())
	})
	// d is in no cluster file of the others: gossip takes it once it is
	// a voter (it announced itself before), and every node sees it.
	for _, c := range n.nodes() {
		waitFor(t, c.self+" sees d alive", 5*time.Second, func() bool {
			for _, m := range c.Status().Members {
				if m.Name == "d" {
					return m.State == Alive
				}
			}
			return false
		})
	}

	if voters, err := follower.RemoveVoter(ctx, "d"); err != nil || !slices.Equal(voters, []string{"a", "b", "w"}) {
		t.Fatalf("remove d: voters %v, %v; want a b w", voters, err)
	}
	for _, name := range []string{"a", "b", "w"} {
		c := n.node(name)
		waitFor(t, name+" no longer counts d", 5*time.Second, func() bool {
			return slices.Equal(c.Status().Voters, []string{"a", "b", "w"})
		})
	}
	waitFor(t, "d hears from no leader", 5*time.Second, func() bool { return dc.Status().Leader == "" })
}

// TestProposeAsLeaderOnlyInTheOfficeOfTheDecision: a leader's failover is
// carried out only by that leader in the office it decided it in; a
// follower, or the leader with another office, changes nothing.
func TestProposeAsLeaderOnlyInTheOfficeOfTheDecision(t *testing.T) {
	n, leader := threeNodes(t)
	ctx := testContext(t, 20*time.Second)
	promote := replication.PromoteCommand("vol", 1, "b", false)
	for try := 1; ; try++ {
		office := leader.LeadingSince()
		if office.IsZero() {
			t.Fatal("the leader reports no office")
		}
		if _, err := n.follower(t, leader).ProposeAsLeader(ctx, promote, office); !errors.Is(err, ErrLeadershipChanged) {
			t.Fatalf("ProposeAsLeader on a follower: %v, want ErrLeadershipChanged", err)
		}
		if _, err := leader.ProposeAsLeader(ctx, promote, office.Add(-time.Second)); !errors.Is(err, ErrLeadershipChanged) {
			t.Fatalf("ProposeAsLeader for an earlier office: %v, want ErrLeadershipChanged", err)
		}
		if va, _ := leader.Authority().Volume("vol"); va.Primary != "a" || va.Epoch != 1 {
			t.Fatalf("refused proposals changed the volume: %+v", va)
		}
		va, err := leader.ProposeAsLeader(ctx, promote, office)
		if errors.Is(err, ErrLeadershipChanged) && leader.LeadingSince() != office && try < 5 {
			// The leader lost its office meanwhile (a loaded machine:
			// no quorum contact within raft's leader lease), and the
			// refusal is right; the proposal is asked in the next
			// leader's office.
			t.Logf("try %d: %s's office of %s ended before the proposal (%v): again under the next leader", try, leader.self, office.Format(time.StampMilli), err)
			leader = n.waitLeader(t)
			continue
		}
		if err != nil || va.Primary != "b" || va.Epoch != 2 {
			t.Fatalf("ProposeAsLeader in the leader's office: %+v, %v", va, err)
		}
		return
	}
}

// removeWitness removes w from raft through a node that is not w, with
// the leadership moved off w first; it returns w.
func removeWitness(t *testing.T, n *testNet, leader *Cluster) *Cluster {
	t.Helper()
	if leader.self == "w" {
		if err := leader.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
		leader = n.waitLeader(t)
	}
	if _, err := leader.RemoveVoter(testContext(t, 5*time.Second), "w"); err != nil {
		t.Fatalf("remove w: %v", err)
	}
	return n.node("w")
}

// requireNotAVoter checks what a node that is not a voter says and that
// it refuses a proposal at once instead of waiting for a leader.
func requireNotAVoter(t *testing.T, c *Cluster, standing Standing, words string) {
	t.Helper()
	s := c.Status()
	if s.Standing != standing || s.Leader != "" || s.Quorum || !slices.Equal(s.Voters, []string{"a", "b"}) || !strings.Contains(s.NotAVoter, words) {
		t.Fatalf("status of %s: standing %q, leader %q, quorum %v, voters %v, %q; want %s, no leader, the voters a and b, and %q",
			c.self, s.Standing, s.Leader, s.Quorum, s.Voters, s.NotAVoter, standing, words)
	}
	start := time.Now()
	_, err := c.Propose(testContext(t, 5*time.Second), replication.MarkOutdatedCommand("vol", 1, "b"))
	if !errors.Is(err, ErrNotAVoter) || !strings.Contains(err.Error(), words) {
		t.Fatalf("a proposal through %s: %v; want ErrNotAVoter saying %q", c.self, err, words)
	}
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Fatalf("the proposal through %s was refused after %v, want at once", c.self, took)
	}
}

// TestARemovedVoterSaysSoAndRefusesAtOnce: the witness is removed; the
// leader tells it, so its status says at once that it is no longer a
// voter and names the voters, and a request that needs the leader is
// refused at once instead of waiting for a leader that never comes.
func TestARemovedVoterSaysSoAndRefusesAtOnce(t *testing.T) {
	n, leader := threeNodes(t)
	w := removeWitness(t, n, leader)
	words := "this node (w) was removed from the cluster; it is no longer a voter; the voters are a, b"
	waitFor(t, "w knows it was removed", time.Second, func() bool { return w.Status().Standing == Removed })
	requireNotAVoter(t, w, Removed, words)
}

// TestARemovedLeaderSaysSoAndNamesTheVoters: the witness leads when it is
// removed (the node layer hands the office to it); it learns the voters
// from its own removal, not from a message to itself, which it would
// refuse as from a node that is no voter any more.
func TestARemovedLeaderSaysSoAndNamesTheVoters(t *testing.T) {
	n, leader := threeNodes(t)
	if leader.self != "w" {
		if err := leader.TransferLeadership(testContext(t, 5*time.Second), "w"); err != nil {
			t.Fatal(err)
		}
	}
	w := n.node("w")
	waitFor(t, "w leads", 5*time.Second, func() bool { return w.raft.State() == raft.Leader })
	if _, err := w.RemoveVoter(testContext(t, 5*time.Second), "w"); err != nil {
		t.Fatalf("w removes itself: %v", err)
	}
	// At once: its removal, not a later question to the others, told it.
	requireNotAVoter(t, w, Removed, "this node (w) was removed from the cluster; it is no longer a voter; the voters are a, b")
}

// TestANodeRemovedWhileCutOffLearnsItByAsking: the witness is cut off
// when it is removed, so nobody can tell it; once the cut heals it hears
// from no leader, asks the others, and learns it.
func TestANodeRemovedWhileCutOffLearnsItByAsking(t *testing.T) {
	n, leader := threeNodes(t)
	if leader.self == "w" {
		if err := leader.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
		leader = n.waitLeader(t)
	}
	n.partition("w")
	w := removeWitness(t, n, leader)
	time.Sleep(time.Second)
	if s := w.Status(); s.Standing != "" {
		t.Fatalf("w, cut off, knows its standing already: %+v", s)
	}
	n.heal("w")
	waitFor(t, "w learns it was removed", 5*time.Second, func() bool { return w.Status().Standing == Removed })
	requireNotAVoter(t, w, Removed, "it is no longer a voter; the voters are a, b")
}

// TestAJoiningNodeIsNotAVoterUntilAdded: a node started without bootstrap
// and not added yet says so, names the voters and refuses at once; once
// added it is a voter like any other.
func TestAJoiningNodeIsNotAVoterUntilAdded(t *testing.T) {
	n, leader := threeNodes(t)
	d := n.defineSpare(member("d"))
	dc := n.start("d")
	waitFor(t, "d knows it is not a voter yet", 5*time.Second, func() bool { return dc.Status().Standing == Joining })
	s := dc.Status()
	if !slices.Equal(s.Voters, []string{"a", "b", "w"}) || !strings.Contains(s.NotAVoter, "this node (d) is not a voter of the cluster yet; the voters are a, b, w; replctl node add d") {
		t.Fatalf("status of the joining d: %+v", s)
	}
	if _, err := dc.Propose(testContext(t, 5*time.Second), replication.MarkOutdatedCommand("vol", 1, "b")); !errors.Is(err, ErrNotAVoter) {
		t.Fatalf("a proposal through the joining d: %v, want ErrNotAVoter", err)
	}
	if _, err := leader.AddVoter(testContext(t, 5*time.Second), d); err != nil {
		t.Fatalf("add d: %v", err)
	}
	waitFor(t, "d, added, is a voter", 5*time.Second, func() bool {
		s := dc.Status()
		return s.Standing == "" && s.Quorum && slices.Equal(s.Voters, []string{"a", "b", "d", "w"})
	})
	if _, err := dc.Propose(testContext(t, 5*time.Second), replication.MarkUpToDateCommand("vol", 1, "b")); err != nil {
		t.Fatalf("a proposal through d once added: %v", err)
	}
}

// TestAwaitQuorumWaitsOutAnElectionButNotALostMajority: right after the
// leader stops, a follower sees no quorum, yet one forms within the
// election: AwaitQuorum says so. With two of three voters gone none can
// form, and it says so within its bound.
func TestAwaitQuorumWaitsOutAnElectionButNotALostMajority(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.startAll()
	leader := n.waitLeader(t)
	n.stop(leader.self)
	var rest []*Cluster
	for _, c := range n.nodes() {
		if c != leader {
			rest = append(rest, c)
		}
	}
	// The election has not ended while rest[0] sees no quorum.
	waitFor(t, rest[0].self+" sees the leader gone", 5*time.Second, func() bool { return !rest[0].Status().Quorum })
	ctx := testContext(t, 20*time.Second)
	if !rest[0].AwaitQuorum(ctx) {
		t.Fatalf("%s: no quorum awaited after the leader %s stopped, with two of three voters up", rest[0].self, leader.self)
	}
	if !rest[0].Status().Quorum {
		t.Fatalf("AwaitQuorum said yes, but %s's status has no quorum", rest[0].self)
	}
	n.stop(rest[1].self)
	waitFor(t, rest[0].self+" loses its quorum", 5*time.Second, func() bool { return !rest[0].Status().Quorum })
	began := time.Now()
	if rest[0].AwaitQuorum(ctx) {
		t.Fatalf("%s awaited a quorum alone of three voters", rest[0].self)
	}
	tm := rest[0].cfg.Timing
	if took, bound := time.Since(began), 2*(tm.HeartbeatTimeout+tm.ElectionTimeout)+time.Second; took > bound {
		t.Fatalf("AwaitQuorum without a majority returned after %s, want within %s", took, bound)
	}
}

// TestAMembershipChangeWhoseOutcomeIsUnknownIsRunAgain: a leader that
// loses its office while it commits a membership change answers "outcome
// unknown" (a loaded machine saw it: "leadership lost while committing
// log"). The change is asked again, of the next leader, as a proposal is:
// adding a voter twice, or removing one twice, is the same configuration.
// Here each change is committed and its answer lost on the way back.
func TestAMembershipChangeWhoseOutcomeIsUnknownIsRunAgain(t *testing.T) {
	n, leader := threeNodes(t)
	ctx := testContext(t, 10*time.Second)
	follower := n.follower(t, leader)
	d := n.defineSpare(member("d"))
	n.start("d")
	lost := map[ForwardKind]int{}
	n.mu.Lock()
	n.reply = func(req ForwardRequest, r ForwardReply) ForwardReply {
		if (req.Kind == KindAddVoter || req.Kind == KindRemoveVoter) && r.Err() == nil && lost[req.Kind] == 0 {
			lost[req.Kind]++
			return replyOf(replication.VolumeAuthority{}, fmt.Errorf("raft configuration change: %w: leadership lost while committing log", ErrOutcomeUnknown))
		}
		return r
	}
	n.mu.Unlock()

	changes := []struct {
		kind   ForwardKind
		what   string
		change func(c *Cluster) ([]string, error)
		want   []string
	}{
		{KindAddVoter, "add d", func(c *Cluster) ([]string, error) { return c.AddVoter(ctx, d) }, []string{"a", "b", "d", "w"}},
		{KindRemoveVoter, "remove d", func(c *Cluster) ([]string, error) { return c.RemoveVoter(ctx, "d") }, []string{"a", "b", "w"}},
	}
	for _, ch := range changes {
		for try := 1; ; try++ {
			if voters, err := ch.change(follower); err != nil || !slices.Equal(voters, ch.want) {
				t.Fatalf("%s, its first answer lost: voters %v, %v; want %v", ch.what, voters, err, ch.want)
			}
			n.mu.Lock()
			got := lost[ch.kind]
			n.mu.Unlock()
			if got == 1 {
				break
			}
			if try == 5 {
				t.Fatalf("%s: no answer of a leader was lost in %d tries (%v): the asking node led each time", ch.what, try, lost)
			}
			// The asking node led by the time it asked (a loaded
			// machine moved the office to it): it changed the
			// configuration itself and no answer crossed the wire to
			// be lost. The same change again, asked through a node that
			// does not lead, is the same configuration.
			t.Logf("try %d: %s was not forwarded (%s led): again through another node", try, ch.what, follower.self)
			follower = n.follower(t, n.waitLeader(t))
		}
	}
}

// TestAClusterWhoseGossipCannotStartFailsToOpenAndCleansUp: a node whose
// gossip address is taken opens no cluster: Open says why, and undoes
// what it started (raft, the goroutines that watch it). It dereferenced
// a nil Cluster in that undo (Open's result, set to nil by the return)
// and raced with the goroutine that watches raft.
func TestAClusterWhoseGossipCannotStartFailsToOpenAndCleansUp(t *testing.T) {
	taken, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := Member{Name: "a", Raft: ln.Addr().String(), Gossip: taken.LocalAddr().String()}
	c, err := Open(Config{Self: "a", Members: []Member{self}, Dir: t.TempDir(), RaftListener: ln, Timing: testTiming})
	if err == nil {
		c.Close()
		t.Fatalf("Open with gossip's address %s taken: no error", self.Gossip)
	}
	if c != nil {
		t.Fatalf("Open failed (%v) and returned a cluster", err)
	}
	t.Logf("Open: %v", err)
}

// TestABarrierWaitsOutALeadershipTransfer: a leader handing its office
// over refuses barriers while the transfer runs; a Barrier asked then
// (a volume create or delete, which the control API answers Unavailable
// on any other error) waits it out and ends either taken, with this node
// leading on, or with ErrLeadershipChanged, which the control API asks
// the next leader again for.
func TestABarrierWaitsOutALeadershipTransfer(t *testing.T) {
	n, leader := threeNodes(t)
	ctx := testContext(t, 20*time.Second)
	for range 5 {
		transfer := leader.raft.LeadershipTransfer()
		_, err := leader.Barrier(ctx)
		if errors.Is(err, raft.ErrLeadershipTransferInProgress) || err != nil && !errors.Is(err, ErrLeadershipChanged) {
			t.Fatalf("a barrier during a leadership transfer: %v; want it taken or ErrLeadershipChanged", err)
		}
		if err := transfer.Error(); err != nil {
			t.Logf("the transfer: %v", err)
		}
		leader = n.waitLeader(t)
	}
}

// TestACommandWaitsOutALeadershipTransfer: a leader handing its office
// over refuses commands while the transfer runs, before they reach its
// log; a volume create asked then (ProposeAsLeader in the office the
// create's barrier saw, or Propose through any node) waits it out and
// ends applied or with ErrLeadershipChanged, never with the transfer's
// refusal.
func TestACommandWaitsOutALeadershipTransfer(t *testing.T) {
	n, leader := threeNodes(t)
	ctx := testContext(t, 30*time.Second)
	for i := range 4 {
		office := leader.LeadingSince()
		transfer := leader.raft.LeadershipTransfer()
		def := replication.CreatedVolume{Name: fmt.Sprintf("pvc%d", i), Size: 4096, Pool: "default", Protocol: "C", Nodes: []string{"a", "b"}}
		_, err := leader.ProposeAsLeader(ctx, replication.CreateVolumeCommand(def), office)
		if err != nil && !errors.Is(err, ErrLeadershipChanged) {
			t.Fatalf("ProposeAsLeader during a leadership transfer: %v; want it applied or ErrLeadershipChanged", err)
		}
		if err := transfer.Error(); err != nil {
			t.Logf("the transfer: %v", err)
		}
		leader = n.waitLeader(t)

		transfer = leader.raft.LeadershipTransfer()
		def.Name = fmt.Sprintf("pvc%d-any", i)
		if _, err := n.follower(t, leader).Propose(ctx, replication.CreateVolumeCommand(def)); err != nil {
			t.Fatalf("Propose during a leadership transfer: %v; want it applied", err)
		}
		if _, ok := leader.Authority().Created(def.Name); !ok {
			waitFor(t, def.Name+" recorded", 5*time.Second, func() bool { _, ok := leader.Authority().Created(def.Name); return ok })
		}
		if err := transfer.Error(); err != nil {
			t.Logf("the transfer: %v", err)
		}
		leader = n.waitLeader(t)
	}
}

// TestAHandoffIsAnElectionAndALostMajorityIsNoQuorum: while a leader
// hands its office on, a node may see no quorum for a moment; its status
// says Electing then, so that status does not warn of a lost quorum at
// every handoff (a loaded machine's run of replctl status --check saw
// one, critical). Every node had a quorum when the transfer began, so a
// loss it sees began after that: no sample taken less than ElectionGrace
// after the transfer began may read "no quorum, not electing". With two
// of three voters gone, the last one says "no quorum, not electing"
// once the grace is over.
func TestAHandoffIsAnElectionAndALostMajorityIsNoQuorum(t *testing.T) {
	n, leader := threeNodes(t)
	grace := leader.cfg.Timing.ElectionGrace()
	electing := 0
	for range 5 {
		began := time.Now()
		for _, c := range n.nodes() {
			if st := c.Status(); !st.Quorum {
				t.Fatalf("%s has no quorum before the transfer: %+v", c.self, st)
			}
		}
		transfer, done := leader.raft.LeadershipTransfer(), make(chan struct{})
		go func() {
			defer close(done)
			if err := transfer.Error(); err != nil {
				t.Logf("the transfer: %v", err)
			}
		}()
		for sampling := true; sampling; {
			select {
			case <-done:
				sampling = false
			default:
			}
			for _, c := range n.nodes() {
				st := c.Status()
				at := time.Now()
				if st.Electing {
					electing++
				}
				if !st.Quorum && !st.Electing && at.Sub(began) < grace {
					t.Fatalf("%s %s after the transfer began: no quorum and not electing, within the grace of %s", c.self, at.Sub(began), grace)
				}
			}
		}
		leader = n.waitLeader(t)
		waitFor(t, "every node sees the quorum again", 10*time.Second, func() bool {
			for _, c := range n.nodes() {
				if !c.Status().Quorum {
					return false
				}
			}
			return true
		})
	}
	t.Logf("samples that saw an election under way: %d", electing)

	last := n.follower(t, leader)
	for _, c := range n.nodes() {
		if c != last {
			n.stop(c.self)
		}
	}
	waitFor(t, last.self+" sees the election under way", 5*time.Second, func() bool {
		st := last.Status()
		return !st.Quorum && st.Electing
	})
	waitFor(t, last.self+" sees no quorum, no election under way, once the grace is over", 10*time.Second, func() bool {
		st := last.Status()
		return !st.Quorum && !st.Electing
	})
}
