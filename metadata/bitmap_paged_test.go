package metadata

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
)

// TestPeerBitmapMatchesModel drives a bitmap over three pages (the last one
// partial, the volume size not a multiple of 4 KiB) with random set, clear
// and scan operations, checking every answer against a plain []bool, and
// the same after a flush and reopen: once with the volume filling the data
// device, once with a volume that ends short of the device (the bitmap must
// ignore every offset past the volume's end).
func TestPeerBitmapMatchesModel(t *testing.T) {
	volume := int64(2*BitsPerPage*4096 + 5000*4096 + 1234)
	cases := []struct {
		name       string
		deviceSize int64
		volumeSize int64
	}{
		{"volume fills the data device", volume, 0},
		{"volume ends 300 MiB short of the data device", volume + 300<<20, volume},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := testOptions(External)
			opts.DeviceSize, opts.VolumeSize = c.deviceSize, c.volumeSize
			checkBitmapAgainstModel(t, opts, volume, c.deviceSize)
		})
	}
}

// checkBitmapAgainstModel runs the random operations of
// TestPeerBitmapMatchesModel on offsets up to reach, past a volume of
// volume bytes.
func checkBitmapAgainstModel(t *testing.T, opts MDOptions, volume, reach int64) {
	dev, md := newTestMD(t, opts)
	b, _ := md.Bitmap(nodeBeta)
	blocks := b.Blocks()
	if blocks != (volume+4095)/4096 {
		t.Fatalf("%d blocks for a volume of %d bytes", blocks, volume)
	}
	model := make([]bool, blocks)
	r := rand.New(rand.NewPCG(3, 4))
	check := func(b *PeerBitmap) {
		t.Helper()
		var n int64
		for i, v := range model {
			if v {
				n++
			}
			if i%97 == 0 && b.Test(int64(i)) != v {
				t.Fatalf("block %d: %v, want %v", i, !v, v)
			}
		}
		if b.Count() != n {
			t.Fatalf("count %d, want %d", b.Count(), n)
		}
		// Scan every run and compare.
		var from int64
		for {
			start, k, ok := b.NextRun(from, 1<<30)
			if !ok {
				break
			}
			for i := from; i < start; i++ {
				if model[i] {
					t.Fatalf("NextRun skipped set block %d", i)
				}
			}
			for i := start; i < start+k; i++ {
				if !model[i] {
					t.Fatalf("NextRun returned clear block %d", i)
				}
			}
			if start+k < blocks && model[start+k] {
				t.Fatalf("run at %d stops early at %d", start, start+k)
			}
			from = start + k
		}
		for i := from; i < blocks; i++ {
			if model[i] {
				t.Fatalf("set block %d never scanned", i)
			}
		}
	}
	for step := range 3000 {
		off := r.Int64N(reach)
		length := r.Int64N(1 << (r.IntN(28) + 1))
		switch r.IntN(5) {
		case 0, 1:
			b.SetBits(off, length)
			for i := off / 4096; off < volume && i <= min((off+length-1)/4096, blocks-1); i++ {
				model[i] = true
			}
		case 2, 3:
			b.ClearBits(off, length)
			end := off + length
			last := end/4096 - 1
			if end >= volume {
				last = blocks - 1
			}
			for i := (off + 4095) / 4096; i <= min(last, blocks-1); i++ {
				model[i] = false
			}
		case 4:
			if step%7 == 0 {
				b.SetAll()
				for i := range model {
					model[i] = true
				}
			}
		}
		if step%300 == 0 {
			check(b)
		}
	}
	check(b)
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	b2, _ := reopen(t, dev.Crash(), opts).Bitmap(nodeBeta)
	check(b2)
}

