// Package metadata is the on-disk metadata of each volume (OpenMD,
// CreateMD): a superblock with generation UUIDs, an activity log of hot
// 4 MiB extents, and one out-of-sync bitmap per peer covering the volume's
// size (MDOptions.VolumeSize), placed at the end of the backing device
// (internal) or in a separate file (external). layout.go documents the
// format byte by byte; MD.Grow grows it with its volume, online.
//
// A node's bbolt files are in the packages below: statefile (state.db)
// and raftlog (raft.db). metadata itself imports only replication: not
// bbolt, raft, node, transport or web, so that config and replctl's
// offline commands link it alone. node and backing call it; MD,
// ActivityLog and PeerBitmap are safe for concurrent use.
package metadata
