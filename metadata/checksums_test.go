package metadata

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata/mdtest"
)

// The block checksums at rest (issue 29) live in a paged area of the
// metadata (format 2): what is Set and flushed survives a crash, what is
// only Set may be lost but nothing else is, an extent leaves the activity
// log only once the checksums of its blocks are durable (after its data),
// a volume's store holds bounded memory however large the volume, and
// Grow keeps the sums where the metadata goes.

// checksumOptions are testOptions with a checksum area.
func checksumOptions(p Placement) MDOptions {
	opts := testOptions(p)
	opts.Checksums = true
	if p == External {
		opts.DataDevice = mdtest.NewDevice(opts.DeviceSize)
	}
	return opts
}

func sumsOf(t testing.TB, md *MD) *Checksums {
	t.Helper()
	c, ok := md.Checksums()
	if !ok {
		t.Fatal("metadata has no checksum area")
	}
	return c
}

// wantSums fails unless c holds exactly want for the blocks in want, and
// no known sum for those in unknown.
func wantSums(t testing.TB, c *Checksums, want map[int64]uint32, unknown []int64) {
	t.Helper()
	for b, w := range want {
		got, known, err := c.Get(b)
		if err != nil || !known || got != w {
			t.Fatalf("block %d: sum %08x known %v (%v), want %08x", b, got, known, err, w)
		}
	}
	for _, b := range unknown {
		if got, known, err := c.Get(b); err != nil || known {
			t.Fatalf("block %d: sum %08x known %v (%v), want none", b, got, known, err)
		}
	}
}

// TestChecksumsRoundTrip: sums set and flushed read back after a crash,
// blocks never set have none, Forget drops a range, and the metadata is
// format 2 on disk.
func TestChecksumsRoundTrip(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := checksumOptions(p)
			dev, md := newTestMD(t, opts)
			c := sumsOf(t, md)
			if c.Blocks() != blocksOf(md.VolumeSize()) {
				t.Fatalf("%d blocks for a volume of %d bytes", c.Blocks(), md.VolumeSize())
			}
			r := rand.New(rand.NewPCG(1, 2))
			want := map[int64]uint32{0: 0, c.Blocks() - 1: 0xffffffff, SumsPerPage - 1: 1, SumsPerPage: 2}
			for range 300 {
				want[r.Int64N(c.Blocks())] = r.Uint32()
			}
			for b, s := range want {
				if err := c.Set(b, s); err != nil {
					t.Fatal(err)
				}
			}
			seq := []uint32{10, 11, 12, 13}
			if err := c.SetRange(2*SumsPerPage-2, seq); err != nil { // across a page boundary
				t.Fatal(err)
			}
			for i, s := range seq {
				want[2*SumsPerPage-2+int64(i)] = s
			}
			unknown := []int64{}
			for b := int64(3 * SumsPerPage); len(unknown) < 5; b++ {
				if _, ok := want[b]; !ok {
					unknown = append(unknown, b)
				}
			}
			wantSums(t, c, want, unknown)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			crashed := dev.Crash()
			if v := crashed.Snapshot(md.geo.sbOffset[1], 12)[8]; v != FormatChecksums {
				t.Fatalf("superblock version %d, want %d", v, FormatChecksums)
			}
			md2 := reopen(t, crashed, opts)
			c2 := sumsOf(t, md2)
			wantSums(t, c2, want, unknown)

			got := make([]uint32, 4)
			known := make([]bool, 4)
			if err := c2.GetRange(2*SumsPerPage-2, got, known); err != nil || !slices.Equal(got, seq) || slices.Contains(known, false) {
				t.Fatalf("GetRange: %v %v %v", got, known, err)
			}
			// Forget: the blocks [off, off+length) touches lose their sums.
			if err := c2.Forget((SumsPerPage-1)*4096+100, 4096); err != nil {
				t.Fatal(err)
			}
			if err := c2.Flush(); err != nil {
				t.Fatal(err)
			}
			delete(want, SumsPerPage-1)
			delete(want, SumsPerPage)
			wantSums(t, sumsOf(t, reopen(t, crashed.Crash(), opts)), want, []int64{SumsPerPage - 1, SumsPerPage})
		})
	}
}

