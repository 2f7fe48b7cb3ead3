//go:build amd64 && !purego

package blocksum

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// hasFold is whether this CPU runs updateFold: 512-bit carry-less
// multiplies (VPCLMULQDQ on zmm, AVX-512F and VL for the ternary XOR and
// the lane extracts), PCLMULQDQ and SSE4.2 (CRC32Q) for the end.
var hasFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ &&
	cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// update is crc32.Update(crc, castagnoli, p): by updateFold when the CPU
// has it and len(p) is a multiple of 256 (a block is), else by
// hash/crc32, whose three interleaved CRC32Q streams are half as fast
// on a 4 KiB block.
func update(crc uint32, p []byte) uint32 {
	if hasFold && len(p) >= foldStep && len(p)%foldStep == 0 {
		return updateFold(crc, p)
	}
	return crc32.Update(crc, castagnoli, p)
}

// foldStep is the bytes updateFold takes in one step, and the multiple
// of it len(p) must be.
const foldStep = 256

// updateFold is crc32.Update(crc, castagnoli, p) for len(p) a non-zero
// multiple of foldStep, on a CPU with hasFold (crc_amd64.s).
//
//go:noescape
func updateFold(crc uint32, p []byte) uint32

// foldTable is the assembly's table of multipliers, for the test that
// computes them again.
func foldTable() *[16]uint64
