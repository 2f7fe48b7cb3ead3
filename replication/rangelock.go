package replication

import (
	"context"
	"sync"
)

// RangeLocks orders overlapping requests: a request waits until every
// earlier request whose byte range overlaps its own has released. Requests
// that do not overlap run concurrently, and so do shared ones (reads) that
// overlap each other. Safe for concurrent use.
type RangeLocks struct {
	mu     sync.Mutex
	active map[*rangeLock]struct{}
}

type rangeLock struct {
	off, end int64
	shared   bool
	done     chan struct{}
}

// Lock waits for every earlier overlapping holder of [off, off+length) to
// release, and returns the release function for this one. It returns the
// context's error if ctx ends first; then nothing is held.
func (r *RangeLocks) Lock(ctx context.Context, off, length int64) (release func(), err error) {
	return r.lock(ctx, off, length, false)
}

// LockShared is Lock for a reader: it waits only for earlier overlapping
// exclusive holders (writes), so it never sees a write that has not
// completed; later writes wait for it.
func (r *RangeLocks) LockShared(ctx context.Context, off, length int64) (release func(), err error) {
	return r.lock(ctx, off, length, true)
}

func (r *RangeLocks) lock(ctx context.Context, off, length int64, shared bool) (release func(), err error) {
	me := &rangeLock{off: off, end: off + length, shared: shared, done: make(chan struct{})}
	r.mu.Lock()
	if r.active == nil {
		r.active = make(map[*rangeLock]struct{})
	}
	var wait []chan struct{}
	for l := range r.active {
		if l.off < me.end && me.off < l.end && !(shared && l.shared) {
			wait = append(wait, l.done)
		}
	}
	r.active[me] = struct{}{}
	r.mu.Unlock()
	release = func() {
		r.mu.Lock()
		delete(r.active, me)
		r.mu.Unlock()
		close(me.done)
	}
	for _, w := range wait {
		select {
		case <-w:
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		}
	}
	return release, nil
}

// Len returns the number of held or waiting ranges.
func (r *RangeLocks) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.active)
}
