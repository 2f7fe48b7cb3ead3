package node

import "github.com/replvol/replvol/internal/lockorder"

// mutex is every mutex of package node: internal/lockorder's, which a
// build with the deadlock tag swaps for one that checks the lock order of
// doc.go against every other mutex of the process.
type mutex = lockorder.Mutex
