package sim

import (
	"math"
	"slices"
	"strconv"
)

// Checksums at rest (issue 29, docs/integrity.md), as node keeps them: a
// sum per block in the metadata, in pages; a write changes its blocks'
// sums in memory only (their pages dirty), and a page reaches stable
// storage at a FLUSH (after the data), at a primary's FUA write (its own
// page, after its data), when the primary indicator is cleared, and
// BEFORE the activity log gives the slot of a block's extent away (after
// the data: DATA, THEN CHECKSUM PAGE, THEN EVICTION). A crash loses the
// dirty pages; a node that went down as primary or applying a primary's
// writes computes the sums of its activity log's hot blocks again from
// what its disk holds (metadata.MD.RebuildActivityLogChecksums) before
// anything reads them. A sum here is the value of the write it describes
// (a torn block's too: the negated number); noSum is no known sum (none
// until a block is written: create-md writes no page).
//
// The hot blocks are a bounded window of the activity log, hotBlocks
// long, least recently used first: a block enters it when the log admits
// it (alAdmit), and the window gives its least recently used block away
// when a new one comes in, as node's log evicts an extent. node syncs the
// data device at an eviction; the sim, which must not change what its
// runs do (the disks' caches, the seeded source's draws), gives away only
// a block whose data is durable already (not in the cache) and that no
// write holds, and lets the window grow past hotBlocks while there is
// none: a sync at that eviction would have changed nothing of that block
// (the sim keeps less durable than node does, never more). (The log the
// sim marks from, logged, keeps every block: see alExtents.) A primary's
// pull copies outside the activity log, as node's copyMissingFromPeer
// does, and makes data and sums durable at its end, in the same step.

// noSum is a block with no known sum.
const noSum = math.MinInt64

// sumText says a sum for the trace: the value it describes, or none.
func sumText(v int64) string {
	if v == noSum {
		return "none"
	}
	return strconv.FormatInt(v, 10)
}

// sumsPerPage is how many blocks' sums one checksum page holds (node's
// 990): a page written for one block writes its neighbours' sums too.
const sumsPerPage = 4

// hotBlocks is the checksum side of the activity log's size (node's
// al_extents): blocks outside it must have durable sums of durable data.
const hotBlocks = 4

// sumStore is one data node's checksums.
type sumStore struct {
	durable [blocks]int64 // the pages on stable storage, per block
	// mem is each block's sum in memory where dirty says it changed
	// since its page was last written.
	mem   [blocks]int64
	dirty [blocks]bool
	hot   []int // the activity log's hot blocks, least recently used first
	// replica: the replica indicator (node's MD.SetReplica), set when
	// the node first applies a primary's write or resync; node clears it
	// only at a clean stop, which the sim never makes.
	replica bool
}

func newSumStore() *sumStore {
	st := &sumStore{}
	for b := range st.durable {
		st.durable[b] = noSum
	}
	return st
}

// get is block's sum as a verified read sees it: memory first.
func (st *sumStore) get(block int) int64 {
	if st.dirty[block] {
		return st.mem[block]
	}
	return st.durable[block]
}

// set stores block's sum in memory (node's integrity.written: once the
// data is on the disk, BEFORE the write's activity-log Done).
func (st *sumStore) set(block int, v int64) { st.mem[block], st.dirty[block] = v, true }

// flushPage writes page's dirty sums (node's FlushRange of one page).
func (st *sumStore) flushPage(page int) {
	for b := page * sumsPerPage; b < min(blocks, (page+1)*sumsPerPage); b++ {
		if st.dirty[b] {
			st.durable[b], st.dirty[b] = st.mem[b], false
		}
	}
}

// flushAll writes every dirty page (node's Checksums.Flush). Call it only
// once the data they describe is durable.
func (st *sumStore) flushAll() {
	for b := range blocks {
		if st.dirty[b] {
			st.durable[b], st.dirty[b] = st.mem[b], false
		}
	}
}

