package node

import (
	"sync/atomic"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// durableState is the volume's metadata and what it keeps on stable
// storage here, held by value in Volume (v.durable). The durable state the
// state machine steps (st.Durable, written through commit under v.stateMu)
// and the size (v.size) stay the Volume's. No lock of the volume guards
// these fields: md, integ, closeMD and sizeMax are set before the volume
// starts (newVolume, openVolume) and never change after; md, integ and
// localMissing take their own locks (metadata's, integ.listMu, the
// bitmap's); replicaMarked is atomic. Its methods use nothing else of the
// volume's: piece (write.go), buildSums (scrub.go).
type durableState struct {
	// md is the on-disk metadata: the peers' bitmaps and the activity log.
	md *metadata.MD
	// integ is the volume's checksums at rest here (integrity.go).
	integ *integrity
	// closeMD closes what openMD opened for md (its file or device).
	closeMD func() error
	// sizeMax: the file says size: max (size is what this node resolved).
	sizeMax bool
	// The local disk is detached (out of service after it failed: the
	// primary reads and writes through a peer) while st.Disk is
	// Diskless (detachedLocked). localMissing marks the blocks this disk
	// misses (st.Durable.LocalStale says so durably).
	localMissing *replication.Bitmap
	// replicaMarked: the replica indicator is on stable storage (set
	// before the first replicated write applied here; metadata.FlagReplica).
	replicaMarked atomic.Bool
	// primarySets counts the primary indicator's sets (a step's
	// SetIndicator, under v.stateMu): a step-down's clear, done off the
	// loop, clears it only if none came since it began (clearPrimary).
	primarySets atomic.Uint64
}
