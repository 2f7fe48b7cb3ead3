package sim

import (
	"maps"
	"math/rand/v2"
	"slices"
	"time"
)

// disk is a block array behind a volatile write cache: a write lands in
// the cache, a flush makes the cache durable, a crash loses (or tears)
// what was not flushed. A value is a write's number: later writes have
// larger ones.
type disk struct {
	durable []int64
	cache   map[int]int64
	// failUntil: writes fail until then (a failing disk).
	failUntil time.Time
}

func newDisk(blocks int) *disk {
	return &disk{durable: make([]int64, blocks), cache: map[int]int64{}}
}

// read returns what a read of block sees (the cache first).
func (d *disk) read(block int) int64 {
	if v, ok := d.cache[block]; ok {
		return v
	}
	return d.durable[block]
}

// write puts v in block's cache; it fails while the disk fails.
func (d *disk) write(block int, v int64, now time.Time) bool {
	if now.Before(d.failUntil) {
		return false
	}
	d.cache[block] = v
	return true
}

// writeFUA writes v to block durably (FUA): it lands in the cache and
// that block is made durable at once; the rest of the cache stays
// volatile. It fails while the disk fails.
func (d *disk) writeFUA(block int, v int64, now time.Time) bool {
	if !d.write(block, v, now) {
		return false
	}
	d.durable[block] = v
	delete(d.cache, block)
	return true
}

// stable returns what block holds on stable storage: what a power loss
// now could leave at least (a write in the cache may yet land too).
func (d *disk) stable(block int) int64 { return d.durable[block] }

// flush makes every cached write durable; it fails while the disk fails.
func (d *disk) flush(now time.Time) bool {
	if now.Before(d.failUntil) {
		return false
	}
	for b, v := range d.cache {
		d.durable[b] = v
	}
	clear(d.cache)
	return true
}

// crash loses the cache: each unflushed write is lost, kept, or (when
// tear) torn, as the rng says.
func (d *disk) crash(rng *rand.Rand, tear bool) (lost, tornBlocks []int) {
	for _, b := range slices.Sorted(maps.Keys(d.cache)) {
		switch rng.IntN(3) {
		case 0:
			d.durable[b] = d.cache[b]
		case 1:
			if tear {
				// A torn write holds neither value: the negated
				// number of the write that tore it.
				d.durable[b] = -d.cache[b]
				tornBlocks = append(tornBlocks, b)
				continue
			}
			lost = append(lost, b)
		default:
			lost = append(lost, b)
		}
	}
	clear(d.cache)
	d.failUntil = time.Time{}
	return lost, tornBlocks
}

// alExtents is how many blocks the activity log holds. node's log holds
// far fewer extents than a large volume has, but the sim's volume is
// smaller than any log, so it holds every block: evictions are not
// modelled. (Modelled with 8 to 32, they showed a real gap: a third node
// whose log evicted a block the old primary's in-flight write reached it
// with no longer reconciles it toward the new primary. The fix, DRBD 9's
// peer acks keeping extents until every peer has the write, is not built.
// They also showed that a forced promotion reconciled nothing, fixed in
// volstate's force.)
const alExtents = blocks

// alAdmit enters block in n's activity log, durably, as node's
// ActivityLog.Admit: a block already in it moves to the most recently
// used end; a new one evicts the least recently used block no write in
// flight holds, and the log's transaction is synced. The metadata is
// internal (on the data disk), so that sync makes the disk's whole cache
// durable too. false: the log is full of blocks in flight (the write
// waits), or the sync failed (the disk fails).
func (s *Sim) alAdmit(n *node, block int) (ok, full bool) {
	if n.logged[block] {
		n.alOrder = append(slices.DeleteFunc(n.alOrder, func(b int) bool { return b == block }), block)
		s.sumAdmit(n, block)
		return true, false
	}
	if len(n.alOrder) >= alExtents {
		i := slices.IndexFunc(n.alOrder, func(b int) bool { return n.al[b] == 0 })
		if i < 0 {
			return false, true
		}
		delete(n.logged, n.alOrder[i])
		n.alOrder = slices.Delete(n.alOrder, i, i+1)
	}
	if !n.disk.flush(s.now) {
		return false, false
	}
	n.logged[block] = true
	n.alOrder = append(n.alOrder, block)
	s.sumAdmit(n, block)
	return true, false
}
