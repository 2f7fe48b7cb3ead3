package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/applier"
	"github.com/replvol/replvol/replication"
)

// Verified reads that heal (docs/integrity.md): every block an NBD read
// takes from the local disk is checked against its stored checksum (a
// block without a known sum is not). A block that fails it, or that the
// disk cannot read, is read from a peer in sync (which checks it with its
// own sums, and this node with its own when it has one), handed to the
// client, and written back over the bad block, BEFORE the read returns:
// the client sees neither an error nor wrong data. When no peer holds a
// good copy, the read fails with EIO and the block is named in an event.

// errUnrecoverable: a block read here is bad and no peer holds a good
// copy of it.
var errUnrecoverable = errors.New("a block is bad on this disk and no peer holds a good copy")

// maxRepairsPerRead bounds the blocks one read repairs one by one: a
// disk that fails more than that in one read is taken for failed (the
// detach path), not repaired block by block.
const maxRepairsPerRead = 64

// sumsChunk is how many blocks' sums a verified read looks up at once
// (on the stack: no allocation per read).
const sumsChunk = 16

// blockBufs holds 4 KiB buffers for the edges of a read of part of a
// block, and for repairs.
var blockBufs = sync.Pool{New: func() any { b := make([]byte, blocksum.BlockSize); return &b }}

// blockSpan is the byte range of block b of a volume of size bytes.
func blockSpan(b, size int64) (off, length int64) {
	off = b * blocksum.BlockSize
	return off, min(blocksum.BlockSize, size-off)
}

// blockTally counts what a check of blocks found (a scrub's figures):
// the blocks verified against a known sum, those repaired from a peer,
// and those no peer held good. A check given one goes on past an
// unrecoverable block; a read (given none) stops there with EIO.
type blockTally struct {
	checked, repaired, unrecoverable int64
	// lost are the blocks found unrecoverable: not checked (nor counted)
	// again by the same check.
	lost map[int64]bool
	// quietLost: a block lost already before this check is not reported
	// again (no block-unrecoverable event nor error log): a resync or a
	// verify that retries reports it once.
	quietLost bool
}

// quiet reports whether t reports a block lost already again.
func (t *blockTally) quiet() bool { return t != nil && t.quietLost }

// add counts a repair's outcome: err nil is a block repaired; true when
// the check goes on (err nil, or unrecoverable and counted in t).
func (t *blockTally) add(b int64, err error) bool {
	switch {
	case t == nil:
		return err == nil
	case err == nil:
		t.repaired++
		return true
	case errors.Is(err, errUnrecoverable):
		t.unrecoverable++
		if t.lost == nil {
			t.lost = map[int64]bool{}
		}
		t.lost[b] = true
		return true
	}
	return false
}

// verifyRead checks p, just read from the local disk at off, block by
// block against the stored sums, and repairs each block that fails:
// nil when p now holds good data throughout.
func (v *Volume) verifyRead(ctx context.Context, p []byte, off int64) error {
	return v.verifyBlocks(ctx, p, off, nil)
}

// verifyBlocks is verifyRead, counting in t (nil: none) what it finds;
// with t it goes on past an unrecoverable block (a scrub).
func (v *Volume) verifyBlocks(ctx context.Context, p []byte, off int64, t *blockTally) error {
	in := v.durable.integ
	if !in.on() || len(p) == 0 {
		return nil
	}
	size := v.size.Load()
	end := off + int64(len(p))
	first, last := off/blocksum.BlockSize, (end-1)/blocksum.BlockSize
	var sums [sumsChunk]uint32
	var known [sumsChunk]bool
	for b0 := first; b0 <= last; b0 += sumsChunk {
		n := min(int64(sumsChunk), last-b0+1)
		if err := in.sums.GetRange(b0, sums[:n], known[:n]); err != nil {
			// The sums cannot be read: the data is returned unverified,
			// as a block without a known sum is.
			v.log.Warn("read the checksums", "off", off, "len", len(p), "err", err)
			return nil
		}
		for k := range n {
			b := b0 + k
			lost := in.isLost(b)
			if !known[k] && !lost {
				continue
			}
			if t != nil {
				if t.lost[b] {
					continue
				}
				t.checked++
			}
			if lost {
				// A lost block is no good copy, whatever its data (a
				// resync target's older copy may match its older sum): a
				// replica that holds it good repairs it, or it fails.
				if err := v.repairBlock(ctx, p, off, b, sums[k], known[k], repairChecksum, t.quiet()); !t.add(b, err) {
					return err
				}
				continue
			}
			boff, blen := blockSpan(b, size)
			var data []byte
			if boff >= off && boff+blen <= end {
				data = p[boff-off : boff-off+blen]
			} else {
				// Part of the block is read: the whole of it is checked.
				bp := blockBufs.Get().(*[]byte)
				data = (*bp)[:blen]
				_, err := v.disk.ReadAt(data, boff)
				if err == nil {
					err = in.seed.Verify(uint64(b), data, sums[k])
				}
				blockBufs.Put(bp)
				if err == nil {
					continue
				}
				if rerr := v.repairBlock(ctx, p, off, b, sums[k], true, causeOf(err), t.quiet()); !t.add(b, rerr) {
					return rerr
				}
				continue
			}
			if in.seed.Verify(uint64(b), data, sums[k]) == nil {
				continue
			}
			if err := v.repairBlock(ctx, p, off, b, sums[k], true, repairChecksum, t.quiet()); !t.add(b, err) {
				return err
			}
		}
	}
	return nil
}

// causeOf is the repair cause of a failed check of a block: a mismatch,
// or the disk's error.
func causeOf(err error) repairCause {
	if errors.Is(err, blocksum.ErrMismatch) {
		return repairChecksum
	}
	return repairReadError
}

// repairUnreadable is the read of p at off after the disk failed it
// (readErr): each block is read again on its own, and those the disk
// cannot read are repaired from a peer. handled is false when the disk
// fails more blocks than one read repairs (it is taken for failed: the
// caller detaches it); err is errUnrecoverable (EIO) when a block had no
// good copy anywhere.
func (v *Volume) repairUnreadable(ctx context.Context, p []byte, off int64) (handled bool, err error) {
	return v.repairUnreadableTally(ctx, p, off, nil)
}

// repairUnreadableTally is repairUnreadable, counting in t (nil: none)
// what it finds; with t it goes on past an unrecoverable block.
func (v *Volume) repairUnreadableTally(ctx context.Context, p []byte, off int64, t *blockTally) (handled bool, err error) {
	size := v.size.Load()
	end := off + int64(len(p))
	var failed []int64
	for b := off / blocksum.BlockSize; b <= (end-1)/blocksum.BlockSize; b++ {
		boff, blen := blockSpan(b, size)
		from, to := max(boff, off), min(boff+blen, end)
		if _, err := v.disk.ReadAt(p[from-off:to-off], from); err != nil {
			if failed = append(failed, b); len(failed) > maxRepairsPerRead {
				return false, nil
			}
		}
	}
	if len(failed) == 0 {
		// Every block reads now (the disk's hiccup): checked as usual.
		return true, v.verifyBlocks(ctx, p, off, t)
	}
	for _, b := range failed {
		var sum uint32
		known := false
		if v.durable.integ.on() {
			if s, k, err := v.durable.integ.sums.Get(b); err == nil {
				sum, known = s, k
			}
		}
		if err := v.repairBlock(ctx, p, off, b, sum, known, repairReadError, t.quiet()); !t.add(b, err) {
			if errors.Is(err, errUnrecoverable) {
				return true, err
			}
			return false, nil
		}
	}
	// The blocks that did read are checked too (a repaired block again:
	// p holds its good copy now).
	return true, v.verifyBlocks(ctx, p, off, t)
}

// errRepairLater: a block a secondary's scrub found bad was written by
// the primary's stream before it could be repaired (it holds newer data
// now), or the stream from the primary ended: nothing was repaired, and
// a later scrub checks it again.
var errRepairLater = errors.New("the block changed, or the primary went away, before its repair")