// TestMetadataWithoutChecksumsIsFormat1: metadata made with checksums off
// is the format older builds read, and opens with no checksum area, as
// metadata an older build made does.
func TestMetadataWithoutChecksumsIsFormat1(t *testing.T) {
	opts := testOptions(Internal)
	dev, md := newTestMD(t, opts)
	if _, ok := md.Checksums(); ok {
		t.Fatal("checksum area without MDOptions.Checksums")
	}
	if v := dev.Snapshot(md.geo.sbOffset[1], 12)[8]; v != 1 {
		t.Fatalf("superblock version %d, want 1", v)
	}
	if _, ok := reopen(t, dev.Crash(), opts).Checksums(); ok {
		t.Fatal("checksum area after reopening format 1")
	}
	// Opened with Checksums set, format 1 stays format 1: the option is
	// create-md's.
	opts.Checksums = true
	if _, ok := reopen(t, dev, opts).Checksums(); ok {
		t.Fatal("OpenMD made a checksum area")
	}
}

// TestChecksumsRefuseAndChangeNothing: a block past the volume, and
// external checksums without the data device, are refused and store
// nothing.
func TestChecksumsRefuseAndChangeNothing(t *testing.T) {
	opts := checksumOptions(External)
	opts.VolumeSize = 10*4096 + 100 // 11 blocks, the last partial
	_, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	if c.Blocks() != 11 {
		t.Fatalf("%d blocks, want 11", c.Blocks())
	}
	if err := c.SetRange(9, []uint32{1, 2, 3}); !errors.Is(err, ErrBlockOutOfRange) {
		t.Fatalf("a range past the end: %v", err)
	}
	if _, _, err := c.Get(11); !errors.Is(err, ErrBlockOutOfRange) {
		t.Fatalf("Get past the end: %v", err)
	}
	wantSums(t, c, nil, []int64{9, 10})
	if c.DirtyPages() != 0 {
		t.Fatalf("%d dirty pages after refusals", c.DirtyPages())
	}

	opts.DataDevice = nil
	_, md = newTestMD(t, opts)
	c = sumsOf(t, md)
	if err := c.Set(1, 5); !errors.Is(err, ErrNoDataDevice) {
		t.Fatalf("Set without the data device: %v", err)
	}
	wantSums(t, c, nil, []int64{1})
}

