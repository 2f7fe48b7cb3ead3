package node

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/applier"
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
	// shared is the backing disk when the metadata is internal: one sync
	// of it makes the data and the checksum pages durable (syncData).
	shared io.WriterAt
	// repaired counts the blocks rewritten with a peer's copy, by cause.
	repaired [repairCauses]atomic.Int64

	// The bad-block list (badblocks.go): list is where it is durable
	// (the volume's metadata), dataSync syncs the data disk (a block
	// leaves the list only once what was written over it is durable),
	// badMax is the volume's bad_blocks_max.
	list     badBlockStore
	dataSync func() error
	badMax   int
	// size is the volume's size (its last block may be partial).
	size *atomic.Int64
	// listMu guards lost and every change of bad and durable; it is held
	// across the list's durable write, so only the metadata's mutexes
	// are taken under it.
	listMu mutex
	// lost are the blocks found bad here that no replica held good, until
	// a write covers them (clearLost); nLost is len(lost), read without
	// the lock by every write. As many of them as the list has room for
	// are durable too.
	lost  map[int64]struct{}
	nLost atomic.Int64
	// bad are the blocks that could not be rewritten, in order: never
	// read from this disk. Durable BEFORE they are published here; read
	// without the lock.
	bad atomic.Pointer[[]int64]
	// durable is the list the metadata holds, in block order.
	durable atomic.Pointer[[]metadata.BadBlock]

	// rooms are arrays for the sums of a large write, kept for reuse
	// (takeRoom, returnRoom): one allocated per write faulted pages in,
	// 7-18 us a 1 MiB write on a busy machine (docs/perf-gaps.md).
	rooms chan *sumsRoom
}

// sumsRoom holds the sums of a write of up to 1 MiB (what Linux's NBD
// client sends at most by default).
type sumsRoom [256]uint32

// keptRooms bounds the rooms kept for reuse: 1 KiB each, as many as a
// volume's writes of 1 MiB usually have in flight and more.
const keptRooms = 64

// takeRoom returns a room for the sums of a write, a kept one when there
// is one.
func (in *integrity) takeRoom() *sumsRoom {
	select {
	case r := <-in.rooms:
		return r
	default:
		return new(sumsRoom)
	}
}

// returnRoom keeps r for another write. Call it only once nothing reads
// the sums in r any more: when the write's last hold is released
// (countdown.Done), every peer's entry has completed.
func (in *integrity) returnRoom(r *sumsRoom) {
	select {
	case in.rooms <- r:
	default:
	}
}

// markLost records block b as bad here with no good copy anywhere, in
// the durable list too while it has room; added is false when it was
// lost already. An error says that could not be written (the block is
// counted all the same).
func (in *integrity) markLost(b int64) (added bool, err error) {
	in.listMu.Lock()
	defer in.listMu.Unlock()
	if in.lost == nil {
		in.lost = map[int64]struct{}{}
	}
	_, had := in.lost[b]
	in.lost[b] = struct{}{}
	in.nLost.Store(int64(len(in.lost)))
	return !had, in.persistLocked(*in.bad.Load())
}

// isLost reports whether block b is lost here: a read of it is served
// from a replica that holds it good, or fails, whatever its data and
// stored sum say (a resync target's older copy may match its own older
// sum).
func (in *integrity) isLost(b int64) bool {
	if in.nLost.Load() == 0 {
		return false
	}
	in.listMu.Lock()
	defer in.listMu.Unlock()
	_, ok := in.lost[b]
	return ok
}

// clearLost forgets the lost blocks [off, off+length) touches: a write
// put new data there. (They leave the durable list at unlist, once that
// data is durable.)
func (in *integrity) clearLost(off, length int64) {
	if in.nLost.Load() == 0 || length <= 0 {
		return
	}
	in.listMu.Lock()
	defer in.listMu.Unlock()
	first, last := off/blocksum.BlockSize, (off+length-1)/blocksum.BlockSize
	if last-first+1 < int64(len(in.lost)) {
		for b := first; b <= last; b++ {
			delete(in.lost, b)
		}
	} else {
		for b := range in.lost {
			if b >= first && b <= last {
				delete(in.lost, b)
			}
		}
	}
	in.nLost.Store(int64(len(in.lost)))
}

// lostIn returns the first lost block [off, off+length) touches.
func (in *integrity) lostIn(off, length int64) (int64, bool) {
	if in.nLost.Load() == 0 || length <= 0 {
		return 0, false
	}
	in.listMu.Lock()
	defer in.listMu.Unlock()
	first, last := off/blocksum.BlockSize, (off+length-1)/blocksum.BlockSize
	found, ok := int64(0), false
	for b := range in.lost {
		if b >= first && b <= last && (!ok || b < found) {
			found, ok = b, true
		}
	}
	return found, ok
}

// unrecoverable is how many blocks are lost now.
func (in *integrity) unrecoverable() int64 { return in.nLost.Load() }

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

