package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/node/failover"
	"github.com/replvol/replvol/replication"
)

// raft is the model of the cluster's raft: not run, only its effects. A
// leader is a live voter that reaches a majority of the voters; a
// proposal from a node that reaches the leader is committed at once and
// applied with the real Authority.Apply. The leader grants the leases,
// runs the real failover.Decide, and applies a promotion only once no
// lease of the old primary can still be valid (the lease fence).
type raft struct {
	voters  []string
	auth    replication.Authority
	version int

	leader  string
	office  time.Time
	electAt time.Time
	// lastGrant is this leader's last grant of the volume's lease (a new
	// leader does not know the old one's: it waits from its office).
	lastGrant  time.Time
	pending    *promotion
	terms      map[string]failover.Term
	seen       map[string]time.Time
	lastDecide time.Time
}

// promotion is a promote command waiting for the lease fence.
type promotion struct {
	cmd    replication.AuthorityCommand
	office time.Time
	// operator: an operator's forced promotion (which may lose writes).
	operator bool
}

var (
	errNoLeader = errors.New("no raft leader reachable")
	errBusy     = errors.New("a promotion is in progress")
)

func newRaft(voters []string) *raft {
	return &raft{voters: voters}
}

func (r *raft) quorum(s *Sim, l *node) bool {
	n := 0
	for _, v := range r.voters {
		if s.reachable(l, s.node(v)) {
			n++
		}
	}
	return n > len(r.voters)/2
}

// reach reports whether n reaches a leader.
func (r *raft) reach(s *Sim, n *node) bool {
	return r.leader != "" && s.reachable(n, s.node(r.leader))
}

func (r *raft) tick(s *Sim) {
	if r.leader != "" {
		if l := s.node(r.leader); !l.running(s.now) || !r.quorum(s, l) {
			s.tracef("raft: leader %s lost", r.leader)
			r.leader, r.pending, r.electAt = "", nil, s.now.Add(electionTimeout)
		}
	}
	if r.leader == "" && !s.now.Before(r.electAt) {
		first := s.rng.IntN(len(r.voters))
		for i := range r.voters {
			v := r.voters[(first+i)%len(r.voters)]
			if l := s.node(v); l.running(s.now) && r.quorum(s, l) {
				r.leader, r.office, r.lastGrant = v, s.now, time.Time{}
				r.terms, r.seen, r.lastDecide = map[string]failover.Term{}, map[string]time.Time{}, time.Time{}
				s.tracef("raft: %s leads", v)
				break
			}
		}
		if r.leader == "" {
			r.electAt = s.now.Add(electionTimeout)
			return
		}
	}
	if r.leader == "" {
		return
	}
	l := s.node(r.leader)
	for _, n := range s.nodes {
		if s.reachable(l, n) {
			r.seen[n.name] = s.now
		}
	}
	r.applyPending(s)
	if s.now.Sub(r.lastDecide) >= decideEvery {
		r.lastDecide = s.now
		r.decide(s)
	}
}

// apply commits cmd (not a promotion) proposed by from.
func (r *raft) apply(s *Sim, from *node, cmd replication.AuthorityCommand) (replication.VolumeAuthority, error) {
	if cmd.Op == replication.OpPromote {
		panic("sim: a promotion goes through promote")
	}
	if !r.reach(s, from) {
		return replication.VolumeAuthority{}, errNoLeader
	}
	return r.commit(s, cmd)
}

func (r *raft) commit(s *Sim, cmd replication.AuthorityCommand) (replication.VolumeAuthority, error) {
	next, va, err := r.auth.Apply(cmd)
	if err != nil {
		s.tracef("raft: %s %s at %d refused: %v", cmd.Op, cmd.Node, cmd.Epoch, err)
		return va, err
	}
	r.auth = next
	r.version++
	s.tracef("raft: %s %s at %d: primary %s epoch %d up-to-date %v outdated %v", cmd.Op, cmd.Node, cmd.Epoch, va.Primary, va.Epoch, va.UpToDate, va.Outdated)
	return va, nil
}

