package blocksum

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// The tests below hold update (updateFold where the CPU has it, hash/crc32
// elsewhere and with -tags purego) to hash/crc32 itself.

func crcValues(r *rand.Rand) []uint32 {
	return []uint32{0, 0xffffffff, 1, 0x80000000, r.Uint32(), r.Uint32()}
}

func checkUpdate(t *testing.T, crc uint32, p []byte, what string) {
	t.Helper()
	if got, want := update(crc, p), crc32.Update(crc, castagnoli, p); got != want {
		t.Fatalf("%s, %d bytes, crc %08x: update = %08x, crc32.Update = %08x", what, len(p), crc, got, want)
	}
}

// TestUpdateIsCRC32C: random data of every multiple of 256 bytes up to
// 16 KiB, and 1 MiB, from random initial values and 0 and ^0; at every
// alignment of the start for the lengths a block pass sees.
func TestUpdateIsCRC32C(t *testing.T) {
	t.Logf("folding CRC on this CPU: %v", hasFold)
	r := rand.New(rand.NewPCG(11, 12))
	buf := randomBlock(r, 1<<20+64)
	for n := 256; n <= 16<<10; n += 256 {
		for _, crc := range crcValues(r) {
			checkUpdate(t, crc, buf[:n], "random")
		}
	}
	for _, crc := range crcValues(r) {
		checkUpdate(t, crc, buf[:1<<20], "random")
	}
	for _, n := range []int{256, 512, BlockSize, 2 * BlockSize} {
		for off := range 64 {
			checkUpdate(t, r.Uint32(), buf[off:off+n], "unaligned")
		}
	}
	// Lengths around the multiples: the fallback.
	for _, n := range []int{0, 1, 4, 255, 257, 511, BlockSize - 1, BlockSize + 1} {
		checkUpdate(t, r.Uint32(), buf[:n], "not a multiple of 256")
	}
}

// TestUpdateOfConstantBlocks: all zeroes and all ones, whose
// accumulators hold nothing, or the same lanes, at every step.
func TestUpdateOfConstantBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	zeroes, ones := make([]byte, 4*BlockSize), make([]byte, 4*BlockSize)
	for i := range ones {
		ones[i] = 0xff
	}
	for _, n := range []int{256, 768, BlockSize, 4 * BlockSize} {
		for _, crc := range crcValues(r) {
			checkUpdate(t, crc, zeroes[:n], "zeroes")
			checkUpdate(t, crc, ones[:n], "ones")
		}
	}
}

// TestUpdateOfEveryFlippedBit: a block with each of its bits flipped in
// turn, against hash/crc32 (and each sum differs from the block's own).
func TestUpdateOfEveryFlippedBit(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	data := randomBlock(r, BlockSize)
	crc := r.Uint32()
	own := update(crc, data)
	for bit := range BlockSize * 8 {
		data[bit/8] ^= 1 << (bit % 8)
		got, want := update(crc, data), crc32.Update(crc, castagnoli, data)
		data[bit/8] ^= 1 << (bit % 8)
		if got != want || got == own {
			t.Fatalf("bit %d flipped: update = %08x, crc32.Update = %08x, unflipped %08x", bit, got, want, own)
		}
	}
}

// FuzzFastCRC: update against hash/crc32 for any bytes and initial value
// (and for the bytes cut to a multiple of 256, the folding's lengths), and
// Seed.Sum against its definition, CRC-32C of UUID, address and data.
func FuzzFastCRC(f *testing.F) {
	f.Add([]byte("hello"), uint32(0))
	f.Add(make([]byte, 256), uint32(0xffffffff))
	f.Add(randomBlock(rand.New(rand.NewPCG(17, 18)), 1000), uint32(0x12345678))
	f.Fuzz(func(t *testing.T, data []byte, crc uint32) {
		checkUpdate(t, crc, data, "fuzz")
		checkUpdate(t, crc, data[:len(data)&^(256-1)], "fuzz, cut")
		block := uint64(crc) * 0x9e3779b97f4a7c15 >> 26
		msg := append(append(append([]byte(nil), testVolume[:]...), binary.LittleEndian.AppendUint64(nil, block)...), data...)
		if got, want := NewSeed(testVolume).Sum(block, data), crc32.Checksum(msg, castagnoli); got != want {
			t.Fatalf("Sum(%d, %d bytes) = %08x, CRC-32C of uuid|address|data = %08x", block, len(data), got, want)
		}
	})
}

// TestUpdateAddress: the address's 8 bytes from the tables, against
// hash/crc32 over them.
func TestUpdateAddress(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for i := range 100000 {
		crc, block := r.Uint32(), r.Uint64()
		switch i {
		case 0:
			crc, block = 0, 0
		case 1:
			crc, block = 0xffffffff, 0xffffffffffffffff
		}
		want := crc32.Update(crc, castagnoli, binary.LittleEndian.AppendUint64(nil, block))
		if got := updateAddress(crc, block); got != want {
			t.Fatalf("crc %08x, block %#x: updateAddress = %08x, crc32.Update = %08x", crc, block, got, want)
		}
	}
}
