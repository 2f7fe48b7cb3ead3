package metadata

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
)

// MD.EnableChecksums turns checksums on for a volume whose metadata was
// made without them (format 1): the metadata gains a checksum area
// (format 2), keeps every bit of its bitmaps and every extent of its
// activity log, changes no byte of the volume's data, and a crash at any
// point leaves the old metadata or the new one, whole. Where the device
// or file has no room it refuses, says how much it needs, and changes
// nothing.

// convertCase is a format-1 volume to convert.
type convertCase struct {
	name      string
	placement Placement
	peers     []uint32
	// devBefore is the backing device's size when the metadata was made
	// (internal); the operator grows it to devAfter before the conversion.
	devBefore, devAfter int64
	volume              int64
	// moves: the metadata is written whole at a new place (otherwise
	// only a superblock switches).
	moves bool
}

func convertCases(t testing.TB) []convertCase {
	t.Helper()
	one, two := []uint32{nodeBeta}, []uint32{nodeBeta, 3}
	vol := int64(64 * mib)
	roomy := deviceFor(vol, 0, 0, DefaultALExtents, 1, true)
	exact := deviceFor(vol, 0, 0, DefaultALExtents, 1, false)
	grown := deviceFor(vol, floorBlock(exact), 0, DefaultALExtents, 1, true)
	return []convertCase{
		{"internal, the device holds the area past the volume already", Internal, one, roomy, roomy, vol, false},
		{"internal, the device grew and the metadata moves to its end", Internal, one, exact, grown, vol, true},
		{"external, one peer", External, one, 0, 0, vol, true},
		{"external, two peers", External, two, 0, 0, vol, true},
	}
}

// dataMarks are bytes of the volume's data the conversion must leave
// alone: its first and last blocks, and one in the middle.
func (c convertCase) dataMarks() map[int64][]byte {
	m := map[int64][]byte{}
	for i, off := range []int64{0, c.volume / 2, c.volume - 4096} {
		m[off] = bytes.Repeat([]byte{byte(0xA0 + i)}, 4096)
	}
	return m
}

