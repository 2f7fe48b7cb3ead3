package metadata

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/replvol/replvol/metadata/mdtest"
	"github.com/replvol/replvol/replication"
)

// TestBadBlockListSurvivesAReopen: a list set in any order is kept in
// block order, durably: a crash right after SetBadBlocks returned, and a
// reopen, find it; later superblock writes (flags, generations) carry it.
func TestBadBlockListSurvivesAReopen(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/checksums=%v", p, sums), func(t *testing.T) {
				opts := testOptions(p)
				opts.Checksums = sums
				dev, md := newTestMD(t, opts)
				if got := md.BadBlocks(); len(got) != 0 {
					t.Fatalf("new metadata has bad blocks %v", got)
				}
				last := blocksOf(md.UsableSize()) - 1
				list := []BadBlock{{last, BadBlockLost}, {7, BadBlockUnwritable}, {0, BadBlockUnwritable}}
				if err := md.SetBadBlocks(list); err != nil {
					t.Fatal(err)
				}
				want := []BadBlock{{0, BadBlockUnwritable}, {7, BadBlockUnwritable}, {last, BadBlockLost}}
				if got := reopen(t, dev.Crash(), opts).BadBlocks(); !slices.Equal(got, want) {
					t.Fatalf("after a crash: %v, want %v", got, want)
				}
				if err := md.UpdateSuperblock(func(sb *Superblock) { sb.Current = replication.NewGeneration() }); err != nil {
					t.Fatal(err)
				}
				if err := md.SetPrimary(true); err != nil {
					t.Fatal(err)
				}
				crashed := dev.Crash()
				md2 := reopen(t, crashed, opts)
				if got := md2.BadBlocks(); !slices.Equal(got, want) {
					t.Fatalf("after other superblock writes: %v, want %v", got, want)
				}
				if err := md2.SetBadBlocks(nil); err != nil {
					t.Fatal(err)
				}
				if got := reopen(t, crashed.Crash(), opts).BadBlocks(); len(got) != 0 {
					t.Fatalf("after clearing: %v", got)
				}
			})
		}
	}
}

// TestBadBlockListEncoding: the list's bytes are layout.go's, and every
// list the encoder writes decodes to itself, up to MaxBadBlocks entries.
func TestBadBlockListEncoding(t *testing.T) {
	sb := Superblock{Version: 1, Seq: 3, Placement: External, Peers: []PeerSlot{{NodeID: 2, InUse: true}}}
	sb.BadBlocks = []BadBlock{{5, BadBlockUnwritable}, {1 << 37, BadBlockLost}}
	b := encodeBadBlocksIn(sb)
	if n := le32(b[1024:]); n != 2 {
		t.Fatalf("count at 1024: %d", n)
	}
	if e := le64(b[1032:]); e != 5|1<<56 {
		t.Fatalf("first entry %#x", e)
	}
	if e := le64(b[1040:]); e != 1<<37|2<<56 {
		t.Fatalf("second entry %#x", e)
	}
	got, err := decodeBadBlocks(b, 1<<50)
	if err != nil || !slices.Equal(got, sb.BadBlocks) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	full := make([]BadBlock, MaxBadBlocks)
	for i := range full {
		full[i] = BadBlock{int64(3 * i), BadBlockKind(1 + i%2)}
	}
	sb.BadBlocks = full
	if got, err := decodeBadBlocks(encodeBadBlocksIn(sb), 1<<40); err != nil || !slices.Equal(got, full) {
		t.Fatalf("a full list decoded to %d entries, %v", len(got), err)
	}
	if MaxBadBlocks != 382 {
		t.Fatalf("MaxBadBlocks %d: layout.go says 382", MaxBadBlocks)
	}
}

func encodeBadBlocksIn(sb Superblock) []byte {
	b := make([]byte, MDBlockSize)
	encodeBadBlocks(b, sb.BadBlocks)
	return b
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }

// TestBadBlockListRefusalsChangeNothing: a list too long, with a block
// twice, past the data or of an unknown kind is refused, and the list in
// force (on the device too) stays as it was.
func TestBadBlockListRefusalsChangeNothing(t *testing.T) {
	opts := testOptions(Internal)
	dev, md := newTestMD(t, opts)
	before := []BadBlock{{9, BadBlockUnwritable}}
	if err := md.SetBadBlocks(before); err != nil {
		t.Fatal(err)
	}
	// SetBadBlocks writes nothing but a superblock slot.
	slots := superblockOffsets(Internal, testVolumeSize)
	image := func() []byte {
		return append(dev.Snapshot(slots[0], MDBlockSize), dev.Snapshot(slots[1], MDBlockSize)...)
	}
	was := image()
	tooLong := make([]BadBlock, MaxBadBlocks+1)
	for i := range tooLong {
		tooLong[i] = BadBlock{int64(i), BadBlockUnwritable}
	}
	for _, c := range []struct {
		name string
		list []BadBlock
		want error
	}{
		{"more entries than the superblock holds", tooLong, ErrBadBlockListFull},
		{"a block listed twice", []BadBlock{{4, BadBlockUnwritable}, {4, BadBlockLost}}, ErrBadOptions},
		{"a block past the data", []BadBlock{{blocksOf(md.UsableSize()), BadBlockUnwritable}}, ErrBadOptions},
		{"a negative block", []BadBlock{{-1, BadBlockUnwritable}}, ErrBadOptions},
		{"an unknown kind", []BadBlock{{4, 3}}, ErrBadOptions},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := md.SetBadBlocks(c.list); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if got := md.BadBlocks(); !slices.Equal(got, before) {
				t.Fatalf("the list in force became %v", got)
			}
			if !slices.Equal(image(), was) {
				t.Fatal("a superblock slot changed")
			}
		})
	}
}

