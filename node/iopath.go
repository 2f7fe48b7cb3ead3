package node

import (
	"sync"

	"github.com/replvol/replvol/replication"
)

// ioPath is the state of the volume's IO path, held by value in Volume
// (v.iopath): what the NBD reads, writes and flushes (volume.go, write.go,
// readbalance.go), the resync and scrub's reads and writes, and the waits
// for the IO in flight use. No lock of the volume guards these fields:
// locks and rb take their own (the range locks', rb.mu); io is added to
// under v.mu while the volume serves (enter), so that a wait that follows
// the serving's close (WaitIO, DrainIO, a switchover, shutdown) sees every
// IO admitted (the rest of a peer's ship that runs on after a write,
// peer.shipLater, is added while that write still counts).
type ioPath struct {
	// locks orders overlapping writes and resync reads.
	locks replication.RangeLocks
	// rb balances reads between the local disk and the peers.
	rb readBalancer
	// io is the IO in flight, which WaitIO and DrainIO wait for: each IO
	// enter admitted, and each peer's ship that runs on after its write
	// (peer.shipLater).
	io sync.WaitGroup
}
