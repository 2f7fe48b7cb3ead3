package failover

import (
	"reflect"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
)

// The leader's failover decision as a table: for each situation, what
// Decide proposes, and why it leaves each other volume alone. A primary is
// failed over only by a leader that observes, with failover on, when
// gossip says it is gone and it renewed nothing for half a lease, or it
// renewed no lease for two leases of time the leader itself observed, and only to an alive UpToDate data node that is
// not the primary.

func TestDecideFailover(t *testing.T) {
	const lease = 1500 * time.Millisecond
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	// alpha is the primary of vol at epoch 3; beta its UpToDate secondary;
	// witness a voter without a disk.
	volume := func(upToDate, outdated []string) replication.VolumeAuthority {
		return replication.VolumeAuthority{Primary: "alpha", Epoch: 3, DataNodes: []string{"alpha", "beta"}, UpToDate: upToDate, Outdated: outdated}
	}
	healthy := volume([]string{"alpha", "beta"}, nil)
	authority := func(va replication.VolumeAuthority) replication.Authority {
		return replication.Authority{Volumes: map[string]replication.VolumeAuthority{"vol": va}}
	}
	status := func(voters []string, live map[string]Liveness) Status {
		st := Status{Self: "witness", Leader: "witness", Quorum: true, Voters: voters}
		for _, name := range []string{"alpha", "arbiter", "beta", "witness"} {
			if l, ok := live[name]; ok {
				st.Members = append(st.Members, MemberState{Name: name, State: l, Witness: name == "witness" || name == "arbiter", Voter: true})
			}
		}
		return st
	}
	three := []string{"alpha", "beta", "witness"}
	allAlive := status(three, map[string]Liveness{"alpha": Alive, "beta": Alive, "witness": Alive})
	alphaDead := status(three, map[string]Liveness{"alpha": Dead, "beta": Alive, "witness": Alive})
	renewed := func(last time.Time) Renewals {
		return Renewals{Lease: lease, Volumes: map[string]Renewal{"vol": {Last: last}}}
	}
	on := FailoverConfig{Auto: true}
	// leading: this node took office at 0 and has observed since, and saw
	// alpha's term at 0.
	leading := Leader{Office: at(0), Observing: at(0), Failover: on, Terms: map[string]Term{"vol": {Epoch: 3, Since: at(0)}}}
	left := func(why Reason, idle time.Duration) Decision {
		return Decision{Left: []LeftAlone{{Volume: "vol", Why: why, Primary: "alpha", Idle: idle}}}
	}
	promote := func(why Reason, idle time.Duration) Decision {
		return Decision{Proposals: []Proposal{{Volume: "vol", From: "alpha", To: "beta", Epoch: 3, Why: why, Idle: idle, Office: at(0)}}}
	}

	cases := []struct {
		name      string
		authority replication.Authority
		members   Status
		renewals  Renewals
		leader    Leader
		now       time.Time
		want      Decision
	}{
		{name: "a healthy primary: it renews, nothing is proposed",
			authority: authority(healthy), members: allAlive, renewals: renewed(at(9500)), leader: leading, now: at(10000),
			want: left(PrimaryRenewed, 500*time.Millisecond)},
		{name: "a renewal in progress",
			authority: authority(healthy), members: allAlive, leader: leading, now: at(10000),
			renewals: Renewals{Lease: lease, Volumes: map[string]Renewal{"vol": {Last: at(1000), Renewing: true}}},
			want:     left(PrimaryRenewing, 0)},
		{name: "alive, no renewal for just under two leases: its lease has not starved yet",
			authority: authority(healthy), members: allAlive, renewals: renewed(at(7100)), leader: leading, now: at(10000),
			want: left(PrimaryRenewed, 2900*time.Millisecond)},
		{name: "alive, no renewal for two leases: cut off from raft, beta takes over",
			authority: authority(healthy), members: allAlive, renewals: renewed(at(7000)), leader: leading, now: at(10000),
			want: promote(PrimaryCutOff, 3*time.Second)},
		{name: "alive to gossip but never renewed since the leader took office two leases ago",
			authority: authority(healthy), members: allAlive, renewals: renewed(time.Time{}), leader: leading, now: at(3200),
			want: promote(PrimaryCutOff, 3200*time.Millisecond)},
		{name: "cut off, and the only other UpToDate node is dead: the primary is not a candidate",
			authority: authority(healthy), renewals: renewed(at(7000)), leader: leading, now: at(10000),
			members: status(three, map[string]Liveness{"alpha": Alive, "beta": Dead, "witness": Alive}),
			want: Decision{Left: []LeftAlone{{Volume: "vol", Why: NoUpToDateCandidate, Primary: "alpha", Idle: 3 * time.Second, Lost: PrimaryCutOff,
				Refusal: replication.FailoverRefusal{Primary: "alpha", NotAlive: []string{"beta"}}}}}},
		{name: "the leader resumed from a 5 s pause of its own: the primary renewed right before it, and is not deposed",
			authority: authority(healthy), members: allAlive, renewals: renewed(at(10000)), now: at(15500),
			leader: Leader{Office: at(0), Observing: at(15300), Failover: on, Terms: leading.Terms},
			want:   left(PrimaryRenewed, 200*time.Millisecond)},
		{name: "the leader resumed from a pause, and the primary renewed nothing for two leases since",
			authority: authority(healthy), members: allAlive, renewals: renewed(at(10000)), now: at(18300),
			leader: Leader{Office: at(0), Observing: at(15300), Failover: on, Terms: leading.Terms},
			want:   promote(PrimaryCutOff, 3*time.Second)},
		{name: "a new primary's term, first seen now, gets two leases to renew",
			authority: authority(replication.VolumeAuthority{Primary: "alpha", Epoch: 4, DataNodes: []string{"alpha", "beta"}, UpToDate: []string{"alpha", "beta"}}),
			members:   allAlive, renewals: renewed(at(1000)), leader: leading, now: at(10000),
			want: Decision{Left: []LeftAlone{{Volume: "vol", Why: PrimaryRenewed, Primary: "alpha"}},
				Seen: map[string]Term{"vol": {Epoch: 4, Since: at(10000)}}}},
		{name: "gossip declared the primary dead: beta takes over",
			authority: authority(healthy), members: alphaDead, renewals: renewed(at(9000)), leader: leading, now: at(10000),
			want: promote(PrimaryGone, 0)},
		{name: "gossip declared the primary dead, but it renewed 100 ms ago: gossip is a hint, nothing is proposed",
			authority: authority(healthy), members: alphaDead, renewals: renewed(at(9900)), leader: leading, now: at(10000),
			want: left(PrimaryRenewed, 100*time.Millisecond)},
		{name: "gossip never heard of the primary, past the grace",
			authority: authority(healthy), renewals: renewed(at(1000)), leader: leading, now: at(6000),
			members: status(three, map[string]Liveness{"beta": Alive, "witness": Alive}),
			want:    promote(PrimaryGone, 0)},
		{name: "the primary is dead and beta alive but Outdated: no promotion",
			authority: authority(volume([]string{"alpha"}, []string{"beta"})), members: alphaDead, renewals: renewed(at(9000)), leader: leading, now: at(10000),
			want: Decision{Left: []LeftAlone{{Volume: "vol", Why: CandidateOutdated, Primary: "alpha", Lost: PrimaryGone,
				Refusal: replication.FailoverRefusal{Primary: "alpha", OutdatedAlive: []string{"beta"}}}}}},
		{name: "the primary and the UpToDate beta are dead",
			authority: authority(healthy), renewals: renewed(at(9000)), leader: leading, now: at(10000),
			members: status(three, map[string]Liveness{"alpha": Dead, "beta": Dead, "witness": Alive}),
			want: Decision{Left: []LeftAlone{{Volume: "vol", Why: NoUpToDateCandidate, Primary: "alpha", Lost: PrimaryGone,
				Refusal: replication.FailoverRefusal{Primary: "alpha", NotAlive: []string{"beta"}}}}}},
		{name: "a witness is never chosen, even one the authority lists UpToDate",
			authority: authority(volume([]string{"alpha", "arbiter", "beta"}, nil)), renewals: renewed(at(9000)), leader: leading, now: at(10000),
			members: status([]string{"alpha", "arbiter", "beta"}, map[string]Liveness{"alpha": Dead, "arbiter": Alive, "beta": Alive}),
			want:    promote(PrimaryGone, 0)},
		{name: "no quorum: raft elected nobody, this node leads nothing and decides nothing",
			authority: authority(healthy), renewals: Renewals{Lease: lease}, now: at(10000),
			members: Status{Self: "witness", Voters: three, Members: alphaDead.Members},
			leader:  Leader{Failover: on, Terms: leading.Terms},
			want:    Decision{Off: NotLeading, Left: []LeftAlone{{Volume: "vol", Why: NotLeading}}}},
		{name: "two voters left: failover off",
			authority: authority(healthy), renewals: renewed(at(9900)), leader: leading, now: at(10000),
			members: status([]string{"alpha", "beta"}, map[string]Liveness{"alpha": Dead, "beta": Alive}),
			want:    Decision{Off: FailoverOff, Left: []LeftAlone{{Volume: "vol", Why: FailoverOff}}}},
		{name: "failover: off in the config",
			authority: authority(healthy), members: alphaDead, renewals: renewed(at(9900)), now: at(10000),
			leader: Leader{Office: at(0), Observing: at(0), Failover: FailoverConfig{Why: "failover: off in the config"}},
			want:   Decision{Off: FailoverOff, Left: []LeftAlone{{Volume: "vol", Why: FailoverOff}}}},
		{name: "a node removed from raft decides nothing",
			authority: authority(healthy), renewals: renewed(at(9900)), leader: leading, now: at(10000),
			members: Status{Self: "witness", Voters: []string{"alpha", "beta", "gamma"}, Members: alphaDead.Members, Standing: "removed", NotAVoter: "removed"},
			want:    Decision{Off: FailoverOff, Left: []LeftAlone{{Volume: "vol", Why: FailoverOff}}}},
		{name: "a volume raft does not know yet",
			authority: replication.Authority{}, members: alphaDead, renewals: renewed(time.Time{}), leader: leading, now: at(10000),
			want: Decision{Left: []LeftAlone{{Volume: "vol", Why: NoPrimary}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Decide([]string{"vol"}, c.authority, c.members, c.renewals, c.leader, c.now)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Decide at +%v:\n got %+v\nwant %+v", c.now.Sub(t0), got, c.want)
			}
		})
	}
}