// TestChecksumPagesEvictedAndReloaded: with room for 4 pages, sums over
// 40 pages stay readable; at most 4 clean pages stay in memory, a dirty
// page stays until it is flushed, and dropped pages are read again.
func TestChecksumPagesEvictedAndReloaded(t *testing.T) {
	opts := checksumOptions(Internal)
	opts.ChecksumCachePages = 4
	_, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	want := map[int64]uint32{}
	for pg := range int64(40) {
		b := pg*SumsPerPage + pg
		want[b] = uint32(pg * 7)
		if err := c.Set(b, uint32(pg*7)); err != nil {
			t.Fatal(err)
		}
		if pg%10 == 9 {
			if c.ResidentPages() != 10 || c.DirtyPages() != 10 {
				t.Fatalf("before a flush: %d pages, %d dirty: want the 10 dirty kept", c.ResidentPages(), c.DirtyPages())
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			if c.ResidentPages() > 4 || c.DirtyPages() != 0 {
				t.Fatalf("after a flush: %d pages in memory, %d dirty; want at most 4, none", c.ResidentPages(), c.DirtyPages())
			}
		}
	}
	loads := c.Stats().Loads
	wantSums(t, c, want, nil)
	if c.ResidentPages() > 4 {
		t.Fatalf("%d pages in memory after reading 40", c.ResidentPages())
	}
	if st := c.Stats(); st.Loads-loads < 36 || st.Evictions == 0 {
		t.Fatalf("reading 40 pages with room for 4: %+v", st)
	}
}

// TestChecksumsCrashBeforeFlushLosesOnlyTheDirty: a crash keeps every sum
// flushed before it and loses only what was set after. A crash that
// tears a page being flushed loses that page's sums (it fails its
// checksum): never a wrong sum.
func TestChecksumsCrashBeforeFlushLosesOnlyTheDirty(t *testing.T) {
	opts := checksumOptions(Internal)
	dev, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	flushed := map[int64]uint32{}
	for pg := range int64(6) {
		for k := range int64(3) {
			b := pg*SumsPerPage + k*100
			flushed[b] = uint32(pg<<8 | k)
			if err := c.Set(b, flushed[b]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// After the flush: new sums on pages 0..2 (flushed pages changed) and
	// 10 (a page never flushed), each the last of its page, so that its
	// known bit (first sector) and its sum (last sector) tear apart.
	later := []int64{SumsPerPage - 1, 2*SumsPerPage - 1, 3*SumsPerPage - 1, 11*SumsPerPage - 1}
	for _, b := range later {
		if err := c.Set(b, 0xabcdef); err != nil {
			t.Fatal(err)
		}
	}
	wantSums(t, sumsOf(t, reopen(t, dev.Crash(), opts)), flushed, later)

	// A crash during a flush of those pages: each page is whole (old or
	// new) or torn; a torn page holds no known sum, never a wrong one.
	for tear := range 8 {
		dev2, md2 := newTestMD(t, opts)
		c2 := sumsOf(t, md2)
		for b, s := range flushed {
			if err := c2.Set(b, s); err != nil {
				t.Fatal(err)
			}
		}
		if err := c2.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, b := range later {
			if err := c2.Set(b, 0xabcdef); err != nil {
				t.Fatal(err)
			}
		}
		// The power fails before the flush's sync: its page writes are
		// pending, and the crash tears them.
		dev2.SetInjector(func(op mdtest.Op) mdtest.Fault {
			if op.Kind == mdtest.OpSync {
				return mdtest.Fault{Err: mdtest.ErrInjected}
			}
			return mdtest.Fault{}
		})
		if err := c2.Flush(); !errors.Is(err, mdtest.ErrInjected) {
			t.Fatalf("flush with a failing sync: %v", err)
		}
		crashed := dev2.CrashKeeping(func(i int, off int64, length int) int { return (tear + i) % 9 })
		c3 := sumsOf(t, reopen(t, crashed, opts))
		for b, s := range flushed {
			got, known, err := c3.Get(b)
			if err != nil || (known && got != s) {
				t.Fatalf("tear %d: block %d holds %08x (known %v, %v), want %08x or none", tear, b, got, known, err, s)
			}
			if !known && b/SumsPerPage > 2 {
				t.Fatalf("tear %d: block %d, on a page no flush rewrote, lost its sum", tear, b)
			}
		}
		for _, b := range later {
			if got, known, _ := c3.Get(b); known && got != 0xabcdef {
				t.Fatalf("tear %d: block %d holds %08x", tear, b, got)
			}
		}
	}
}

// TestALEvictionMakesTheChecksumsDurable pins the rule AN EXTENT LEAVES
// THE ACTIVITY LOG ONLY ONCE THE CHECKSUMS OF ITS BLOCKS ARE DURABLE (and
// the data before them): blocks written to an extent, their sums set, the
// extent evicted, and both disks crash right after the eviction. The
// extent is no longer in the log, so recovery would trust its sums: every
// one must be there and match the data the crash left.
func TestALEvictionMakesTheChecksumsDurable(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := checksumOptions(p)
			opts.ALExtents = MinALExtents
			mdDev, md := newTestMD(t, opts)
			data := mdDev // internal: the data shares the device
			if p == External {
				data = opts.DataDevice.(*mdtest.Device)
			}
			c := sumsOf(t, md)
			seed := blocksum.NewSeed(testVolume)
			al := md.ActivityLog()
			for e := range uint64(MinALExtents) {
				admit(t, al, e)
			}
			r := rand.New(rand.NewPCG(3, 4))
			written := map[int64]bool{}
			for range 50 {
				b := int64(extentStart(1))/4096 + r.Int64N(ExtentSize/4096)
				buf := make([]byte, 4096)
				for i := range buf {
					buf[i] = byte(r.Uint32())
				}
				if _, err := data.WriteAt(buf, b*4096); err != nil {
					t.Fatal(err)
				}
				if err := c.Set(b, seed.Sum(uint64(b), buf)); err != nil {
					t.Fatal(err)
				}
				written[b] = true
			}
			for e := range uint64(MinALExtents) {
				if e != 0 {
					done(al, e) // extent 0 keeps a write in flight
				}
			}
			dirty := c.DirtyPagesCovering(extentStart(1), ExtentSize)
			if dirty != 2 { // an extent's 1024 blocks lie on two pages of 990
				t.Fatalf("%d dirty checksum pages cover the extent written, want 2", dirty)
			}
			var log opLog
			mdDev.SetInjector(log.record(md))
			admit(t, al, 100) // evicts extent 1: the oldest with nothing in flight
			if slices.Contains(al.ActiveExtents(), 1) {
				t.Fatalf("extent 1 still in the log: %v", al.ActiveExtents())
			}
			if p == Internal {
				want := []string{"sync", "write checksums", "write checksums", "sync", "write al", "sync"}
				if ops := log.take(); !slices.Equal(ops, want) {
					t.Fatalf("eviction: %v, want %v", ops, want)
				}
			}

			// Power fails right after the eviction.
			mdAfter := mdDev.Crash()
			dataAfter := mdAfter
			if p == External {
				dataAfter = data.Crash()
				opts.DataDevice = dataAfter
			}
			md2 := reopen(t, mdAfter, opts)
			if slices.Contains(md2.ActivityLog().ActiveExtents(), 1) {
				t.Fatal("extent 1 back in the log after the crash")
			}
			c2 := sumsOf(t, md2)
			for b := range written {
				buf := make([]byte, 4096)
				if _, err := dataAfter.ReadAt(buf, b*4096); err != nil {
					t.Fatal(err)
				}
				sum, known, err := c2.Get(b)
				if err != nil || !known {
					t.Fatalf("block %d of the evicted extent has no sum after the crash (%v)", b, err)
				}
				if err := seed.Verify(uint64(b), buf, sum); err != nil {
					t.Fatalf("after the crash: %v", err)
				}
			}
			if n := c.DirtyPagesCovering(extentStart(1), ExtentSize); n != 0 {
				t.Fatalf("%d dirty checksum pages cover the evicted extent", n)
			}
			if st := al.Stats(); st.ChecksumPagesFlushed != int64(dirty) {
				t.Fatalf("stats: %+v, want %d checksum pages flushed", st, dirty)
			}
		})
	}
}

// TestALEvictionOfACleanExtentWritesNoChecksum: an extent whose sums are
// durable already leaves the log at the cost it had.
func TestALEvictionOfACleanExtentWritesNoChecksum(t *testing.T) {
	opts := checksumOptions(Internal)
	opts.ALExtents = MinALExtents
	dev, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	al := md.ActivityLog()
	for e := range uint64(MinALExtents) {
		admit(t, al, e)
	}
	// A sum in extent 3 (on a page of its own), none in extent 1.
	if err := c.Set(int64(extentStart(3))/4096+100, 1); err != nil {
		t.Fatal(err)
	}
	for e := uint64(1); e < MinALExtents; e++ {
		done(al, e) // extent 0 keeps a write in flight; 1 is the oldest
	}
	var log opLog
	dev.SetInjector(log.record(md))
	admit(t, al, 100)
	if ops := log.take(); !slices.Equal(ops, []string{"write al", "sync"}) {
		t.Fatalf("clean eviction: %v", ops)
	}
	if c.DirtyPages() != 1 {
		t.Fatalf("%d dirty pages, want extent 2's", c.DirtyPages())
	}
}

// TestChecksumMemoryOf1TiBIsBounded: a 1 TiB volume has 1 GiB of sums;
// its store holds the bound (here 64 pages, 264 KiB) and the pages
// changed since the last flush, however many it touched.
func TestChecksumMemoryOf1TiBIsBounded(t *testing.T) {
	const tib = 1 << 40
	opts := checksumOptions(External)
	opts.DeviceSize = tib
	opts.ChecksumCachePages = 64
	_, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	if c.Blocks() != tib/4096 {
		t.Fatalf("%d blocks", c.Blocks())
	}
	r := rand.New(rand.NewPCG(5, 6))
	want := map[int64]uint32{}
	for i := range 3000 {
		b := r.Int64N(c.Blocks())
		want[b] = r.Uint32()
		if err := c.Set(b, want[b]); err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			if c.ResidentPages() > 64 {
				t.Fatalf("%d pages in memory, bound 64", c.ResidentPages())
			}
		}
	}
	wantSums(t, c, want, nil)
	mem := c.MemoryBytes()
	t.Logf("1 TiB, 3000 sums over 3000 pages: %d pages, %d KiB in memory; %d loads", c.ResidentPages(), mem>>10, c.Stats().Loads)
	if c.ResidentPages() > 64 || mem > 64*(MDBlockSize+256) {
		t.Fatalf("%d pages, %d bytes in memory; bound 64 pages", c.ResidentPages(), mem)
	}
}

