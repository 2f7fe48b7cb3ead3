package metadata

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
	"github.com/replvol/replvol/replication"
)

const (
	testVolumeSize = 1 << 30
	nodeAlpha      = 1
	nodeBeta       = 2
)

var testVolume = VolumeUUID{0: 0x76, 15: 0x01}

func testOptions(p Placement) MDOptions {
	return MDOptions{Placement: p, DeviceSize: testVolumeSize, Volume: testVolume, NodeID: nodeAlpha, Peers: []uint32{nodeBeta}}
}

// newTestMD creates metadata on a fresh in-memory device: for internal
// placement the device is the whole backing disk, for external the
// metadata file alone.
func newTestMD(t testing.TB, opts MDOptions) (*mdtest.Device, *MD) {
	t.Helper()
	size := opts.DeviceSize
	if opts.Placement == External {
		g, err := computeGeometry(External, opts.DeviceSize, max(opts.ALExtents, DefaultALExtents), len(opts.Peers), opts.Checksums)
		if err != nil {
			t.Fatal(err)
		}
		size = g.mdSize
	}
	dev := mdtest.NewDevice(size)
	md, err := CreateMD(dev, opts)
	if err != nil {
		t.Fatalf("CreateMD: %v", err)
	}
	return dev, md
}

func reopen(t testing.TB, dev *mdtest.Device, opts MDOptions) *MD {
	t.Helper()
	md, err := OpenMD(dev, opts)
	if err != nil {
		t.Fatalf("OpenMD: %v", err)
	}
	return md
}

func TestMetadataRoundTrip(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := testOptions(p)
			dev, md := newTestMD(t, opts)
			switch {
			case p == Internal && (md.UsableSize() >= testVolumeSize || md.UsableSize() < testVolumeSize-(1<<20)):
				t.Fatalf("internal usable size %d of %d: want the device less about 32 KiB/GiB of bitmap", md.UsableSize(), testVolumeSize)
			case p == External && md.UsableSize() != testVolumeSize:
				t.Fatalf("external usable size %d, want %d", md.UsableSize(), testVolumeSize)
			}
			t.Logf("%v: usable %d of %d bytes, metadata %d bytes", p, md.UsableSize(), int64(testVolumeSize), md.Superblock().MDSize)

			cur, bm := replication.NewGeneration(), replication.NewGeneration()
			err := md.UpdateSuperblock(func(sb *Superblock) {
				sb.Flags |= FlagConsistent | FlagUpToDate
				sb.Current = cur
				sb.History[0] = bm
				sb.Peers[0].Bitmap = bm
				sb.NodeID = 99 // geometry and identity are not editable
			})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := md.Bitmap(nodeBeta)
			b.SetBits(0, 4096)
			b.SetBits(200<<20, 1<<20)
			b.SetBits(md.UsableSize()-1, 1)
			if err := md.Close(); err != nil {
				t.Fatal(err)
			}

			md2 := reopen(t, dev.Crash(), opts)
			sb := md2.Superblock()
			if sb.Current != cur || sb.Peers[0].Bitmap != bm || sb.History[0] != bm || sb.NodeID != nodeAlpha ||
				sb.Flags != FlagConsistent|FlagUpToDate || sb.Seq != 2 {
				t.Fatalf("superblock after reopen: %+v", sb)
			}
			b2, _ := md2.Bitmap(nodeBeta)
			if got, want := b2.Count(), b.Count(); got != want || want != 1+256+1 {
				t.Fatalf("bitmap after reopen: %d bits set, want %d (258)", got, want)
			}
			if !b2.Test(0) || !b2.Test(200<<20/4096) || !b2.Test(b2.Blocks()-1) || b2.Test(1) {
				t.Fatal("bitmap bits moved")
			}
			u := md2.UUIDs(nodeBeta)
			if u.Current != cur || u.Bitmap != bm || u.NodeID != nodeAlpha || u.CrashedPrimary {
				t.Fatalf("UUIDs: %+v", u)
			}
			if r := md2.Report(); len(r.CorruptBitmapPages) != 0 || r.ALIncomplete || r.OtherSlot != "" {
				t.Fatalf("clean reopen reports trouble: %+v", r)
			}
		})
	}
}

