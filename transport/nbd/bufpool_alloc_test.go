//go:build !deadlock

package nbd

import (
	"testing"
	"time"
)

// TestPooledGetAndPutAllocateNothing pins that a buffer taken from the
// pool and put back costs no allocation. It is left out of the deadlock
// build, whose mutexes allocate as they record each lock; make test runs
// it without the tag.
func TestPooledGetAndPutAllocateNothing(t *testing.T) {
	const size = 1 << 20
	p := newBufferPool(3 * size)
	p.trimInterval = time.Hour // no trim while it counts
	p.put(p.get(size))
	if allocs := testing.AllocsPerRun(100, func() { p.put(p.get(size - 100)) }); allocs != 0 {
		t.Fatalf("a pooled get and put allocate %v times", allocs)
	}
}
