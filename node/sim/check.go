package sim

import (
	"slices"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Invariant names one of DESIGN.md §2's invariants as the sim checks it.
type Invariant uint8

const (
	// NoAckedWriteLost: every block reads back, on the current serving
	// primary, the last acknowledged value or a later one.
	NoAckedWriteLost Invariant = iota + 1
	// OneWriter: never two primaries serving under leases that overlap.
	OneWriter
	// NoStalePromotion: a node that lacks an acknowledged write is never
	// promoted without force.
	NoStalePromotion
	// ReplicasEqualInSync: a primary and a peer it counts in sync (no
	// marked blocks, nothing in flight) hold the same blocks.
	ReplicasEqualInSync
)

func (i Invariant) String() string {
	switch i {
	case NoAckedWriteLost:
		return "no-acknowledged-write-lost"
	case OneWriter:
		return "one-writer"
	case NoStalePromotion:
		return "no-stale-promotion"
	case ReplicasEqualInSync:
		return "replicas-equal-in-sync"
	}
	return "invariant(?)"
}

// checker holds what the invariants are checked against.
type checker struct {
	acked [blocks]int64 // the last acknowledged value of each block
	acks  int
	// forced: the node's next promotion is an operator's forced one.
	forced map[string]bool
	// split: a forced promotion without raft may have left two primaries.
	split bool
	// mayDiffer are blocks invariant 4 skips until a write to them is
	// acknowledged: what a forced promotion leaves (forgetDifferences).
	mayDiffer map[int]bool
}

func newChecker() checker { return checker{forced: map[string]bool{}, mayDiffer: map[int]bool{}} }

func (c *checker) acknowledged(s *Sim, n *node, w *write) {
	if c.split {
		s.tracef("%s: write %d acknowledged during a forced split (not counted)", n.name, w.id)
		return
	}
	c.acked[w.block] = w.id
	c.acks++
	delete(c.mayDiffer, w.block)
	s.tracef("%s: write %d block %d acknowledged", n.name, w.id, w.block)
}

// lacks returns the first block whose acknowledged value n does not hold
// (nor a later one: a write that tore a block after it was acknowledged
// was not acknowledged itself, and counts as later).
func (c *checker) lacks(n *node) (block int, has int64, ok bool) {
	for b := range blocks {
		if v := n.disk.read(b); max(v, -v) < c.acked[b] {
			return b, v, true
		}
	}
	return 0, 0, false
}

// promoted checks invariant 3 when n became primary by e.
func (c *checker) promoted(s *Sim, n *node, e volstate.Event) {
	if _, force := e.(volstate.Force); force {
		return // the operator's (forcedHere)
	}
	if c.forced[n.name] || c.split {
		delete(c.forced, n.name)
		return
	}
	if b, v, ok := c.lacks(n); ok {
		s.fail(NoStalePromotion, "%s promoted at epoch %d by %T holds %d in block %d, acknowledged %d", n.name, n.st.Durable.Epoch, e, v, b, c.acked[b])
	}
}

// forcedHere: the operator forced n to primary while raft had no
// quorum. The command may lose any write acknowledged before it, and
// until one primary is left, named by raft, two sides may serve (a split
// brain the operator chose): writes acknowledged meanwhile count for
// neither, and invariants 1 and 3 start again once it is resolved.
func (c *checker) forcedHere(s *Sim, n *node) {
	c.acked, c.split = [blocks]int64{}, true
	c.forgetDifferences(s)
	s.tracef("check: forced primary %s: writes acknowledged so far may be lost; invariants 1 and 3 wait for one primary", n.name)
}

// forgetDifferences: a forced promotion counts every peer in sync by
// generation and promises nothing of the blocks the copies differ in then
// (the blocks it marked for them are still resynced, but a peer's own
// changes it never saw are not); invariant 4 skips them until a write to
// them is acknowledged.
func (c *checker) forgetDifferences(s *Sim) {
	for b := range blocks {
		var seen []int64
		for _, n := range s.dataNodes() {
			seen = append(seen, n.disk.read(b))
		}
		if slices.Min(seen) != slices.Max(seen) {
			c.mayDiffer[b] = true
		}
	}
}

// resolved reports whether a forced split is over: one data node holds
// itself primary, the one raft names at its epoch.
func (s *Sim) resolved() bool {
	va, known := s.raft.auth.Volume(volume)
	primaries := 0
	for _, n := range s.dataNodes() {
		if n.durable.Primary == n.name {
			primaries++
			if !known || va.Primary != n.name || va.Epoch != n.durable.Epoch {
				return false
			}
		}
	}
	return primaries == 1
}

// forcedByRaft: raft applied an operator's forced promotion of n (after
// the lease fence): it may lose any write acknowledged before it.
func (c *checker) forcedByRaft(s *Sim, n *node) {
	c.forced[n.name] = n.st.Role() != replication.Primary
	c.acked = [blocks]int64{}
	c.forgetDifferences(s)
	s.tracef("check: raft forced %s: writes acknowledged so far may be lost", n.name)
}

// checkAll checks invariants 1, 2 and 4 (3 is checked at promotions).
func (s *Sim) checkAll() {
	if s.check.split && s.resolved() {
		s.check.split = false
		s.tracef("check: the forced split is resolved")
	}
	va, known := s.raft.auth.Volume(volume)
	var leased []string
	for _, n := range s.dataNodes() {
		if !n.up {
			continue
		}
		st := n.st
		if st.Serving == volstate.Open && volstate.Admit(st, s.now) == volstate.Serve {
			leased = append(leased, n.name)
		}
		// The current primary: raft's, or one forced while raft had no
		// quorum that raft has not heard of yet.
		current := known && va.Primary == n.name && va.Epoch == st.Durable.Epoch && st.Serving.IsOpen() ||
			st.Serving == volstate.OpenWithoutLease && (!known || va.Epoch < st.Durable.Epoch)
		if st.Role() != replication.Primary || !current || st.Disk != replication.UpToDate {
			continue
		}
		if b, v, ok := s.check.lacks(n); ok && !s.check.split {
			s.fail(NoAckedWriteLost, "primary %s (epoch %d) reads %d in block %d, acknowledged %d", n.name, st.Durable.Epoch, v, b, s.check.acked[b])
		}
		s.checkInSync(n)
	}
	if len(leased) > 1 {
		s.fail(OneWriter, "%v serve with leases at once", leased)
	}
}

// checkInSync checks invariant 4 for primary p and each peer it counts in
// sync: connected, no marks either side, nothing in flight.
func (s *Sim) checkInSync(p *node) {
	if len(p.writes) > 0 {
		return
	}
	for _, name := range p.peers {
		q := s.node(name)
		sid, ok := p.sessions[name]
		if !ok || !q.up || q.incoming.id != sid || p.st.Peers[name].Repl != replication.Connected || p.durable.Gens.Tracking(name) ||
			len(p.marks[name]) > 0 || len(q.marks[p.name]) > 0 || !s.link(p.name, name).idle() ||
			q.durable.Gens.Current.IsZero() || !q.durable.SyncGen.IsZero() {
			continue
		}
		for b := range blocks {
			if pv, qv := p.disk.read(b), q.disk.read(b); pv != qv && !s.check.mayDiffer[b] {
				s.fail(ReplicasEqualInSync, "%s and %s in sync, block %d holds %d and %d", p.name, name, b, pv, qv)
				return
			}
		}
	}
}
