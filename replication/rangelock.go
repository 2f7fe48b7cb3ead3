package replication

import (
	"context"

	"github.com/replvol/replvol/internal/lockorder"
)

// RangeLocks orders overlapping requests: a request waits until every
// earlier request whose byte range overlaps its own has released. Requests
// that do not overlap run concurrently, and so do shared ones (reads) that
// overlap each other. Safe for concurrent use.
//
// A range covers the whole 4 KiB blocks it touches: two requests in one
// block are ordered even when their bytes do not overlap, because a block
// is the unit of its checksum at rest (a read verifies the whole block a
// part of it is read from, and a write of part of a block changes the
// block's checksum).
type RangeLocks struct {
	mu lockorder.Mutex
	// active holds the held and waiting ranges, in no order: a write
	// path holds a few (its queue depth), which a slice scans faster than
	// a map is iterated.
	active []*RangeHold
}

// RangeHold is one request's hold on its range, from Lock or LockShared
// until its Release.
type RangeHold struct {
	r        *RangeLocks
	off, end int64
	shared   bool
	idx      int // its place in r.active
	// done is made when a later request first waits for this one (most
	// never meet an overlap), and closed at its release. Guarded by r.mu.
	done chan struct{}
}

// Lock waits for every earlier overlapping holder of [off, off+length) to
// release, and returns this one's hold, to be released once. It returns
// the context's error if ctx ends first; then nothing is held.
func (r *RangeLocks) Lock(ctx context.Context, off, length int64) (*RangeHold, error) {
	return r.lock(ctx, off, length, false)
}

// LockShared is Lock for a reader: it waits only for earlier overlapping
// exclusive holders (writes), so it never sees a write that has not
// completed; later writes wait for it.
func (r *RangeLocks) LockShared(ctx context.Context, off, length int64) (*RangeHold, error) {
	return r.lock(ctx, off, length, true)
}

func (r *RangeLocks) lock(ctx context.Context, off, length int64, shared bool) (*RangeHold, error) {
	first := off / BlockSize * BlockSize
	end := (off + length + BlockSize - 1) / BlockSize * BlockSize
	me := &RangeHold{r: r, off: first, end: end, shared: shared}
	var buf [4]chan struct{}
	wait := buf[:0]
	r.mu.Lock()
	for _, l := range r.active {
		if l.off < me.end && me.off < l.end && !(shared && l.shared) {
			if l.done == nil {
				l.done = make(chan struct{})
			}
			wait = append(wait, l.done)
		}
	}
	me.idx = len(r.active)
	r.active = append(r.active, me)
	r.mu.Unlock()
	for _, w := range wait {
		select {
		case <-w:
		case <-ctx.Done():
			me.Release()
			return nil, ctx.Err()
		}
	}
	return me, nil
}

// Release takes l out of the active ranges and wakes what waits for it.
// (A hold, not a release function, is what Lock returns: a method value
// would cost every request an allocation.)
func (l *RangeHold) Release() {
	r := l.r
	r.mu.Lock()
	last := len(r.active) - 1
	moved := r.active[last]
	r.active[l.idx], moved.idx = moved, l.idx
	r.active[last] = nil
	r.active = r.active[:last]
	done := l.done
	r.mu.Unlock()
	if done != nil {
		close(done)
	}
}

// Len returns the number of held or waiting ranges.
func (r *RangeLocks) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.active)
}
