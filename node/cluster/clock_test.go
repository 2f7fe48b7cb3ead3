package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
)

// TestTheLeasesKeepTheInjectedClock: a lease's hold runs on the cluster's
// clock, whatever the time raft and the network take. With a clock.Fake
// shared by the nodes, a switchover away from a primary that renewed its
// lease waits on the fake's timer, LeaseFree stays false until the fake
// reaches LeaseDuration×(1+LeaseDrift) past the renewal, and the promotion
// completes as soon as it does, after the primary's lease ran out. Gossip's
// view of the members is dated on the same clock.
func TestTheLeasesKeepTheInjectedClock(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fake := clock.NewFake(start)
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.clock = fake
	// Slower raft than the package's other tests (the lease's time is the
	// fake's): a loaded machine that holds a node up for a moment must not
	// make an election of its own. A renewal is given up after
	// LeaseDuration of real time, which is its barrier's room.
	n.timing.HeartbeatTimeout, n.timing.ElectionTimeout, n.timing.LeaderLeaseTimeout = 1500*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond
	n.timing.LeaseDuration = 3 * time.Second
	n.startAll()
	leader := n.waitLeader(t)
	for _, c := range n.nodes() {
		waitFor(t, c.self+" sees every member alive", 30*time.Second, func() bool {
			for _, m := range c.Status().Members {
				if m.State != Alive {
					return false
				}
			}
			return true
		})
		for _, m := range c.Status().Members {
			if !m.Since.Equal(start) {
				t.Errorf("%s sees %s alive since %v, want the injected clock's %v", c.self, m.Name, m.Since, start)
			}
		}
	}
	ctx := testContext(t, 60*time.Second)
	if _, err := leader.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Propose(ctx, replication.MarkUpToDateCommand("vol", 1, "b")); err != nil {
		t.Fatal(err)
	}
	a, b := n.node("a"), n.node("b")
	// A renewal fails while raft has no leader; a primary renews again, as
	// a does here until one is granted.
	var validUntil time.Time
	var err error
	if !within(30*time.Second, 10*time.Millisecond, func() bool {
		validUntil, err = a.RenewLease(ctx, "vol", 1)
		return err == nil
	}) {
		t.Fatalf("a's renewals failed for 30s, the last: %v", err)
	}
	if want := fake.Now().Add(leader.leases.duration); !validUntil.Equal(want) {
		t.Fatalf("a's lease is valid until %v, want the fake's now + LeaseDuration×(1−LeaseDrift) = %v", validUntil, want)
	}

	type proposed struct {
		va  replication.VolumeAuthority
		err error
	}
	// The gossip and membership loops keep their tickers armed: the
	// leader's wait for the lease is the timer armed beyond them.
	armed := fake.Armed()
	done := make(chan proposed, 1)
	go func() {
		va, err := b.Propose(ctx, replication.PromoteCommand("vol", 1, "b", false))
		done <- proposed{va, err}
	}()
	waitArmed(t, fake, armed+1, "the leader waits for a's lease to run out")
	hold := leader.leases.hold
	fake.Advance(hold - time.Nanosecond)
	if leader.LeaseFree("vol") {
		t.Fatalf("the lease is free %v after a's renewal, before its hold of %v", hold-time.Nanosecond, hold)
	}
	select {
	case p := <-done:
		t.Fatalf("b was promoted before a's lease could have run out: %+v, %v", p.va, p.err)
	default:
	}
	term := terms(n)
	fake.Advance(time.Nanosecond)
	// A leader elected after the fake passed the renewal cannot know what
	// the old one granted: it waits a whole hold from its office on the
	// fake, which the test then lets pass.
	var p proposed
	for waiting := true; waiting; {
		select {
		case p = <-done:
			waiting = false
		case <-time.After(time.Second):
			if now := terms(n); now != term {
				t.Logf("raft elected again after a's lease ran out (terms %s, then %s): the fake moves on by a hold", term, now)
				term = now
				fake.Advance(hold)
			}
		}
	}
	if p.err != nil || p.va.Primary != "b" || p.va.Epoch != 2 {
		t.Fatalf("switchover to b: %+v, %v (raft terms %s)", p.va, p.err, terms(n))
	}
	if !validUntil.Before(fake.Now()) {
		t.Errorf("b was promoted at %v, not after a's lease ran out at %v", fake.Now(), validUntil)
	}
}

