//go:build !deadlock

package applier

import "sync"

// mutex is the stream's apply lock. A build with the deadlock tag
// (lock_deadlock.go) swaps in one that checks the lock order of package
// node's doc.go, which this lock is part of.
type mutex = sync.Mutex
