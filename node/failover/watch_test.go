package failover

import (
	"strings"
	"testing"
	"time"
)

// The leader's watch: a primary counts as lost when gossip says it is
// gone and it renewed nothing for half a lease (its renewals overrule
// gossip), or when it renewed no lease for two leases of time the leader
// itself observed. Time the leader could not observe (before it took
// office, during a pause of its own process) is never held against the
// primary.

func TestJudgePrimary(t *testing.T) {
	const lease = 1500 * time.Millisecond
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cases := []struct {
		name string
		w    PrimaryWatch
		now  time.Time
		want PrimaryVerdict
	}{
		{"a node that does not lead judges nothing",
			PrimaryWatch{Liveness: Dead}, at(100000), PrimaryVerdict{}},
		{"gossip declared the primary dead",
			PrimaryWatch{Liveness: Dead, Observing: at(0)}, at(100), PrimaryVerdict{Lost: true}},
		{"the primary left",
			PrimaryWatch{Liveness: Left, Observing: at(0)}, at(100), PrimaryVerdict{Lost: true}},
		{"never heard of by gossip, renewing, shortly after the leader took office",
			PrimaryWatch{Liveness: Unknown, Observing: at(0), LastRenewal: at(3800)}, at(4000), PrimaryVerdict{Idle: 200 * time.Millisecond}},
		{"never heard of by gossip for longer than the grace, but renewing: its renewals overrule gossip",
			PrimaryWatch{Liveness: Unknown, Observing: at(0), LastRenewal: at(5000)}, at(5100), PrimaryVerdict{Idle: 100 * time.Millisecond}},
		{"never heard of by gossip for longer than the grace, last renewal half a lease ago",
			PrimaryWatch{Liveness: Unknown, Observing: at(0), LastRenewal: at(4350)}, at(5100), PrimaryVerdict{Lost: true}},
		{"gossip declared the primary dead, but it renewed 100 ms ago: a hint, not the authority",
			PrimaryWatch{Liveness: Dead, Observing: at(0), TermSeen: at(0), LastRenewal: at(9900)}, at(10000), PrimaryVerdict{Idle: 100 * time.Millisecond}},
		{"gossip declared the primary dead, and a renewal is in progress",
			PrimaryWatch{Liveness: Dead, Observing: at(0), TermSeen: at(0), LastRenewal: at(1000), Renewing: true}, at(10000), PrimaryVerdict{}},
		{"gossip declared the primary dead, last renewal just under half a lease ago",
			PrimaryWatch{Liveness: Dead, Observing: at(0), TermSeen: at(0), LastRenewal: at(9251)}, at(10000), PrimaryVerdict{Idle: 749 * time.Millisecond}},
		{"gossip declared the primary dead, last renewal half a lease ago",
			PrimaryWatch{Liveness: Dead, Observing: at(0), TermSeen: at(0), LastRenewal: at(9250)}, at(10000), PrimaryVerdict{Lost: true}},
		{"the primary left, and renewed nothing since",
			PrimaryWatch{Liveness: Left, Observing: at(0), TermSeen: at(0), LastRenewal: at(8000)}, at(10000), PrimaryVerdict{Lost: true}},
		{"never heard of by gossip, and the leader just resumed from a long pause",
			PrimaryWatch{Liveness: Unknown, Observing: at(10000), LastRenewal: at(1000)}, at(10200), PrimaryVerdict{Idle: 200 * time.Millisecond}},
		{"never heard of by gossip, renewing nothing for two leases",
			PrimaryWatch{Liveness: Unknown, Observing: at(0)}, at(3000), PrimaryVerdict{Lost: true, CutOff: true, Idle: 3 * time.Second}},
		{"alive and renewing",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0), LastRenewal: at(9500)}, at(10000), PrimaryVerdict{Idle: 500 * time.Millisecond}},
		{"alive, no renewal for just under two leases",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0), LastRenewal: at(7100)}, at(10000), PrimaryVerdict{Idle: 2900 * time.Millisecond}},
		{"alive, no renewal for two leases: cut off from the leader",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0), LastRenewal: at(7000)}, at(10000), PrimaryVerdict{Lost: true, CutOff: true, Idle: 3 * time.Second}},
		{"alive, never renewed since the leader took office two leases ago",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0)}, at(3200), PrimaryVerdict{Lost: true, CutOff: true, Idle: 3200 * time.Millisecond}},
		{"alive, the leader took office a second ago",
			PrimaryWatch{Liveness: Alive, Observing: at(9000), TermSeen: at(0), LastRenewal: at(1000)}, at(10000), PrimaryVerdict{Idle: time.Second}},
		{"alive, last renewal before the leader's 5 s pause, which just ended",
			PrimaryWatch{Liveness: Alive, Observing: at(15300), TermSeen: at(0), LastRenewal: at(10000)}, at(15300), PrimaryVerdict{}},
		{"alive, no renewal for two leases since the leader's pause ended",
			PrimaryWatch{Liveness: Alive, Observing: at(15300), TermSeen: at(0), LastRenewal: at(10000)}, at(18300), PrimaryVerdict{Lost: true, CutOff: true, Idle: 3 * time.Second}},
		{"alive, a new primary whose term the leader saw a second ago",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(9000)}, at(10000), PrimaryVerdict{Idle: time.Second}},
		{"alive, a renewal in progress",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0), Renewing: true}, at(10000), PrimaryVerdict{}},
		{"alive, renewed after the moment judged",
			PrimaryWatch{Liveness: Alive, Observing: at(0), TermSeen: at(0), LastRenewal: at(10100)}, at(10000), PrimaryVerdict{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.w.Judge(c.now, lease); got != c.want {
				t.Errorf("Judge(%+v, now +%v) = %+v, want %+v", c.w, c.now.Sub(t0), got, c.want)
			}
		})
	}
}