// TestDecideInWords pins what status and the failover record say of a
// decision.
func TestDecideInWords(t *testing.T) {
	p := Proposal{Volume: "vol", From: "alpha", To: "beta", Epoch: 3, Why: PrimaryCutOff, Idle: 3 * time.Second}
	if got, want := p.Status(), "primary alpha is alive to gossip but has renewed no lease for 3.0s (cut off from the raft leader): promoting beta once its lease has run out"; got != want {
		t.Errorf("proposal status %q, want %q", got, want)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if got, want := p.Command(at), replication.FailoverCommand("vol", 3, "beta", false, at, "alpha alive to gossip but has renewed no lease for 3.0s (cut off from the raft leader)"); !reflect.DeepEqual(got, want) {
		t.Errorf("command %+v, want %+v", got, want)
	}
	l := LeftAlone{Volume: "vol", Why: CandidateOutdated, Primary: "alpha", Lost: PrimaryGone,
		Refusal: replication.FailoverRefusal{Primary: "alpha", OutdatedAlive: []string{"beta"}}}
	if got, want := l.Status(), "primary alpha is lost and no node can take over: no UpToDate data node besides the primary alpha; beta alive but Outdated (only a forced promotion takes it)"; got != want {
		t.Errorf("left-alone status %q, want %q", got, want)
	}
	for _, quiet := range []LeftAlone{{Why: PrimaryRenewed, Primary: "alpha"}, {Why: NotLeading}, {Why: FailoverOff}, {Why: NoPrimary}} {
		if s := quiet.Status(); s != "" {
			t.Errorf("%v says %q in status, want nothing", quiet.Why, s)
		}
	}
}

// TestDecideSeveralVolumes: each volume is decided by itself, in the
// config's order.
func TestDecideSeveralVolumes(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	va := func(primary string) replication.VolumeAuthority {
		return replication.VolumeAuthority{Primary: primary, Epoch: 7, DataNodes: []string{"alpha", "beta"}, UpToDate: []string{"alpha", "beta"}}
	}
	auth := replication.Authority{Volumes: map[string]replication.VolumeAuthority{"on-alpha": va("alpha"), "on-beta": va("beta")}}
	members := Status{Leader: "witness", Quorum: true, Voters: []string{"alpha", "beta", "witness"},
		Members: []MemberState{{Name: "alpha", State: Dead}, {Name: "beta", State: Alive}, {Name: "witness", State: Alive}}}
	renewals := Renewals{Lease: time.Second, Volumes: map[string]Renewal{"on-alpha": {Last: t0}, "on-beta": {Last: t0}}}
	leader := Leader{Office: t0, Observing: t0, Failover: FailoverConfig{Auto: true}}
	got := Decide([]string{"on-beta", "on-alpha"}, auth, members, renewals, leader, t0.Add(time.Second))
	want := Decision{
		Proposals: []Proposal{{Volume: "on-alpha", From: "alpha", To: "beta", Epoch: 7, Why: PrimaryGone, Office: t0}},
		Left:      []LeftAlone{{Volume: "on-beta", Why: PrimaryRenewed, Primary: "beta", Idle: 0}},
		Seen:      map[string]Term{"on-beta": {Epoch: 7, Since: t0.Add(time.Second)}, "on-alpha": {Epoch: 7, Since: t0.Add(time.Second)}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestDecideHandOff: a leader that serves as a primary hands raft's
// leadership to an alive voter that is no volume's primary, a witness
// first, once it has led for LeadershipSettle, and only in authority mode.
func TestDecideHandOff(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	auth := replication.Authority{Volumes: map[string]replication.VolumeAuthority{
		"vol0": {Primary: "alpha", Epoch: 2, DataNodes: []string{"alpha", "beta"}, UpToDate: []string{"alpha", "beta"}},
		"vol1": {Primary: "gamma", Epoch: 2, DataNodes: []string{"alpha", "gamma"}, UpToDate: []string{"alpha", "gamma"}},
	}}
	member := func(name string, state Liveness, voter, witness bool) MemberState {
		return MemberState{Name: name, State: state, Voter: voter, Witness: witness}
	}
	all := []MemberState{member("alpha", Alive, true, false), member("beta", Alive, true, false),
		member("gamma", Alive, true, false), member("witness", Alive, true, true)}
	settled := Leader{Failover: FailoverConfig{Auto: true}, Settling: t0, PrimaryHere: true}
	cases := []struct {
		name    string
		members []MemberState
		leader  Leader
		now     time.Time
		want    string
	}{
		{"settled, a primary: the witness first", all, settled, t0.Add(LeadershipSettle), "witness"},
		{"not settled yet after taking office", all, settled, t0.Add(LeadershipSettle - time.Millisecond), ""},
		{"no primary here", all, Leader{Failover: settled.Failover, Settling: t0}, t0.Add(time.Minute), ""},
		{"not leading", all, Leader{Failover: settled.Failover, PrimaryHere: true}, t0.Add(time.Minute), ""},
		{"not in authority mode", all, Leader{Settling: t0, PrimaryHere: true}, t0.Add(time.Minute), ""},
		{"the witness dead: a voter that is no volume's primary",
			[]MemberState{all[0], all[1], all[2], member("witness", Dead, true, true)}, settled, t0.Add(time.Minute), "beta"},
		{"only primaries and non-voters left",
			[]MemberState{all[0], member("beta", Alive, false, false), all[2], member("witness", Left, true, true)}, settled, t0.Add(time.Minute), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			members := Status{Self: "alpha", Leader: "alpha", Quorum: true, Voters: []string{"alpha", "beta", "gamma", "witness"}, Members: c.members}
			d := Decide([]string{"vol0", "vol1"}, auth, members, Renewals{Lease: time.Second}, c.leader, c.now)
			if d.HandOff != c.want {
				t.Errorf("hand off to %q, want %q", d.HandOff, c.want)
			}
		})
	}
}