// syncWithSums is node's integrity.syncData: the disk syncs, THEN the
// checksum pages are written; a failed sync writes none.
func (s *Sim) syncWithSums(n *node) bool {
	if !n.disk.flush(s.now) {
		return false
	}
	n.sums.flushAll()
	return true
}

// sumAdmit enters block in the hot window as the activity log admits it
// (the most recently used end), and gives away the least recently used
// blocks the window holds past hotBlocks that can go: no write holds
// them (al) and their data is durable. Each goes only once the pages of
// its sums are written (AN EXTENT LEAVES THE ACTIVITY LOG ONLY ONCE THE
// CHECKSUMS OF ITS BLOCKS ARE DURABLE).
func (s *Sim) sumAdmit(n *node, block int) {
	st := n.sums
	st.hot = append(slices.DeleteFunc(st.hot, func(b int) bool { return b == block }), block)
	for len(st.hot) > hotBlocks {
		i := slices.IndexFunc(st.hot, func(b int) bool {
			_, cached := n.disk.cache[b]
			return b != block && n.al[b] == 0 && !cached
		})
		if i < 0 {
			return
		}
		b := st.hot[i]
		if s.cfg.mutation != mutEvictionSkipsSums {
			st.flushPage(b / sumsPerPage)
		}
		st.hot = slices.Delete(st.hot, i, i+1)
	}
}

// sumsCrashed: the crash took the dirty pages.
func (s *Sim) sumsCrashed(n *node) { n.sums.dirty = [blocks]bool{} }

// rebuildSums is node's recovery at a restart of a node that went down
// as primary or applying writes: the sums of the hot blocks are computed
// again from what the disk holds, and written.
func (s *Sim) rebuildSums(n *node) {
	st := n.sums
	if !n.indicator && !st.replica {
		return
	}
	for i, b := range st.hot {
		if i == 0 && s.cfg.mutation == mutRebuildSkipsOldest {
			continue
		}
		st.durable[b] = n.disk.read(b)
	}
	s.tracef("%s: checksums of the hot blocks %v computed again", n.name, st.hot)
}

// checkSums checks ChecksumsMatchData on every data node that runs.
func (s *Sim) checkSums() {
	for _, n := range s.dataNodes() {
		if !n.up {
			continue
		}
		st := n.sums
		var hot, inCache [blocks]bool
		for _, b := range st.hot {
			hot[b] = true
		}
		// What reads see: the cache over stable storage, built in one
		// pass over the cache (a lookup per block is this check's cost).
		var reads [blocks]int64
		copy(reads[:], n.disk.durable)
		for b, v := range n.disk.cache {
			reads[b], inCache[b] = v, true
		}
		for b := range blocks {
			v, cached := reads[b], inCache[b]
			if sum := st.get(b); sum != noSum && sum != v {
				s.fail(ChecksumsMatchData, "%s: block %d reads %d but its checksum describes %d: a verified read would report it repaired or unrecoverable", n.name, b, v, sum)
				return
			}
			if hot[b] {
				continue
			}
			switch durable, stable := st.durable[b], n.disk.durable[b]; {
			case cached:
				s.fail(ChecksumsMatchData, "%s: block %d, outside the activity log's hot blocks %v, holds data not yet durable: a crash could change it, and recovery would not compute its checksum again", n.name, b, st.hot)
				return
			case st.dirty[b]:
				s.fail(ChecksumsMatchData, "%s: block %d left the activity log's hot blocks %v with its checksum (%d) not durable: a crash would leave %s beside its data %d", n.name, b, st.hot, st.mem[b], sumText(durable), stable)
				return
			case durable != noSum && durable != stable:
				s.fail(ChecksumsMatchData, "%s: block %d, outside the activity log's hot blocks %v, holds %d on stable storage with the checksum of %d: a crash would leave a false corruption", n.name, b, st.hot, stable, durable)
				return
			}
		}
	}
}
