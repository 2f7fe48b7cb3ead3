package blocksum

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// BlockSize is the span one checksum covers.
const BlockSize = 4096

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrMismatch is a block whose bytes do not give the checksum stored for
// it (errors.Is; a *MismatchError says which block).
var ErrMismatch = errors.New("block checksum mismatch")

// MismatchError is Verify's refusal: the block at Block gave Got, not
// Want.
type MismatchError struct {
	Block     uint64
	Got, Want uint32
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("block %d (byte %d): checksum %08x, want %08x", e.Block, e.Block*BlockSize, e.Got, e.Want)
}

// Is makes a MismatchError ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Seed is a volume's part of every checksum: the CRC-32C of its UUID,
// computed once.
type Seed struct{ crc uint32 }

// NewSeed returns the seed of the volume whose UUID is volume.
func NewSeed(volume [16]byte) Seed { return Seed{crc32.Update(0, castagnoli, volume[:])} }

// Sum is the checksum of the block at address block (its byte offset
// divided by BlockSize) holding data: CRC-32C over the volume's UUID, the
// address as 8 little-endian bytes, then data. data is one block, or
// less for the volume's partial last block (its bytes inside the volume).
//
// Any change of data up to 32 bits long, any two addresses that differ in
// their low 32 bits only, give another sum (CRC-32C detects every error
// burst of up to 32 bits); other changes, and another volume's UUID, give
// the same sum with a chance of 2^-32.
func (s Seed) Sum(block uint64, data []byte) uint32 {
	return update(updateAddress(s.crc, block), data)
}

// updateAddress is crc32.Update(crc, castagnoli, the 8 little-endian
// bytes of block), from tables: a slice of the address would escape to
// the heap through crc32.Update, an allocation per block. The eight
// bytes are looked up at once, each in the table that carries it over
// the bytes after it (slicing by 8): the byte-by-byte loop was a chain
// of eight dependent loads, 15 ns, a quarter of the folding of a block
// that waits for it.
func updateAddress(crc uint32, block uint64) uint32 {
	v := block ^ uint64(^crc)
	t := &addressTables
	return ^(t[7][byte(v)] ^ t[6][byte(v>>8)] ^ t[5][byte(v>>16)] ^ t[4][byte(v>>24)] ^
		t[3][byte(v>>32)] ^ t[2][byte(v>>40)] ^ t[1][byte(v>>48)] ^ t[0][byte(v>>56)])
}

// addressTables[k][b] is the CRC-32C state (uninverted) of the byte b
// followed by k zero bytes, from the state 0.
var addressTables = func() (t [8][256]uint32) {
	t[0] = *castagnoli
	for k := 1; k < len(t); k++ {
		for b := range t[k] {
			t[k][b] = t[k-1][b]>>8 ^ t[0][byte(t[k-1][b])]
		}
	}
	return t
}()

// Sums appends to dst the sums of the blocks of data, the first at
// address first: one per BlockSize bytes, the last over what remains.
// It allocates nothing when dst has room for them, and once otherwise
// (not once per growth of dst: a 1 MiB write's 256 sums would cost four
// allocations, which a profile of 1 MiB writes found costing more than
// a third as much as the CRC pass itself).
func (s Seed) Sums(dst []uint32, first uint64, data []byte) []uint32 {
	dst = slices.Grow(dst, (len(data)+BlockSize-1)/BlockSize)
	for off := 0; off < len(data); off += BlockSize {
		dst = append(dst, s.Sum(first, data[off:min(off+BlockSize, len(data))]))
		first++
	}
	return dst
}

// Verify checks that data, the block at address block, gives want; it
// returns a *MismatchError (ErrMismatch) when it does not.
func (s Seed) Verify(block uint64, data []byte, want uint32) error {
	if got := s.Sum(block, data); got != want {
		return &MismatchError{Block: block, Got: got, Want: want}
	}
	return nil
}

// VerifyAll checks the blocks of data, the first at address first,
// against sums (one per block, as Sums gives them); it returns the first
// mismatch, or an error if the counts differ.
func (s Seed) VerifyAll(first uint64, data []byte, sums []uint32) error {
	if n := (len(data) + BlockSize - 1) / BlockSize; n != len(sums) {
		return fmt.Errorf("%w: %d bytes are %d blocks, %d checksums came with them", ErrMismatch, len(data), n, len(sums))
	}
	for i, off := 0, 0; off < len(data); i, off = i+1, off+BlockSize {
		if err := s.Verify(first+uint64(i), data[off:min(off+BlockSize, len(data))], sums[i]); err != nil {
			return err
		}
	}
	return nil
}
