//go:build deadlock

package applier

import deadlock "github.com/sasha-s/go-deadlock"

// mutex is, in a build with the deadlock tag, a mutex that records the
// order in which goroutines take it and package node's mutexes (one
// detector for the process) and fails the process at the first inversion
// (make test-locks).
type mutex = deadlock.Mutex

func init() {
	// Only the order is checked: a batch applied for long (a slow disk)
	// is not a deadlock.
	deadlock.Opts.DeadlockTimeout = 0
}
