package cluster

import (
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
)

// TestTheLeasesKeepTheInjectedClock: a lease's hold runs on the cluster's
// clock, whatever the time raft and the network take. With a clock.Fake
// shared by the nodes, a switchover away from a primary that renewed its
// lease waits on the fake's timer, LeaseFree stays false until the fake
// reaches LeaseDuration×(1+LeaseDrift) past the renewal, and the promotion
// completes as soon as it does, after the primary's lease ran out.
func TestTheLeasesKeepTheInjectedClock(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.clock = fake
	n.startAll()
	leader := n.waitLeader(t)
	ctx := testContext(t, 10*time.Second)
	if _, err := leader.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Propose(ctx, replication.MarkUpToDateCommand("vol", 1, "b")); err != nil {
		t.Fatal(err)
	}
	a, b := n.node("a"), n.node("b")
	validUntil, err := a.RenewLease(ctx, "vol", 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := fake.Now().Add(leader.leases.duration); !validUntil.Equal(want) {
		t.Fatalf("a's lease is valid until %v, want the fake's now + LeaseDuration×(1−LeaseDrift) = %v", validUntil, want)
	}

	type proposed struct {
		va  replication.VolumeAuthority
		err error
	}
	done := make(chan proposed, 1)
	go func() {
		va, err := b.Propose(ctx, replication.PromoteCommand("vol", 1, "b", false))
		done <- proposed{va, err}
	}()
	fake.WaitArmed(1) // the leader waits for the lease to run out
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
	fake.Advance(time.Nanosecond)
	p := <-done
	if p.err != nil || p.va.Primary != "b" || p.va.Epoch != 2 {
		t.Fatalf("switchover to b: %+v, %v", p.va, p.err)
	}
	if !validUntil.Before(fake.Now()) {
		t.Errorf("b was promoted at %v, not after a's lease ran out at %v", fake.Now(), validUntil)
	}
}
