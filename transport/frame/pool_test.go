package frame

import "testing"

// TestThePoolHandsOutBuffersOfTheirTier: a buffer comes back with the
// length asked and the capacity of its power-of-two tier, is reused once
// put back, and one of another capacity is not kept.
func TestThePoolHandsOutBuffersOfTheirTier(t *testing.T) {
	p := &bufferPool{}
	for _, tc := range []struct{ n, cap int }{{0, 256}, {1, 256}, {256, 256}, {257, 512}, {8 << 10, 8 << 10}, {8<<10 + 5, 16 << 10}, {MaxSize, 64 << 20}} {
		b := p.Get(tc.n)
		if len(*b) != tc.n || cap(*b) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(*b), cap(*b), tc.n, tc.cap)
		}
	}
	b := p.Get(1000)
	(*b)[0] = 42
	p.Put(b)
	if c := p.Get(700); cap(*c) != 1024 {
		t.Errorf("Get(700) after a Put of a 1 KiB buffer: cap %d", cap(*c))
	}
	odd := make([]byte, 0, 1000)
	p.Put(&odd) // not a tier's capacity: dropped, never handed out
	for range 10 {
		if c := p.Get(1000); cap(*c) == 1000 {
			t.Fatal("a buffer of a capacity that is no tier was handed out")
		}
	}
}
