// Package metadata keeps a node's durable state. Three parts:
//
//   - Store, a bbolt file per node (state.db): per volume the epoch and
//     primary it last agreed to, its data generation, whether it shut down
//     cleanly, and an event history.
//   - RaftStore, a second bbolt file per node (raft.db): the cluster's raft
//     log and stable state, as hashicorp/raft's LogStore and StableStore.
//   - The on-disk metadata of each volume (OpenMD, CreateMD): a superblock
//     with generation UUIDs, an activity log of hot 4 MiB extents, and one
//     out-of-sync bitmap per peer covering the volume's size
//     (MDOptions.VolumeSize), placed at the end of the backing device
//     (internal) or in a separate file (external). layout.go documents the
//     format byte by byte; MD.Grow grows it with its volume, online.
//
// It must not import node, transport or web. Store, RaftStore, MD,
// ActivityLog and PeerBitmap are safe for concurrent use.
package metadata
