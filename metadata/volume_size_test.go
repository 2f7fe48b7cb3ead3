package metadata

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
)

// The bitmaps cover the volume (MDOptions.VolumeSize), not the whole
// usable size of the device: a real LUN is never exactly the volume plus
// its metadata, and a resync driven by a bitmap that covers the spare
// bytes sends blocks past the volume's end, which the peer refuses
// forever. These tests pin that no bitmap operation reaches past the
// volume, on any shape of volume end, and that metadata written by an
// older build (bitmaps over the whole usable size) opens with its bits
// past the volume ignored.

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// usableOf is the usable size of a device with internal metadata for
// peers peers.
func usableOf(t testing.TB, deviceSize int64, peers int) int64 {
	t.Helper()
	g, err := computeGeometry(Internal, deviceSize, DefaultALExtents, peers, false)
	if err != nil {
		t.Fatal(err)
	}
	return g.dataSize
}

// checkRunsInsideVolume scans b's runs from the start and fails if one
// starts at or ends past the volume's end; it returns the blocks scanned.
func checkRunsInsideVolume(t testing.TB, b *PeerBitmap, volume int64) int64 {
	t.Helper()
	var from, total int64
	for {
		start, n, ok := b.NextRun(from, 1000)
		if !ok {
			return total
		}
		if n <= 0 || start < from || start*bytesPerBit >= volume || start+n > b.Blocks() || (start+n-1)*bytesPerBit >= volume {
			t.Fatalf("run [%d, +%d) blocks = bytes [%d, %d) reaches past the volume's %d bytes (%d blocks)",
				start, n, start*bytesPerBit, (start+n)*bytesPerBit, volume, b.Blocks())
		}
		total += n
		from = start + n
	}
}

// TestBitmapsCoverTheVolumeNotTheDevice: every peer's bitmap covers exactly
// the volume: SetAll marks the volume and nothing more, no run reaches past
// it, SetBits past the end changes nothing, ClearBits of the partial last
// block clears it, and the pages past the volume's last page are never
// written.
func TestBitmapsCoverTheVolumeNotTheDevice(t *testing.T) {
	usable := usableOf(t, gib, 2)
	cases := []struct {
		name       string
		placement  Placement
		volumeSize int64 // MDOptions.VolumeSize
		want       int64 // what the bitmaps cover
	}{
		{"128 MiB volume on a 1 GiB device", Internal, 128 * mib, 128 * mib},
		{"1 MiB spare between the volume and the metadata", Internal, usable - mib, usable - mib},
		{"volume ends inside a 4 KiB block", Internal, 128*mib + 1000, 128*mib + 1000},
		{"volume ends on a bitmap page boundary", Internal, 2 * BitsPerPage * 4096, 2 * BitsPerPage * 4096},
		{"volume is the whole usable size", Internal, usable, usable},
		{"zero volume size means the whole usable size", Internal, 0, usable},
		{"external metadata, 100 MiB volume on a 1 GiB data device", External, 100 * mib, 100 * mib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := testOptions(c.placement)
			opts.DeviceSize, opts.VolumeSize, opts.Peers = gib, c.volumeSize, []uint32{nodeBeta, 3}
			dev, md := newTestMD(t, opts)
			if md.VolumeSize() != c.want {
				t.Fatalf("VolumeSize %d, want %d", md.VolumeSize(), c.want)
			}
			blocks := (c.want + 4095) / 4096
			lastStart := (blocks - 1) * 4096
			for _, peer := range opts.Peers {
				b, _ := md.Bitmap(peer)
				if b.Blocks() != blocks {
					t.Fatalf("peer %d: %d blocks, want %d", peer, b.Blocks(), blocks)
				}
				b.SetAll()
				if b.Bytes() != c.want || b.Count() != blocks {
					t.Fatalf("peer %d after SetAll: %d bytes in %d blocks, want %d bytes in %d", peer, b.Bytes(), b.Count(), c.want, blocks)
				}
				if got := checkRunsInsideVolume(t, b, c.want); got != blocks {
					t.Fatalf("peer %d: runs cover %d blocks, want %d", peer, got, blocks)
				}
				b.ClearBits(0, c.want)
				if b.Count() != 0 {
					t.Fatalf("peer %d: %d blocks left after clearing the volume", peer, b.Count())
				}
				// Past the end: the spare bytes and the metadata area.
				b.SetBits(c.want, 4096)
				if spare := md.UsableSize() - 4096; spare >= c.want {
					b.SetBits(spare, 4096)
				}
				b.SetBits(c.want+mib, gib)
				if b.Count() != 0 || b.Test(blocks) {
					t.Fatalf("peer %d: SetBits past the volume's end set %d blocks", peer, b.Count())
				}
				// A range reaching the end marks the last block; clearing
				// from its start to the volume's end clears it, even when
				// the volume ends inside it.
				b.SetBits(c.want-1, 1<<40)
				if b.Count() != 1 || !b.Test(blocks-1) || b.Bytes() != c.want-lastStart {
					t.Fatalf("peer %d: last block: count %d, %d bytes", peer, b.Count(), b.Bytes())
				}
				b.ClearBits(lastStart, c.want-lastStart)
				if b.Count() != 0 {
					t.Fatal("clearing the partial last block to the volume's end left it set")
				}
				b.SetBits(0, 4096)
				b.SetBits(c.want-1, 1)
			}
			if err := md.Close(); err != nil {
				t.Fatal(err)
			}
			b, _ := md.Bitmap(nodeBeta)
			volumePages := (blocks + BitsPerPage - 1) / BitsPerPage
			past := b.pageOffset(volumePages)
			end := b.pageOffset(md.geo.bitmapPages)
			if !bytes.Equal(dev.Snapshot(past, int(end-past)), make([]byte, end-past)) {
				t.Fatalf("pages %d..%d, past the volume, were written", volumePages, md.geo.bitmapPages-1)
			}

			md2 := reopen(t, dev.Crash(), opts)
			if r := md2.Report(); len(r.CorruptBitmapPages) != 0 {
				t.Fatalf("reopen reports corrupt pages %+v", r.CorruptBitmapPages)
			}
			for _, peer := range opts.Peers {
				b, _ := md2.Bitmap(peer)
				if b.Count() != 2 || !b.Test(0) || !b.Test(blocks-1) {
					t.Fatalf("peer %d after reopen: %d blocks set", peer, b.Count())
				}
			}
		})
	}
}