// TestCreateMDForgetsTheSumsOfTheMetadataItReplaces: create-md over
// metadata of the same volume writes no checksum page, yet none of the
// old pages' sums is taken: they lack the new area's seed.
func TestCreateMDForgetsTheSumsOfTheMetadataItReplaces(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := checksumOptions(p)
			dev, md := newTestMD(t, opts)
			c := sumsOf(t, md)
			blocks := []int64{0, 1, SumsPerPage, c.Blocks() - 1}
			for _, b := range blocks {
				if err := c.Set(b, uint32(b)); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			opts.Overwrite = true
			md2, err := CreateMD(dev, opts)
			if err != nil {
				t.Fatal(err)
			}
			wantSums(t, sumsOf(t, md2), nil, blocks)
			c3 := sumsOf(t, reopen(t, dev.Crash(), opts))
			wantSums(t, c3, nil, blocks)
			if st := c3.Stats(); st.Unknown != 3 {
				t.Fatalf("stats %+v: want the 3 old pages read as holding no sum", st)
			}
		})
	}
}

// FuzzDecodeChecksumPage: the page decoder never panics, and what it
// accepts re-encodes to the same page (known bits past the volume's end
// dropped).
func FuzzDecodeChecksumPage(f *testing.F) {
	_, md := newTestMD(f, checksumOptions(Internal))
	c := sumsOf(f, md)
	p := &sumPage{index: 1}
	p.known[0], p.sums[0], p.sums[63] = 1|1<<63, 0xdeadbeef, 7
	f.Add(c.encodePage(p)[4:200])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Most inputs would fail the page checksum: give them a good
		// one, so that the fuzzer explores what lies behind it.
		page := make([]byte, MDBlockSize)
		copy(page[4:], b)
		binary.LittleEndian.PutUint32(page[0:], c.pageCRC(page))
		for _, index := range []int64{1, int64(binary.LittleEndian.Uint32(page[4:]))} {
			got := &sumPage{index: index}
			c.mu.Lock()
			ok := index < ceilDiv64(c.blocks, SumsPerPage) && c.decodePage(got, page)
			c.mu.Unlock()
			if !ok {
				continue
			}
			again := &sumPage{index: index}
			c.mu.Lock()
			ok = c.decodePage(again, c.encodePage(got))
			c.mu.Unlock()
			if !ok || again.known != got.known || again.sums != got.sums {
				t.Fatalf("page %d does not round-trip", index)
			}
		}
	})
}

