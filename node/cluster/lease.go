package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/node/failover"
	"github.com/replvol/replvol/replication"
)

// The primary's lease: a primary completes writes only while it holds one;
// the leader promotes another node only once no lease can still be valid.
//
// Why the old lease has run out when LeaseFree is true. The primary notes
// the time it SENDS a renewal and holds the lease until
// sent + LeaseDuration×(1−drift) on its own monotonic clock. The leader
// grants only after a raft barrier entry, appended after the request
// arrived, is committed: a majority accepted the leader's term after the
// request was sent. It then checks the state machine (current as of the
// barrier) names the requester primary at that epoch, and records the
// grant at a time after the send.
//   - The same leader: LeaseFree waits LeaseDuration×(1+drift) after its
//     last grant of that volume, and is false while a grant is in progress.
//     A promotion fences the volume (no new grant starts) before it waits,
//     and applies only after LeaseFree, so no grant slips in between.
//   - Another leader: it was elected by a majority that shares a voter
//     with the majority that committed the old leader's barrier; that
//     voter accepted the barrier before it voted in the newer term. So the
//     new leader took office after the request was sent, and LeaseFree
//     waits LeaseDuration×(1+drift) from the moment raft told it it leads
//     (raft blocks on the unbuffered NotifyCh before it acts as leader).
//
// Both hold while the clocks' rates differ by less than drift (0.05 by
// default; quartz drifts by 1e-4 and NTP slews at most 5e-4). A paused
// or overloaded primary is not covered by rates: it must check its lease
// right before it completes a write, and the epoch fences its writes at
// the secondaries anyway (DESIGN.md §2, invariants 1 and 3).
type leases struct {
	duration, hold time.Duration // LeaseDuration×(1−drift), ×(1+drift)

	mu lockorder.Mutex
	// leader and since mirror raft's NotifyCh: this node leads since.
	leader bool
	since  time.Time
	// lastGrant is the last grant this node made per volume; pending
	// counts grants in progress, fenced promotions waiting.
	lastGrant map[string]time.Time
	pending   map[string]int
	fenced    map[string]int
	// changed fires when a grant ends, a lease is released or leadership
	// changes: a waiting promotion looks again.
	changed *broadcast
}

func newLeases(t Timing) *leases {
	d := float64(t.LeaseDuration)
	return &leases{
		duration:  time.Duration(d * (1 - t.LeaseDrift)),
		hold:      time.Duration(d * (1 + t.LeaseDrift)),
		lastGrant: map[string]time.Time{},
		pending:   map[string]int{},
		fenced:    map[string]int{},
		changed:   newBroadcast(),
	}
}

// setLeader records a leadership change as raft announces it.
func (l *leases) setLeader(leader bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader, l.since = leader, now
	l.changed.fire()
}

// fenceOf is what this node knows of volume's lease for the lease fence
// (failover.LeaseFence); leading is false when this node is not the
// leader.
func (l *leases) fenceOf(volume string) (f failover.LeaseFence, leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return failover.LeaseFence{Office: l.since, Renewal: failover.Renewal{Last: l.lastGrant[volume], Renewing: l.pending[volume] > 0}, Hold: l.hold}, l.leader
}

// begin starts a grant, unless a promotion fenced the volume. The grant
// must end with end.
func (l *leases) begin(volume string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fenced[volume] > 0 {
		return fmt.Errorf("%w: volume %q", ErrPromotionPending, volume)
	}
	l.pending[volume]++
	return nil
}

// end ends a grant; granted records it at now.
func (l *leases) end(volume string, granted bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending[volume]--; l.pending[volume] == 0 {
		delete(l.pending, volume)
	}
	if granted {
		l.lastGrant[volume] = now
	}
	l.changed.fire()
}

// fence stops new grants for volume until the returned func runs.
func (l *leases) fence(volume string) (unfence func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fenced[volume]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.fenced[volume]--; l.fenced[volume] == 0 {
			delete(l.fenced, volume)
		}
	}
}

// release forgets volume's last grant.
func (l *leases) release(volume string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.lastGrant, volume)
	l.changed.fire()
}

// RenewLease asks the leader to renew this node's lease as primary of
// volume at epoch. The lease is valid until the returned time, on the
// monotonic clock: compare it with Clock().Now(), never store or send it. It
// runs from the moment the request was SENT, for
// LeaseDuration×(1−LeaseDrift). Give ctx a deadline before the current
// lease ends: cut off from the leader, RenewLease waits for another one
// until ctx ends. Errors: ErrStaleEpoch or ErrNotPrimary (another node is
// primary: stop), ErrPromotionPending (a switchover is waiting for this
// lease to run out), ErrNoQuorum, or the Forwarder's.
//
// The renewals of all of this node's volumes travel together
// (renewals.go): one request to the leader and one raft barrier there per
// round, however many volumes this node serves.
func (c *Cluster) RenewLease(ctx context.Context, volume string, epoch uint64) (validUntil time.Time, err error) {
	sent, err := c.renew(ctx, LeaseClaim{Volume: volume, Epoch: epoch})
	if err != nil {
		return time.Time{}, fmt.Errorf("renew the lease of %s at epoch %d: %w", volume, epoch, err)
	}
	return sent.Add(c.leases.duration), nil
}

