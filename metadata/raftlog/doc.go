// Package raftlog is the cluster's raft log and stable state, raft.db (a
// bbolt file of its own), as hashicorp/raft's LogStore and StableStore.
// It imports raft, bbolt, metadata (its error classes) and statefile;
// node/cluster calls it. RaftStore is safe for concurrent use.
package raftlog
