package failover

import (
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
)

// The leader's failover decision, whole and pure: Decide reads no clock,
// starts no goroutine and calls neither raft nor the network. The node
// layer's cluster loop gathers its inputs once per pass (one clock
// reading), calls Decide and proposes what it returns with
// ProposeAsLeader, which waits, fenced, until no lease of the old primary
// can still be valid (lease.go): when the promotion is safe stays with the
// leases, which see every grant as it happens.
//
// Decide composes the rules: whether this node fails anything over now
// (it leads and observes, FailoverNow), when a primary counts as lost
// (PrimaryWatch.Judge, with the time the leader itself observed), who
// takes over (replication.ChooseFailover, among the alive data nodes,
// never the primary gossip sees alive but raft cannot reach), and whether
// a leader that serves as a primary hands its leadership off (handOff).

// Reason says, as a value, why Decide fails a volume over or leaves it
// alone.
type Reason int

// Reasons. NotLeading and FailoverOff hold for a whole pass; the others
// for one volume. PrimaryGone and PrimaryCutOff are why a Proposal is
// made; the others why a volume is Left.
const (
	// NotLeading: this node does not lead raft (another node does, or no
	// majority elected anybody: no quorum), or it has not observed as
	// leader since it took office or resumed from a pause of its own.
	NotLeading Reason = iota + 1
	// FailoverOff: the config turns automatic failover off, raft has
	// fewer than three live voters, or this node is not a voter.
	FailoverOff
	// NoPrimary: raft names no primary of the volume (not registered).
	NoPrimary
	// PrimaryRenewing: a renewal of the primary's lease is in progress.
	PrimaryRenewing
	// PrimaryRenewed: the primary renewed its lease within StarvedAfter
	// of the time this leader observed (since its office, its own
	// resumption, the primary's term, or the last renewal), and gossip
	// does not say it is gone, or it renewed within
	// RenewalOverrulesGossip: a healthy primary, or one whose lease has
	// not starved yet.
	PrimaryRenewed
	// NoUpToDateCandidate: the primary is lost, and no UpToDate data node
	// besides it is alive.
	NoUpToDateCandidate
	// CandidateOutdated: the primary is lost, and the alive data nodes
	// that could take over are Outdated (only a forced promotion takes
	// one).
	CandidateOutdated
	// PrimaryGone: gossip declared the primary dead or gone, or never
	// heard of it in UnknownGrace, and it renewed nothing within
	// RenewalOverrulesGossip: another node takes over.
	PrimaryGone
	// PrimaryCutOff: gossip sees the primary alive, but it renewed no
	// lease for StarvedAfter of the time this leader observed: it is cut
	// off from raft, its IO froze, and another node takes over.
	PrimaryCutOff
)

var reasonNames = map[Reason]string{
	NotLeading: "not-leading", FailoverOff: "failover-off", NoPrimary: "no-primary",
	PrimaryRenewing: "primary-renewing", PrimaryRenewed: "primary-renewed",
	NoUpToDateCandidate: "no-up-to-date-candidate", CandidateOutdated: "candidate-outdated",
	PrimaryGone: "primary-gone", PrimaryCutOff: "primary-cut-off",
}

func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// Renewal is what the leader saw of one volume's lease renewals
// (LeaseWatch): its last grant (zero: none) and whether one runs.
type Renewal struct {
	Last     time.Time
	Renewing bool
}

// Renewals are the leader's renewals per volume and the lease they renew.
type Renewals struct {
	Lease   time.Duration
	Volumes map[string]Renewal
}

// Term is a primary's term (its epoch) and when this node first saw it.
type Term struct {
	Epoch uint64
	Since time.Time
}

// FailoverConfig is what a node's config says of automatic failover, fixed
// at start: Auto, or why not.
type FailoverConfig struct {
	Auto bool
	Why  string
}

// Leader is this node's own state as the deciding leader.
type Leader struct {
	// Office is when raft told this node it leads (LeadingSince), zero
	// when it does not: the office a Proposal is made in.
	Office time.Time
	// Observing is since when it has observed as leader without a break
	// (Watch.Step): its office, or the end of its last pause. Zero when
	// it does not lead.
	Observing time.Time
	// Failover is the config's failover mode.
	Failover FailoverConfig
	// Terms are the terms it saw on earlier passes, per volume
	// (Decision.Seen merged in): a new primary is given StarvedAfter from
	// then to renew its first lease.
	Terms map[string]Term
	// Settling is since when this node leads as its loop saw it, or since
	// it last tried to hand the leadership off (zero when it does not
	// lead): it hands off no sooner than LeadershipSettle after.
	Settling time.Time
	// PrimaryHere: this node serves as primary of a volume.
	PrimaryHere bool
}

// Proposal is a failover to propose: To becomes primary of Volume at
// Epoch+1 instead of From, because of Why (PrimaryGone or PrimaryCutOff).
type Proposal struct {
	Volume   string
	From, To string
	// Epoch is the epoch decided on, the command's compare-and-set.
	Epoch uint64
	Why   Reason
	// Idle is how long a cut-off primary renewed nothing.
	Idle time.Duration
	// Office is the leader's office the decision holds in: propose it in
	// that office only (ProposeAsLeader).
	Office time.Time
}

// LeftAlone is a volume Decide fails nothing over for, and why.
type LeftAlone struct {
	Volume string
	Why    Reason
	// Primary is the volume's primary ("" when NoPrimary or the pass
	// decides nothing).
	Primary string
	// Idle is how long the primary has renewed nothing, as judged.
	Idle time.Duration
	// Lost (PrimaryGone or PrimaryCutOff) and Refusal: how a primary
	// nobody can replace was lost, and why nobody can.
	Lost    Reason
	Refusal replication.FailoverRefusal
}

// Decision is Decide's answer.
type Decision struct {
	// Off is why this node fails nothing over on this pass (NotLeading,
	// FailoverOff), zero when it decided volume by volume.
	Off Reason
	// Proposals are the failovers to propose, in the order of the volumes.
	Proposals []Proposal
	// Left names every other volume, with why.
	Left []LeftAlone
	// Seen are the terms first seen on this pass: keep them for the next.
	Seen map[string]Term
	// HandOff is the voter to hand raft's leadership to, "" for none.
	HandOff string
}

// FailoverNow says whether the leader fails primaries over by itself now,
// and why not: the config decides at start (failover: off, fewer than
// three nodes), raft's live voters from then on (replctl node remove may
// leave two), and a node that is not a voter decides nothing.
func FailoverNow(st Status, cfg FailoverConfig) (auto bool, why string) {
	switch {
	case st.Standing != "":
		return false, st.NotAVoter
	case !cfg.Auto:
		return false, cfg.Why
	}
	return AutoFailover(st.Voters)
}