// TestVolumeLargerThanUsableIsRefused: a volume that does not fit beside
// its metadata is refused by OpenMD and CreateMD, naming both sizes, and
// the device is left as it was.
func TestVolumeLargerThanUsableIsRefused(t *testing.T) {
	usable := usableOf(t, testVolumeSize, 1)
	cases := []struct {
		name       string
		placement  Placement
		create     bool
		volumeSize int64
		usable     int64
		want       error
	}{
		{"create-md, internal, one block too large", Internal, true, usable + 4096, usable, ErrVolumeTooLarge},
		{"create-md, internal, one byte too large", Internal, true, usable + 1, usable, ErrVolumeTooLarge},
		{"open, internal, one block too large", Internal, false, usable + 4096, usable, ErrVolumeTooLarge},
		{"create-md, external, larger than the data device", External, true, testVolumeSize + 1, testVolumeSize, ErrVolumeTooLarge},
		{"open, external, larger than the data device", External, false, testVolumeSize + 4096, testVolumeSize, ErrVolumeTooLarge},
		{"create-md, negative volume size", Internal, true, -4096, usable, ErrBadOptions},
		{"open, negative volume size", External, false, -1, testVolumeSize, ErrBadOptions},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := testOptions(c.placement)
			dev, md := newTestMD(t, opts)
			if c.create {
				opts.Overwrite = true
			}
			opts.VolumeSize = c.volumeSize
			// The write counter covers the whole device; the snapshot the
			// metadata area.
			mdOff := md.Superblock().MDOffset
			before := dev.Snapshot(mdOff, int(dev.Size()-mdOff))
			writesBefore, _ := dev.Count(mdtest.OpWrite)
			var err error
			if c.create {
				_, err = CreateMD(dev, opts)
			} else {
				_, err = OpenMD(dev, opts)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Logf("refused: %v", err)
			if c.want == ErrVolumeTooLarge {
				for _, n := range []int64{c.volumeSize, c.usable} {
					if !strings.Contains(err.Error(), strconv.FormatInt(n, 10)) {
						t.Errorf("error %q does not name %d", err, n)
					}
				}
			}
			if writes, _ := dev.Count(mdtest.OpWrite); writes != writesBefore ||
				!bytes.Equal(before, dev.Snapshot(mdOff, len(before))) {
				t.Fatal("the refusal changed the device")
			}
		})
	}
}

