package nbd

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Payload buffers come in power-of-two size classes, 512 B to MaxRequestLength. Each Server keeps
// freed buffers for reuse, so a steady stream of requests allocates nothing, but keeps at most
// MaxPooledBytes of them, and gives back to the OS what stayed unused for a trim interval.
//
// Buffers of mappedBufferSize and more are anonymous memory mappings outside the Go heap, so
// their memory can go back to the OS at once rather than whenever the garbage collector and the
// scavenger get to it. Giving back is madvise(MADV_DONTNEED): the pages go, the mapping stays,
// empty, for reuse. A mapping is never unmapped while an Export call might still hold it, so an
// Export that wrongly writes into p after returning (say, after its context was cancelled) cannot
// crash the process; Shutdown unmaps them once every connection closed without force.
const (
	minBufferShift   = 9
	maxBufferShift   = 25 // 32 MiB == MaxRequestLength
	numBufferClasses = maxBufferShift - minBufferShift + 1
	mappedBufferSize = 1 << 20
)

// poolTrimInterval is how often a pool frees the buffers that were not needed since the last
// trim: a buffer unused for one to two intervals is given back.
const poolTrimInterval = 5 * time.Second

func bufferClass(n int) int {
	if n <= 1<<minBufferShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufferShift
}

// bufferSize is the capacity of the buffer that holds n bytes.
func bufferSize(n int) int { return 1 << (bufferClass(n) + minBufferShift) }

// buffer is one payload buffer; cap(b) is its class size.
type buffer struct {
	b      []byte
	mapped bool // b is an anonymous mapping of its own, not Go heap memory
}

// bufferPool keeps free buffers, at most limit bytes of them with their memory, and the empty
// mappings of the mapped ones it gave back. Its methods may be called concurrently.
type bufferPool struct {
	limit        int64
	trimInterval time.Duration
	pooled       atomic.Int64 // bytes in the free lists, <= limit
	emptyMapped  atomic.Int64 // bytes of address space in the empty lists, holding no memory
	classes      [numBufferClasses]bufferClassPool
	// trimming is true while a trim is scheduled; one is whenever the pool holds buffers.
	trimming atomic.Bool
}

type bufferClassPool struct {
	mu   lockorder.Mutex
	free []*buffer // oldest first; get takes from the end
	// idle is the fewest buffers free since the last trim: that many were not needed.
	idle int
	// empty are mappings whose memory was given back; reused when free runs out.
	empty []*buffer
}

func newBufferPool(limit int64) *bufferPool {
	return &bufferPool{limit: limit, trimInterval: poolTrimInterval}
}

// get returns a buffer of length n (1 <= n <= MaxRequestLength). Its contents are garbage.
func (p *bufferPool) get(n int) *buffer {
	class := bufferClass(n)
	cp := &p.classes[class]
	cp.mu.Lock()
	if last := len(cp.free) - 1; last >= 0 {
		buf := cp.free[last]
		cp.free[last] = nil
		cp.free = cp.free[:last]
		cp.idle = min(cp.idle, last)
		cp.mu.Unlock()
		p.pooled.Add(-int64(cap(buf.b)))
		buf.b = buf.b[:n]
		return buf
	}
	if last := len(cp.empty) - 1; last >= 0 {
		buf := cp.empty[last]
		cp.empty[last] = nil
		cp.empty = cp.empty[:last]
		cp.mu.Unlock()
		p.emptyMapped.Add(-int64(cap(buf.b)))
		buf.b = buf.b[:n]
		return buf
	}
	cp.mu.Unlock()
	size := 1 << (class + minBufferShift)
	if size >= mappedBufferSize {
		if b, err := mapBuffer(size); err == nil {
			return &buffer{b: b[:n], mapped: true}
		}
	}
	return &buffer{b: make([]byte, n, size)}
}

// put takes buf back: into the free list if the pool has room for it, else its memory is given
// back. Nothing may use buf afterwards.
func (p *bufferPool) put(buf *buffer) {
	size := int64(cap(buf.b))
	for {
		pooled := p.pooled.Load()
		if pooled+size > p.limit {
			p.giveBack(buf)
			return
		}
		if p.pooled.CompareAndSwap(pooled, pooled+size) {
			break
		}
	}
	cp := &p.classes[bufferClass(int(size))]
	cp.mu.Lock()
	cp.free = append(cp.free, buf)
	cp.mu.Unlock()
	if !p.trimming.Load() && p.trimming.CompareAndSwap(false, true) {
		time.AfterFunc(p.trimInterval, p.trimAndReschedule)
	}
}

func (p *bufferPool) trimAndReschedule() {
	p.trim()
	p.trimming.Store(false)
	// A put between trim and Store saw trimming still true and scheduled nothing.
	if p.pooled.Load() > 0 && p.trimming.CompareAndSwap(false, true) {
		time.AfterFunc(p.trimInterval, p.trimAndReschedule)
	}
}

// trim gives back the memory of the buffers that stayed in the pool since the last trim.
func (p *bufferPool) trim() {
	for i := range p.classes {
		cp := &p.classes[i]
		cp.mu.Lock()
		var idle []*buffer
		if cp.idle > 0 {
			idle = cp.free[:cp.idle:cp.idle]
			cp.free = append([]*buffer(nil), cp.free[cp.idle:]...)
		}
		cp.idle = len(cp.free)
		cp.mu.Unlock()
		p.giveBackFree(idle)
	}
}

// freeAll gives back the memory of every free buffer.
func (p *bufferPool) freeAll() {
	for i := range p.classes {
		cp := &p.classes[i]
		cp.mu.Lock()
		all := cp.free
		cp.free, cp.idle = nil, 0
		cp.mu.Unlock()
		p.giveBackFree(all)
	}
}

// unmapAll gives back every free buffer and unmaps every empty mapping. Only for when no
// buffer the pool handed out can be touched again.
func (p *bufferPool) unmapAll() {
	p.freeAll()
	for i := range p.classes {
		cp := &p.classes[i]
		cp.mu.Lock()
		empty := cp.empty
		cp.empty = nil
		cp.mu.Unlock()
		for _, buf := range empty {
			p.emptyMapped.Add(-int64(cap(buf.b)))
			unmapBuffer(buf.b[:cap(buf.b)])
			buf.b = nil
		}
	}
}

// giveBackFree gives back buffers taken out of the free lists.
func (p *bufferPool) giveBackFree(bufs []*buffer) {
	for _, buf := range bufs {
		p.pooled.Add(-int64(cap(buf.b)))
		p.giveBack(buf)
	}
}

// giveBack returns the memory of a buffer no one uses: a mapping's pages go back to the OS and
// the empty mapping is kept for reuse; a heap buffer is left to the garbage collector.
func (p *bufferPool) giveBack(buf *buffer) {
	if !buf.mapped {
		buf.b = nil
		return
	}
	b := buf.b[:cap(buf.b)]
	discardPages(b)
	buf.b = b
	p.emptyMapped.Add(int64(len(b)))
	cp := &p.classes[bufferClass(len(b))]
	cp.mu.Lock()
	cp.empty = append(cp.empty, buf)
	cp.mu.Unlock()
}
