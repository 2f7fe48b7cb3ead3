//go:build deadlock

package node

import deadlock "github.com/sasha-s/go-deadlock"

// mutex is, in a build with the deadlock tag, a mutex that records the
// order in which goroutines take node's mutexes and fails the process at
// the first inversion (make test-locks).
type mutex = deadlock.Mutex

func init() {
	// Only the order is checked: a mutex waited on for long (a slow disk
	// under stateMu) is not a deadlock.
	deadlock.Opts.DeadlockTimeout = 0
}