// TestBitmapPageChecksumMismatchSetsItsRange: a bitmap page that fails its
// checksum is loaded as all-set (that range is resynced in full), reported,
// and written back so; the other pages load as they were.
func TestBitmapPageChecksumMismatchSetsItsRange(t *testing.T) {
	opts := testOptions(Internal)
	dev, md := newTestMD(t, opts)
	b, _ := md.Bitmap(nodeBeta)
	b.SetBits(0, 4096)                     // page 0
	b.SetBits(3*BitsPerPage*4096+8192, 10) // page 3
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	flipByte(t, dev, b.pageOffset(3)+2000) // a bit flip on the media

	crashed := dev.Crash()
	md2 := reopen(t, crashed, opts)
	r := md2.Report()
	if len(r.CorruptBitmapPages) != 1 || r.CorruptBitmapPages[0].Page != 3 ||
		r.CorruptBitmapPages[0].Offset != 3*BitsPerPage*4096 || r.CorruptBitmapPages[0].Length != BitsPerPage*4096 {
		t.Fatalf("report: %+v", r.CorruptBitmapPages)
	}
	b2, _ := md2.Bitmap(nodeBeta)
	if got, want := b2.Count(), int64(1+BitsPerPage); got != want {
		t.Fatalf("%d bits set, want page 0's one bit plus all of page 3 (%d)", got, want)
	}
	// The page was rewritten all-set with a good checksum: the next load
	// agrees, and the range stays marked until a resync clears it.
	md3 := reopen(t, crashed.Crash(), opts)
	b3, _ := md3.Bitmap(nodeBeta)
	if len(md3.Report().CorruptBitmapPages) != 0 || b3.Count() != 1+BitsPerPage {
		t.Fatalf("second load: %+v, %d bits", md3.Report().CorruptBitmapPages, b3.Count())
	}
}

// TestBitmapFlushOnlyDirtyPages: Flush writes the pages changed since the
// last flush and nothing else.
func TestBitmapFlushOnlyDirtyPages(t *testing.T) {
	dev, md := newTestMD(t, testOptions(External))
	b, _ := md.Bitmap(nodeBeta)
	w0, _ := dev.Count(mdtest.OpWrite)
	b.SetBits(0, 4096)
	b.SetBits(5*BitsPerPage*4096, 4096)
	b.SetBits(5*BitsPerPage*4096+4096, 4096)
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if w, _ := dev.Count(mdtest.OpWrite); w-w0 != 2 {
		t.Fatalf("%d page writes, want 2", w-w0)
	}
}

// TestBitmapMemorySparse1TiB shows the memory of one peer's bitmap for a
// 1 TiB volume: empty, with scattered writes, fully set, and in the worst
// case. DRBD's figure is 32 KiB per GiB, 32 MiB for 1 TiB, allocated up
// front.
func TestBitmapMemorySparse1TiB(t *testing.T) {
	const tib = 1 << 40
	md := &MD{geo: geometry{dataSize: tib, bitmapPages: bitmapPagesFor(tib)}, volumeSize: tib}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b := newPeerBitmap(md, 0, nodeBeta)
	runtime.GC()
	runtime.ReadMemStats(&after)
	empty := b.MemoryBytes()
	t.Logf("1 TiB, empty:              %7d KiB (heap grew %d KiB)", empty>>10, (after.HeapAlloc-before.HeapAlloc)>>10)
	if empty > 128<<10 || after.HeapAlloc-before.HeapAlloc > 256<<10 {
		t.Fatalf("an empty 1 TiB bitmap holds %d bytes", empty)
	}

	r := rand.New(rand.NewPCG(5, 6))
	for range 1000 { // 1000 random 4 MiB writes, each at most two pages
		b.SetBits(r.Int64N(tib-4<<20), 4<<20)
	}
	scattered := b.MemoryBytes()
	t.Logf("1 TiB, 1000 random 4 MiB writes: %5d KiB", scattered>>10)
	if scattered > empty+2000*4096 {
		t.Fatalf("scattered: %d bytes", scattered)
	}

	b.SetAll()
	full := b.MemoryBytes()
	t.Logf("1 TiB, all set (full resync): %6d KiB", full>>10)
	if full != empty {
		t.Fatalf("an all-set bitmap holds %d bytes, want the empty figure %d", full, empty)
	}

	for p := range int64(len(b.pages)) { // one clear bit per page: every page allocated
		b.ClearBits(p*BitsPerPage*4096, 4096)
	}
	worst := b.MemoryBytes()
	perGiB := float64(worst) / 1024
	t.Logf("1 TiB, worst case (every page mixed): %d KiB = %.0f bytes per GiB", worst>>10, perGiB)
	if perGiB > 32*1024*1.01 {
		t.Fatalf("worst case %.0f bytes per GiB, want 32 KiB (+1%%: page headers and table)", perGiB)
	}
}
