package frame

import (
	"math/bits"
	"sync"
)

// bufferPool holds the replication stream's frame buffers in tiers of
// powers of two, from minPooled to maxPooled bytes. Unlike gRPC's pool it
// does not clear a buffer it hands out: a frame is always written whole
// (an encoder appends to it, a receive fills exactly its length) before
// it is read, and clearing cost a tenth of the CPU of 8 KiB writes.
// Buffers of other capacities (a frame SetBytes gave a slice of its own)
// are left to the garbage collector.
type bufferPool struct {
	tiers [maxTier - minTier + 1]sync.Pool
}

const (
	minTier = 8  // 256 bytes
	maxTier = 26 // 64 MiB: the largest frame, MaxSize, fits
)

// tier is the tier of a buffer of n bytes: the smallest power of two at
// least n (and at least 1<<minTier).
func tier(n int) int {
	if n <= 1<<minTier {
		return minTier
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n, its contents undefined.
func (p *bufferPool) Get(n int) *[]byte {
	t := tier(n)
	if t > maxTier {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[t-minTier].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<t)
	return &b
}

// Put returns b to its tier, if its capacity is one.
func (p *bufferPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minTier || c&(c-1) != 0 {
		return
	}
	if t := bits.Len(uint(c)) - 1; t <= maxTier {
		p.tiers[t-minTier].Put(b)
	}
}

// pool holds frame buffers. It is shared by every stream of the process,
// as sync.Pool is meant to be; it holds no state of any node.
var pool = &bufferPool{}

// GetBuffer returns a buffer of length n from the frames' pool, its
// contents undefined (a stream's scratch for a frame it copies whole).
func GetBuffer(n int) *[]byte { return pool.Get(n) }

// PutBuffer returns b, from GetBuffer, to the pool.
func PutBuffer(b *[]byte) { pool.Put(b) }
