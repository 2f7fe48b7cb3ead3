//go:build !deadlock

package node

import "sync"

// mutex is every mutex of package node. A build with the deadlock tag
// (lock_deadlock.go) swaps in one that checks the lock order of doc.go.
type mutex = sync.Mutex
