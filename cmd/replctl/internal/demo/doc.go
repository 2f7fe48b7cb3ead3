// Package demo runs replctl demo's two nodes, alpha and beta, in the
// replctl process (Run), and waits through alpha's control socket for
// them to be in sync. It is the only part of replctl that imports node
// (and so raft, memberlist and bbolt); replctl's demo command calls it,
// once per process.
package demo
