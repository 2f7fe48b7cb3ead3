package sim

import (
	"time"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Fault rates, per step (tick).
const (
	pCrash     = 0.0015 // per node
	pPause     = 0.002  // per node
	pPartition = 0.004
	pDrop      = 0.003
	pDiskFail  = 0.002
	pSwitch    = 0.002
	pForce     = 0.01 // while the primary is cut off from the leader
	pDiscard   = 0.02 // while a split brain stands
	// pCrashBetweenStages: a primary crashes right after one of a
	// write's stages (per stage run), so that the order of the stages is
	// tested where it matters.
	pCrashBetweenStages = 0.002
	// pStateWriteFails: a secondary's write of its volume state at a
	// sync end fails alone, its data synced (per write; stateWrite).
	pStateWriteFails = 0.01
)

// The client's requests: of the steps it sends one, these shares are a
// bad request, a FLUSH; of its writes, pFUA are FUA.
const (
	pBadInput = 0.03
	pFlush    = 0.15
	pFUA      = 0.1
)

// faults injects this step's faults and ends those that are over.
func (s *Sim) faults() {
	for _, n := range s.nodes {
		switch {
		case !n.up:
			if !s.now.Before(n.restartAt) {
				s.restart(n)
			}
		case s.chance(pCrash):
			s.crash(n)
		case n.running(s.now) && s.chance(pPause):
			n.pausedAt, n.pausedUntil = s.now, s.now.Add(s.duration(300*time.Millisecond, 4*time.Second))
			s.tracef("PAUSE %s until %v", n.name, n.pausedUntil.Sub(s.start))
		}
	}
	for i, a := range s.nodes {
		for _, b := range s.nodes[i+1:] {
			l := s.link(a.name, b.name)
			if l.cut && !s.now.Before(l.healAt) {
				l.cut = false
				s.tracef("HEAL %s-%s", a.name, b.name)
			}
		}
	}
	if s.chance(pPartition) {
		a := s.nodes[s.rng.IntN(len(s.nodes))]
		until := s.now.Add(s.duration(500*time.Millisecond, 6*time.Second))
		isolate := s.chance(0.5)
		b := s.nodes[s.rng.IntN(len(s.nodes))]
		for _, m := range s.nodes {
			if m != a && (isolate || m == b) {
				s.cut(a, m, until)
			}
		}
	}
	data := s.dataNodes()
	if s.chance(pDrop) {
		a, b := data[s.rng.IntN(len(data))], data[s.rng.IntN(len(data))]
		if a != b {
			s.tracef("DROP connection %s-%s", a.name, b.name)
			s.breakConnection(a, b)
		}
	}
	if s.chance(pDiskFail) {
		n := data[s.rng.IntN(len(data))]
		n.disk.failUntil = s.now.Add(s.duration(100*time.Millisecond, 1500*time.Millisecond))
		s.tracef("DISK %s fails until %v", n.name, n.disk.failUntil.Sub(s.start))
	}
	// A connection to a node paused for long breaks (the peer's timeout).
	for i, a := range data {
		for _, b := range data[i+1:] {
			if (a.paused(s.now) && s.now.Sub(a.pausedAt) >= connTimeout) || (b.paused(s.now) && s.now.Sub(b.pausedAt) >= connTimeout) {
				if _, ok := a.sessions[b.name]; ok {
					s.breakConnection(a, b)
				} else if _, ok := b.sessions[a.name]; ok {
					s.breakConnection(a, b)
				}
			}
		}
	}
}

func (s *Sim) cut(a, b *node, until time.Time) {
	l := s.link(a.name, b.name)
	l.cut, l.healAt = true, later(until, l.healAt)
	s.tracef("PARTITION %s-%s until %v", a.name, b.name, l.healAt.Sub(s.start))
	if !a.witness && !b.witness {
		s.breakConnection(a, b)
	}
}

// operator runs the operator's commands now and then: a switchover to a
// peer in sync, a forced promotion while the primary is cut off, a
// discard-my-data on a split brain's victim.
func (s *Sim) operator() {
	va, known := s.raft.auth.Volume(volume)
	if !known {
		return
	}
	p := s.node(va.Primary)
	if s.chance(pSwitch) && p.running(s.now) && p.st.Serving == volstate.Open && p.st.Pending == nil {
		for _, q := range p.peers {
			if _, ok := p.sessions[q]; ok && p.st.Peers[q].Repl == replication.Connected && !p.durable.Gens.Tracking(q) {
				s.tracef("OPERATOR switchover %s -> %s", p.name, q)
				_ = s.drive(p, volstate.Demote{To: q})
				break
			}
		}
	}
	cutOff := !p.running(s.now) || !s.raft.reach(s, p)
	if cutOff && s.chance(pForce) {
		x := s.dataNodes()[s.rng.IntN(len(s.data))]
		if x != p && x.running(s.now) && !x.durable.Gens.Current.IsZero() {
			if s.raft.reach(s, x) && s.cfg.mutation != mutForceLocally {
				s.tracef("OPERATOR primary --force %s (through raft)", x.name)
				_ = s.raft.promote(s, x, replication.FailoverCommand(volume, va.Epoch, x.name, true, s.now, "forced by the operator"), true)
			} else {
				s.tracef("OPERATOR primary --force %s (no quorum)", x.name)
				// node's forcePromote: above the epoch its view of raft
				// names.
				if s.drive(x, volstate.Force{Now: s.now, NewGen: s.newGen(), AuthorityEpoch: x.authEpoch}) == nil {
					s.check.forcedHere(s, x)
				}
			}
		}
	}
	for _, n := range s.dataNodes() {
		if n.running(s.now) && n.st.InSplitBrain() && !n.st.Serving.IsOpen() && s.chance(pDiscard) {
			s.tracef("OPERATOR discard-my-data on %s", n.name)
			s.post(n, volstate.DiscardMyData{})
		}
	}
}