// writeRawBitmapPage writes page i of b's slot with every bit word set to
// word and a valid checksum, as some other build may have.
func writeRawBitmapPage(t *testing.T, dev *mdtest.Device, b *PeerBitmap, i int64, word uint64) {
	t.Helper()
	page := make([]byte, MDBlockSize)
	binary.LittleEndian.PutUint32(page[4:], uint32(i))
	for w := range bitmapPageWords {
		binary.LittleEndian.PutUint64(page[bitmapPageHeaderSize+8*w:], word)
	}
	binary.LittleEndian.PutUint32(page[0:], b.pageCRC(page))
	if _, err := dev.WriteAt(page, b.pageOffset(i)); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestOlderBitmapBitsPastTheVolumeAreIgnored: an older build sized the
// bitmaps by the usable size and, after a SetAll, left bits set past the
// volume's end on disk. Opened with the volume's size, those bits count
// for nothing: no run reaches them, Bytes is the volume, and the pages
// wholly past the volume are not even read (a bad checksum there is not
// reported, nor rewritten).
func TestOlderBitmapBitsPastTheVolumeAreIgnored(t *testing.T) {
	older := testOptions(Internal) // VolumeSize 0: the bitmaps cover the usable size
	dev, md := newTestMD(t, older)
	b, _ := md.Bitmap(nodeBeta)
	b.SetAll()
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	// The volume ends inside page 1 and inside a block; page 1 is
	// rewritten with every bit set (even past the page's own blocks), and
	// page 5 is garbage.
	volume := int64(BitsPerPage*4096 + 3*mib + 100)
	writeRawBitmapPage(t, dev, b, 1, ^uint64(0))
	flipByte(t, dev, b.pageOffset(5)+100)
	garbage := dev.Snapshot(b.pageOffset(5), MDBlockSize)

	opts := older
	opts.VolumeSize = volume
	md2 := reopen(t, dev, opts)
	if r := md2.Report(); len(r.CorruptBitmapPages) != 0 {
		t.Fatalf("a page past the volume was loaded: %+v", r.CorruptBitmapPages)
	}
	b2, _ := md2.Bitmap(nodeBeta)
	blocks := (volume + 4095) / 4096
	if b2.Blocks() != blocks || b2.Count() != blocks || b2.Bytes() != volume {
		t.Fatalf("%d of %d blocks set, %d bytes; want all %d blocks, %d bytes", b2.Count(), b2.Blocks(), b2.Bytes(), blocks, volume)
	}
	if got := checkRunsInsideVolume(t, b2, volume); got != blocks {
		t.Fatalf("runs cover %d blocks, want %d", got, blocks)
	}
	if _, _, ok := b2.NextRun(blocks, 1<<30); ok {
		t.Fatal("NextRun found a block past the volume")
	}
	// A resync of the volume leaves nothing to do, and stays so.
	b2.ClearBits(0, volume)
	if err := md2.Close(); err != nil {
		t.Fatal(err)
	}
	b3, _ := reopen(t, dev.Crash(), opts).Bitmap(nodeBeta)
	if b3.Count() != 0 {
		t.Fatalf("%d blocks set after a full resync and a reopen", b3.Count())
	}
	if !bytes.Equal(garbage, dev.Snapshot(b.pageOffset(5), MDBlockSize)) {
		t.Fatal("a page past the volume was rewritten")
	}
}

// TestApplyActivityLogStopsAtTheVolumeEnd: after a crash as primary, the
// extents of the activity log are marked only as far as the volume goes,
// and a lost activity log marks the volume, not the device.
func TestApplyActivityLogStopsAtTheVolumeEnd(t *testing.T) {
	opts := testOptions(Internal)
	opts.VolumeSize = 128*mib + mib // extent 32 (128..132 MiB) straddles the end
	dev, md := newTestMD(t, opts)
	if err := md.SetPrimary(true); err != nil {
		t.Fatal(err)
	}
	al := md.ActivityLog()
	for _, off := range []int64{3 * ExtentSize, 32 * ExtentSize, 100 * ExtentSize} {
		if err := al.Admit(context.Background(), off, 4096); err != nil {
			t.Fatal(err)
		}
	}
	crashed := dev.Crash()

	md2 := reopen(t, crashed, opts)
	marked, err := md2.ApplyActivityLog()
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(ExtentSize) + mib; marked != want {
		t.Fatalf("marked %d bytes, want extent 3 and the volume's 1 MiB of extent 32 (%d)", marked, want)
	}
	b, _ := md2.Bitmap(nodeBeta)
	if b.Bytes() != marked {
		t.Fatalf("bitmap holds %d bytes, marked %d", b.Bytes(), marked)
	}
	checkRunsInsideVolume(t, b, opts.VolumeSize)

	md3 := reopen(t, crashed.Crash(), opts)
	md3.report.ALIncomplete = true // as if the ring were unreadable
	if marked, err := md3.ApplyActivityLog(); err != nil || marked != opts.VolumeSize {
		t.Fatalf("lost activity log: marked %d bytes (%v), want the volume's %d", marked, err, opts.VolumeSize)
	}
	b3, _ := md3.Bitmap(nodeBeta)
	if b3.Bytes() != opts.VolumeSize || checkRunsInsideVolume(t, b3, opts.VolumeSize) != b3.Blocks() {
		t.Fatalf("lost activity log: bitmap holds %d bytes", b3.Bytes())
	}
}

// newVolumeBitmap is a bitmap of a volume of volume bytes on a data device
// of usable bytes, with no device behind it (SetBits and friends touch
// only memory).
func newVolumeBitmap(volume, usable int64) *PeerBitmap {
	md := &MD{geo: geometry{dataSize: usable, bitmapPages: bitmapPagesFor(usable)}, volumeSize: volume}
	return newPeerBitmap(md, 0, nodeBeta)
}

// runOps applies the operations encoded in ops (5 bytes each: kind, then
// offset and length as fractions of reach) to b, checking after each
// that no run reaches past the volume and that the counts stay inside it.
func runOps(t testing.TB, b *PeerBitmap, volume, reach int64, ops []byte) {
	t.Helper()
	for ; len(ops) >= 5; ops = ops[5:] {
		off := int64(binary.LittleEndian.Uint16(ops[1:])) * reach >> 16
		length := (int64(binary.LittleEndian.Uint16(ops[3:])) + 1) * reach >> 16
		switch ops[0] % 4 {
		case 0, 1:
			b.SetBits(off, length)
		case 2:
			b.ClearBits(off, length)
		case 3:
			b.SetAll()
		}
		if b.Count() > b.Blocks() || b.Bytes() > volume || b.Test(b.Blocks()) {
			t.Fatalf("%d blocks and %d bytes set of a %d-byte volume (%d blocks)", b.Count(), b.Bytes(), volume, b.Blocks())
		}
		if got := checkRunsInsideVolume(t, b, volume); got != b.Count() {
			t.Fatalf("runs cover %d blocks, %d are set", got, b.Count())
		}
	}
}

// FuzzBitmapRunsStayInsideVolume: whatever the volume's size, the spare
// bytes past it and the sequence of set, clear and set-all operations
// (at offsets reaching past the device), no run ever starts or ends past
// the volume, and Count and Bytes never exceed it.
func FuzzBitmapRunsStayInsideVolume(f *testing.F) {
	f.Add(uint32(128*mib/4096), uint32(mib/4096), uint16(0), []byte{3, 0, 0, 0xff, 0xff})
	f.Add(uint32(BitsPerPage), uint32(1), uint16(100), []byte{0, 0xf0, 0xff, 0xff, 0xff, 2, 0, 0, 0x10, 0})
	f.Add(uint32(2*BitsPerPage+7), uint32(0), uint16(4095), []byte{3, 0, 0, 0, 0, 2, 0, 0x80, 0, 0x40})
	f.Fuzz(func(t *testing.T, volumeBlocks, spareBlocks uint32, tail uint16, ops []byte) {
		// Up to three pages and a bit, ending anywhere inside a block.
		volume := int64(volumeBlocks%(3*BitsPerPage+100))*4096 + int64(tail%4096)
		if volume == 0 {
			return
		}
		usable := floorBlock(volume+4095) + int64(spareBlocks%(2*BitsPerPage))*4096
		b := newVolumeBitmap(volume, usable)
		runOps(t, b, volume, usable+ExtentSize, ops)
	})
}

// TestBitmapRunsStayInsideVolumeRandom runs the fuzz property over random
// volumes and operations, so that go test covers more than the seeds.
func TestBitmapRunsStayInsideVolumeRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 50 {
		volume := 1 + r.Int64N(3*BitsPerPage*4096)
		usable := floorBlock(volume+4095) + r.Int64N(BitsPerPage)*4096
		ops := make([]byte, 5*20)
		for i := range ops {
			ops[i] = byte(r.Uint32())
		}
		runOps(t, newVolumeBitmap(volume, usable), volume, usable+ExtentSize, ops)
	}
}
