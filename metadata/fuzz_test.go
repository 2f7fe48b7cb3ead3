package metadata

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/replvol/replvol/replication"
)

var writeFuzzSeeds = flag.Bool("write-fuzz-seeds", false, "rewrite the committed seed corpus under testdata/fuzz")

// seedSuperblocks are valid superblocks of both placements and some
// variations, plus the shapes of damage the decoder must refuse.
func seedSuperblocks() [][]byte {
	var seeds, checksummed [][]byte
	for _, p := range []Placement{Internal, External} {
		for _, size := range []int64{1 << 30, 1<<40 + 12345} {
			g, err := computeGeometry(p, size, DefaultALExtents, 2, false)
			if err != nil {
				panic(err)
			}
			sb := Superblock{
				Version: 1, Seq: 7, Flags: FlagConsistent | FlagPrimary, Volume: testVolume, NodeID: 1, Placement: p,
				DeviceSize: size, DataSize: g.dataSize, MDOffset: g.mdOffset, MDSize: g.mdSize,
				ALOffset: g.alOffset, ALBlocks: uint32(g.alBlocks), ALExtents: uint32(g.alExtents),
				BitmapOffset: g.bitmapOffset, BitmapPages: uint32(g.bitmapPages), BytesPerBit: bytesPerBit, ExtentShift: ExtentShift,
				Current: replication.Generation{1, 2, 3}, History: [HistorySlots]replication.Generation{{4}, {5}},
				Peers: []PeerSlot{{NodeID: 2, InUse: true, Bitmap: replication.Generation{1}}, {NodeID: 3}},
			}
			seeds = append(seeds, encodeSuperblock(&sb))
			// The same with a checksum area (format 2).
			if g, err = computeGeometry(p, size, DefaultALExtents, 2, true); err != nil {
				panic(err)
			}
			sb.Version = FormatChecksums
			sb.setGeometry(g)
			sb.ChecksumSeed = 0x0123456789abcdef
			checksummed = append(checksummed, encodeSuperblock(&sb))
		}
	}
	newer := append([]byte(nil), seeds[1]...)
	newer[8] = FormatVersion + 1
	return append(append(seeds, newer, nil), checksummed[0], checksummed[3])
}

// trimSeed drops the checksum and the trailing zeros of a block: the fuzz
// targets pad their input to a block and checksum it, and a short input
// keeps the fuzzer's minimisation (quadratic in the input length) cheap.
func trimSeed(b []byte) []byte { return bytes.TrimRight(b[:min(len(b), crcOffset)], "\x00") }

// seedALTransactions are valid transactions (update, initialise, full
// context, empty) and a torn one.
func seedALTransactions() [][]byte {
	ctx := make([]uint32, alContextPerTx)
	for i := range ctx {
		ctx[i] = uint32(i * 3)
	}
	// Small AL sizes keep the seeds short (see trimSeed).
	txs := []alTransaction{
		{Type: alTypeInit, Seq: 1, ALExtents: 61, Context: ctx[:61]},
		{Type: alTypeUpdate, Seq: 9, ALExtents: DefaultALExtents, Updates: []alUpdate{{1, 100}, {2, alNoExtent}}, ContextStart: 1200, Context: ctx[:37]},
		{Type: alTypeUpdate, Seq: 1 << 40, ALExtents: MinALExtents, Updates: []alUpdate{{6, 5}}, Context: ctx[:7]},
	}
	var seeds [][]byte
	for i := range txs {
		seeds = append(seeds, encodeALTransaction(testVolume, &txs[i]))
	}
	return append(seeds, seeds[1][:100])
}

// FuzzDecodeSuperblock: the decoder never panics, accepts only what it
// can re-encode to the same superblock, and an accepted superblock has a
// geometry this format computes.
func FuzzDecodeSuperblock(f *testing.F) {
	for _, s := range seedSuperblocks() {
		f.Add(trimSeed(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeSuperblock(b)
		// Most mutations fail the checksum; fix it so that the fuzzer
		// also explores the field checks behind it.
		b = fixChecksum(b, func(b []byte) uint32 { return crc32.Checksum(b[:crcOffset], castagnoli) })
		sb, err := decodeSuperblock(b)
		if err != nil {
			return
		}
		again, err := decodeSuperblock(encodeSuperblock(&sb))
		if err != nil {
			t.Fatalf("re-encoded superblock does not decode: %v", err)
		}
		if !reflect.DeepEqual(sb, again) {
			t.Fatalf("round trip changed the superblock:\n%+v\n%+v", sb, again)
		}
		_ = sb.geometry() // panics if checkGeometry let an impossible layout through
	})
}

// FuzzDecodeALTransaction: the decoder never panics, and what it accepts
// re-encodes to a block that decodes to the same transaction, within the
// bounds a replay indexes by.
func FuzzDecodeALTransaction(f *testing.F) {
	for _, s := range seedALTransactions() {
		f.Add(trimSeed(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeALTransaction(testVolume, b)
		b = fixChecksum(b, func(b []byte) uint32 { return alCRC(testVolume, b) })
		tx, err := decodeALTransaction(testVolume, b)
		if err != nil {
			return
		}
		for _, u := range tx.Updates {
			if uint32(u.Slot) >= tx.ALExtents {
				t.Fatalf("update of slot %d of %d accepted", u.Slot, tx.ALExtents)
			}
		}
		if uint64(tx.ContextStart)+uint64(len(tx.Context)) > uint64(tx.ALExtents) {
			t.Fatalf("context beyond the slots accepted")
		}
		again, err := decodeALTransaction(testVolume, encodeALTransaction(testVolume, &tx))
		if err != nil || !reflect.DeepEqual(tx, again) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, tx, again)
		}
	})
}

// TestWriteFuzzSeeds rewrites the committed corpus when run with
// -write-fuzz-seeds (after a format change); otherwise it checks that the
// corpus is there.
func TestWriteFuzzSeeds(t *testing.T) {
	for i, s := range slices.Concat(seedSuperblocks()[:4], seedSuperblocks()[6:]) {
		s = fixChecksum(trimSeed(s), func(b []byte) uint32 { return crc32.Checksum(b[:crcOffset], castagnoli) })
		if _, err := decodeSuperblock(s); err != nil {
			t.Errorf("superblock seed %d does not decode: %v", i, err)
		}
	}
	for i, s := range seedALTransactions()[:3] {
		s = fixChecksum(trimSeed(s), func(b []byte) uint32 { return alCRC(testVolume, b) })
		if _, err := decodeALTransaction(testVolume, s); err != nil {
			t.Errorf("AL seed %d does not decode: %v", i, err)
		}
	}
	for name, seeds := range map[string][][]byte{
		"FuzzDecodeSuperblock":    seedSuperblocks(),
		"FuzzDecodeALTransaction": seedALTransactions(),
	} {
		dir := filepath.Join("testdata", "fuzz", name)
		if !*writeFuzzSeeds {
			if entries, err := os.ReadDir(dir); err != nil || len(entries) < len(seeds) {
				t.Errorf("seed corpus %s: %d files, %v; run go test -run TestWriteFuzzSeeds -write-fuzz-seeds", dir, len(entries), err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", trimSeed(s))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// fixChecksum returns a copy of b (the fuzzer's input must not change)
// cut or zero-padded to one block, with the checksum sum computes: most
// mutations would fail the checksum, and this lets the fuzzer explore the
// field checks behind it.
func fixChecksum(b []byte, sum func([]byte) uint32) []byte {
	c := make([]byte, MDBlockSize)
	copy(c, b)
	binary.LittleEndian.PutUint32(c[crcOffset:], sum(c))
	return c
}