// TestSuperblockTornWriteKeepsPreviousCopy: a superblock write that is torn
// (power lost after its first sector) leaves the previous copy in force.
func TestSuperblockTornWriteKeepsPreviousCopy(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := testOptions(p)
			dev, md := newTestMD(t, opts)
			good := replication.NewGeneration()
			if err := md.UpdateSuperblock(func(sb *Superblock) { sb.Current = good }); err != nil {
				t.Fatal(err)
			}
			// The next superblock write reaches the media for one sector only,
			// and its sync fails: the node loses power.
			dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
				if op.Kind == mdtest.OpSync {
					return mdtest.Fault{Err: mdtest.ErrInjected}
				}
				return mdtest.Fault{}
			})
			if err := md.UpdateSuperblock(func(sb *Superblock) { sb.Current = replication.NewGeneration() }); err == nil {
				t.Fatal("update with a failing sync succeeded")
			}
			crashed := dev.CrashKeeping(func(int, int64, int) int { return 1 })
			md2 := reopen(t, crashed, opts)
			if got := md2.Superblock(); got.Current != good || got.Seq != 2 {
				t.Fatalf("after a torn write: seq %d current %v, want seq 2 current %v", got.Seq, got.Current, good)
			}
			if r := md2.Report(); !strings.Contains(r.OtherSlot, "checksum") {
				t.Fatalf("the torn slot is not reported: %+v", r)
			}
			// The next write goes to the torn slot and repairs it.
			if err := md2.UpdateSuperblock(func(sb *Superblock) {}); err != nil {
				t.Fatal(err)
			}
			if r := reopen(t, crashed.Crash(), opts).Report(); r.OtherSlot != "" {
				t.Fatalf("the torn slot was not repaired: %q", r.OtherSlot)
			}
		})
	}
}

// TestRefusalsChangeNothing: each refusal names what is wrong and what to
// do, matches its sentinel, and leaves every byte of the device as it was.
func TestRefusalsChangeNothing(t *testing.T) {
	opts := testOptions(Internal)
	sbOffs := superblockOffsets(Internal, testVolumeSize)
	cases := []struct {
		name    string
		damage  func(t *testing.T, dev *mdtest.Device)
		open    MDOptions
		want    error
		advises string
	}{
		{"metadata of another volume", nil,
			MDOptions{Placement: Internal, DeviceSize: testVolumeSize, Volume: VolumeUUID{1}, NodeID: nodeAlpha}, ErrNotOurVolume, "attach the disk of this volume"},
		{"metadata of another node of the same volume", nil,
			MDOptions{Placement: Internal, DeviceSize: testVolumeSize, Volume: testVolume, NodeID: nodeBeta}, ErrNotOurVolume, "create-md"},
		{"both superblock copies fail their checksum", func(t *testing.T, dev *mdtest.Device) {
			for _, off := range sbOffs {
				flipByte(t, dev, off+100)
			}
		}, opts, ErrCorrupt, "create-md"},
		{"a newer format version", func(t *testing.T, dev *mdtest.Device) {
			b := dev.Snapshot(sbOffs[1], MDBlockSize)
			b[8] = FormatVersion + 1
			if _, err := dev.WriteAt(b, sbOffs[1]); err != nil {
				t.Fatal(err)
			}
		}, opts, ErrNewerFormat, "upgrade replvol"},
		{"no metadata at all", func(t *testing.T, dev *mdtest.Device) {
			for _, off := range sbOffs {
				if _, err := dev.WriteAt(make([]byte, MDBlockSize), off); err != nil {
					t.Fatal(err)
				}
			}
		}, opts, ErrNoMetadata, "create-md"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dev, md := newTestMD(t, opts)
			if err := md.UpdateSuperblock(func(sb *Superblock) { sb.Current = replication.NewGeneration() }); err != nil {
				t.Fatal(err)
			}
			if c.damage != nil {
				c.damage(t, dev)
			}
			// The write counter covers the whole device; the snapshot the
			// metadata area.
			mdOff := md.Superblock().MDOffset
			before := dev.Snapshot(mdOff, int(dev.Size()-mdOff))
			writesBefore, _ := dev.Count(mdtest.OpWrite)
			_, err := OpenMD(dev, c.open)
			if !errors.Is(err, c.want) {
				t.Fatalf("OpenMD: %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.advises) {
				t.Errorf("error %q does not say what to do (%q)", err, c.advises)
			}
			t.Logf("refused: %v", err)
			if writes, _ := dev.Count(mdtest.OpWrite); writes != writesBefore {
				t.Errorf("a refusal wrote %d times", writes-writesBefore)
			}
			if !bytes.Equal(before, dev.Snapshot(mdOff, int(dev.Size()-mdOff))) {
				t.Error("a refusal changed the device")
			}
		})
	}
}

