package replication

import (
	"context"
	"testing"
	"time"
)

func TestBitmapMarksWholeBlocksTouched(t *testing.T) {
	b := NewBitmap(1 << 20)
	b.SetRange(4095, 2) // straddles blocks 0 and 1
	b.SetRange(8192, 4096)
	b.SetRange(8192, 1) // already set
	if got := b.Count(); got != 3 {
		t.Fatalf("count %d, want 3", got)
	}
	start, n, ok := b.NextRun(0, 100)
	if !ok || start != 0 || n != 3 {
		t.Fatalf("run %d+%d %v, want 0+3", start, n, ok)
	}
	if _, n, _ := b.NextRun(0, 2); n != 2 {
		t.Fatalf("run limited to 2 gave %d", n)
	}
	if !b.AnySet(4000, 200) || b.AnySet(12288, 4096) {
		t.Fatal("AnySet wrong")
	}
	b.ClearRange(4096, 4096)
	if start, n, _ := b.NextRun(1, 100); start != 2 || n != 1 {
		t.Fatalf("after clear: run %d+%d", start, n)
	}
	b.SetAll()
	if b.Count() != 256 || b.Bytes() != 1<<20 {
		t.Fatalf("SetAll: %d blocks", b.Count())
	}
	b.ClearRange(0, 1<<20)
	if _, _, ok := b.NextRun(0, 10); ok || b.Count() != 0 {
		t.Fatal("not clear after ClearRange of everything")
	}
}

func TestBitmapPartialLastBlockAndBounds(t *testing.T) {
	b := NewBitmap(3*4096 + 100)
	b.SetAll()
	if b.Count() != 4 {
		t.Fatalf("count %d, want 4", b.Count())
	}
	b.SetRange(1<<30, 4096) // beyond the end: ignored
	b.SetRange(-5, 10)
	if b.Count() != 4 {
		t.Fatalf("out-of-range marks changed the count: %d", b.Count())
	}
}

func TestRangeLocksOrderOverlappingOnly(t *testing.T) {
	var r RangeLocks
	ctx := context.Background()
	rel1, _ := r.Lock(ctx, 0, 4096)
	// A disjoint range goes ahead at once.
	rel2, err := r.Lock(ctx, 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	rel2.Release()
	got := make(chan *RangeHold)
	go func() {
		rel, _ := r.Lock(ctx, 100, 10) // overlaps the first
		got <- rel
	}()
	select {
	case <-got:
		t.Fatal("overlapping lock did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	rel1.Release()
	(<-got).Release()
	// A waiter whose context ends gives up and holds nothing.
	rel3, _ := r.Lock(ctx, 0, 10)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Lock(cctx, 5, 10); err == nil {
		t.Fatal("cancelled lock succeeded")
	}
	rel3.Release()
	if r.Len() != 0 {
		t.Fatalf("%d ranges still held", r.Len())
	}
}

// TestSharedRangeLocksWaitForWritesOnly: overlapping readers run together;
// a reader waits for an overlapping write that holds the range (it must
// not see a write that has not completed), and a write waits for the
// readers before it.
func TestSharedRangeLocksWaitForWritesOnly(t *testing.T) {
	var r RangeLocks
	ctx := context.Background()
	read1, _ := r.LockShared(ctx, 0, 8192)
	read2, err := r.LockShared(ctx, 4096, 4096) // overlaps read1: goes ahead
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan *RangeHold)
	go func() {
		rel, _ := r.Lock(ctx, 4096, 4096)
		wrote <- rel
	}()
	select {
	case <-wrote:
		t.Fatal("a write went ahead of the reads holding its range")
	case <-time.After(50 * time.Millisecond):
	}
	read1.Release()
	read2.Release()
	relWrite := <-wrote
	readDone := make(chan *RangeHold)
	go func() {
		rel, _ := r.LockShared(ctx, 0, 4097) // overlaps the write by a byte
		readDone <- rel
	}()
	select {
	case <-readDone:
		t.Fatal("a read went ahead of the write holding its range")
	case <-time.After(50 * time.Millisecond):
	}
	relWrite.Release()
	(<-readDone).Release() // released here, so the count below cannot race it
	if r.Len() != 0 {
		t.Fatalf("%d ranges still held", r.Len())
	}
}

// TestBitmapGrowKeepsTheMarksAndAddsClearBlocks: a bitmap grown with its
// volume keeps every mark, its partial last word included, and the blocks
// gained are in sync; a smaller size changes nothing.
func TestBitmapGrowKeepsTheMarksAndAddsClearBlocks(t *testing.T) {
	b := NewBitmap(100 * BlockSize)
	b.SetAll()
	b.ClearRange(10*BlockSize, BlockSize)
	b.Grow(1000 * BlockSize)
	if b.Blocks() != 1000 || b.Count() != 99 {
		t.Fatalf("after Grow: %d blocks, %d set; want 1000, 99", b.Blocks(), b.Count())
	}
	if start, n, ok := b.NextRun(11, 1<<20); !ok || start != 11 || n != 89 {
		t.Fatalf("run after the cleared block: %d+%d %v, want 11+89", start, n, ok)
	}
	if b.AnySet(100*BlockSize, 900*BlockSize) {
		t.Fatal("a block gained is marked")
	}
	b.SetRange(999*BlockSize, BlockSize)
	b.Grow(10 * BlockSize)
	if b.Blocks() != 1000 || b.Count() != 100 {
		t.Fatalf("after a smaller Grow: %d blocks, %d set", b.Blocks(), b.Count())
	}
}
