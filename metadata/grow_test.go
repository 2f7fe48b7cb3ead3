package metadata

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
)

// MD.Grow makes a volume's metadata cover a larger volume while it is in
// use: the bits set before stay set, the range gained is in sync, and the
// activity log keeps every hot extent. Where the layout cannot hold the
// new size the metadata moves (internal: to the end of the grown device;
// external: its bitmaps laid out again in the file), and a crash at any
// point of the move leaves the old metadata or the new one, whole: never
// a superblock pointing at pages or a log that were not written. These
// tests pin that, and that a refused growth changes no byte.

// growCase is a volume with its metadata and a growth to do.
type growCase struct {
	name      string
	placement Placement
	peers     []uint32
	// devBefore and devAfter are the backing device's sizes (internal);
	// the device grows to devAfter before Grow.
	devBefore, devAfter int64
	// volBefore and volAfter are the volume's sizes.
	volBefore, volAfter int64
	// checksums: the metadata has a checksum area (format 2).
	checksums bool
	// alExtents is the number of hot extents (0: the default).
	alExtents int
}

// growCases: growth within the layout, a move of internal metadata to
// the end of a grown device, and external metadata with one and with two
// peer slots.
func growCases(t testing.TB) []growCase {
	t.Helper()
	twoPeers := []uint32{nodeBeta, 3}
	bigDev := deviceFor(256*mib, 0, 0, DefaultALExtents, 2, false)
	smallDev := deviceFor(64*mib, 0, 0, DefaultALExtents, 2, false)
	return []growCase{
		{"internal, the device holds the new size already", Internal, twoPeers, bigDev, bigDev, 64 * mib, 256 * mib, false, 0},
		{"internal, the metadata moves to the end of the grown device", Internal, twoPeers, smallDev, bigDev + 64*mib, 64 * mib, 256 * mib, false, 0},
		{"internal, the volume ends inside a bitmap page and grows past three", Internal, []uint32{nodeBeta}, smallDev, 3 * bigDev, 64*mib + 4096, 600 * mib, false, 0},
		{"external, one peer", External, []uint32{nodeBeta}, 0, 0, 64 * mib, 256 * mib, false, 0},
		{"external, two peers", External, twoPeers, 0, 0, 64 * mib, 256 * mib, false, 0},
	}
}

// growChecksumCases are growth within the layout, a move of internal
// metadata and external metadata, with checksum areas.
func growChecksumCases(t testing.TB) []growCase {
	t.Helper()
	bigDev := deviceFor(256*mib, 0, 0, DefaultALExtents, 1, true)
	smallDev := deviceFor(64*mib, 0, 0, DefaultALExtents, 1, true)
	one := []uint32{nodeBeta}
	return []growCase{
		{"internal with checksums, the device holds the new size already", Internal, one, bigDev, bigDev, 64 * mib, 256 * mib, true, 0},
		{"internal with checksums, the metadata moves to the end of the grown device", Internal, one, smallDev, bigDev + 64*mib, 64 * mib, 256 * mib, true, 0},
		{"external with checksums, one peer", External, one, 0, 0, 64 * mib, 256 * mib, true, 0},
	}
}

// allGrowCases are growCases and growChecksumCases.
func allGrowCases(t testing.TB) []growCase { return append(growCases(t), growChecksumCases(t)...) }

// grownState is what a growCase's metadata holds before Grow: bits set
// for each peer (byte offsets) and extents in the activity log.
type grownState struct {
	bits    []int64
	extents []uint64
	// sums are the block checksums set and flushed (with checksums).
	sums map[int64]uint32
}

