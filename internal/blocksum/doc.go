// Package blocksum is the checksum of one 4 KiB block at rest (issue 29):
// CRC-32C (Castagnoli) over the block's bytes, seeded with the volume's
// UUID and the block's address, so that a block written to the wrong
// place, or read from another volume, fails as a flipped bit does. The
// primary computes it where a write enters, the secondary verifies it
// before it writes, and metadata stores it. It imports nothing of
// replvol; a Seed is immutable and safe for concurrent use.
package blocksum
