package sim

import (
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
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
	// track: the peers without a stream it found that this node has had
	// no stream to since it became primary (its peers are new then): the
	// volume tracks each BEFORE the flush completes (node's submit).
	track map[string]bool
	// ends: the peers without a stream it found whose last session ended:
	// it waits for each end, and fails when it could not track its peer
	// (node's flushUnreached: Finished, MarkErr).
	ends map[string]*session.Session
	// failed: a session's end it waited for could not track its peer.
	failed error
}

// startFlush is the client's FLUSH at n (node's Flush, flushAll): the
// local disk syncs; each peer with a stream gets a flush entry after the
// writes it carries. A peer without a stream whose last stream ended
// has that end's tracking waited for (settleEnds); one this node has
// had no stream to since it became primary may hold in its cache only
// writes of an earlier primary that this FLUSH declares durable, and is
// tracked first (progressFlushes).
func (s *Sim) startFlush(n *node) {
	s.nextFlush++
	f := &flushOp{id: s.nextFlush, epoch: n.st.Durable.Epoch, started: s.now, waiting: map[string]bool{}}
	if !s.check.split {
		f.covered = slices.Clone(s.check.acked)
		for b, e := range s.check.ackedEpoch {
			if e > f.epoch {
				// A newer primary's write: not this FLUSH's.
				f.covered[b] = 0
			}
		}
	}
	if s.cfg.mutation != mutFlushSkipsLocal && !s.syncWithSums(n) {
		// node detaches the disk and may complete the flush from a peer;
		// the sim fails it (a FLUSH that completes less often).
		s.tracef("%s: flush %d: local flush failed", n.name, f.id)
		_ = s.drive(n, volstate.DiskFailed{})
		return
	}
	f.track = s.unstreamed(n)
	for _, p := range n.peers {
		if _, ok := n.sessions[p]; !ok {
			if str := n.ending[p]; str != nil {
				if f.ends == nil {
					f.ends = map[string]*session.Session{}
				}
				f.ends[p] = str.st.Session()
			}
			continue
		}
		f.waiting[p] = true
		s.enqueue(n, p, replication.Entry{Op: replication.OpFlush}, nil, shipped{kind: shipFlush, id: f.id}, nil)
	}
	s.tracef("%s: flush %d sent to %v, tracks %v", n.name, f.id, slices.Sorted(maps.Keys(f.waiting)), slices.Sorted(maps.Keys(f.track)))
	n.flushes = append(n.flushes, f)
	s.progressFlushes(n)
}

// trackUnstreamed tracks the peers in track, which a flush found with no
// stream since this node became primary, as node's submit does
// (Volume.startTracking): raft records each Outdated at this epoch, then
// the generation moves on when the rules say so, announced to the peers
// in sync (the flush waits for that too: cacheAnnounce). Each peer
// tracked leaves track. errWait: raft is still to record one; another
// error: the tracking failed, and so does the flush.
func (s *Sim) trackUnstreamed(n *node, track map[string]bool) error {
	for _, p := range slices.Sorted(maps.Keys(track)) {
		if err := s.ensureOutdated(n, p); err != nil {
			return err
		}
		if err := s.moveGeneration(n, p); err != nil {
			return err
		}
		n.cacheAnnounce = n.cacheAnnounce || len(n.announcing) > 0
		delete(track, p)
	}
	return nil
}

// unstreamed returns the peers a flush of n tracks: those without a
// stream that n has had no stream to since its peers were new.
func (s *Sim) unstreamed(n *node) map[string]bool {
	track := map[string]bool{}
	for _, p := range n.peers {
		if _, ok := n.sessions[p]; !ok && !n.streamed[p] && s.cfg.mutation != mutFlushSkipsUnstreamedPeer {
			track[p] = true
		}
	}
	return track
}

// progressFlushes completes the node's flushes that can: every peer it
// went to acknowledged it (or its session ended and what the peer held
// in its cache only is tracked: settleEnds), every session's end it found
// is done, every peer it found never streamed to is tracked
// (trackUnstreamed), under a valid lease.
func (s *Sim) progressFlushes(n *node) {
	s.settleEnds(n)
	failed := map[*flushOp]bool{}
	for _, f := range slices.Clone(n.flushes) {
		if f.failed == nil {
			for _, p := range slices.Sorted(maps.Keys(f.ends)) {
				select {
				case <-f.ends[p].Finished():
					f.failed = f.ends[p].MarkErr()
					delete(f.ends, p)
				default:
				}
			}
		}
		if f.failed != nil {
			s.tracef("%s: flush %d fails: a peer's end could not track it: %v", n.name, f.id, f.failed)
			failed[f] = true
			continue
		}
		if n.st.Durable.Epoch != f.epoch {
			continue // it fails below
		}
		switch err := s.trackUnstreamed(n, f.track); {
		case errors.Is(err, errWait):
		case err != nil:
			s.tracef("%s: flush %d fails: a peer it found never streamed to could not be tracked: %v", n.name, f.id, err)
			failed[f] = true
		}
	}
	n.flushes = slices.DeleteFunc(n.flushes, func(f *flushOp) bool {
		if failed[f] {
			return true
		}
		if s.now.Sub(f.started) > writeTimeout {
			s.tracef("%s: flush %d timed out", n.name, f.id)
			return true
		}
		if len(f.waiting) > 0 && s.cfg.mutation != mutFlushNotAwaited {
			return false
		}
		if len(f.track) > 0 || len(f.ends) > 0 || (n.cacheAnnounce && len(n.announcing) > 0) {
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
		b := replication.AppendBatchHeader(nil, 1)
		e, _ := dataEntry(replication.OpWrite, block, -1, false)
		e.Seq = 1
		s.receive(q, msg{at: s.now, from: n.name, to: q.name, session: s.nextSession, kind: msgFrame, data: replication.AppendEntry(b, &e)})
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
	return ok
}

// touch records that n's block may change (invariant 4's changed set).
func (s *Sim) touch(n *node, block int) {
	for _, p := range n.peers {
		s.check.allow(n.name, p, block)
	}
}