// setUp creates c's metadata, sets bits near the start, the middle and
// the end of the old volume (the last page full for the first peer),
// admits three extents (writes in flight) and makes it durable; it
// returns the device, the metadata and what it holds. The device is sized
// for the grown volume already (external: the file), as an operator grows
// it before a resize; internal devices grow to devAfter later.
func (c growCase) setUp(t testing.TB) (*mdtest.Device, *MD, grownState) {
	t.Helper()
	opts := MDOptions{Placement: c.placement, Volume: testVolume, NodeID: nodeAlpha, Peers: c.peers, VolumeSize: c.volBefore, Checksums: c.checksums, ALExtents: c.alExtents}
	var dev *mdtest.Device
	if c.placement == Internal {
		opts.DeviceSize = c.devBefore
		dev = mdtest.NewDevice(c.devBefore)
	} else {
		opts.DeviceSize = c.volBefore
		opts.DataDevice = mdtest.NewDevice(c.volAfter)
		n, err := ExternalSizeFor(c.volAfter, 0, len(c.peers), c.checksums)
		if err != nil {
			t.Fatal(err)
		}
		dev = mdtest.NewDevice(n)
	}
	md, err := CreateMD(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	st := grownState{bits: []int64{0, 5 * mib, c.volBefore / 2, c.volBefore - 4096}}
	for i, p := range c.peers {
		b, _ := md.Bitmap(p)
		for _, off := range st.bits {
			b.SetBits(off, 4096)
		}
		if i == 0 {
			last := (c.volBefore - 1) / (BitsPerPage * 4096) * (BitsPerPage * 4096)
			b.SetBits(last, c.volBefore-last) // the last page full
		}
	}
	if err := md.FlushBitmaps(); err != nil {
		t.Fatal(err)
	}
	if c.checksums {
		sums, _ := md.Checksums()
		last := blocksOf(c.volBefore) - 1
		st.sums = map[int64]uint32{0: 1, SumsPerPage - 1: 2, SumsPerPage: 3, last / 2: 4, last: 5}
		for b, s := range st.sums {
			if err := sums.Set(b, s); err != nil {
				t.Fatal(err)
			}
		}
		if err := sums.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	al := md.ActivityLog()
	st.extents = []uint64{0, 3, extentOf(c.volBefore - 1)}
	for _, e := range st.extents {
		admit(t, al, e)
	}
	return dev, md, st
}

// open opens the metadata a growCase left on dev at the volume size vol:
// internal metadata at the end of the grown device, or, where none is
// there, at the end of the device's old size.
func (c growCase) open(dev MDDevice, vol int64) (*MD, error) {
	opts := MDOptions{Placement: c.placement, Volume: testVolume, NodeID: nodeAlpha, VolumeSize: vol}
	if c.placement == External {
		opts.DeviceSize = c.volBefore
		return OpenMD(dev, opts)
	}
	opts.DeviceSize = c.devAfter
	md, err := OpenMD(dev, opts)
	if errors.Is(err, ErrNoMetadata) || errors.Is(err, ErrCorrupt) {
		opts.DeviceSize = c.devBefore
		md, err = OpenMD(dev, opts)
	}
	return md, err
}

// check fails unless md holds every bit and extent of st.
func (st grownState) check(t testing.TB, md *MD, peers []uint32) {
	t.Helper()
	for _, p := range peers {
		b, _ := md.Bitmap(p)
		for _, off := range st.bits {
			if !b.Test(off / 4096) {
				t.Fatalf("peer %d: the bit of byte %d was set and is not", p, off)
			}
		}
	}
	if rep := md.Report(); rep.ALIncomplete {
		t.Fatalf("the activity log lost its slots: %+v", rep)
	}
	if got := md.ActivityLog().ActiveExtents(); !isSubset(st.extents, got) {
		t.Fatalf("activity log holds %v, want at least %v", got, st.extents)
	}
	if st.sums != nil {
		wantSums(t, sumsOf(t, md), st.sums, nil)
	}
}

func isSubset(small, big []uint64) bool {
	for _, e := range small {
		if !slices.Contains(big, e) {
			return false
		}
	}
	return true
}

// TestGrowKeepsWhatTheMetadataHeldAndTheNewRangeIsInSync: after Grow the
// bits set before are set, the range gained holds no set bit, the
// activity log holds its extents and takes new ones (in the range gained
// too), and all of it is what the device holds after a crash: opened at
// the new size, at the same place Grow reported.
func TestGrowKeepsWhatTheMetadataHeldAndTheNewRangeIsInSync(t *testing.T) {
	for _, c := range allGrowCases(t) {
		t.Run(c.name, func(t *testing.T) {
			dev, md, st := c.setUp(t)
			dev.Grow(c.devAfter)
			first, _ := md.Bitmap(c.peers[0])
			setBefore := first.Count()
			rep, err := md.Grow(GrowOptions{VolumeSize: c.volAfter, DeviceSize: c.devAfter})
			if err != nil {
				t.Fatalf("Grow: %v", err)
			}
			wantMove := c.placement == External || c.devAfter != c.devBefore
			if rep.Moved != wantMove || rep.VolumeSize != c.volAfter || md.VolumeSize() != c.volAfter {
				t.Fatalf("report %+v, volume %d; want moved %v, volume %d", rep, md.VolumeSize(), wantMove, c.volAfter)
			}
			if c.placement == Internal && rep.DeviceSize != c.devAfter {
				t.Fatalf("report %+v: device size %d, want %d", rep, rep.DeviceSize, c.devAfter)
			}
			for _, p := range c.peers {
				b, _ := md.Bitmap(p)
				if b.Blocks() != blocksOf(c.volAfter) {
					t.Fatalf("peer %d covers %d blocks, want %d", p, b.Blocks(), blocksOf(c.volAfter))
				}
				if start, n, ok := b.NextRun(blocksOf(c.volBefore), 1<<20); ok {
					t.Fatalf("peer %d: blocks [%d,+%d) of the range gained are set", p, start, n)
				}
			}
			if first.Count() != setBefore {
				t.Fatalf("%d bits set after Grow, %d before", first.Count(), setBefore)
			}
			st.check(t, md, c.peers)
			if c.checksums {
				// The blocks gained have no sum; the store covers them.
				sums := sumsOf(t, md)
				gained := []int64{blocksOf(c.volBefore), blocksOf(c.volAfter) - 1}
				wantSums(t, sums, nil, gained)
				if err := sums.Set(gained[1], 6); err != nil {
					t.Fatal(err)
				}
				if err := sums.Flush(); err != nil {
					t.Fatal(err)
				}
				st.sums[gained[1]] = 6
			}
			// The grown range is usable: bits, and a cold extent.
			for _, p := range c.peers {
				b, _ := md.Bitmap(p)
				b.SetBits(c.volAfter-8192, 8192)
			}
			newExtent := extentOf(c.volAfter - 1)
			admit(t, md.ActivityLog(), newExtent)
			if err := md.FlushBitmaps(); err != nil {
				t.Fatal(err)
			}
			st.extents = append(st.extents, newExtent)
			st.bits = append(st.bits, c.volAfter-4096)

			again, err := c.open(dev.Crash(), c.volAfter)
			if err != nil {
				t.Fatalf("open after Grow and a crash: %v", err)
			}
			if sb := again.Superblock(); c.placement == Internal && sb.DeviceSize != rep.DeviceSize {
				t.Fatalf("opened metadata for a %d-byte device, Grow reported %d", sb.DeviceSize, rep.DeviceSize)
			}
			st.check(t, again, c.peers)
			if len(again.Report().CorruptBitmapPages) > 0 {
				t.Fatalf("corrupt pages after a clean Grow: %+v", again.Report().CorruptBitmapPages)
			}
			b, _ := again.Bitmap(c.peers[0])
			if b.Count() != setBefore+2 {
				t.Fatalf("reopened: %d bits set, want %d", b.Count(), setBefore+2)
			}
			if c.placement == Internal && wantMove {
				// The old copy is gone: nothing opens there.
				_, err := OpenMD(dev, MDOptions{Placement: Internal, DeviceSize: c.devBefore, Volume: testVolume, NodeID: nodeAlpha})
				if !errors.Is(err, ErrNoMetadata) {
					t.Fatalf("the old superblocks still open after the move: %v", err)
				}
			}
		})
	}
}

// TestGrowWritesTheRangeGainedClear: bits an older build left set past the
// volume's end (ignored while the volume ended there) are clear once the
// volume grows over them.
func TestGrowWritesTheRangeGainedClear(t *testing.T) {
	dev := mdtest.NewDevice(deviceFor(256*mib, 0, 0, DefaultALExtents, 1, false))
	opts := MDOptions{Placement: Internal, DeviceSize: dev.Size(), Volume: testVolume, NodeID: nodeAlpha, Peers: []uint32{nodeBeta}}
	md, err := CreateMD(dev, opts) // the whole usable size
	if err != nil {
		t.Fatal(err)
	}
	b, _ := md.Bitmap(nodeBeta)
	b.SetAll()
	if err := md.FlushBitmaps(); err != nil {
		t.Fatal(err)
	}
	opts.VolumeSize = 64*mib + 8192
	md = reopen(t, dev, opts)
	b, _ = md.Bitmap(nodeBeta)
	b.ClearBits(0, opts.VolumeSize)
	if _, err := md.Grow(GrowOptions{VolumeSize: 256 * mib}); err != nil {
		t.Fatal(err)
	}
	if b.Count() != 0 {
		t.Fatalf("%d bits set after growing a clear volume", b.Count())
	}
	opts.VolumeSize = 256 * mib
	b, _ = reopen(t, dev.Crash(), opts).Bitmap(nodeBeta)
	if b.Count() != 0 {
		start, n, _ := b.NextRun(0, 1<<20)
		t.Fatalf("reopened at the new size: %d bits set, first run [%d,+%d)", b.Count(), start, n)
	}
}

// TestGrowRefusesWhatItCannotDoAndChangesNothing: a smaller size, a
// device that does not hold the new size, one grown too little for its
// metadata to move clear of the old copy, and an external metadata file
// too small are refused, each saying how much is needed, and no byte of
// the device changes.
func TestGrowRefusesWhatItCannotDoAndChangesNothing(t *testing.T) {
	small := deviceFor(64*mib, 0, 0, DefaultALExtents, 1, false)
	cases := []struct {
		name     string
		c        growCase
		vol      int64
		want     error
		wantRoom NoRoomError
	}{
		{"a smaller size", growCase{placement: Internal, peers: []uint32{nodeBeta}, devBefore: small, devAfter: small, volBefore: 64 * mib}, 32 * mib, ErrShrink, NoRoomError{}},
		{"a device that was not grown", growCase{placement: Internal, peers: []uint32{nodeBeta}, devBefore: small, devAfter: small, volBefore: 64 * mib}, 256 * mib, ErrVolumeTooLarge,
			NoRoomError{Volume: 256 * mib, Have: small, Need: deviceFor(256*mib, 0, 0, DefaultALExtents, 1, false)}},
		{"a device grown by less than its metadata", growCase{placement: Internal, peers: []uint32{nodeBeta}, devBefore: small, devAfter: small + 16*1024, volBefore: 64 * mib}, 64*mib + 8192, ErrVolumeTooLarge,
			NoRoomError{Move: true, Volume: 64*mib + 8192, Have: small + 16*1024, Need: deviceFor(64*mib+8192, small, 0, DefaultALExtents, 1, false)}},
		{"a volume no device holds with its metadata (the format's largest)", growCase{placement: Internal, peers: []uint32{nodeBeta}, devBefore: small, devAfter: small, volBefore: 64 * mib}, maxDataSize, ErrVolumeTooLarge,
			NoRoomError{Volume: maxDataSize, Have: small, Limit: internalLimit(t, 1)}},
		{"an external metadata file for the old size", growCase{placement: External, peers: []uint32{nodeBeta, 3}, volBefore: 64 * mib, volAfter: 64 * mib}, 256 * mib, ErrVolumeTooLarge, NoRoomError{MetadataFile: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev, md, st := tc.c.setUp(t)
			dev.Grow(tc.c.devAfter)
			before := dev.Snapshot(0, int(dev.Size()))
			_, err := md.Grow(GrowOptions{VolumeSize: tc.vol, DeviceSize: tc.c.devAfter})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Grow to %d: %v, want %v", tc.vol, err, tc.want)
			}
			var room *NoRoomError
			if errors.As(err, &room) {
				if tc.wantRoom.MetadataFile {
					tc.wantRoom.Volume, tc.wantRoom.Have = tc.vol, dev.Size()
					tc.wantRoom.Need, _ = ExternalSize(tc.vol, 0, 2)
				}
				got := *room
				got.Holds = 0 // checked below, by growing to it
				if got != tc.wantRoom {
					t.Fatalf("refusal %+v, want %+v", *room, tc.wantRoom)
				}
				if room.Limit == 0 && room.Need <= room.Have {
					t.Fatalf("refusal needs %d of a %d-byte device", room.Need, room.Have)
				}
				if room.Holds < tc.c.volBefore || room.Holds >= tc.vol {
					t.Fatalf("refusal says the device holds a volume of %d bytes: not between the volume's %d and the %d refused", room.Holds, tc.c.volBefore, tc.vol)
				}
				defer checkHolds(t, tc.c, room.Holds)
			}
			t.Logf("refused: %v", err)
			if !bytes.Equal(dev.Snapshot(0, int(dev.Size())), before) {
				t.Fatal("a refused Grow changed the device")
			}
			if md.VolumeSize() != tc.c.volBefore {
				t.Fatalf("volume size %d after a refusal, want %d", md.VolumeSize(), tc.c.volBefore)
			}
			st.check(t, md, tc.c.peers)
		})
	}
	// The room asked for is enough.
	c := cases[2].c
	dev, md, _ := c.setUp(t)
	dev.Grow(cases[2].wantRoom.Need)
	if _, err := md.Grow(GrowOptions{VolumeSize: cases[2].vol, DeviceSize: cases[2].wantRoom.Need}); err != nil {
		t.Fatalf("Grow on a device of the size the refusal named: %v", err)
	}
}

// internalLimit is the largest volume internal metadata for peers peers
// holds: what a device of the format's largest size leaves.
func internalLimit(t *testing.T, peers int) int64 {
	g, err := computeGeometry(Internal, maxDataSize, DefaultALExtents, peers, false)
	if err != nil {
		t.Fatal(err)
	}
	return g.dataSize
}

// checkHolds checks that the volume of c holds is the largest c's device
// takes: GrowLimit says so, a Grow one block larger is refused, and a
// Grow to it succeeds.
func checkHolds(t *testing.T, c growCase, holds int64) {
	t.Helper()
	dev, md, _ := c.setUp(t)
	dev.Grow(c.devAfter)
	if got, err := md.GrowLimit(c.devAfter); err != nil || got != holds {
		t.Fatalf("GrowLimit = %d, %v; the refusal said %d", got, err, holds)
	}
	if _, err := md.Grow(GrowOptions{VolumeSize: holds + MDBlockSize, DeviceSize: c.devAfter}); !errors.Is(err, ErrVolumeTooLarge) {
		t.Fatalf("Grow one block past the %d bytes the refusal said the device holds: %v, want a refusal", holds, err)
	}
	if _, err := md.Grow(GrowOptions{VolumeSize: holds, DeviceSize: c.devAfter}); err != nil {
		t.Fatalf("Grow to the %d bytes the refusal said the device holds: %v", holds, err)
	}
}

// powerCut fails every device operation from the n-th on, as a power
// loss in the middle of Grow would stop them.
type powerCut struct {
	mu  sync.Mutex
	n   int
	ops int
}

func (p *powerCut) injector(op mdtest.Op) mdtest.Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	if op.Kind == mdtest.OpRead {
		return mdtest.Fault{}
	}
	p.ops++
	if p.ops >= p.n {
		return mdtest.Fault{Err: fmt.Errorf("power cut at operation %d: %w", p.ops, mdtest.ErrInjected)}
	}
	return mdtest.Fault{}
}

