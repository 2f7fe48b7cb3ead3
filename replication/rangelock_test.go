package replication

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRangeLocksNeverLetOverlappingWritersIn: sixteen goroutines lock
// random overlapping ranges, a third of them shared; while a range is held
// no block of it is held by a writer other than the holder, and a shared
// holder sees no writer. Every range is released at the end.
func TestRangeLocksNeverLetOverlappingWritersIn(t *testing.T) {
	const blocks, workers, rounds = 64, 16, 2000
	var r RangeLocks
	var writers, readers [blocks]atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				first := rng.IntN(blocks)
				n := min(1+rng.IntN(4), blocks-first)
				shared := rng.IntN(3) == 0
				var hold *RangeHold
				var err error
				if shared {
					hold, err = r.LockShared(context.Background(), int64(first)*BlockSize, int64(n)*BlockSize)
				} else {
					hold, err = r.Lock(context.Background(), int64(first)*BlockSize, int64(n)*BlockSize)
				}
				if err != nil {
					t.Error(err)
					return
				}
				for b := first; b < first+n; b++ {
					if shared {
						readers[b].Add(1)
						if writers[b].Load() != 0 {
							t.Errorf("a reader of block %d ran beside a writer", b)
						}
					} else if writers[b].Add(1) != 1 || readers[b].Load() != 0 {
						t.Errorf("a writer of block %d ran beside another holder", b)
					}
				}
				for b := first; b < first+n; b++ {
					if shared {
						readers[b].Add(-1)
					} else {
						writers[b].Add(-1)
					}
				}
				hold.Release()
			}
		}()
	}
	wg.Wait()
	if n := r.Len(); n != 0 {
		t.Fatalf("%d ranges still held", n)
	}
}

// BenchmarkRangeLocksQueueDepth16: a write path's use, sixteen requests
// in flight on disjoint 8 KiB ranges, each locked and released.
func BenchmarkRangeLocksQueueDepth16(b *testing.B) {
	var r RangeLocks
	ctx := context.Background()
	held := make([]*RangeHold, 15)
	for i := range held {
		held[i], _ = r.Lock(ctx, int64(i+1)<<20, 8192)
	}
	b.ReportAllocs()
	for b.Loop() {
		hold, _ := r.Lock(ctx, 0, 8192)
		hold.Release()
	}
	for _, hold := range held {
		hold.Release()
	}
}

// TestRangeLocksOrderRequestsInOneBlock: two requests in one 4 KiB block
// whose bytes do not overlap are ordered all the same (a block is the
// unit of its checksum at rest); requests in different blocks are not.
func TestRangeLocksOrderRequestsInOneBlock(t *testing.T) {
	var r RangeLocks
	ctx := context.Background()
	held, err := r.LockShared(ctx, 0, 512)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		h, err := r.Lock(ctx, 512, 512)
		if err == nil {
			h.Release()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a write of bytes 512-1024 went ahead of a read of bytes 0-512 of the same block")
	case <-time.After(50 * time.Millisecond):
	}
	other, err := r.Lock(ctx, BlockSize, 512) // the next block: not held up
	if err != nil {
		t.Fatal(err)
	}
	other.Release()
	held.Release()
	<-got
}
