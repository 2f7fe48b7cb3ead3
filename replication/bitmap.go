package replication

import (
	"math/bits"

	"github.com/replvol/replvol/internal/lockorder"
)

// BlockSize is the granularity of out-of-sync tracking: one bit per 4 KiB.
const BlockSize = 4096

// Bitmap records which 4 KiB blocks of a volume are out of sync with one
// peer. It is safe for concurrent use.
type Bitmap struct {
	mu     lockorder.Mutex
	words  []uint64
	blocks int64
	set    int64
}

// NewBitmap returns an all-clear bitmap for a volume of size bytes.
func NewBitmap(size int64) *Bitmap {
	blocks := (size + BlockSize - 1) / BlockSize
	return &Bitmap{words: make([]uint64, (blocks+63)/64), blocks: blocks}
}

// blockRange returns the blocks [first, last] touched by [off, off+length).
func (b *Bitmap) blockRange(off, length int64) (first, last int64, ok bool) {
	if length <= 0 || off < 0 {
		return 0, 0, false
	}
	first = off / BlockSize
	last = (off + length - 1) / BlockSize
	if last >= b.blocks {
		last = b.blocks - 1
	}
	return first, last, first <= last
}

// SetRange marks every block touched by [off, off+length) out of sync.
func (b *Bitmap) SetRange(off, length int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	first, last, ok := b.blockRange(off, length)
	if !ok {
		return
	}
	for i := first; i <= last; i++ {
		w, m := i/64, uint64(1)<<(i%64)
		if b.words[w]&m == 0 {
			b.words[w] |= m
			b.set++
		}
	}
}

// SetAll marks the whole volume out of sync (a full resync).
func (b *Bitmap) SetAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.words {
		b.words[i] = ^uint64(0)
	}
	if tail := b.blocks % 64; tail != 0 {
		b.words[len(b.words)-1] = (uint64(1) << tail) - 1
	}
	b.set = b.blocks
}

// ClearRange marks the blocks fully inside [off, off+length) in sync.
// Resync only ever clears whole blocks, which it sent whole.
func (b *Bitmap) ClearRange(off, length int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	first, last, ok := b.blockRange(off, length)
	if !ok {
		return
	}
	for i := first; i <= last; i++ {
		w, m := i/64, uint64(1)<<(i%64)
		if b.words[w]&m != 0 {
			b.words[w] &^= m
			b.set--
		}
	}
}

// AnySet reports whether any block touched by [off, off+length) is marked.
func (b *Bitmap) AnySet(off, length int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.set == 0 {
		return false
	}
	first, last, ok := b.blockRange(off, length)
	if !ok {
		return false
	}
	for i := first; i <= last; i++ {
		if b.words[i/64]&(uint64(1)<<(i%64)) != 0 {
			return true
		}
	}
	return false
}

// Count returns the number of out-of-sync blocks.
func (b *Bitmap) Count() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.set
}

// Bytes returns the out-of-sync amount in bytes.
func (b *Bitmap) Bytes() int64 { return b.Count() * BlockSize }

// NextRun finds the first out-of-sync block at or after block from and
// returns the run of consecutive set blocks starting there, at most max
// blocks long. ok is false when no block at or after from is set.
func (b *Bitmap) NextRun(from, max int64) (start, n int64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := from
	for i < b.blocks {
		w := b.words[i/64] >> (i % 64)
		if w == 0 {
			i = (i/64 + 1) * 64
			continue
		}
		i += int64(bits.TrailingZeros64(w))
		break
	}
	if i >= b.blocks {
		return 0, 0, false
	}
	start = i
	for i < b.blocks && n < max && b.words[i/64]&(uint64(1)<<(i%64)) != 0 {
		i++
		n++
	}
	return start, n, true
}

// Blocks returns the number of blocks the bitmap covers.
func (b *Bitmap) Blocks() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.blocks
}

// Grow makes the bitmap cover a volume of size bytes; the blocks gained
// are in sync. A smaller size changes nothing.
func (b *Bitmap) Grow(size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	blocks := (size + BlockSize - 1) / BlockSize
	if blocks <= b.blocks {
		return
	}
	words := make([]uint64, (blocks+63)/64)
	copy(words, b.words)
	b.words, b.blocks = words, blocks
}
