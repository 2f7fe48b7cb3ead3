//go:build !amd64 || purego

package blocksum

import "hash/crc32"

// hasFold: there is no folding CRC but amd64's.
const hasFold = false

// update is crc32.Update(crc, castagnoli, p).
func update(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }
