package replication

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Generation identifies a lineage of data (DRBD's generation UUID). Two
// disks with the same current generation hold the same data at a flush
// boundary. The zero Generation means "no consistent data".
type Generation [16]byte

// NewGeneration returns a fresh random generation.
func NewGeneration() Generation {
	var g Generation
	if _, err := rand.Read(g[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return g
}

// IsZero reports whether g is the "no consistent data" generation.
func (g Generation) IsZero() bool { return g == Generation{} }

// String renders g as 16 hex digits, the way logs and status show it.
func (g Generation) String() string {
	if g.IsZero() {
		return "0000000000000000"
	}
	return hex.EncodeToString(g[:8])
}

// MarshalText renders the full generation for JSON and bbolt.
func (g Generation) MarshalText() ([]byte, error) {
	return []byte(hex.EncodeToString(g[:])), nil
}

// UnmarshalText parses what MarshalText wrote.
func (g *Generation) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*g = Generation{}
		return nil
	}
	if len(b) != 32 {
		return fmt.Errorf("generation %q: want 32 hex digits", b)
	}
	_, err := hex.Decode(g[:], b)
	return err
}
