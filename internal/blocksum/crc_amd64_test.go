//go:build amd64 && !purego

package blocksum

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// xPowMod is x^n mod P, P the Castagnoli polynomial, in the reflected
// form (bit 31-j the coefficient of x^j): multiplying by x is a shift
// right, and x^32 is P's other terms, 0x82F63B78.
func xPowMod(n int) uint32 {
	r := uint32(1 << 31) // x^0
	for range n {
		if r&1 != 0 {
			r = r>>1 ^ 0x82F63B78
		} else {
			r >>= 1
		}
	}
	return r
}

// TestFoldConstants computes the assembly's multipliers from the
// polynomial: for a fold over d bits, x^(d+31) mod P for a lane's low
// quadword and x^(d-33) mod P for its high one (VPCLMULQDQ of reflected
// operands of 64 and 32 bits yields the product times x^33).
func TestFoldConstants(t *testing.T) {
	// xPowMod itself, by hash/crc32: from the state 0 (crc ^0 before
	// its inversion), a 1 bit then 8L-1 zero bits is x^(8L-1), whose CRC
	// is x^(8L-1) * x^32 mod P.
	for _, l := range []int{1, 2, 8, 100, 300} {
		msg := make([]byte, l)
		msg[0] = 1
		if got, want := xPowMod(8*l+31), ^crc32.Update(0xffffffff, castagnoli, msg); got != want {
			t.Fatalf("x^%d mod P = %08x, by hash/crc32 %08x", 8*l+31, got, want)
		}
	}
	var want [16]uint64
	for i, d := range []int{2048, 1536, 1024, 512, 384, 256, 128} {
		want[2*i] = uint64(xPowMod(d + 31))
		want[2*i+1] = uint64(xPowMod(d - 33))
	}
	if got := foldTable(); *got != want {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("foldConsts[%d] = %#08x, want %#08x", i, got[i], want[i])
			}
		}
	}
}

// TestUpdateFold calls the assembly directly, whatever update chooses
// (on a CPU that has it).
func TestUpdateFold(t *testing.T) {
	if !hasFold {
		t.Skip("this CPU lacks AVX-512 VPCLMULQDQ: update is hash/crc32")
	}
	r := rand.New(rand.NewPCG(19, 20))
	buf := randomBlock(r, 64<<10)
	for n := 256; n <= len(buf); n += 256 {
		crc := r.Uint32()
		if got, want := updateFold(crc, buf[:n]), crc32.Update(crc, castagnoli, buf[:n]); got != want {
			t.Fatalf("%d bytes, crc %08x: updateFold = %08x, crc32.Update = %08x", n, crc, got, want)
		}
	}
}
