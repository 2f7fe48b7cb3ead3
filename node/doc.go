// Package node runs one replvol node: its configuration, its state store,
// its volumes (the replicated IO path on the primary, the applier on a
// secondary), the NBD export, the replication and control servers and the
// web status page. Several Nodes may run in one process: nothing here is
// global. Node and Volume methods are safe for concurrent use.
//
// A primary dials each peer (peer.go). The handshake (handshake.go) sends
// both nodes' generation sets; replication.CompareUUIDs decides, and the
// primary then streams writes and either resyncs the blocks its bitmap
// marks (SyncSource), copies from the peer what it lacks (SyncTarget,
// reading those blocks from the peer meanwhile), or refuses (split brain,
// unrelated data). A secondary (secondary.go) applies the stream in order;
// an old primary reached by a primary of a newer epoch steps down when
// nothing is lost by following it.
//
// Lock order: v.genMu, then p.mu, then v.mu; p.mu is never taken while
// v.mu is held.
package node