// newIntegrity is the integrity of a volume whose metadata is md, on
// disk; badMax is its bad_blocks_max.
func newIntegrity(md *metadata.MD, volume metadata.VolumeUUID, disk Disk, badMax int) *integrity {
	in := &integrity{seed: blocksum.NewSeed(volume), list: md, dataSync: disk.Sync, badMax: badMax,
		rooms: make(chan *sumsRoom, keptRooms)}
	if sums, ok := md.Checksums(); ok {
		in.sums = sums
		if md.Placement() == metadata.Internal {
			in.shared = disk
		}
	}
	in.loadList(md.BadBlocks())
	return in
}

// syncData makes the data written so far and its sums durable: sync
// syncs the data; with internal metadata the changed checksum pages are
// written first and that one sync covers both (metadata's FlushVia),
// otherwise they are written and synced after it.
func (in *integrity) syncData(sync func() error) error {
	switch {
	case in.sums == nil:
		return sync()
	case in.shared != nil:
		return in.sums.FlushVia(in.shared, sync)
	}
	if err := sync(); err != nil {
		return err
	}
	return in.sums.Flush()
}

// on reports whether the volume keeps checksums here.
func (in *integrity) on() bool { return in.sums != nil }

// status is the integrity part of the volume's status.
func (in *integrity) status() *transport.IntegrityStatus {
	return &transport.IntegrityStatus{
		Checksums:           in.on(),
		RepairedBlocks:      in.repaired[repairChecksum].Load() + in.repaired[repairReadError].Load(),
		UnrecoverableBlocks: in.unrecoverable(),
		BadBlocks:           in.badBlocks(),
		// No scrub yet: always idle.
		Scrub: transport.ScrubStatus{State: "idle"},
	}
}

// sumsOf appends to dst the checksums of data, to be written at off, and
// returns them; nil when the volume keeps none here, or when [off,
// off+len(data)) is not whole blocks (a write of part of a block: the
// block's other bytes are not at hand, so its sum is forgotten instead).
// The last block of a volume whose size is not a multiple of 4 KiB is
// whole when data ends at the volume's end. One pass over data, and no
// allocation when dst has room.
func (in *integrity) sumsOf(dst []uint32, off int64, data []byte, volume int64) []uint32 {
	if in.sums == nil || !wholeBlocks(off, int64(len(data)), volume) {
		return nil
	}
	return in.seed.Sums(dst, uint64(off/blocksum.BlockSize), data)
}

// wholeBlocks reports whether [off, off+length) covers whole blocks of a
// volume of volume bytes.
func wholeBlocks(off, length, volume int64) bool {
	end := off + length
	return length > 0 && off%blocksum.BlockSize == 0 && (end%blocksum.BlockSize == 0 || end == volume)
}

// written records what a write of [off, off+length) left on the disk:
// sums, the checksums of its blocks, or, without them (a trim, zeroes, a
// write of part of a block), no known sum for the blocks it touched; the
// blocks it touched are no longer lost, and those it covers whole leave
// the bad-block list (unlist: the data is synced first). Call
// it once the write is on the disk and BEFORE its activity-log Done, so
// that a crash before the sums are durable rebuilds them
// (metadata.MD.RebuildActivityLogChecksums).
func (in *integrity) written(off, length int64, sums []uint32) error {
	in.clearLost(off, length)
	if in.sums != nil {
		var err error
		if sums != nil {
			err = in.sums.SetRange(off/blocksum.BlockSize, sums)
		} else {
			err = in.sums.Forget(off, length)
		}
		if err != nil {
			return err
		}
	}
	return in.unlist(off, length)
}

// flush makes the checksums stored so far durable. Call it once the data
// they describe is synced: at a FLUSH, and BEFORE the primary indicator
// is cleared (after which a crash rebuilds none of them).
func (in *integrity) flush() error {
	if in.sums == nil {
		return nil
	}
	return in.sums.Flush()
}

// applierSums is the volume's checksums as one stream's applier keeps
// them (applier.Checksums); scratch holds the sums computed for entries
// that carried none, reused entry after entry (one goroutine applies).
type applierSums struct {
	v       *Volume
	in      *integrity
	size    *atomic.Int64
	scratch []uint32
}

// applierChecksums is what a stream's applier keeps and verifies
// checksums through: a volume that keeps none here still verifies the
// blocks that come with them.
func (v *Volume) applierChecksums() applier.Checksums {
	return &applierSums{v: v, in: v.durable.integ, size: &v.size}
}

func (a *applierSums) Verify(off int64, data []byte, sums []uint32) error {
	return a.in.seed.VerifyAll(uint64(off/blocksum.BlockSize), data, sums)
}

func (a *applierSums) Written(off, length int64, data []byte, sums []uint32) error {
	if !a.in.on() {
		return a.in.written(off, length, nil)
	}
	if sums == nil && data != nil {
		a.scratch = a.in.sumsOf(a.scratch[:0], off, data, a.size.Load())
		sums = a.scratch
	}
	return a.in.written(off, length, sums)
}