// Clock returns the clock the leases keep (Config.Clock; the real one
// unless a test set another): RenewLease's validUntil, LeaseWatch's grants
// and LeadingSince are its times, and a caller compares them with its Now
// and waits on its timers.
func (c *Cluster) Clock() clock.Clock { return c.cfg.Clock }

// ReleaseLease gives up this node's lease of volume at epoch, so that a
// switchover need not wait for it to run out. Call it only AFTER the
// volume stopped completing writes here and no RenewLease for it is in
// flight or will be sent at this epoch.
func (c *Cluster) ReleaseLease(ctx context.Context, volume string, epoch uint64) error {
	_, err := c.toLeader(ctx, ForwardRequest{Kind: KindReleaseLease, From: c.self, Volume: volume, Epoch: epoch})
	return err
}

// idle is how long this leader has made no grant of volume's lease (since
// it leads, when it made none); 0 while not leading or a grant runs.
func (l *leases) idle(volume string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader || l.pending[volume] > 0 {
		return 0
	}
	last := l.since
	if g := l.lastGrant[volume]; g.After(last) {
		last = g
	}
	return now.Sub(last)
}

// LeaseIdle reports, on the leader, how long nobody has renewed volume's
// lease here: a primary that gossip sees alive but that renews nothing is
// cut off from the leader, and its IO is frozen. 0 on any other node.
func (c *Cluster) LeaseIdle(volume string) time.Duration {
	if c.raft.State() != raft.Leader {
		return 0
	}
	return c.leases.idle(volume, c.cfg.Clock.Now())
}

// watch returns this node's last grant of volume's lease (zero: none)
// and whether a grant runs.
func (l *leases) watch(volume string) (lastGrant time.Time, renewing bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastGrant[volume], l.pending[volume] > 0
}

// LeaseWatch reports, on the leader, its last grant of volume's lease
// (zero: none) and whether a grant is in progress: what PrimaryWatch
// needs. Zero values on any other node.
func (c *Cluster) LeaseWatch(volume string) (lastGrant time.Time, renewing bool) {
	if c.LeadingSince().IsZero() {
		return time.Time{}, false
	}
	return c.leases.watch(volume)
}

// office returns since when this node leads, zero when it does not.
func (l *leases) office() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return time.Time{}
	}
	return l.since
}

// LeadingSince returns when raft told this node it leads, zero when it
// does not lead: it names this node's office (ProposeAsLeader).
func (c *Cluster) LeadingSince() time.Time {
	if c.raft.State() != raft.Leader {
		return time.Time{}
	}
	return c.leases.office()
}

// LeaseFree reports, on the leader, that no lease of volume can still be
// valid: this node has led for LeaseDuration×(1+LeaseDrift) (a new leader
// cannot know what the old one granted), its own last grant is as old,
// and no grant is in progress. On any other node it is false. Propose
// waits for it before a promotion that changes the primary.
func (c *Cluster) LeaseFree(volume string) bool {
	f, leading := c.leases.fenceOf(volume)
	free, _ := f.Wait(c.cfg.Clock.Now())
	return leading && free && c.raft.State() == raft.Leader
}

// grantLease is the leader's side of RenewLease.
func (c *Cluster) grantLease(ctx context.Context, from, volume string, epoch uint64) error {
	if c.raft.State() != raft.Leader {
		return errNotLeader
	}
	if err := c.leases.begin(volume); err != nil {
		return err
	}
	granted := false
	defer func() { c.leases.end(volume, granted, c.cfg.Clock.Now()) }()
	if err := c.grantBarrier(ctx); err != nil {
		return err
	}
	err := c.checkHolder(from, volume, epoch)
	granted = err == nil
	return err
}

// checkHolder returns nil if the state machine names from the primary of
// volume at epoch.
func (c *Cluster) checkHolder(from, volume string, epoch uint64) error {
	va, ok := c.fsm.volume(volume)
	if !ok {
		return fmt.Errorf("%w %q", replication.ErrUnknownVolume, volume)
	}
	return va.CheckPrimary(from, epoch)
}

// releaseLease is the leader's side of ReleaseLease.
func (c *Cluster) releaseLease(from, volume string, epoch uint64) error {
	if c.raft.State() != raft.Leader {
		return errNotLeader
	}
	if err := c.checkHolder(from, volume, epoch); err != nil {
		return err
	}
	c.leases.release(volume)
	return nil
}

// waitLeaseFree waits, on the leader, until LeaseFree(volume). With a
// non-zero office it gives up when this node no longer leads in the
// office it took then.
func (c *Cluster) waitLeaseFree(ctx context.Context, volume string, office time.Time) error {
	for {
		changed := c.leases.changed.wait()
		f, leading := c.leases.fenceOf(volume)
		if !leading || c.raft.State() != raft.Leader {
			return errNotLeader
		}
		if !office.IsZero() && !c.leases.office().Equal(office) {
			return errNotLeader
		}
		// The rule is failover's (LeaseFence), which the simulation runs.
		free, wait := f.Wait(c.cfg.Clock.Now())
		if free {
			return nil
		}
		if wait <= 0 {
			wait = c.cfg.Timing.LeaseDuration // a grant's end fires changed
		}
		timer := c.cfg.Clock.NewTimer(wait)
		select {
		case <-changed:
		case <-timer.C():
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("waiting for the lease of %s to run out: %w", volume, ctx.Err())
		}
		timer.Stop()
	}
}
