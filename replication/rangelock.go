package replication

import (
	"context"
	"sync"
)

// RangeLocks orders overlapping requests: a request waits until every
// earlier request whose byte range overlaps its own has released. Requests
// that do not overlap run concurrently. Safe for concurrent use.
type RangeLocks struct {
	mu     sync.Mutex
	active map[*rangeLock]struct{}
}

type rangeLock struct {
	off, end int64
	done     chan struct{}
}

// Lock waits for every earlier overlapping holder of [off, off+length) to
// release, and returns the release function for this one. It returns the
// context's error if ctx ends first; then nothing is held.
func (r *RangeLocks) Lock(ctx context.Context, off, length int64) (release func(), err error) {
	me := &rangeLock{off: off, end: off + length, done: make(chan struct{})}
	r.mu.Lock()
	if r.active == nil {
		r.active = make(map[*rangeLock]struct{})
	}
	var wait []chan struct{}
	for l := range r.active {
		if l.off < me.end && me.off < l.end {
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