// Decide is the leader's failover decision at now for the volumes this
// node's config names (volumes, in order), from raft's committed
// authority, the cluster as this node sees it (members: gossip's liveness
// of each node, raft's voters, this node's standing), the lease renewals
// it granted and its own state as leader.
//
// It also says whether the leader hands its leadership off (HandOff).
func Decide(volumes []string, authority replication.Authority, members Status, renewals Renewals, leader Leader, now time.Time) Decision {
	d := Decision{HandOff: handOff(volumes, authority, members, leader, now)}
	auto, _ := FailoverNow(members, leader.Failover)
	switch {
	case leader.Observing.IsZero():
		d.Off = NotLeading
	case !auto:
		d.Off = FailoverOff
	}
	if d.Off != 0 {
		for _, vol := range volumes {
			d.Left = append(d.Left, LeftAlone{Volume: vol, Why: d.Off})
		}
		return d
	}
	alive := map[string]bool{}
	liveness := map[string]Liveness{}
	for _, m := range members.Members {
		alive[m.Name] = m.State == Alive
		liveness[m.Name] = m.State
	}
	for _, vol := range volumes {
		va, ok := authority.Volume(vol)
		if !ok || va.Primary == "" {
			d.Left = append(d.Left, LeftAlone{Volume: vol, Why: NoPrimary})
			continue
		}
		term, ok := leader.Terms[vol]
		if !ok || term.Epoch != va.Epoch {
			term = Term{Epoch: va.Epoch, Since: now}
			if d.Seen == nil {
				d.Seen = map[string]Term{}
			}
			d.Seen[vol] = term
		}
		w := PrimaryWatch{Liveness: Unknown, Observing: leader.Observing, TermSeen: term.Since}
		if l, ok := liveness[va.Primary]; ok {
			w.Liveness = l
		}
		r := renewals.Volumes[vol]
		w.LastRenewal, w.Renewing = r.Last, r.Renewing
		verdict := w.Judge(now, renewals.Lease)
		if !verdict.Lost {
			why := PrimaryRenewed
			if r.Renewing {
				why = PrimaryRenewing
			}
			d.Left = append(d.Left, LeftAlone{Volume: vol, Why: why, Primary: va.Primary, Idle: verdict.Idle})
			continue
		}
		lost := PrimaryGone
		if verdict.CutOff {
			// Alive to gossip, but renewing no lease: it is cut off from
			// the leader (its raft and control links), and its IO froze
			// when its lease ran out. Another node serves instead (never
			// the primary: ChooseFailover passes it over, alive or not).
			lost = PrimaryCutOff
		}
		node, ok, refusal := replication.ChooseFailover(va, alive, va.DataNodes)
		if !ok {
			why := NoUpToDateCandidate
			if len(refusal.OutdatedAlive) > 0 {
				why = CandidateOutdated
			}
			d.Left = append(d.Left, LeftAlone{Volume: vol, Why: why, Primary: va.Primary, Idle: verdict.Idle, Lost: lost, Refusal: refusal})
			continue
		}
		d.Proposals = append(d.Proposals, Proposal{Volume: vol, From: va.Primary, To: node, Epoch: va.Epoch,
			Why: lost, Idle: verdict.Idle, Office: leader.Office})
	}
	return d
}

// LeadershipSettle is how long a node leads before it hands leadership
// off a primary (no flapping right after an election).
const LeadershipSettle = 500 * time.Millisecond

// handOff returns the alive voter, no volume's primary (a witness first),
// to hand raft's leadership to when this leader serves as a primary (in
// authority mode, once settled): then killing the primary does not also
// kill the leader, and a failover waits for the lease only, not for an
// election and a new leader's wait. "" for none.
func handOff(volumes []string, authority replication.Authority, members Status, leader Leader, now time.Time) string {
	if !leader.Failover.Auto || leader.Settling.IsZero() || now.Sub(leader.Settling) < LeadershipSettle || !leader.PrimaryHere {
		return ""
	}
	primaries := map[string]bool{}
	for _, vol := range volumes {
		if va, ok := authority.Volume(vol); ok {
			primaries[va.Primary] = true
		}
	}
	to := ""
	for _, m := range members.Members {
		if m.Name == members.Self || !m.Voter || m.State != Alive || primaries[m.Name] {
			continue
		}
		if to == "" || m.Witness {
			to = m.Name
		}
	}
	return to
}

// lostWords says how a primary was lost, as status and events say it.
func lostWords(why Reason, idle time.Duration) string {
	if why == PrimaryCutOff {
		return fmt.Sprintf("alive to gossip but has renewed no lease for %.1fs (cut off from the raft leader)", idle.Seconds())
	}
	return "lost"
}

// Lost says in words how the primary was lost.
func (p Proposal) Lost() string { return lostWords(p.Why, p.Idle) }

// Command is the failover command to propose, recorded at the proposer's
// time at.
func (p Proposal) Command(at time.Time) replication.AuthorityCommand {
	return replication.FailoverCommand(p.Volume, p.Epoch, p.To, false, at, p.From+" "+p.Lost())
}

// Status says in words what the leader does, for status.
func (p Proposal) Status() string {
	return fmt.Sprintf("primary %s is %s: promoting %s once its lease has run out", p.From, p.Lost(), p.To)
}

// Status says in words why the volume is not failed over, for status: ""
// when nothing is wrong or the pass decided nothing.
func (l LeftAlone) Status() string {
	switch l.Why {
	case NoUpToDateCandidate, CandidateOutdated:
		return fmt.Sprintf("primary %s is %s and no node can take over: %s", l.Primary, lostWords(l.Lost, l.Idle), l.Refusal)
	}
	return ""
}
