// Package metadata is the on-disk metadata of each volume (OpenMD,
// CreateMD): a superblock with generation UUIDs, an activity log of hot
// 4 MiB extents, and one out-of-sync bitmap per peer covering the volume's
// size (MDOptions.VolumeSize), placed at the end of the backing device
// (internal) or in a separate file (external); with MDOptions.Checksums,
// also the block checksums at rest (format 2, Checksums, paged). layout.go
// documents the format byte by byte; MD.Grow grows it with its volume,
// online; MD.EnableChecksums gives format-1 metadata a checksum area
// (convert.go), before the metadata is shared.
//
// A node's bbolt files are in the packages below: statefile (state.db)
// and raftlog (raft.db). metadata itself imports only replication (and
// internal/blocksum and lockorder): not
// bbolt, raft, node, transport or web, so that config and replctl's
// offline commands link it alone. node and backing call it; MD,
// ActivityLog, PeerBitmap and Checksums are safe for concurrent use.
//
// Lock order (internal/lockorder's mutexes; go test -tags deadlock checks
// it), outermost first: an MD's growMu (a Grow), then the Checksums'
// flushMu, then each PeerBitmap's flushMu (a Grow's move takes every one,
// in md.bitmaps' order; a flush takes its own), then the MD's mu, then a
// PeerBitmap's mu or the Checksums' mu (each a leaf but for the device's
// lock: a page is read holding it). An
// ActivityLog's mu is taken under growMu (a Grow owns the log) and holds
// nothing of this package: the log releases it for its IO and its bitmap
// flushes. The device's own lock (internal/fault's or mdtest's, in tests)
// comes after all of them: the superblock is written under the MD's mu.
// UpdateSuperblock runs its caller's function under the MD's mu, which
// must take no lock.
package metadata
