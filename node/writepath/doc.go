// Package writepath is the order of one replicated write on the primary,
// as a pure step machine: which stage runs next (enter the extent in the
// activity log, hand the write to the peers, write the local disk, wait
// for the peers as the protocol says, count the lag, hold the lease) and
// what the write's outcome is, given what each stage reported. Node's
// write path (node/write.go) runs it on the request's goroutine, one
// stage after the other, doing each stage's I/O itself; the simulation
// (node/sim) runs the same machine over its model of disks and links,
// one stage per step in a seeded order, so that a crash can fall between
// any two stages. Within the Ship stage, Peer is one peer's part: the
// entry goes to its stream, or the peer that misses it is tracked
// durably, THEN its blocks are marked, BEFORE its part settles; node's
// submit (node/submit.go) and the simulation run it too. The rules of the
// order live here once: a change to them is a change to both.
//
// It imports nothing of the project and does no I/O; a Write and a Peer
// are values (no allocation), not safe for concurrent use.
package writepath
