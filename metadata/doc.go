// Package metadata keeps a node's durable state. Two parts:
//
//   - Store, a bbolt file per node: per volume the epoch and primary it last
//     agreed to, its data generation, whether it shut down cleanly, and an
//     event history.
//   - The on-disk metadata of each volume (OpenMD, CreateMD): a superblock
//     with generation UUIDs, an activity log of hot 4 MiB extents, and one
//     out-of-sync bitmap per peer, placed at the end of the backing device
//     (internal) or in a separate file (external). layout.go documents the
//     format byte by byte.
//
// The replication IO path still keeps its bitmaps in memory and uses
// Store's clean-shutdown flag; wiring the on-disk metadata into it is the
// next step. Store, MD, ActivityLog and PeerBitmap are safe for concurrent
// use.
package metadata
