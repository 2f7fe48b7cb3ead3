// Package statefile is a node's state file, state.db (bbolt): per volume
// the epoch and primary it last agreed to, its data generation, whether it
// shut down cleanly, and an event history. It imports bbolt and
// replication, never raft, memberlist or node. node calls it, and backing
// (replctl create-md, offline); raftlog shares its OpenBolt. Store is safe
// for concurrent use.
package statefile