// setUp makes c's format-1 metadata with bits set, extents in the
// activity log and data written, and grows the device to devAfter. It
// returns the metadata device, the data device (the same for internal
// metadata) and what the metadata holds.
func (c convertCase) setUp(t testing.TB) (dev, data *mdtest.Device, md *MD, st grownState) {
	t.Helper()
	opts := MDOptions{Placement: c.placement, Volume: testVolume, NodeID: nodeAlpha, Peers: c.peers, VolumeSize: c.volume}
	if c.placement == Internal {
		opts.DeviceSize = c.devBefore
		dev = mdtest.NewDevice(c.devBefore)
		data = dev
	} else {
		opts.DeviceSize = c.volume
		n, err := ExternalSizeFor(c.volume, 0, len(c.peers), true)
		if err != nil {
			t.Fatal(err)
		}
		dev, data = mdtest.NewDevice(n), mdtest.NewDevice(c.volume)
	}
	md, err := CreateMD(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := md.Checksums(); ok || md.Superblock().Version != 1 {
		t.Fatalf("the metadata to convert is format %d with checksums %v; want format 1", md.Superblock().Version, ok)
	}
	for off, b := range c.dataMarks() {
		if _, err := data.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := data.Sync(); err != nil {
		t.Fatal(err)
	}
	st.bits = []int64{0, 5 * mib, c.volume / 2, c.volume - 4096}
	for _, p := range c.peers {
		b, _ := md.Bitmap(p)
		for _, off := range st.bits {
			b.SetBits(off, 4096)
		}
	}
	if err := md.FlushBitmaps(); err != nil {
		t.Fatal(err)
	}
	st.extents = []uint64{0, 3, extentOf(c.volume - 1)}
	for _, e := range st.extents {
		admit(t, md.ActivityLog(), e)
	}
	dev.Grow(c.devAfter)
	return dev, data, md, st
}

// open opens what c's conversion left on dev: internal metadata at the
// end of the grown device, or, where none is there, at the end of the
// device's old size.
func (c convertCase) open(dev MDDevice, data Syncer) (*MD, error) {
	opts := MDOptions{Placement: c.placement, Volume: testVolume, NodeID: nodeAlpha, VolumeSize: c.volume, DataDevice: data}
	if c.placement == External {
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

// checkData fails unless data holds c's marks.
func (c convertCase) checkData(t testing.TB, data *mdtest.Device) {
	t.Helper()
	for off, want := range c.dataMarks() {
		if got := data.Snapshot(off, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("the data at byte %d changed", off)
		}
	}
}

// checkConverted fails unless md is format 2 with a checksum area that
// holds no known sum, and stores one that survives a reopen.
func (c convertCase) checkConverted(t testing.TB, md *MD, dev *mdtest.Device, data *mdtest.Device) {
	t.Helper()
	sb := md.Superblock()
	if sb.Version != FormatChecksums || !sb.HasChecksums() {
		t.Fatalf("superblock format %d; want %d", sb.Version, FormatChecksums)
	}
	sums := sumsOf(t, md)
	last := blocksOf(c.volume) - 1
	wantSums(t, sums, nil, []int64{0, 1, SumsPerPage, last / 2, last})
	if err := sums.Set(last, 0xC0FFEE); err != nil {
		t.Fatal(err)
	}
	if err := sums.Flush(); err != nil {
		t.Fatal(err)
	}
	again, err := c.open(dev.Crash(), data)
	if err != nil {
		t.Fatalf("the converted metadata does not open after a crash: %v", err)
	}
	wantSums(t, sumsOf(t, again), map[int64]uint32{last: 0xC0FFEE}, []int64{0, last / 2})
}

// TestEnableChecksumsKeepsWhatTheMetadataHeld: after EnableChecksums the
// metadata is format 2 with an area holding no known sum, every bit and
// extent it held is there (after a crash too, at the place the report
// gives), the data is untouched, the bitmaps and log keep working, and a
// second call does nothing.
func TestEnableChecksumsKeepsWhatTheMetadataHeld(t *testing.T) {
	for _, c := range convertCases(t) {
		t.Run(c.name, func(t *testing.T) {
			dev, data, md, st := c.setUp(t)
			rep, err := md.EnableChecksums(EnableChecksumsOptions{DeviceSize: c.devAfter, DataDevice: data})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Moved != c.moves || rep.Already || rep.AreaBytes <= 0 {
				t.Fatalf("report %+v; want moved %v", rep, c.moves)
			}
			if c.placement == Internal && rep.DeviceSize != md.Superblock().DeviceSize {
				t.Fatalf("report says device size %d, the superblock %d", rep.DeviceSize, md.Superblock().DeviceSize)
			}
			st.check(t, md, c.peers)
			c.checkData(t, data)
			// The log and bitmaps work on in the new layout.
			admit(t, md.ActivityLog(), 7)
			b, _ := md.Bitmap(c.peers[0])
			b.SetBits(9*mib, 4096)
			if err := md.FlushBitmaps(); err != nil {
				t.Fatal(err)
			}
			st.extents = append(st.extents, 7)
			st.bits = append(st.bits, 9*mib)
			again, err := c.open(dev.Crash(), data)
			if err != nil {
				t.Fatal(err)
			}
			st.check(t, again, c.peers[:1])
			c.checkConverted(t, md, dev, data)
			if rep, err := md.EnableChecksums(EnableChecksumsOptions{DeviceSize: c.devAfter, DataDevice: data}); err != nil || !rep.Already {
				t.Fatalf("a second EnableChecksums: %+v, %v; want already", rep, err)
			}
		})
	}
}

// TestEnableChecksumsSurvivesAPowerLossAtEveryStep: the power fails at
// every write and sync EnableChecksums issues, in turn; what the device
// keeps (the synced bytes alone, every write issued, or the last ones
// torn, or a superblock alone) opens, as format 1 or format 2, with every bit and extent it
// held and its data untouched, never as corrupt (but for the pages of
// external bitmaps the move overwrote, which read as all set: resynced,
// never taken as in sync). Both outcomes are seen.
func TestEnableChecksumsSurvivesAPowerLossAtEveryStep(t *testing.T) {
	for _, c := range convertCases(t) {
		t.Run(c.name, func(t *testing.T) {
			mayCorrupt := c.placement == External && len(c.peers) > 1
			sawOld, sawNew := false, false
			for n := 1; ; n++ {
				dev, data, md, st := c.setUp(t)
				cut := &powerCut{n: n}
				dev.SetInjector(cut.injector)
				_, err := md.EnableChecksums(EnableChecksumsOptions{DeviceSize: c.devAfter, DataDevice: data})
				dev.SetInjector(nil)
				finished := err == nil
				if !finished && !errors.Is(err, mdtest.ErrInjected) {
					t.Fatalf("cut at %d: EnableChecksums: %v", n, err)
				}
				keeps := map[string]func(int, int64, int) int{
					"synced only": nil,
					"every write": func(int, int64, int) int { return -1 },
					"last torn":   func(int, int64, int) int { return 1 },
					// The disk reordered the unsynced writes: a
					// superblock reached it, nothing else did.
					"superblocks only": func(_ int, off int64, _ int) int {
						for _, size := range []int64{c.devBefore, c.devAfter} {
							if offs := superblockOffsets(c.placement, size); slices.Contains(offs[:], off) {
								return -1
							}
						}
						return 0
					},
				}
				for what, keep := range keeps {
					crashed := dev.CrashKeeping(keep)
					again, err := c.open(crashed, data)
					if err != nil {
						t.Fatalf("cut at operation %d, %s kept: the metadata does not open: %v", n, what, err)
					}
					sb := again.Superblock()
					if sb.HasChecksums() {
						sawNew = true
						wantSums(t, sumsOf(t, again), nil, []int64{0, blocksOf(c.volume) - 1})
					} else {
						sawOld = true
						if _, ok := again.Checksums(); ok {
							t.Fatal("format-1 metadata opened with checksums")
						}
					}
					if finished && !sb.HasChecksums() {
						t.Fatalf("EnableChecksums returned, %s kept: the metadata opens as format %d", what, sb.Version)
					}
					if !mayCorrupt && len(again.Report().CorruptBitmapPages) > 0 {
						t.Fatalf("cut at operation %d, %s kept: corrupt pages %+v", n, what, again.Report().CorruptBitmapPages)
					}
					st.check(t, again, c.peers)
				}
				c.checkData(t, data)
				if finished {
					t.Logf("EnableChecksums issued %d writes and syncs", n-1)
					break
				}
				if n > 10000 {
					t.Fatal("EnableChecksums never finished")
				}
			}
			if !sawOld || !sawNew {
				t.Fatalf("a cut left the old metadata: %v, the new: %v; want both seen", sawOld, sawNew)
			}
		})
	}
}

// TestEnableChecksumsWithoutRoomChangesNothing: internal metadata whose
// device holds the volume and its format-1 metadata only (not grown, or
// grown by too little for the metadata to move clear of its old copy),
// and an external file of the format-1 size, are refused with
// ErrNoRoomForChecksums saying how many bytes the device or file needs;
// no byte of the device or file changes, the metadata stays format 1
// and works on, and once the device grows by what the error said the
// conversion succeeds.
func TestEnableChecksumsWithoutRoomChangesNothing(t *testing.T) {
	vol := int64(64 * mib)
	exact := deviceFor(vol, 0, 0, DefaultALExtents, 1, false)
	for _, c := range []struct {
		convertCase
		fileSize int64 // external: the metadata file's size
	}{
		{convertCase{"internal, the device did not grow", Internal, []uint32{nodeBeta}, exact, exact, vol, false}, 0},
		{convertCase{"internal, the device grew by too little", Internal, []uint32{nodeBeta}, exact, exact + 8*4096, vol, false}, 0},
		{convertCase{"external, the file has the format-1 size", External, []uint32{nodeBeta}, 0, 0, vol, false}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev, data, md, st := c.setUp(t)
			if c.placement == External {
				n, err := ExternalSize(c.volume, 0, len(c.peers))
				if err != nil {
					t.Fatal(err)
				}
				dev = shrunk(t, dev, n)
				if md, err = c.open(dev, data); err != nil {
					t.Fatal(err)
				}
			}
			size := dev.Size()
			before := dev.Snapshot(0, int(size))
			opts := EnableChecksumsOptions{DeviceSize: c.devAfter, DataDevice: data}
			check := md.CheckEnableChecksums(opts)
			_, err := md.EnableChecksums(opts)
			if !errors.Is(err, ErrNoRoomForChecksums) || !errors.Is(check, ErrNoRoomForChecksums) {
				t.Fatalf("EnableChecksums: %v (check: %v); want ErrNoRoomForChecksums", err, check)
			}
			var need int64
			if _, serr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "truncate -s ")+len("truncate -s "):], "%d", &need); serr != nil || need <= size {
				t.Fatalf("the refusal does not say the size to grow to: %v", err)
			}
			if !bytes.Equal(dev.Snapshot(0, int(size)), before) {
				t.Fatal("a refused conversion changed bytes of the device")
			}
			if _, ok := md.Checksums(); ok || md.Superblock().Version != 1 {
				t.Fatal("a refused conversion left the metadata with checksums")
			}
			st.check(t, md, c.peers)
			admit(t, md.ActivityLog(), 9)

			// Grown by what the refusal said, it converts.
			dev.Grow(need)
			if c.placement == Internal {
				opts.DeviceSize = need
			}
			rep, err := md.EnableChecksums(opts)
			if err != nil {
				t.Fatalf("grown to %d bytes as the refusal said: %v", need, err)
			}
			if _, ok := md.Checksums(); !ok {
				t.Fatalf("converted (%+v), but no checksums", rep)
			}
			st.check(t, md, c.peers)
			c.checkData(t, data)
		})
	}
}

// shrunk is a device of size bytes holding the first size bytes of d.
func shrunk(t testing.TB, d *mdtest.Device, size int64) *mdtest.Device {
	t.Helper()
	out := mdtest.NewDevice(size)
	if _, err := out.WriteAt(d.Snapshot(0, int(size)), 0); err != nil {
		t.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}