func (a *applierSums) Sync(syncData func() error) error { return a.in.syncData(syncData) }

// flushRange makes the sums of the blocks [off, off+length) touches
// durable (a FUA write's, once its data is).
func (in *integrity) flushRange(off, length int64) error {
	if in.sums == nil {
		return nil
	}
	_, err := in.sums.FlushRange(off, length)
	return err
}

// Listed: a block on the bad-block list is never read from this disk,
// nor is a lost one (its data is no good copy, though it may match an
// older sum of its own): the primary takes them elsewhere.
func (a *applierSums) Listed(off, length int64) bool {
	if a.in.listedIn(off, length) {
		return true
	}
	_, lost := a.in.lostIn(off, length)
	return lost
}

// Lost records what a resync source held back as unrecoverable
// (OpResyncLost): each block of [off, off+length) is lost here too, as
// integrity.markLost records a block found so here, durably (while the
// list has room) BEFORE the entry is acknowledged; the event
// block-unrecoverable names the range once, not at each retry of the
// resync. A write to the range clears it (written).
func (a *applierSums) Lost(off, length int64) error {
	v, size := a.v, a.size.Load()
	if off < 0 || length <= 0 || off+length > size || off%blocksum.BlockSize != 0 {
		return fmt.Errorf("unrecoverable range [%d, +%d) is not whole blocks of the volume", off, length)
	}
	added := false
	for b := off / blocksum.BlockSize; b*blocksum.BlockSize < off+length; b++ {
		fresh, err := a.in.markLost(b)
		if err != nil {
			return fmt.Errorf("record the unrecoverable block at byte %d: %w", b*blocksum.BlockSize, err)
		}
		added = added || fresh
	}
	if !added {
		return nil
	}
	from := ""
	if in := v.incomingStream(); in != nil {
		from = in.From()
	}
	msg := fmt.Sprintf("the range at byte %d (%d bytes) of %s on %s is unrecoverable: the resync source %s holds it bad and no replica in sync holds a good copy, so %s keeps no good copy either: reads of it fail with EIO. Write the range again (from a backup, or what the application knows) to clear it",
		off, length, v.name, v.self, from, v.self)
	v.log.Error(msg)
	v.node.emit(statefile.Event{Volume: v.name, Kind: "block-unrecoverable", Peer: from, Reason: string(CauseSourceUnrecoverable), Offset: off, Length: length, Message: msg})
	return nil
}

func (a *applierSums) Check(off int64, data []byte) error {
	return a.in.check(off, data, a.size.Load())
}

// firstBad is the first block of data, read from the disk at off, that
// is lost here or that it covers whole and fails its known sum; ok false
// when there is none (a sum that cannot be read counts as a bad block:
// nothing is taken for good unchecked).
func (in *integrity) firstBad(off int64, data []byte, size int64) (b int64, ok bool) {
	if in.sums == nil || len(data) == 0 {
		return 0, false
	}
	first := off / blocksum.BlockSize
	if lb, lost := in.lostIn(off, int64(len(data))); lost {
		if err := in.check(off, data[:min(int64(len(data)), lb*blocksum.BlockSize-off)], size); err == nil {
			return lb, true
		}
	}
	end := off + int64(len(data))
	for b := first; b*blocksum.BlockSize < end; b += sumsChunk {
		boff := b * blocksum.BlockSize
		chunk := data[boff-off : min(end, boff+sumsChunk*blocksum.BlockSize)-off]
		if err := in.check(boff, chunk, size); err != nil {
			for k := b; k*blocksum.BlockSize < boff+int64(len(chunk)); k++ {
				koff, klen := blockSpan(k, size)
				if in.check(koff, data[koff-off:min(end, koff+klen)-off], size) != nil {
					return k, true
				}
			}
			return b, true
		}
	}
	return 0, false
}

// check verifies the blocks of data, read from the disk at off, that it
// covers whole and that have a known sum; it returns the first mismatch.
func (in *integrity) check(off int64, data []byte, size int64) error {
	if in.sums == nil || len(data) == 0 {
		return nil
	}
	end := off + int64(len(data))
	var sums [sumsChunk]uint32
	var known [sumsChunk]bool
	first, last := off/blocksum.BlockSize, (end-1)/blocksum.BlockSize
	for b0 := first; b0 <= last; b0 += sumsChunk {
		n := min(int64(sumsChunk), last-b0+1)
		if err := in.sums.GetRange(b0, sums[:n], known[:n]); err != nil {
			return err
		}
		for k := range n {
			boff, blen := blockSpan(b0+k, size)
			if !known[k] || boff < off || boff+blen > end {
				continue
			}
			if err := in.seed.Verify(uint64(b0+k), data[boff-off:boff-off+blen], sums[k]); err != nil {
				return err
			}
		}
	}
	return nil
}