// TestGrowSurvivesAPowerLossAtEveryStep: the power fails at every write
// and sync Grow issues, in turn; what the device keeps (the synced bytes
// alone, or every write issued, or the last one torn) opens, at the old
// layout or the new one, with every bit and extent it held, and never as
// corrupt. Only external metadata with two peer slots may lose pages of
// its second slot in the middle of a move, which then read as all set
// (resynced, never taken as in sync).
func TestGrowSurvivesAPowerLossAtEveryStep(t *testing.T) {
	for _, c := range allGrowCases(t) {
		t.Run(c.name, func(t *testing.T) {
			mayCorrupt := c.placement == External && len(c.peers) > 1
			sawOld, sawNew := false, false
			for n := 1; ; n++ {
				dev, md, st := c.setUp(t)
				dev.Grow(c.devAfter)
				cut := &powerCut{n: n}
				dev.SetInjector(cut.injector)
				_, err := md.Grow(GrowOptions{VolumeSize: c.volAfter, DeviceSize: c.devAfter})
				dev.SetInjector(nil)
				finished := err == nil
				if !finished && !errors.Is(err, mdtest.ErrInjected) {
					t.Fatalf("cut at %d: Grow: %v", n, err)
				}
				keeps := map[string]func(int, int64, int) int{
					"synced only": nil,
					"every write": func(int, int64, int) int { return -1 },
					"last torn": func(i int, _ int64, length int) int {
						return 1 // every unsynced write kept in part: its first sector
					},
				}
				for what, keep := range keeps {
					crashed := dev.CrashKeeping(keep)
					again, err := c.open(crashed, c.volBefore)
					if err != nil {
						t.Fatalf("cut at operation %d, %s kept: the metadata does not open: %v", n, what, err)
					}
					if c.placement == Internal {
						switch again.Superblock().DeviceSize {
						case c.devBefore:
							sawOld = true
						case c.devAfter:
							sawNew = true
						}
					}
					if !mayCorrupt && len(again.Report().CorruptBitmapPages) > 0 {
						t.Fatalf("cut at operation %d, %s kept: corrupt pages %+v", n, what, again.Report().CorruptBitmapPages)
					}
					st.check(t, again, c.peers)
					if finished {
						// The node records the new size once Grow returned.
						grown, err := c.open(crashed, c.volAfter)
						if err != nil {
							t.Fatalf("after Grow, %s kept: does not open at the new size: %v", what, err)
						}
						st.check(t, grown, c.peers)
					}
				}
				if finished {
					t.Logf("Grow issued %d writes and syncs", n-1)
					break
				}
				if n > 10000 {
					t.Fatal("Grow never finished")
				}
			}
			if c.placement == Internal && c.devAfter != c.devBefore && (!sawOld || !sawNew) {
				t.Fatalf("a cut left the old metadata: %v, the new: %v; want both seen", sawOld, sawNew)
			}
		})
	}
}

