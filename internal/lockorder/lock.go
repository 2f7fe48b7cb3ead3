//go:build !deadlock

package lockorder

import "sync"

// Mutex is sync.Mutex; a build with the deadlock tag checks its order.
type Mutex = sync.Mutex

// RWMutex is sync.RWMutex; a build with the deadlock tag checks its order.
type RWMutex = sync.RWMutex

// Checked says whether this build checks the lock order (the deadlock tag).
const Checked = false
