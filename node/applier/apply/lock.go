package apply

import "github.com/replvol/replvol/internal/lockorder"

// mutex is the stream's apply lock: internal/lockorder's, which a build
// with the deadlock tag swaps for one that checks its order with package
// node's mutexes (node's doc.go), whose order it is part of.
type mutex = lockorder.Mutex
