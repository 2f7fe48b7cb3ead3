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