// TestRebuildActivityLogChecksumsAfterACrash: a crash leaves, in an
// extent of the activity log, data newer than its stored sums (and, in
// another, blocks whose sums were never stored); recovery computes the
// sums of the log's extents again from the data, durably, and touches no
// other sum.
func TestRebuildActivityLogChecksumsAfterACrash(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := checksumOptions(p)
			dev, md := newTestMD(t, opts)
			data := dev
			if p == External {
				data = opts.DataDevice.(*mdtest.Device)
			}
			c := sumsOf(t, md)
			seed := blocksum.NewSeed(testVolume)
			al := md.ActivityLog()
			admit(t, al, 1)
			admit(t, al, 2)
			write := func(b int64, fill byte, store bool) {
				t.Helper()
				buf := bytes.Repeat([]byte{fill}, 4096)
				if _, err := data.WriteAt(buf, b*4096); err != nil {
					t.Fatal(err)
				}
				if store {
					if err := c.Set(b, seed.Sum(uint64(b), buf)); err != nil {
						t.Fatal(err)
					}
				}
			}
			inLog := []int64{1024, 1500, 2047, 2048 + 7}
			for _, b := range inLog[:3] {
				write(b, 0xaa, true)
			}
			// Outside the log: a sum that matches no data on purpose, so
			// that a recovery touching it would show.
			outside := int64(100 * 1024)
			if err := c.Set(outside, 0x12345678); err != nil {
				t.Fatal(err)
			}
			if err := data.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			// Newer data, synced; its sums, and extent 2's block's, never
			// reach the disk.
			for _, b := range inLog[:3] {
				write(b, 0xbb, true)
			}
			write(inLog[3], 0xcc, false)
			if err := data.Sync(); err != nil {
				t.Fatal(err)
			}

			mdAfter := dev.Crash()
			dataAfter := mdAfter
			if p == External {
				dataAfter = data.Crash()
				opts.DataDevice = dataAfter
			}
			md2 := reopen(t, mdAfter, opts)
			var log opLog
			dataAfter.SetInjector(log.record(md2))
			rec, err := md2.RebuildActivityLogChecksums(dataAfter)
			if err != nil {
				t.Fatal(err)
			}
			dataAfter.SetInjector(nil)
			if ops := log.take(); len(ops) == 0 || ops[0] != "sync" {
				t.Fatalf("recovery's operations on the data device: %v; want a sync first", ops)
			}
			if rec.Extents != 2 || rec.Blocks != 2*ExtentSize/4096 || rec.ForgotAll {
				t.Fatalf("recovery %+v: want extents 1 and 2 rebuilt", rec)
			}
			check := func(md *MD) {
				t.Helper()
				c := sumsOf(t, md)
				for _, b := range inLog {
					buf := make([]byte, 4096)
					if _, err := dataAfter.ReadAt(buf, b*4096); err != nil {
						t.Fatal(err)
					}
					sum, known, err := c.Get(b)
					if err != nil || !known {
						t.Fatalf("block %d: no sum after recovery (%v)", b, err)
					}
					if err := seed.Verify(uint64(b), buf, sum); err != nil {
						t.Fatalf("after recovery: %v", err)
					}
				}
				wantSums(t, c, map[int64]uint32{outside: 0x12345678}, nil)
			}
			check(md2)
			check(reopen(t, mdAfter.Crash(), opts)) // and durably
		})
	}
}

