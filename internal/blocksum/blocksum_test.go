package blocksum

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

var testVolume = [16]byte{0: 0x76, 15: 0x01}

func randomBlock(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestSumIsCRC32COverUUIDAddressAndData pins the format the replication
// frame and the metadata carry: CRC-32C of the UUID, the address (8 bytes
// little-endian) and the data, in one pass.
func TestSumIsCRC32COverUUIDAddressAndData(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := randomBlock(r, BlockSize)
	const block = 0x0102030405
	msg := append(append([]byte(nil), testVolume[:]...), binary.LittleEndian.AppendUint64(nil, block)...)
	msg = append(msg, data...)
	want := crc32.Checksum(msg, crc32.MakeTable(crc32.Castagnoli))
	if got := NewSeed(testVolume).Sum(block, data); got != want {
		t.Fatalf("Sum = %08x, CRC-32C of uuid|address|data = %08x", got, want)
	}
}

// TestEveryFlippedBitFails flips each bit of a block in turn.
func TestEveryFlippedBitFails(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := NewSeed(testVolume)
	data := randomBlock(r, BlockSize)
	sum := s.Sum(7, data)
	if err := s.Verify(7, data, sum); err != nil {
		t.Fatalf("the block's own sum: %v", err)
	}
	for bit := range BlockSize * 8 {
		data[bit/8] ^= 1 << (bit % 8)
		err := s.Verify(7, data, sum)
		data[bit/8] ^= 1 << (bit % 8)
		var m *MismatchError
		if !errors.Is(err, ErrMismatch) || !errors.As(err, &m) || m.Block != 7 || m.Want != sum {
			t.Fatalf("bit %d flipped: %v", bit, err)
		}
	}
}

// TestAnotherAddressFails: the same bytes at another block, in the low
// 32 bits of the address (always) and anywhere (with a fixed seed).
func TestAnotherAddressFails(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	s := NewSeed(testVolume)
	for range 2000 {
		data := randomBlock(r, BlockSize)
		block := r.Uint64() >> 26 // a 1 PiB volume has 2^38 blocks
		sum := s.Sum(block, data)
		others := []uint64{block ^ 1, block ^ uint64(r.Uint32()|1), r.Uint64() >> 26}
		for _, other := range others {
			if other == block {
				continue
			}
			if err := s.Verify(other, data, sum); !errors.Is(err, ErrMismatch) {
				t.Fatalf("block %d's bytes verified as block %d: %v", block, other, err)
			}
		}
	}
}

// TestAnotherVolumeFails: a block read from another volume, at the same
// address, with the same bytes.
func TestAnotherVolumeFails(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		var other [16]byte
		binary.LittleEndian.PutUint64(other[:], r.Uint64())
		binary.LittleEndian.PutUint64(other[8:], r.Uint64())
		if other == testVolume {
			continue
		}
		data := randomBlock(r, 512)
		block := r.Uint64() >> 26
		if err := NewSeed(other).Verify(block, data, NewSeed(testVolume).Sum(block, data)); !errors.Is(err, ErrMismatch) {
			t.Fatalf("volume %x verified a block of volume %x: %v", other, testVolume, err)
		}
	}
}

// TestSumsAndVerifyAll: a write of several blocks, the last partial (the
// volume's end), sums and verifies block by block.
func TestSumsAndVerifyAll(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	s := NewSeed(testVolume)
	data := randomBlock(r, 3*BlockSize+100)
	sums := s.Sums(nil, 40, data)
	if len(sums) != 4 || sums[3] != s.Sum(43, data[3*BlockSize:]) || sums[1] != s.Sum(41, data[BlockSize:2*BlockSize]) {
		t.Fatalf("sums %08x", sums)
	}
	if err := s.VerifyAll(40, data, sums); err != nil {
		t.Fatal(err)
	}
	data[2*BlockSize+5] ^= 0x80
	var m *MismatchError
	if err := s.VerifyAll(40, data, sums); !errors.As(err, &m) || m.Block != 42 {
		t.Fatalf("a flipped bit in block 42: %v", err)
	}
	if err := s.VerifyAll(40, data, sums[:3]); !errors.Is(err, ErrMismatch) {
		t.Fatalf("three sums for four blocks: %v", err)
	}
}

// FuzzVerify: for any block, address and volume, the block's own sum
// verifies, and a flipped bit, another address differing in its low 32
// bits, or another volume's seed does not (the last two with the chance
// of a CRC collision, 2^-32, which the fuzzer is welcome to find).
func FuzzVerify(f *testing.F) {
	f.Add([]byte("hello"), uint64(0), uint32(1), uint16(0), uint64(1))
	f.Add(make([]byte, BlockSize), uint64(1<<37), uint32(0xffffffff), uint16(4095*8), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, block uint64, lowXor uint32, bit uint16, volXor uint64) {
		if len(data) == 0 || len(data) > BlockSize {
			return
		}
		s := NewSeed(testVolume)
		sum := s.Sum(block, data)
		if err := s.Verify(block, data, sum); err != nil {
			t.Fatalf("own sum: %v", err)
		}
		flipped := append([]byte(nil), data...)
		i := int(bit) % (len(data) * 8)
		flipped[i/8] ^= 1 << (i % 8)
		if s.Verify(block, flipped, sum) == nil {
			t.Fatalf("bit %d flipped verified", i)
		}
		if lowXor != 0 && s.Verify(block^uint64(lowXor), data, sum) == nil {
			t.Fatalf("block %d verified at %d", block, block^uint64(lowXor))
		}
		other := testVolume
		binary.LittleEndian.PutUint64(other[:], binary.LittleEndian.Uint64(other[:])^volXor)
		if volXor != 0 && NewSeed(other).Verify(block, data, sum) == nil {
			t.Logf("volume differing by %x collides (chance 2^-32)", volXor)
		}
	})
}

func benchmarkSum(b *testing.B, size int) {
	s := NewSeed(testVolume)
	data := randomBlock(rand.New(rand.NewPCG(1, 1)), size)
	sums := make([]uint32, 0, size/BlockSize)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		sums = s.Sums(sums[:0], uint64(i), data)
	}
}

// BenchmarkSum4K and BenchmarkSum8K are the cost a write pays (the
// node's 8 KiB random-write benchmark is two blocks).
func BenchmarkSum4K(b *testing.B) { benchmarkSum(b, BlockSize) }
func BenchmarkSum8K(b *testing.B) { benchmarkSum(b, 2*BlockSize) }

// BenchmarkSums1M is the primary's pass over a 1 MiB write, into a dst
// with room for 16 sums as the write path gives it (its countdown's):
// one allocation at most for the 256 sums, never one per growth.
func BenchmarkSums1M(b *testing.B) {
	s := NewSeed(testVolume)
	data := randomBlock(rand.New(rand.NewPCG(1, 1)), 1<<20)
	var room [16]uint32
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_ = s.Sums(room[:0], uint64(i), data)
	}
}
