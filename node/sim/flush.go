package sim

import (
	"maps"
	"slices"
	"time"

	"github.com/replvol/replvol/node/volstate"
)

// flushOp is a client's FLUSH in flight on a primary.
type flushOp struct {
	id      int64
	epoch   uint64
	started time.Time
	// covered is, per block, the last write acknowledged before the FLUSH
	// was sent (nil during a forced split: nothing is counted then).
	covered []int64
	// waiting: the peers whose flush acknowledgement it waits for.
	waiting map[string]bool
	// unflushed: the peers that did not flush for it: no stream when it
	// was sent, or their stream ended before they acknowledged it.
	unflushed map[string]bool
}

// startFlush is the client's FLUSH at n (node's Flush, flushAll): the
// local disk syncs; each peer with a stream gets a flush entry after the
// writes it carries; a peer without one is skipped.
func (s *Sim) startFlush(n *node) {
	s.nextFlush++
	f := &flushOp{id: s.nextFlush, epoch: n.st.Durable.Epoch, started: s.now, waiting: map[string]bool{}, unflushed: map[string]bool{}}
	if !s.check.split {
		f.covered = slices.Clone(s.check.acked)
	}
	if s.cfg.mutation != mutFlushSkipsLocal && !n.disk.flush(s.now) {
		// node detaches the disk and may complete the flush from a peer;
		// the sim fails it (a FLUSH that completes less often).
		s.tracef("%s: flush %d: local flush failed", n.name, f.id)
		_ = s.drive(n, diskFailed(n))
		return
	}
	for _, p := range n.peers {
		sid, ok := n.sessions[p]
		if !ok {
			f.unflushed[p] = true
			continue
		}
		f.waiting[p] = true
		s.link(n.name, p).send(msg{at: s.now.Add(s.duration(tick/2, 3*tick)), from: n.name, to: p, session: sid, kind: msgFlush, id: f.id})
	}
	s.tracef("%s: flush %d sent to %v", n.name, f.id, slices.Sorted(maps.Keys(f.waiting)))
	n.flushes = append(n.flushes, f)
	s.progressFlushes(n)
}

// progressFlushes completes the node's flushes that can: every peer it
// went to acknowledged it (or its stream ended), under a valid lease.
func (s *Sim) progressFlushes(n *node) {
	n.flushes = slices.DeleteFunc(n.flushes, func(f *flushOp) bool {
		if s.now.Sub(f.started) > writeTimeout {
			s.tracef("%s: flush %d timed out", n.name, f.id)
			return true
		}
		if len(f.waiting) > 0 && s.cfg.mutation != mutFlushNotAwaited {
			return false
		}
		if volstate.Admit(n.st, s.now) != volstate.Serve || n.st.Durable.Epoch != f.epoch {
			s.tracef("%s: flush %d not completed (%s)", n.name, f.id, volstate.Admit(n.st, s.now))
			return true
		}
		s.check.flushed(s, n, f)
		return true
	})
}

// badInput sends n a request it must refuse, and checks that no byte of
// any replica changed (invariant 6): a write past the volume's end, or a
// replication entry of a stream that is not the node's.
func (s *Sim) badInput(n *node) {
	before := s.snapshot()
	switch s.rng.IntN(2) {
	case 0:
		// node's replicate refuses it BEFORE it admits anything.
		block := blocks + s.rng.IntN(blocks)
		s.tracef("BAD INPUT %s: write past the end (block %d)", n.name, block)
		if s.cfg.mutation == mutBadWriteWraps {
			s.diskWrite(n, block%blocks, -1, false)
		}
	default:
		// A stream this node does not take (a stale or forged session):
		// the applier refuses its entries.
		var q *node
		for _, m := range s.dataNodes() {
			if m != n && m.running(s.now) {
				q = m
				break
			}
		}
		if q == nil {
			return
		}
		s.nextSession++
		block := s.rng.IntN(blocks)
		s.tracef("BAD INPUT %s: write from a stale session %d to block %d", q.name, s.nextSession, block)
		s.receive(q, msg{at: s.now, from: n.name, to: q.name, session: s.nextSession, kind: msgWrite, id: -1, block: block, value: -1})
	}
	s.check.unchanged(s, before)
}

// diskWrite writes v to n's block (through, when fua), recording the block
// as changed between n and each peer (invariant 4).
func (s *Sim) diskWrite(n *node, block int, v int64, fua bool) bool {
	s.touch(n, block)
	ok := n.disk.write(block, v, s.now)
	if ok && fua {
		ok = n.disk.writeFUA(block, v, s.now)
	}
	if ok {
		s.check.took(n, block, v)
	}
	return ok
}

// touch records that n's block may change (invariant 4's changed set).
func (s *Sim) touch(n *node, block int) {
	for _, p := range n.peers {
		s.check.allow(n.name, p, block)
	}
}