// repairBlock takes block b from a replica in sync whose copy is good (it
// matches sum, when known; the replica checks it with its own), copies
// it into p (read at off; nil: a scrub, which hands nothing on), and
// writes it back over the local block. On the primary the copy comes
// from a peer in sync; on a secondary from its primary (goodCopy). The
// block-repaired event and counter say so; when no replica holds a good
// copy, the block-unrecoverable event and counter, and errUnrecoverable
// (EIO). A write-back that fails puts the block on the bad-block list
// (listBadBlock), durably BEFORE this returns, or, when the list is full,
// detaches the disk as a failed write does; the client gets the good
// data either way. A lost block repaired is lost no more. quiet: a block
// lost already is not reported again.
func (v *Volume) repairBlock(ctx context.Context, p []byte, off, b int64, sum uint32, known bool, cause repairCause, quiet bool) error {
	boff, blen := blockSpan(b, v.size.Load())
	good := make([]byte, blen)
	var in *applier.Stream
	if v.state().role() != replication.Primary {
		if in = v.incomingStream(); in == nil {
			return errRepairLater
		}
	}
	from, newer := v.goodCopy(ctx, in, good, b, sum, known)
	if newer {
		// The primary holds a good copy, of another version of the
		// block than this node's sum: a write, or a resync, still on
		// its way here (a stream that ended, protocol A or B, a block
		// marked for this node). It brings the block with its sum; a
		// later scrub checks it again. Never a verdict of lost.
		v.log.Info("repair waits: the primary holds another version of the block than this node; its write or resync brings it here",
			"primary", from, "off", boff, "cause", cause)
		return errRepairLater
	}
	if from == "" {
		added, err := v.durable.integ.markLost(b)
		if err != nil {
			v.log.Warn("the unrecoverable block is counted, but a restart will not remember it", "off", boff, "err", err)
		}
		if added || !quiet {
			msg := fmt.Sprintf("the block at byte %d (%d bytes) of %s on %s is bad (%s) and no replica in sync holds a good copy: reads of it fail with EIO. Write the range again (from a backup, or what the application knows) to clear it",
				boff, blen, v.name, v.self, cause)
			v.log.Error(msg)
			v.node.emit(statefile.Event{Volume: v.name, Kind: "block-unrecoverable", Reason: cause.String(), Offset: boff, Length: blen, Message: msg})
		}
		return fmt.Errorf("%s: byte %d: %w (%w)", v.name, boff, errUnrecoverable, syscall.EIO)
	}
	if p != nil {
		from0, to := max(boff, off), min(boff+blen, off+int64(len(p)))
		copy(p[from0-off:to-off], good[from0-boff:to-boff])
	}
	// Written back durably: the sum the block has stays right for it
	// (the data is the one it was computed from), so no sum changes and
	// the activity log need not know.
	var werr error
	if in == nil {
		werr = backing.WriteSync(v.disk, good, boff)
	} else if skipped, err := v.writeBackUnderStream(in, good, b, sum, known); skipped {
		return errRepairLater
	} else {
		werr = err
	}
	v.durable.integ.repaired[cause].Add(1)
	if v.durable.integ.isLost(b) {
		// A replica held it good after all (a third one back in sync):
		// it is lost no more, and leaves the durable list once the good
		// copy is durable (unlist syncs first).
		v.durable.integ.clearLost(boff, blen)
		if werr == nil {
			if err := v.durable.integ.unlist(boff, blen); err != nil {
				v.log.Warn("the repaired block stays on the bad-block list until it is written", "off", boff, "err", err)
			}
		}
	}
	msg := fmt.Sprintf("repaired the block at byte %d (%d bytes) of %s on %s from %s (%s)", boff, blen, v.name, v.self, from, cause)
	if werr != nil {
		msg = fmt.Sprintf("served the block at byte %d (%d bytes) of %s on %s from %s (%s), but writing it back failed: %v", boff, blen, v.name, v.self, from, cause, werr)
	}
	v.log.Warn(msg)
	v.node.emit(statefile.Event{Volume: v.name, Kind: "block-repaired", Peer: from, Reason: cause.String(), Offset: boff, Length: blen, Message: msg})
	if werr != nil {
		v.listBadBlock(b, boff, blen, from, cause, werr)
	}
	return nil
}

// goodCopy reads block b into good from a replica in sync whose copy is
// good, and names it ("" when none has one). The primary asks each peer
// in sync (which checks its copy with its own sums, and reads it in the
// stream's order, after every write sent before); a secondary (in, its
// stream from the primary) asks its primary, which reads the block as a
// client's read is, verified and repaired. Either way the copy is
// checked against this node's sum, when known. A secondary's copy from
// its primary that fails that check is the primary's current version,
// good by the primary's own sum, and this node's is another (the
// control API's read does not wait for the stream to deliver what the
// primary wrote since): newer is true with from naming the primary, and
// nothing may be concluded about the block but that it is to come.
func (v *Volume) goodCopy(ctx context.Context, in *applier.Stream, good []byte, b int64, sum uint32, known bool) (from string, newer bool) {
	boff := b * blocksum.BlockSize
	ok := func(from string) bool {
		if known && v.durable.integ.seed.Verify(uint64(b), good, sum) != nil {
			v.log.Warn("repair: the replica's copy does not match the checksum either", "replica", from, "off", boff)
			return false
		}
		return true
	}
	if in != nil {
		primary := in.From()
		if err := v.readFromPrimary(ctx, primary, good, boff); err != nil {
			v.log.Warn("repair: read from the primary failed", "primary", primary, "off", boff, "err", err)
			return "", false
		}
		if known && v.durable.integ.seed.Verify(uint64(b), good, sum) != nil {
			return primary, true
		}
		return primary, false
	}
	for _, pr := range v.streamingPeers() {
		if !pr.connected() || anySet(pr.bm, boff, int64(len(good))) {
			continue
		}
		if err := pr.read(ctx, good, boff); err != nil {
			v.log.Warn("repair: read from peer failed", "peer", pr.name, "off", boff, "err", err)
			continue
		}
		if ok(pr.name) {
			return pr.name, false
		}
	}
	return "", false
}
