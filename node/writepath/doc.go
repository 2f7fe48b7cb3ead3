// Package writepath is the order of one replicated write on the primary,
// as a pure step machine: which stage runs next (enter the extent in the
// activity log, hand the write to the peers, write the local disk, wait
// for the peers as the protocol says, count the lag, hold the lease) and
// what the write's outcome is, given what each stage reported. Node's
// write path (node/write.go) runs it on the request's goroutine, one
// stage after the other, doing each stage's I/O itself; the simulation
// (node/sim) runs the same machine over its model of disks and links,
// one stage per step in a seeded order, so that a crash can fall between
// any two stages. The rules of the order live here once: a change to
// them is a change to both.
//
// It imports nothing of the project and does no I/O; a Write is a value
// (no allocation), not safe for concurrent use.
package writepath
