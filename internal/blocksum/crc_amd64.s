//go:build amd64 && !purego

#include "textflag.h"

// foldConsts are the multipliers of the folding, each pair for one
// distance d in bits: x^(d+31) mod P for the low quadword of a 128-bit
// lane (the earlier, higher-degree half), x^(d-33) mod P for the high
// one, both 32-bit reflected values in the low half of their quadword.
// VPCLMULQDQ of a reflected quadword by a reflected 32-bit value gives
// the product times x^33 read as a reflected 128-bit lane, hence the
// -33 (and 64-33 = +31 for the half 64 bits earlier). The test computes
// them from the polynomial (TestFoldConstants).
DATA ·foldConsts+0(SB)/8, $0xdcb17aa4   // d = 2048: 256 bytes, the main loop
DATA ·foldConsts+8(SB)/8, $0xb9e02b86
DATA ·foldConsts+16(SB)/8, $0xa87ab8a8  // d = 1536: the first accumulator onto the last
DATA ·foldConsts+24(SB)/8, $0xab7aff2a
DATA ·foldConsts+32(SB)/8, $0x6992cea2  // d = 1024: the second
DATA ·foldConsts+40(SB)/8, $0x0d3b6092
DATA ·foldConsts+48(SB)/8, $0x740eef02  // d = 512: the third
DATA ·foldConsts+56(SB)/8, $0x9e4addf8
DATA ·foldConsts+64(SB)/8, $0x1c291d04  // d = 384: lane 0 of the last 64 bytes onto lane 3
DATA ·foldConsts+72(SB)/8, $0xddc0152b
DATA ·foldConsts+80(SB)/8, $0x3da6d0cb  // d = 256: lane 1
DATA ·foldConsts+88(SB)/8, $0xba4fc28e
DATA ·foldConsts+96(SB)/8, $0xf20c0dfe  // d = 128: lane 2
DATA ·foldConsts+104(SB)/8, $0x493c7d27
DATA ·foldConsts+112(SB)/8, $0          // lane 3 stays as it is
DATA ·foldConsts+120(SB)/8, $0
GLOBL ·foldConsts(SB), RODATA|NOPTR, $128

// func foldTable() *[16]uint64
TEXT ·foldTable(SB), NOSPLIT, $0-8
	LEAQ ·foldConsts(SB), AX
	MOVQ AX, ret+0(FP)
	RET

// func updateFold(crc uint32, p []byte) uint32
//
// crc32.Update(crc, Castagnoli, p) for len(p) a multiple of 256, at
// least 256. Four 512-bit accumulators take 256 bytes a step; each
// 128-bit lane of them is multiplied forward by x^2048 (mod P) and the
// next 256 bytes are added to it. At the end the four fold onto the
// last, its four lanes onto its last, and the 128-bit remainder R,
// congruent to the message (with ^crc added to its first 32 bits), goes
// through CRC32Q as two quadwords: CRC32Q computes c*x^64 + d*x^32 mod
// P, so CRC32Q(CRC32Q(0, R.lo), R.hi) is R*x^32 mod P, the CRC.
TEXT ·updateFold(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	NOTL AX

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4           // zeroes the rest of Z4
	VPXORD    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	JZ        reduce

	VBROADCASTI32X4 ·foldConsts+0(SB), Z4

loop:
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPCLMULQDQ $0x00, Z4, Z1, Z6
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPCLMULQDQ $0x00, Z4, Z2, Z7
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPCLMULQDQ $0x00, Z4, Z3, Z8
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VPTERNLOGD $0x96, 0(SI), Z5, Z0
	VPTERNLOGD $0x96, 64(SI), Z6, Z1
	VPTERNLOGD $0x96, 128(SI), Z7, Z2
	VPTERNLOGD $0x96, 192(SI), Z8, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	JNZ        loop

reduce:
	// Z0, Z1, Z2 onto Z3: 1536, 1024 and 512 bits forward.
	VBROADCASTI32X4 ·foldConsts+16(SB), Z4
	VBROADCASTI32X4 ·foldConsts+32(SB), Z5
	VBROADCASTI32X4 ·foldConsts+48(SB), Z6
	VPCLMULQDQ      $0x00, Z4, Z0, Z7
	VPCLMULQDQ      $0x11, Z4, Z0, Z0
	VPCLMULQDQ      $0x00, Z5, Z1, Z8
	VPCLMULQDQ      $0x11, Z5, Z1, Z1
	VPCLMULQDQ      $0x00, Z6, Z2, Z9
	VPCLMULQDQ      $0x11, Z6, Z2, Z2
	VPTERNLOGD      $0x96, Z7, Z0, Z3
	VPTERNLOGD      $0x96, Z9, Z2, Z8
	VPTERNLOGD      $0x96, Z8, Z1, Z3

	// The lanes of Z3: 0, 1, 2 forward by 384, 256, 128 bits (lane 3 by
	// a zero multiplier), then lane 3 itself, all added into one.
	VMOVDQU64     ·foldConsts+64(SB), Z4
	VPCLMULQDQ    $0x00, Z4, Z3, Z5
	VPCLMULQDQ    $0x11, Z4, Z3, Z6
	VEXTRACTI32X4 $3, Z3, X7   // zeroes the rest of Z7
	VPTERNLOGD    $0x96, Z7, Z6, Z5
	VEXTRACTI64X4 $1, Z5, Y6
	VPXOR         Y6, Y5, Y5
	VEXTRACTI128  $1, Y5, X6
	VPXOR         X6, X5, X5

	// 128 bits to the 32-bit CRC.
	VMOVQ   X5, BX
	VPEXTRQ $1, X5, DX
	XORL    AX, AX
	CRC32Q  BX, AX
	CRC32Q  DX, AX
	NOTL    AX
	VZEROUPPER
	MOVL    AX, ret+32(FP)
	RET
