// Command replctl is the operator's tool: it talks to any node's control
// API (status, events, primary, connect, disconnect, resync, verify, path,
// adjust, node), with the operator's certificate from --tls-dir or
// through a node's unix socket, mounts a volume's file system on its
// primary and unmounts it (mount, umount: internal/volmount, with the
// hidden mount-helper as the NBD client; mountclaim.go asks the primary
// for the volume's mount claim, so that it is mounted at most once),
// writes the cluster's
// certificates (certs init), creates a volume's metadata offline
// (create-md: package backing) and runs a local two-node demo (package
// internal/demo). One file per subcommand; errors.go puts failures in
// words, table.go lays out and colours tables. Client commands reach nodes
// only through package transport, and read the cluster file through
// package config: only internal/demo imports node, raft or memberlist, and
// only create-md's package backing bbolt (node/layering_test.go checks).
//
// Its one mutex (events.go: the writes of a watch to out and errOut) is
// a leaf.
package main