// TestGrowWhileInUse: writers admit extents, set bits and flush while the
// metadata moves; every bit they set is set after a crash, and the log
// holds what they left in flight. (Run with -race.)
func TestGrowWhileInUse(t *testing.T) {
	c := growCases(t)[1] // the move of internal metadata
	dev, md, st := c.setUp(t)
	dev.Grow(c.devAfter)
	al := md.ActivityLog()
	b, _ := md.Bitmap(c.peers[0])
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var marked []int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				off := (int64(w)*7919 + i*104729) % (c.volBefore / 4096) * 4096
				if err := al.Admit(t.Context(), off, 4096); err != nil {
					t.Error(err)
					return
				}
				b.SetBits(off, 4096)
				mu.Lock()
				marked = append(marked, off)
				mu.Unlock()
				if i%8 == 0 {
					if err := md.FlushBitmaps(); err != nil {
						t.Error(err)
					}
				}
				al.Done(off, 4096)
			}
		}()
	}
	for n := 0; n < 50; {
		mu.Lock()
		n = len(marked)
		mu.Unlock()
		runtime.Gosched()
	}
	if _, err := md.Grow(GrowOptions{VolumeSize: c.volAfter, DeviceSize: c.devAfter}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	during := len(marked)
	mu.Unlock()
	for n := during; n < during+50; {
		mu.Lock()
		n = len(marked)
		mu.Unlock()
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if err := md.FlushBitmaps(); err != nil {
		t.Fatal(err)
	}
	again, err := c.open(dev.Crash(), c.volAfter)
	if err != nil {
		t.Fatal(err)
	}
	st.check(t, again, c.peers)
	bb, _ := again.Bitmap(c.peers[0])
	for _, off := range marked {
		if !bb.Test(off / 4096) {
			t.Fatalf("the bit of byte %d, set while the metadata moved, is lost", off)
		}
	}
	t.Logf("%d bits set by writers while the metadata moved", len(marked))
}