func TestWatchCountsNoTimeItDidNotObserve(t *testing.T) {
	const every = 250 * time.Millisecond
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		now, leadingSince time.Time
		observing         time.Time
		gap               time.Duration
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a follower observes nothing", []step{
			{now: at(0)}, {now: at(250)}, {now: at(6000), gap: 5750 * time.Millisecond}, // a gap, as a follower
		}},
		{"a leader observes from its office on, steps on time", []step{
			{now: at(0), leadingSince: at(0), observing: at(0)},
			{now: at(250), leadingSince: at(0), observing: at(0)},
			{now: at(600), leadingSince: at(0), observing: at(0)},
			{now: at(1600), leadingSince: at(0), observing: at(0)}, // 1 s late: a slow moment, not a gap
		}},
		{"a leader paused for 5 s observes again from its resumption", []step{
			{now: at(0), leadingSince: at(0), observing: at(0)},
			{now: at(250), leadingSince: at(0), observing: at(0)},
			{now: at(5300), leadingSince: at(0), observing: at(5300), gap: 5050 * time.Millisecond},
			{now: at(5550), leadingSince: at(0), observing: at(5300)},
			{now: at(9000), leadingSince: at(0), observing: at(9000), gap: 3450 * time.Millisecond}, // another gap
		}},
		{"a gap as a follower, then the office: it observes from the office", []step{
			{now: at(0)},
			{now: at(5000), gap: 5 * time.Second},
			{now: at(5250), leadingSince: at(5200), observing: at(5200)},
			{now: at(5500), leadingSince: at(5200), observing: at(5200)},
		}},
		{"a new office after a gap counts from the office", []step{
			{now: at(0), leadingSince: at(0), observing: at(0)},
			{now: at(5000), leadingSince: at(4900), observing: at(5000), gap: 5 * time.Second},
			{now: at(8000), leadingSince: at(7500), observing: at(8000), gap: 3 * time.Second},
			{now: at(8250), leadingSince: at(8100), observing: at(8100)},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := Watch{Every: every}
			for i, s := range c.steps {
				observing, gap := w.Step(s.now, s.leadingSince)
				if !observing.Equal(s.observing) || gap != s.gap {
					t.Fatalf("step %d at +%v (leading since %v): observing since +%v, gap %v; want +%v, %v",
						i, s.now.Sub(t0), s.leadingSince, observing.Sub(t0), gap, s.observing.Sub(t0), s.gap)
				}
			}
		})
	}
}

func TestAutoFailoverNeedsThreeVoters(t *testing.T) {
	cases := []struct {
		name   string
		voters []string
		ok     bool
		why    string // a part of the reason
	}{
		{"two data nodes and a witness", []string{"alpha", "beta", "witness"}, true, ""},
		{"three data nodes and two witnesses", []string{"a", "b", "c", "w1", "w2"}, true, ""},
		{"the witness removed: two voters", []string{"alpha", "beta"}, false, "2 raft voters (alpha, beta): automatic failover needs three"},
		{"one voter left", []string{"alpha"}, false, "1 raft voter (alpha)"},
		{"no configuration known", nil, false, "knows no raft voters"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ok, why := AutoFailover(c.voters)
			if ok != c.ok || !strings.Contains(why, c.why) || (ok && why != "") {
				t.Errorf("AutoFailover(%v) = %v, %q; want %v and a reason with %q", c.voters, ok, why, c.ok, c.why)
			}
		})
	}
}