// terms is each running node's raft term, in words.
func terms(n *testNet) string {
	var out []string
	for _, c := range n.nodes() {
		out = append(out, fmt.Sprintf("%s:%d", c.self, c.raft.CurrentTerm()))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// waitArmed waits until fake has n timers armed, for at most 10 s.
func waitArmed(t *testing.T, fake *clock.Fake, n int, what string) {
	t.Helper()
	armed := make(chan struct{})
	go func() { fake.WaitArmed(n); close(armed) }()
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: %d timers armed on the fake clock after 10s, want %d", what, fake.Armed(), n)
	}
}

// TestAProposalWhoseOutcomeIsUnknownIsRunAgainOnRaftsTime: a proposal
// whose leader lost its office while committing it is asked again after
// a pause of raft's time, not of the cluster's clock: what it waits for
// is a raft election. With a clock.Fake that the test does not advance,
// the retry waited until its context ended, and the proposal failed with
// "outcome unknown" (TestTheLeasesKeepTheInjectedClock did so on a loaded
// machine, where raft lost its leader while committing). Here the first
// answer of a forwarded proposal is lost so.
func TestAProposalWhoseOutcomeIsUnknownIsRunAgainOnRaftsTime(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.clock = clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n.startAll()
	follower := n.follower(t, n.waitLeader(t))
	lost := 0
	n.mu.Lock()
	n.reply = func(req ForwardRequest, r ForwardReply) ForwardReply {
		if req.Kind == KindPropose && r.Err() == nil && lost == 0 {
			lost++
			return replyOf(replication.VolumeAuthority{}, fmt.Errorf("%w: leadership lost while committing log", ErrOutcomeUnknown))
		}
		return r
	}
	n.mu.Unlock()
	ctx := testContext(t, 10*time.Second)
	if va, err := follower.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil || va.Primary != "a" {
		t.Fatalf("init, its first answer lost: %+v, %v", va, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if lost != 1 {
		t.Fatalf("answers lost: %d, want 1", lost)
	}
}

// stuckLayer is a raft stream layer whose Accept fails with what the test
// sends on results, counting its calls on calls.
type stuckLayer struct {
	net.Listener
	results chan error
	calls   chan struct{}
	closed  chan struct{}
	once    sync.Once
}

func (l *stuckLayer) Accept() (net.Conn, error) {
	l.calls <- struct{}{}
	select {
	case err := <-l.results:
		return nil, err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *stuckLayer) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *stuckLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return nil, errors.New("no dialing in this test")
}

// TestAFailedRaftAcceptPausesOnTheInjectedClock: after a failed accept,
// raft's port pauses on the cluster's clock before it accepts again.
func TestAFailedRaftAcceptPausesOnTheInjectedClock(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	layer := &stuckLayer{Listener: ln, results: make(chan error), calls: make(chan struct{}, 4), closed: make(chan struct{})}
	trans := newGatedTransport(gateConfig{listener: layer, timeout: time.Second, clock: fake,
		logger: slog.New(slog.DiscardHandler), hcl: hclog.NewNullLogger()})
	defer trans.Close()
	trans.start(func() (raft.Configuration, string, bool) { return raft.Configuration{}, "", false })
	within := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("not within 10s: %s", what)
		}
	}
	within("the first accept", layer.calls)
	layer.results <- errors.New("accept: too many open files")
	armed := make(chan struct{})
	go func() { fake.WaitArmed(1); close(armed) }()
	within("the pause is armed on the injected clock", armed)
	select {
	case <-layer.calls:
		t.Fatal("raft's port accepted again before its pause ran out")
	default:
	}
	fake.Advance(5 * time.Millisecond)
	within("the accept after the pause", layer.calls)
}
