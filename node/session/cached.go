package session

import (
	"slices"

	"github.com/replvol/replvol/replication"
)

// The peer's cache, as the session knows it: a peer acknowledges a write
// that is not FUA once it is in its page cache (node/applier), and it is
// durable there only once the peer acknowledged a flush that came after
// it. So the loop keeps the extents of the entries the peer acknowledged
// since its last acknowledged flush (DRBD's transfer log, up to the
// barrier ack). When the stream ends with some left, the peer may lose
// them in a power loss: end has the volume track the peer and marks them
// in its bitmap, BEFORE any FLUSH waiting on the peer completes.

// maxCachedRuns bounds the runs the set keeps. Past it the set coarsens:
// every run grows to whole aligned units of a larger grain and runs that
// then touch merge. Nothing is ever dropped: a coarse run marks more
// blocks than were written (resynced for nothing), never fewer.
const maxCachedRuns = 1024

// coarsenBy is how much larger each coarsening makes the grain.
const coarsenBy = 16

// span is one run of the set: bytes [off, end).
type span struct{ off, end int64 }

// cachedSet is the extents the peer acknowledged and has not made durable
// by an acknowledged flush, as sorted, disjoint, non-adjacent runs aligned
// to grain. Only the session's loop touches it.
type cachedSet struct {
	runs  []span
	grain int64 // 0 is replication.BlockSize
}

// add puts [off, off+length) in the set.
func (c *cachedSet) add(off, length int64) {
	if length <= 0 {
		return
	}
	g := c.unit()
	lo, hi := off/g*g, (off+length+g-1)/g*g
	// The common cases first: a run past the last (random or growing) or
	// one that touches the last (sequential).
	if n := len(c.runs); n == 0 || c.runs[n-1].end < lo {
		c.runs = append(c.runs, span{lo, hi})
	} else if last := &c.runs[n-1]; last.off <= lo {
		last.end = max(last.end, hi)
	} else {
		c.insert(lo, hi)
	}
	if len(c.runs) > maxCachedRuns {
		c.coarsen()
	}
}

// insert merges [lo, hi) into the runs, wherever it falls.
func (c *cachedSet) insert(lo, hi int64) {
	// i: the first run that ends at or after lo (it may touch); j: the
	// first run that starts after hi (it does not).
	i, _ := slices.BinarySearchFunc(c.runs, lo, func(s span, x int64) int {
		if s.end < x {
			return -1
		}
		return 1
	})
	j := i
	for j < len(c.runs) && c.runs[j].off <= hi {
		lo, hi = min(lo, c.runs[j].off), max(hi, c.runs[j].end)
		j++
	}
	c.runs = slices.Replace(c.runs, i, j, span{lo, hi})
}

// coarsen grows the grain until the runs fit in half the bound, so that
// the next coarsening is as far off as this one was.
func (c *cachedSet) coarsen() {
	for len(c.runs) > maxCachedRuns/2 {
		g := c.unit() * coarsenBy
		c.grain = g
		out := c.runs[:0]
		for _, r := range c.runs {
			lo, hi := r.off/g*g, (r.end+g-1)/g*g
			if n := len(out); n > 0 && out[n-1].end >= lo {
				out[n-1].end = max(out[n-1].end, hi)
				continue
			}
			out = append(out, span{lo, hi})
		}
		clear(c.runs[len(out):])
		c.runs = out
	}
}

func (c *cachedSet) unit() int64 {
	if c.grain == 0 {
		return replication.BlockSize
	}
	return c.grain
}

// reset empties the set: a flush the peer acknowledged made durable what
// it held. The grain starts fine again.
func (c *cachedSet) reset() {
	c.runs = c.runs[:0]
	c.grain = 0
}

// empty reports whether the peer holds nothing the set knows of only in
// its cache.
func (c *cachedSet) empty() bool { return len(c.runs) == 0 }

// cachedOnAck reports whether the peer's ack of pd means the entry's blocks
// are in its cache, not yet durable, on a peer that may be promoted: a
// write, a zeroing or a trim that is not FUA (the applier makes a FUA entry
// durable BEFORE its ack). Resync runs are not kept: their target is
// Inconsistent until the sync-done entry, which it acknowledges only once
// its disk is synced, and a resync cut off resumes from the runs not yet
// acknowledged. (A power loss of the target in between loses runs whose
// bits were cleared: not covered here.)
func cachedOnAck(pd *Pending) bool {
	e := &pd.Entry
	switch e.Op {
	case replication.OpWrite, replication.OpZero, replication.OpTrim:
		return e.Flags&replication.EntryFUA == 0
	}
	return false
}

// durableOnAck reports whether the peer's ack of e means everything it
// applied before e is durable: a flush, and the end of a resync (the
// applier syncs its disk BEFORE it records the resync's end).
func durableOnAck(e *replication.Entry) bool {
	return e.Op == replication.OpFlush || e.Op == replication.OpSyncDone
}

// AwaitCacheLoss waits, for each of pds (a write's pendings, one per
// peer, each with its Session) that its peer acknowledged from its cache
// (not FUA) on a stream that has ended since, until that stream's end
// tracked the peer and marked what it held in its cache only (end), and
// returns the first such end's error (MarkErr). The peer may have lost
// the write with its cache (a power loss ends its stream), so a write
// completes only once that is durable, as a FLUSH does, and fails when it
// could not be: raft, with no record of the peer Outdated, could promote
// it without the write. A stream that ends after this returns is the next
// FLUSH's to settle.
func AwaitCacheLoss(pds []*Pending) error {
	for _, pd := range pds {
		if s := cacheLostOn(pd); s != nil {
			<-s.finished
			if err := s.markErr; err != nil {
				return err
			}
		}
	}
	return nil
}

// CacheLossPending is AwaitCacheLoss's look without its wait: pending
// when the end of a stream that lost an ack of pds from its cache has not
// yet tracked its peer, and the first error of such an end that could
// not. A write looks last under its lease (a stream may end while the
// lease is awaited) and completes only when nothing is pending.
func CacheLossPending(pds []*Pending) (pending bool, err error) {
	for _, pd := range pds {
		s := cacheLostOn(pd)
		if s == nil {
			continue
		}
		select {
		case <-s.finished:
			if s.markErr != nil {
				return false, s.markErr
			}
		default:
			pending = true
		}
	}
	return pending, nil
}

// cacheLostOn is pd's session when its peer acknowledged pd, a write
// that is not FUA, from its cache and the stream has ended since; nil
// otherwise.
func cacheLostOn(pd *Pending) *Session {
	select {
	case <-pd.done: // acked is read after done
	default:
		return nil // not acknowledged yet (protocols A and B)
	}
	s := pd.Session
	if s == nil || !pd.acked || pd.Entry.Flags&replication.EntryFUA != 0 || !ChangesData(pd.Entry.Op) || !s.hasEnded() {
		return nil
	}
	return s
}
