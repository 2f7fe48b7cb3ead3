package node

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// The bad-block list (docs/integrity.md): a block whose good copy, taken
// from a peer, could not be written back over it is listed in the
// volume's metadata, durably BEFORE the read that found it returns, and
// never read from this disk again: reads of it go to a peer in sync (EIO
// when none is), a scrub skips it. A write that covers it whole and
// succeeds takes it off, once that write is durable; one that fails
// detaches the disk, as any failed write does. The disk is detached
// instead of listing the block when the list holds bad_blocks_max
// blocks already (reason bad-blocks-full). The blocks found unrecoverable
// (lost) are kept in the same list while it has room, so that a restart
// still counts them.

// errBadBlockListFull: a block could not be rewritten and the bad-block
// list holds bad_blocks_max blocks already: the disk is detached instead.
var errBadBlockListFull = errors.New("the bad-block list is full (bad_blocks_max)")

// listReason is the typed reason of the events of the bad-block list.
type listReason string

const (
	// reasonWriteBackFailed: the good copy of a block could not be
	// written over it (event bad-block).
	reasonWriteBackFailed listReason = "write-back-failed"
	// reasonBadBlocksFull: the disk was detached because the list was
	// full (event detached).
	reasonBadBlocksFull listReason = "bad-blocks-full"
	// reasonIOError: the disk was detached after an IO error (event
	// detached).
	reasonIOError listReason = "io-error"
)

// badBlockStore is where the list is durable: the volume's metadata
// (metadata.MD).
type badBlockStore interface {
	BadBlocks() []metadata.BadBlock
	SetBadBlocks([]metadata.BadBlock) error
}

// loadList takes the list the metadata holds at open.
func (in *integrity) loadList(list []metadata.BadBlock) {
	bad := []int64{}
	for _, e := range list {
		if e.Kind == metadata.BadBlockLost {
			if in.lost == nil {
				in.lost = map[int64]struct{}{}
			}
			in.lost[e.Block] = struct{}{}
			continue
		}
		bad = append(bad, e.Block)
	}
	in.nLost.Store(int64(len(in.lost)))
	in.bad.Store(&bad)
	in.durable.Store(&list)
}

// badBlocks is the length of the bad-block list (status bad_blocks).
func (in *integrity) badBlocks() int64 { return int64(len(*in.bad.Load())) }

// lostRoom is how many lost blocks the durable list keeps: what
// bad_blocks_max leaves of what the metadata holds.
func (in *integrity) lostRoom() int { return max(0, metadata.MaxBadBlocks-in.badMax) }

// desiredLocked is the list the metadata should hold with bad as the bad
// blocks: each of them, and the lost blocks lowest first while there is
// room. Callers hold in.listMu.
func (in *integrity) desiredLocked(bad []int64) []metadata.BadBlock {
	lost := make([]int64, 0, len(in.lost))
	for b := range in.lost {
		lost = append(lost, b)
	}
	slices.Sort(lost)
	lost = lost[:min(len(lost), in.lostRoom())]
	out := make([]metadata.BadBlock, 0, len(bad)+len(lost))
	for _, b := range bad {
		out = append(out, metadata.BadBlock{Block: b, Kind: metadata.BadBlockUnwritable})
	}
	for _, b := range lost {
		if _, listed := slices.BinarySearch(bad, b); !listed {
			out = append(out, metadata.BadBlock{Block: b, Kind: metadata.BadBlockLost})
		}
	}
	slices.SortFunc(out, func(x, y metadata.BadBlock) int { return int(x.Block - y.Block) })
	return out
}

// persistLocked makes the metadata hold the list of bad (and the lost
// blocks), durably, and only then publishes bad; nothing changes when it
// fails. Callers hold in.listMu.
func (in *integrity) persistLocked(bad []int64) error {
	want := in.desiredLocked(bad)
	if !slices.Equal(want, *in.durable.Load()) {
		if err := in.list.SetBadBlocks(want); err != nil {
			return fmt.Errorf("write the bad-block list: %w", err)
		}
		in.durable.Store(&want)
	}
	in.bad.Store(&bad)
	return nil
}

// listBad puts block b on the bad-block list, durably BEFORE it returns;
// added is false when it was listed already. errBadBlockListFull when
// the list holds bad_blocks_max blocks: nothing changes.
func (in *integrity) listBad(b int64) (added bool, err error) {
	in.listMu.Lock()
	defer in.listMu.Unlock()
	cur := *in.bad.Load()
	i, found := slices.BinarySearch(cur, b)
	if found {
		return false, nil
	}
	if len(cur) >= in.badMax {
		return false, fmt.Errorf("%w: it holds %d blocks", errBadBlockListFull, len(cur))
	}
	return true, in.persistLocked(slices.Insert(slices.Clone(cur), i, b))
}

// listedIn reports whether [off, off+length) touches a block on the
// bad-block list: that range is not read from this disk.
func (in *integrity) listedIn(off, length int64) bool {
	bad := *in.bad.Load()
	if len(bad) == 0 || length <= 0 {
		return false
	}
	first := off / blocksum.BlockSize
	i, _ := slices.BinarySearch(bad, first)
	return i < len(bad) && bad[i] <= (off+length-1)/blocksum.BlockSize
}