// TestBadBlockListTornWriteKeepsThePreviousList: a superblock write of a
// new list torn by a power loss (its first sector alone on the media)
// leaves the list before it in force.
func TestBadBlockListTornWriteKeepsThePreviousList(t *testing.T) {
	for _, p := range []Placement{Internal, External} {
		t.Run(p.String(), func(t *testing.T) {
			opts := testOptions(p)
			dev, md := newTestMD(t, opts)
			before := []BadBlock{{3, BadBlockUnwritable}}
			if err := md.SetBadBlocks(before); err != nil {
				t.Fatal(err)
			}
			dev.SetInjector(func(op mdtest.Op) mdtest.Fault {
				if op.Kind == mdtest.OpSync {
					return mdtest.Fault{Err: mdtest.ErrInjected}
				}
				return mdtest.Fault{}
			})
			// Up to the sector that holds the list's head: every tear
			// before the whole block keeps the list before.
			for _, sectors := range []int{1, 2, 3, 7} {
				if err := md.SetBadBlocks(append(slices.Clone(before), BadBlock{4, BadBlockUnwritable})); err == nil {
					t.Fatal("a list written with a failing sync was taken")
				}
				if got := md.BadBlocks(); !slices.Equal(got, before) {
					t.Fatalf("a failed write changed the list in force to %v", got)
				}
				crashed := dev.CrashKeeping(func(int, int64, int) int { return sectors })
				if got := reopen(t, crashed, opts).BadBlocks(); !slices.Equal(got, before) {
					t.Fatalf("torn after %d sectors: %v, want %v", sectors, got, before)
				}
			}
		})
	}
}

// TestBadBlockListCorruptSlotIsNotInForce: a superblock slot whose list
// no encoder writes (out of order, here) but whose checksum holds is
// corrupt: the other slot is in force.
func TestBadBlockListCorruptSlotIsNotInForce(t *testing.T) {
	opts := testOptions(External)
	dev, md := newTestMD(t, opts)
	if err := md.SetBadBlocks([]BadBlock{{3, BadBlockUnwritable}}); err != nil {
		t.Fatal(err)
	}
	sb := md.Superblock()
	sb.Seq++
	sb.BadBlocks = []BadBlock{{8, BadBlockUnwritable}, {2, BadBlockLost}}
	if _, err := dev.WriteAt(encodeSuperblock(&sb), superblockOffsets(External, 0)[sb.Seq%2]); err != nil {
		t.Fatal(err)
	}
	md2 := reopen(t, dev, opts)
	if got := md2.BadBlocks(); !slices.Equal(got, []BadBlock{{3, BadBlockUnwritable}}) {
		t.Fatalf("list in force %v", got)
	}
	if md2.Report().OtherSlot == "" {
		t.Fatal("the corrupt slot is not reported")
	}
}

// TestFormat1MetadataOfAnEarlierBuildHasNoBadBlocks: metadata an earlier
// build wrote (zeroes where the list lives) opens with an empty list, and
// takes one.
func TestFormat1MetadataOfAnEarlierBuildHasNoBadBlocks(t *testing.T) {
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
	opts := MDOptions{Placement: External, DeviceSize: 64 << 20, Volume: testVolume, NodeID: nodeAlpha}
	md := reopen(t, dev, opts)
	if got := md.BadBlocks(); len(got) != 0 {
		t.Fatalf("format-1 metadata of an earlier build: bad blocks %v", got)
	}
	if err := md.SetBadBlocks([]BadBlock{{100, BadBlockUnwritable}}); err != nil {
		t.Fatal(err)
	}
	md2 := reopen(t, dev.Crash(), opts)
	if sb := md2.Superblock(); sb.Version != 1 || !slices.Equal(sb.BadBlocks, []BadBlock{{100, BadBlockUnwritable}}) {
		t.Fatalf("version %d, list %v", sb.Version, sb.BadBlocks)
	}
}