// promote proposes a promotion: refused at once when the state machine
// refuses it, else applied once the lease is free (fenced meanwhile: no
// grant starts).
func (r *raft) promote(s *Sim, from *node, cmd replication.AuthorityCommand, operator bool) error {
	if !r.reach(s, from) {
		return errNoLeader
	}
	if _, _, err := r.auth.Apply(cmd); err != nil {
		return err
	}
	if r.pending != nil {
		return errBusy
	}
	r.pending = &promotion{cmd: cmd, office: r.office, operator: operator}
	s.tracef("raft: promotion of %s at %d (force %t) waits for the lease", cmd.Node, cmd.Epoch, cmd.Force)
	r.applyPending(s)
	return nil
}

// leaseFree: no lease of the volume can still be valid, by the
// production rule (failover.LeaseFence, which node/cluster's
// waitLeaseFree runs): the leader granted none for a lease, and has led
// for a lease. The sim's grants are atomic (none is ever in progress) and
// its clocks do not drift (the hold is the lease).
func (r *raft) leaseFree(s *Sim) bool {
	free, _ := failover.LeaseFence{Office: r.office, Renewal: failover.Renewal{Last: r.lastGrant}, Hold: leaseDuration}.Wait(s.now)
	return free
}

func (r *raft) applyPending(s *Sim) {
	p := r.pending
	if p == nil {
		return
	}
	va, _ := r.auth.Volume(volume)
	if va.Primary != p.cmd.Node && !r.leaseFree(s) && s.cfg.mutation != mutSkipLeaseFence {
		return
	}
	r.pending = nil
	if _, err := r.commit(s, p.cmd); err == nil && p.cmd.Force && p.operator {
		s.check.forcedByRaft(s, s.node(p.cmd.Node))
	}
}

// grant renews n's lease of epoch when the leader's state machine names
// it primary at epoch and no promotion fenced the volume.
func (r *raft) grant(s *Sim, n *node, epoch uint64) bool {
	va, _ := r.auth.Volume(volume)
	if !r.reach(s, n) || r.pending != nil || va.Primary != n.name || va.Epoch != epoch {
		return false
	}
	r.lastGrant = s.now
	return true
}

// release hands the lease of epoch back (a switchover).
func (r *raft) release(s *Sim, n *node, epoch uint64) {
	if va, _ := r.auth.Volume(volume); r.reach(s, n) && va.Primary == n.name && va.Epoch == epoch {
		r.lastGrant = time.Time{}
	}
}

// decide runs the real failover.Decide and proposes what it says.
func (r *raft) decide(s *Sim) {
	st := failover.Status{Self: r.leader, Leader: r.leader, Quorum: true, Voters: r.voters}
	for _, n := range s.nodes {
		live := failover.Alive
		if seen, ok := r.seen[n.name]; !ok || s.now.Sub(seen) > deadAfter {
			live = failover.Dead
		}
		st.Members = append(st.Members, failover.MemberState{Name: n.name, State: live, Voter: true, Witness: n.witness})
	}
	renewals := failover.Renewals{Lease: leaseDuration, Volumes: map[string]failover.Renewal{volume: {Last: r.lastGrant}}}
	leader := failover.Leader{Office: r.office, Observing: r.office, Failover: failover.FailoverConfig{Auto: true}, Terms: r.terms}
	d := failover.Decide([]string{volume}, r.auth, st, renewals, leader, s.now)
	for v, t := range d.Seen {
		r.terms[v] = t
	}
	l := s.node(r.leader)
	for _, p := range d.Proposals {
		s.tracef("raft: decide: %s", p.Status())
		if err := r.promote(s, l, p.Command(s.now), false); err != nil && !errors.Is(err, errBusy) {
			s.tracef("raft: failover refused: %v", err)
		}
	}
	for _, left := range d.Left {
		if s.cfg.mutation == mutBypassOutdated && left.Why == failover.CandidateOutdated && r.pending == nil {
			to := left.Refusal.OutdatedAlive[0]
			va, _ := r.auth.Volume(volume)
			s.tracef("raft: MUTATION promotes Outdated %s", to)
			_ = r.promote(s, l, replication.FailoverCommand(volume, va.Epoch, to, true, s.now, fmt.Sprintf("bypass: %s", left.Why)), false)
		}
	}
}