// touchesDurable reports whether [off, off+length) touches a block the
// metadata lists (bad or lost).
func (in *integrity) touchesDurable(off, length int64) bool {
	list := *in.durable.Load()
	if len(list) == 0 || length <= 0 {
		return false
	}
	first := off / blocksum.BlockSize
	i := sort.Search(len(list), func(i int) bool { return list[i].Block >= first })
	return i < len(list) && list[i].Block <= (off+length-1)/blocksum.BlockSize
}

// unlist takes off the list what a write of [off, off+length), on the
// disk now, put new data in: the bad blocks it covers whole, and the
// lost blocks it touched (clearLost forgot them already). THE DATA IS
// SYNCED FIRST: a block leaves the list only once what was written over
// it is durable, so a power loss never leaves the old, bad block off
// the list. An error is the sync's or the list's write: the write
// failed, and the blocks stay listed.
func (in *integrity) unlist(off, length int64) error {
	if !in.touchesDurable(off, length) {
		return nil
	}
	in.listMu.Lock()
	defer in.listMu.Unlock()
	cur := *in.bad.Load()
	next := make([]int64, 0, len(cur))
	size := in.size.Load()
	for _, b := range cur {
		if boff, blen := blockSpan(b, size); boff < off || boff+blen > off+length {
			next = append(next, b)
		}
	}
	if slices.Equal(in.desiredLocked(next), *in.durable.Load()) {
		return nil
	}
	if err := in.syncData(in.dataSync); err != nil {
		return fmt.Errorf("sync the data before it leaves the bad-block list: %w", err)
	}
	return in.persistLocked(next)
}

// unlistedRuns is [off, off+length) less the blocks on the bad-block
// list, as runs of [off, end).
func (in *integrity) unlistedRuns(off, length int64) [][2]int64 {
	end := off + length
	var runs [][2]int64
	for _, b := range *in.bad.Load() {
		boff := b * blocksum.BlockSize
		if boff+blocksum.BlockSize <= off || boff >= end {
			continue
		}
		if boff > off {
			runs = append(runs, [2]int64{off, boff})
		}
		off = min(end, boff+blocksum.BlockSize)
	}
	if off < end {
		runs = append(runs, [2]int64{off, end})
	}
	return runs
}

// listBadBlock handles a block whose good copy (from) could not be
// written back over it (werr): it goes on the bad-block list, durably,
// with an event bad-block, and is served from a peer from then on. When
// the list is full, or cannot be written, the disk is detached instead,
// as a failed write detaches it.
func (v *Volume) listBadBlock(b, boff, blen int64, from string, cause repairCause, werr error) {
	added, err := v.durable.integ.listBad(b)
	if err == nil {
		if added {
			msg := fmt.Sprintf("the block at byte %d (%d bytes) of %s on %s could not be rewritten with %s's good copy (%s: %v): it is on the bad-block list (%d of bad_blocks_max %d) and read from a peer in sync from now on; a write over it that succeeds takes it off",
				boff, blen, v.name, v.self, from, cause, werr, v.durable.integ.badBlocks(), v.durable.integ.badMax)
			v.log.Warn(msg)
			v.node.emit(statefile.Event{Volume: v.name, Kind: "bad-block", Peer: from, Reason: string(reasonWriteBackFailed), Offset: boff, Length: blen, Message: msg})
		}
		return
	}
	f := diskFailure{op: diskWrite, off: boff, length: blen, err: werr}
	if errors.Is(err, errBadBlockListFull) {
		f.err = fmt.Errorf("%w; the block at byte %d could not be rewritten: %w", err, boff, werr)
	} else {
		v.log.Error("cannot list a block that could not be rewritten: the disk is detached, as for a failed write", "off", boff, "err", err)
	}
	if v.state().role() != replication.Primary {
		v.failReplica(f)
		return
	}
	if !v.detach(f, boff, blen) {
		v.log.Error("a block could not be rewritten nor listed, and the disk cannot be detached here", "off", boff, "err", f.err)
	}
}

// failReplica detaches a secondary's disk as a failed replicated write
// does (appliedState.Failed): the disk is Failed, and the next batch of
// the primary's stream fails with it, applying nothing, so the primary
// counts this node out of sync from then on (reason disk-failed), marks
// what it sends, and resyncs it once the disk takes writes again. The
// event detached gives f's reason (bad-blocks-full).
func (v *Volume) failReplica(f diskFailure) {
	why := because(CauseDiskFailed, "%s detached its disk (%v): the primary counts it out of sync, and resyncs it once the disk takes writes again", v.self, f)
	if err := v.drive(volstate.ReplicaWriteFailed{}, driveOptions{texts: func(volstate.Cause) reason { return why }}); err != nil {
		v.log.Error("record the failed disk", "err", err)
	}
	v.mu.Lock()
	in := v.incoming
	v.mu.Unlock()
	if in != nil {
		in.Fail(f)
	}
	v.log.Error("local disk detached", "cause", f.Error())
	v.node.emit(statefile.Event{Volume: v.name, Kind: "detached", Reason: string(f.reason()),
		Message: fmt.Sprintf("%s detached its disk (%v); its primary counts it out of sync until a resync", v.self, f)})
}

// reason is the typed reason of the detached event of f.
func (f diskFailure) reason() listReason {
	if errors.Is(f.err, errBadBlockListFull) {
		return reasonBadBlocksFull
	}
	return reasonIOError
}
