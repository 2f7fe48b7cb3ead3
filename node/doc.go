// Package node runs one replvol node: its configuration, its state store,
// its volumes (the replicated IO path on the primary, the applier on a
// secondary), the NBD export, the replication and control servers and the
// web status page. Several Nodes may run in one process: nothing here is
// global. Node and Volume methods are safe for concurrent use.
package node
