//go:build deadlock

package lockorder

import deadlock "github.com/sasha-s/go-deadlock"

// Mutex is, in a build with the deadlock tag, a mutex whose order against
// every other mutex of the process is recorded; the first inversion fails
// the process.
type Mutex = deadlock.Mutex

// RWMutex is Mutex's reader/writer kind.
type RWMutex = deadlock.RWMutex

// Checked says whether this build checks the lock order (the deadlock tag).
const Checked = true

func init() {
	// Only the order is checked: a mutex waited on for long (a slow disk
	// under a volume's state lock) is not a deadlock.
	deadlock.Opts.DeadlockTimeout = 0
}