// TestRebuildWithAnIncompleteLogForgetsEverySum: when the activity log
// cannot say which extents were hot, recovery drops every sum, with one
// superblock write, and new sums are stored from then on.
func TestRebuildWithAnIncompleteLogForgetsEverySum(t *testing.T) {
	opts := checksumOptions(Internal)
	dev, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	for _, b := range []int64{0, 5000, 70000} {
		if err := c.Set(b, uint32(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// Wipe the activity log's ring: nothing describes its slots.
	if _, err := dev.WriteAt(make([]byte, md.geo.alBlocks*MDBlockSize), md.geo.alOffset); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	md2 := reopen(t, dev.Crash(), opts)
	if !md2.Report().ALIncomplete {
		t.Fatal("the wiped log reads as complete")
	}
	var log opLog
	dev2 := dev.Crash()
	md2 = reopen(t, dev2, opts)
	dev2.SetInjector(log.record(md2))
	rec, err := md2.RebuildActivityLogChecksums(dev2)
	if err != nil || !rec.ForgotAll {
		t.Fatalf("recovery %+v, %v: want every sum forgotten", rec, err)
	}
	if ops := log.take(); !slices.Equal(ops, []string{"write superblock", "sync"}) {
		t.Fatalf("forgetting every sum: %v", ops)
	}
	c2 := sumsOf(t, md2)
	wantSums(t, c2, nil, []int64{0, 5000, 70000})
	if err := c2.Set(5000, 9); err != nil {
		t.Fatal(err)
	}
	if err := c2.Flush(); err != nil {
		t.Fatal(err)
	}
	wantSums(t, sumsOf(t, reopen(t, dev2.Crash(), opts)), map[int64]uint32{5000: 9}, []int64{0, 70000})
}

// TestChecksumsWhileInUse: writers admit extents, set sums and flush
// while the activity log evicts and the metadata moves (a Grow); every
// sum they set is there after a crash. (Run with -race.)
func TestChecksumsWhileInUse(t *testing.T) {
	c := growChecksumCases(t)[1]   // the move of internal metadata
	c.alExtents = MinALExtents + 4 // setUp keeps 3 in flight, each writer 1 at a time
	dev, md, st := c.setUp(t)
	dev.Grow(c.devAfter)
	al := md.ActivityLog()
	sums := sumsOf(t, md)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	set := map[int64]uint32{}
	var running atomic.Int32
	for w := range 4 {
		wg.Add(1)
		running.Add(1)
		go func() {
			defer wg.Done()
			defer running.Add(-1)
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Spread over many extents, so that the log evicts.
				block := (int64(w)*7919 + i*104729) % blocksOf(c.volBefore)
				if _, ok := st.sums[block]; ok {
					continue
				}
				if err := al.Admit(t.Context(), block*4096, 4096); err != nil {
					t.Error(err)
					return
				}
				sum := uint32(w)<<24 | uint32(i)
				mu.Lock() // one writer per block at a time, as the node orders them
				if err := sums.Set(block, sum); err != nil {
					t.Error(err)
				}
				set[block] = sum
				mu.Unlock()
				al.Done(block*4096, 4096)
				if i%16 == 0 {
					if err := sums.Flush(); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	waitFor := func(n int) {
		for {
			mu.Lock()
			got := len(set)
			mu.Unlock()
			if got >= n {
				return
			}
			if running.Load() == 0 {
				t.Fatalf("the writers stopped after %d sums", got)
			}
			runtime.Gosched()
		}
	}
	waitFor(200)
	if _, err := md.Grow(GrowOptions{VolumeSize: c.volAfter, DeviceSize: c.devAfter}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	during := len(set)
	mu.Unlock()
	waitFor(during + 200)
	close(stop)
	wg.Wait()
	if err := sums.Flush(); err != nil {
		t.Fatal(err)
	}
	if al.Stats().Evictions == 0 {
		t.Fatal("no eviction while the writers ran")
	}
	again, err := c.open(dev.Crash(), c.volAfter)
	if err != nil {
		t.Fatal(err)
	}
	st.check(t, again, c.peers)
	wantSums(t, sumsOf(t, again), set, nil)
	t.Logf("%d sums set by writers, %d before the move ended; %+v", len(set), during, al.Stats())
}

// TestASumSetDuringAFlushIsWrittenByTheNext: a sum set while a flush
// writes its page (the flush wrote the page as it was before) leaves the
// page dirty, and the next flush writes it.
func TestASumSetDuringAFlushIsWrittenByTheNext(t *testing.T) {
	opts := checksumOptions(Internal)
	dev, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	if err := c.Set(10, 1); err != nil {
		t.Fatal(err)
	}
	gate := fault.NewGate()
	dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
		if op.Kind == mdtest.OpWrite && region(md, op) == "write checksums" {
			return mdtest.Fault{Hold: gate}
		}
		return mdtest.Fault{}
	})
	flushed := make(chan error, 1)
	go func() { flushed <- c.Flush() }()
	<-gate.Entered // the flush's page write is under way
	if err := c.Set(11, 2); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	dev.SetInjector(nil)
	if c.DirtyPages() != 1 {
		t.Fatalf("%d dirty pages after a flush that missed a change, want 1", c.DirtyPages())
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	wantSums(t, sumsOf(t, reopen(t, dev.Crash(), opts)), map[int64]uint32{10: 1, 11: 2}, nil)
}

// TestFormat1MetadataOfAnEarlierBuildOpens: external metadata that the
// build before checksums made (testdata/format1-external-64MiB.md.gz: a
// 64 MiB volume, node 1, peer 2, 7 hot extents, crashed as primary with
// extents 1, 5 and 9 hot, the bits of block 0 and of [40 MiB, 41 MiB)
// set) opens with all it held, without a checksum area, and opening it
// changes no byte.
func TestFormat1MetadataOfAnEarlierBuildOpens(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "format1-external-64MiB.md.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	image, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	dev := mdtest.NewDevice(int64(len(image)))
	if _, err := dev.WriteAt(image, 0); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	opts := MDOptions{Placement: External, DeviceSize: 64 << 20, Volume: testVolume, NodeID: nodeAlpha, Checksums: true}
	md := reopen(t, dev, opts)
	if sb := md.Superblock(); sb.Version != 1 || sb.HasChecksums() {
		t.Fatalf("superblock version %d", sb.Version)
	}
	if _, ok := md.Checksums(); ok {
		t.Fatal("a checksum area in format 1 metadata")
	}
	if !md.CrashedPrimary() {
		t.Fatal("the primary indicator was lost")
	}
	if got := md.ActivityLog().ActiveExtents(); !slices.Equal(got, []uint64{1, 5, 9}) {
		t.Fatalf("activity log %v, want [1 5 9]", got)
	}
	b, _ := md.Bitmap(nodeBeta)
	if b.Count() != 1+256 || !b.Test(0) || !b.Test(40<<20/4096) || b.Test(1) {
		t.Fatalf("bitmap: %d bits set", b.Count())
	}
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Snapshot(0, len(image)), image) {
		t.Fatal("opening and closing the metadata changed it")
	}
}

// TestGrowLimitWithChecksumsIsWhatGrowAccepts: external metadata with a
// checksum area grows its area with the volume; the limit GrowLimit
// gives for the file is the largest size Grow takes, and 4 KiB more is
// refused, naming the file's room.
func TestGrowLimitWithChecksumsIsWhatGrowAccepts(t *testing.T) {
	opts := checksumOptions(External)
	opts.DeviceSize = 64 << 20
	need, err := ExternalSizeFor(300<<20, 0, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	dev := mdtest.NewDevice(need + 5*MDBlockSize) // room for a little more than 300 MiB
	md, err := CreateMD(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	limit, err := md.GrowLimit(0)
	if err != nil {
		t.Fatal(err)
	}
	if limit < 300<<20 || limit%4096 != 0 {
		t.Fatalf("limit %d: want at least 300 MiB, a multiple of 4 KiB", limit)
	}
	var room *NoRoomError
	if _, err := md.Grow(GrowOptions{VolumeSize: limit + 4096}); !errors.As(err, &room) || !room.MetadataFile || room.Holds != limit {
		t.Fatalf("Grow past the limit %d: %v", limit, err)
	}
	if _, err := md.Grow(GrowOptions{VolumeSize: limit}); err != nil {
		t.Fatalf("Grow to the limit %d: %v", limit, err)
	}
	if c := sumsOf(t, md); c.Blocks() != limit/4096 {
		t.Fatalf("the store covers %d blocks, want %d", c.Blocks(), limit/4096)
	}
}

// recordingWriter counts the writes through it.
type recordingWriter struct {
	w      io.WriterAt
	writes int
}

func (r *recordingWriter) WriteAt(p []byte, off int64) (int, error) {
	r.writes++
	return r.w.WriteAt(p, off)
}

// TestFlushViaSyncsOnceAfterThePages: internal metadata's FlushVia writes
// the dirty pages through the writer it is given and calls its sync once
// after them (the FLUSH's one sync of data and pages), even with nothing
// dirty; the pages are clean only once the sync succeeded, and they
// survive a crash after it.
func TestFlushViaSyncsOnceAfterThePages(t *testing.T) {
	opts := checksumOptions(Internal)
	dev, md := newTestMD(t, opts)
	c := sumsOf(t, md)
	want := map[int64]uint32{3: 33, SumsPerPage + 1: 44}
	for b, s := range want {
		if err := c.Set(b, s); err != nil {
			t.Fatal(err)
		}
	}
	w := &recordingWriter{w: dev}
	syncs, writesAtSync := 0, 0
	failing := errors.New("sync failed")
	err := c.FlushVia(w, func() error { syncs++; writesAtSync = w.writes; return failing })
	if !errors.Is(err, failing) || c.DirtyPages() != 2 {
		t.Fatalf("a failed sync: %v, %d dirty pages, want the error and both still dirty", err, c.DirtyPages())
	}
	if err := c.FlushVia(w, func() error { syncs++; writesAtSync = w.writes; return dev.Sync() }); err != nil {
		t.Fatal(err)
	}
	if syncs != 2 || writesAtSync != 4 || c.DirtyPages() != 0 {
		t.Fatalf("%d syncs, %d page writes before the last, %d dirty pages; want 2, 4, 0", syncs, writesAtSync, c.DirtyPages())
	}
	if err := c.FlushVia(w, func() error { syncs++; return nil }); err != nil || syncs != 3 || w.writes != 4 {
		t.Fatalf("nothing dirty: %v, %d syncs, %d writes; want the sync alone", err, syncs, w.writes)
	}
	wantSums(t, sumsOf(t, reopen(t, dev.Crash(), opts)), want, nil)
}

// TestSetRangeSetsEachBlockOfTheRange: SetRange stores a page at a time
// (the known bits a word at a time), so ranges that start and end inside
// a word of known bits, span whole words, and cross a page boundary must
// each give every block of the range its sum and leave the blocks around
// it as they were.
func TestSetRangeSetsEachBlockOfTheRange(t *testing.T) {
	_, md := newTestMD(t, checksumOptions(Internal))
	c := sumsOf(t, md)
	if c.Blocks() < 3*SumsPerPage {
		t.Fatalf("the test volume has %d blocks, fewer than three pages", c.Blocks())
	}
	want := map[int64]uint32{}
	r := rand.New(rand.NewPCG(3, 4))
	ranges := [][2]int64{
		{1, 1}, {62, 3}, {64, 64}, {130, 200}, {SumsPerPage - 5, 10},
		{SumsPerPage - 1, SumsPerPage + 2}, {2*SumsPerPage + 63, 1},
	}
	for range 40 {
		first := r.Int64N(3*SumsPerPage - 300)
		ranges = append(ranges, [2]int64{first, 1 + r.Int64N(299)})
	}
	for _, rg := range ranges {
		sums := make([]uint32, rg[1])
		for k := range sums {
			sums[k] = r.Uint32()
			want[rg[0]+int64(k)] = sums[k]
		}
		if err := c.SetRange(rg[0], sums); err != nil {
			t.Fatalf("SetRange(%d, %d sums): %v", rg[0], len(sums), err)
		}
	}
	var unknown []int64
	for b := range int64(3*SumsPerPage + 1) {
		if _, ok := want[b]; !ok {
			unknown = append(unknown, b)
		}
	}
	wantSums(t, c, want, unknown)
}

// BenchmarkChecksumsSetRange1M is the store's part of a 1 MiB write:
// the sums of its 256 blocks set in memory (SetRange, as the primary's
// write and the secondary's apply call it), over the first pages of the
// volume, in memory after the first round, so that only the bookkeeping
// is measured: four writes in a row cover 1024 blocks, and cross a page
// boundary (990 blocks to a page) as the volume's writes do.
func BenchmarkChecksumsSetRange1M(b *testing.B) {
	_, md := newTestMD(b, checksumOptions(Internal))
	c := sumsOf(b, md)
	const n = (1 << 20) / blocksum.BlockSize
	sums := make([]uint32, n)
	for i := range sums {
		sums[i] = uint32(i) * 2654435761
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := c.SetRange(int64(i%4)*n, sums); err != nil {
			b.Fatal(err)
		}
	}
}
