package failover

import (
	"fmt"
	"strings"
	"time"
)

// The leader's watch over the primaries: when does a primary count as
// lost? These are pure rules of (observations, now); the node layer's
// cluster loop feeds them its clock and acts on the verdict.
//
// Gossip declaring the primary dead or gone is enough, unless the primary
// renewed its lease through this leader lately: gossip is a hint, carried
// under one key that every node holds and naming no certificate (a
// holder of the key can say any node is dead), and a primary that renews
// is in touch with the leader whatever gossip says. A primary that
// gossip sees alive but that renews no lease is cut off from the leader;
// it counts as lost once it has renewed nothing for StarvedAfter, counted
// only over time the leader itself observed: since it took office, since
// its own observation resumed after a gap (its process was paused: a
// SIGSTOP, a VM pause, a long GC), since it first saw the primary's term,
// and since the primary's last renewal. A leader that could not observe
// could not grant renewals either, so that time is not held against the
// primary: it gets a full chance to renew once the leader observes again,
// as raft gives a new leader its lease after an election.

// StarvedAfter is how long a primary that gossip sees alive may renew no
// lease, under the leader's eyes, before the leader fails it over: twice
// the lease, so that its IO has been frozen for a whole lease already and
// a renewal or two lost to a slow moment does not move the volume.
func StarvedAfter(lease time.Duration) time.Duration { return 2 * lease }

// UnknownGrace: a member gossip never heard of counts as lost once the
// leader has observed this long (unless it renews).
const UnknownGrace = 5 * time.Second

// RenewalOverrulesGossip is how recent a grant of the primary's lease
// must be to overrule gossip that says the primary is dead, gone or
// unknown: half a lease. A live primary renews every third of a lease; a
// dead one's last grant is half a lease old well before no lease of it
// can still be valid (LeaseDuration×(1+drift) after the grant, when the
// promotion may complete), so waiting for it delays no failover.
func RenewalOverrulesGossip(lease time.Duration) time.Duration { return lease / 2 }

// Watch follows a leader's observation loop, a loop that runs at least
// every Every: a step that comes more than GapAfter(Every) after the one
// before is a gap, time during which this node did not observe. The loop
// owns its Watch; the zero value with Every set is ready.
type Watch struct {
	Every time.Duration

	last    time.Time // the previous step
	resumed time.Time // the end of the last gap
}

// GapAfter is how late a step of a loop that runs every every may come
// before the time since the last step counts as a gap.
func GapAfter(every time.Duration) time.Duration { return 4 * every }

// Step records a step of the loop at now. leadingSince is when this node
// took raft's leadership (zero when it does not lead). It returns since
// when this node has observed as leader without a break (zero when it
// does not lead), and the gap that ended now (zero if none).
func (w *Watch) Step(now, leadingSince time.Time) (observing time.Time, gap time.Duration) {
	if !w.last.IsZero() {
		if d := now.Sub(w.last); d > GapAfter(w.Every) {
			gap, w.resumed = d, now
		}
	}
	w.last = now
	if leadingSince.IsZero() {
		return time.Time{}, gap
	}
	return latest(leadingSince, w.resumed), gap
}

// PrimaryWatch is what the leader knows of a volume's primary at one
// moment: the inputs of Judge. Times are this node's.
type PrimaryWatch struct {
	// Liveness is gossip's view of the primary.
	Liveness Liveness
	// Observing is since when this node has observed as leader without a
	// break (Watch.Step); zero when it does not lead.
	Observing time.Time
	// TermSeen is when this node first saw the primary at its epoch: a
	// new primary gets StarvedAfter from then to renew its first lease.
	TermSeen time.Time
	// LastRenewal is this node's last grant of the volume's lease (zero:
	// none); Renewing, a grant in progress.
	LastRenewal time.Time
	Renewing    bool
}

// PrimaryVerdict is Judge's answer.
type PrimaryVerdict struct {
	// Lost: another node should take over.
	Lost bool
	// CutOff: lost although gossip sees it alive (it renews no lease): it
	// cannot take over itself.
	CutOff bool
	// Idle is how long the primary has renewed nothing while the leader
	// observed (for a primary gossip sees alive).
	Idle time.Duration
}

// Judge says whether the primary counts as lost at now, for a lease of
// the given duration.
func (w PrimaryWatch) Judge(now time.Time, lease time.Duration) PrimaryVerdict {
	if w.Observing.IsZero() {
		return PrimaryVerdict{} // a node that does not lead judges nothing
	}
	renewedLately := w.Renewing || (!w.LastRenewal.IsZero() && now.Sub(w.LastRenewal) < RenewalOverrulesGossip(lease))
	switch w.Liveness {
	case Dead, Left:
		if !renewedLately {
			return PrimaryVerdict{Lost: true}
		}
		// Gossip says it is gone, but it renews: judged by its renewals.
	case Unknown:
		if now.Sub(w.Observing) > UnknownGrace && !renewedLately {
			return PrimaryVerdict{Lost: true}
		}
		// Not heard of yet, or renewing: judged by its renewals.
	}
	if w.Renewing {
		return PrimaryVerdict{}
	}
	idle := max(now.Sub(latest(w.Observing, w.TermSeen, w.LastRenewal)), 0)
	return PrimaryVerdict{Lost: idle >= StarvedAfter(lease), CutOff: idle >= StarvedAfter(lease), Idle: idle}
}

func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// AutoFailover says whether raft's live voters let the leader fail a
// primary over by itself, and why not: a majority must survive the loss
// of any one voter, which takes three. With two, the loss of either is the
// loss of the quorum.
func AutoFailover(voters []string) (ok bool, why string) {
	switch {
	case len(voters) >= 3:
		return true, ""
	case len(voters) == 0:
		return false, "this node knows no raft voters (yet): automatic failover needs three"
	}
	noun := "voters"
	if len(voters) == 1 {
		noun = "voter"
	}
	return false, fmt.Sprintf("%d raft %s (%s): automatic failover needs three, as the loss of any one is the loss of the quorum; "+
		"add a voter with replctl node add NAME; meanwhile a primary's IO holds while the quorum is lost, and only replctl primary (--force --yes when the primary is gone) changes it",
		len(voters), noun, strings.Join(voters, ", "))
}
