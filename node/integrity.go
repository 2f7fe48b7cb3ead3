package node

import (
	"sync/atomic"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
)

// integrity is a volume's checksums at rest as this node keeps them
// (docs/integrity.md): the store in its metadata, the volume's seed, and
// what verified reads found. sums is nil when the metadata has no
// checksum area (format 1: made before checksums, or with checksums:
// off): then nothing is computed, stored or verified.
type integrity struct {
	sums *metadata.Checksums
	seed blocksum.Seed
	// repaired counts the blocks rewritten with a peer's copy, by cause;
	// unrecoverable those no peer held good.
	repaired      [repairCauses]atomic.Int64
	unrecoverable atomic.Int64
}

// repairCause is why a block read here was taken from a peer.
type repairCause int

const (
	// repairChecksum: the block did not match its checksum.
	repairChecksum repairCause = iota
	// repairReadError: the disk failed to read it (EIO).
	repairReadError
	repairCauses
)

// String is the cause's word in the block-repaired event and the metric.
func (c repairCause) String() string {
	if c == repairReadError {
		return "read-error"
	}
	return "checksum"
}

func newIntegrity(md *metadata.MD, volume metadata.VolumeUUID) *integrity {
	in := &integrity{seed: blocksum.NewSeed(volume)}
	if sums, ok := md.Checksums(); ok {
		in.sums = sums
	}
	return in
}

// on reports whether the volume keeps checksums here.
func (in *integrity) on() bool { return in.sums != nil }

// status is the integrity part of the volume's status.
func (in *integrity) status() *transport.IntegrityStatus {
	return &transport.IntegrityStatus{
		Checksums:           in.on(),
		RepairedBlocks:      in.repaired[repairChecksum].Load() + in.repaired[repairReadError].Load(),
		UnrecoverableBlocks: in.unrecoverable.Load(),
		// No scrub yet: always idle.
		Scrub: transport.ScrubStatus{State: "idle"},
	}
}