func TestCreateRefusesExistingMetadata(t *testing.T) {
	opts := testOptions(External)
	dev, _ := newTestMD(t, opts)
	before := dev.Snapshot(0, int(dev.Size()))
	if _, err := CreateMD(dev, opts); !errors.Is(err, ErrMetadataExists) {
		t.Fatalf("CreateMD over metadata: %v", err)
	}
	if !bytes.Equal(before, dev.Snapshot(0, int(dev.Size()))) {
		t.Fatal("the refusal changed the device")
	}
	opts.Overwrite = true
	opts.Volume = VolumeUUID{9}
	if _, err := CreateMD(dev, opts); err != nil {
		t.Fatalf("CreateMD with overwrite: %v", err)
	}
	if _, err := OpenMD(dev, testOptions(External)); !errors.Is(err, ErrNotOurVolume) {
		t.Fatalf("the old volume still opens: %v", err)
	}
}

// TestCreateCrashLeavesNoMixedMetadata: a create-md interrupted at any
// write leaves either no metadata or the new metadata, never the old
// superblock over new bitmaps.
func TestCreateCrashLeavesNoMixedMetadata(t *testing.T) {
	opts := testOptions(External)
	opts.DeviceSize = 64 << 20
	dev, _ := newTestMD(t, opts)
	over := opts
	over.Overwrite, over.Volume = true, VolumeUUID{7}
	original := dev.Snapshot(0, int(dev.Size()))
	for stop := int64(1); ; stop++ {
		d := dev.Crash()
		d.SetInjector(func(op mdtest.Op) mdtest.Fault {
			if op.Kind == mdtest.OpSync && op.N >= stop {
				return mdtest.Fault{Err: mdtest.ErrInjected}
			}
			return mdtest.Fault{}
		})
		_, err := CreateMD(d, over)
		after := d.Crash()
		_, errOld := OpenMD(after, opts)
		_, errNew := OpenMD(after, over)
		switch {
		case err == nil && errNew != nil:
			t.Fatalf("completed create does not open: %v", errNew)
		case err == nil:
			return
		case errOld == nil && !bytes.Equal(original, after.Snapshot(0, int(after.Size()))):
			t.Fatalf("crash at sync %d: the old metadata still opens over a half-done create", stop)
		case errOld != nil && errNew != nil && !errors.Is(errNew, ErrNoMetadata):
			t.Fatalf("crash at sync %d: neither old nor new metadata, and not 'no metadata': %v", stop, errNew)
		}
	}
}

func flipByte(t *testing.T, dev *mdtest.Device, off int64) {
	t.Helper()
	b := dev.Snapshot(off, 1)
	b[0] ^= 0xff
	if _, err := dev.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenFindsTheSizeOfAFile: internal metadata on a file is found from
// the file's size when the caller does not give it.
func TestOpenFindsTheSizeOfAFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	opts := MDOptions{Placement: Internal, Volume: testVolume, NodeID: nodeAlpha, Peers: []uint32{nodeBeta}}
	md, err := CreateMD(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	md2, err := OpenMD(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	if md2.UsableSize() != md.UsableSize() || md2.UsableSize() >= 256<<20 {
		t.Fatalf("usable %d", md2.UsableSize())
	}
}
