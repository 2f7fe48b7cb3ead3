package metadata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// The bad-block list (issue 29): the blocks of this replica that the node
// no longer reads from its disk, kept in the superblock's tail so that a
// change of it is one superblock write, durable and atomic as every other
// (two slots, the valid one with the higher Seq in force: a torn write
// leaves the list before it). layout.go gives the bytes; in short, at
// sbBadBlocksOffset a u32 count and a u32 zero, then count u64 entries in
// ascending block order, each the block number in its low 56 bits and
// its kind in its top 8.
//
// Metadata written before the list has zeroes there: an empty list, in
// format 1 and 2 alike. A build that does not know the list opens
// metadata that holds one, ignores it, and drops it at its next
// superblock write: it then reads those blocks from the disk again,
// verified by their checksums where the metadata has them, as it did
// before the list existed.

// BadBlockKind says why a block is on the list.
type BadBlockKind uint8

const (
	// BadBlockUnwritable: the disk could not rewrite the block with a
	// peer's good copy. It is served from a peer in sync, and leaves the
	// list once a write of the whole block succeeds here and is durable.
	BadBlockUnwritable BadBlockKind = 1
	// BadBlockLost: the block was found bad here and no replica held a
	// good copy (unrecoverable); a write covering it clears it.
	BadBlockLost BadBlockKind = 2
)

func (k BadBlockKind) String() string {
	switch k {
	case BadBlockUnwritable:
		return "bad"
	case BadBlockLost:
		return "lost"
	}
	return fmt.Sprintf("BadBlockKind(%d)", uint8(k))
}

// BadBlock is one entry of the list: a 4 KiB block of the volume.
type BadBlock struct {
	Block int64
	Kind  BadBlockKind
}

const (
	// sbBadBlocksOffset is where the list starts in the superblock (bytes
	// 992..1023 stay free for other fields).
	sbBadBlocksOffset = 1024
	sbBadBlockEntries = sbBadBlocksOffset + 8
	badBlockKindShift = 56
	// MaxBadBlocks is how many entries the superblock holds: 382.
	MaxBadBlocks = (crcOffset - sbBadBlockEntries) / 8
)

// ErrBadBlockListFull: a list longer than the superblock holds
// (MaxBadBlocks). Nothing was written.
var ErrBadBlockListFull = errors.New("the bad-block list is full")

// encodeBadBlocks writes list (sorted, checked) into superblock b.
func encodeBadBlocks(b []byte, list []BadBlock) {
	le := binary.LittleEndian
	le.PutUint32(b[sbBadBlocksOffset:], uint32(len(list)))
	for i, e := range list {
		le.PutUint64(b[sbBadBlockEntries+8*i:], uint64(e.Block)|uint64(e.Kind)<<badBlockKindShift)
	}
}

// decodeBadBlocks reads the list of superblock b, whose data area holds
// dataSize bytes. A list that no encoder writes (too long, out of order,
// a block past the data, an unknown kind, a non-zero reserved word) is
// ErrCorrupt: its slot is not in force.
func decodeBadBlocks(b []byte, dataSize int64) ([]BadBlock, error) {
	le := binary.LittleEndian
	n := le.Uint32(b[sbBadBlocksOffset:])
	if n == 0 && le.Uint32(b[sbBadBlocksOffset+4:]) == 0 {
		return nil, nil
	}
	if n > MaxBadBlocks || le.Uint32(b[sbBadBlocksOffset+4:]) != 0 {
		return nil, fmt.Errorf("%w: bad-block list of %d entries (at most %d)", ErrCorrupt, n, MaxBadBlocks)
	}
	list := make([]BadBlock, n)
	for i := range list {
		v := le.Uint64(b[sbBadBlockEntries+8*i:])
		list[i] = BadBlock{Block: int64(v & (1<<badBlockKindShift - 1)), Kind: BadBlockKind(v >> badBlockKindShift)}
	}
	if err := checkBadBlocks(list, dataSize); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return list, nil
}

// checkBadBlocks refuses a list that is not in ascending block order
// without repeats, names a block past dataSize, or a kind this build
// does not know.
func checkBadBlocks(list []BadBlock, dataSize int64) error {
	blocks := blocksOf(dataSize)
	for i, e := range list {
		switch {
		case e.Kind != BadBlockUnwritable && e.Kind != BadBlockLost:
			return fmt.Errorf("bad-block entry %d: kind %d", i, e.Kind)
		case e.Block < 0 || e.Block >= blocks:
			return fmt.Errorf("bad-block entry %d: block %d, the data holds %d", i, e.Block, blocks)
		case i > 0 && e.Block <= list[i-1].Block:
			return fmt.Errorf("bad-block entry %d: block %d after %d", i, e.Block, list[i-1].Block)
		}
	}
	return nil
}

// BadBlocks returns a copy of the bad-block list in force, in block
// order.
func (md *MD) BadBlocks() []BadBlock {
	md.mu.Lock()
	defer md.mu.Unlock()
	return slices.Clone(md.sb.BadBlocks)
}

// SetBadBlocks replaces the bad-block list, durably (the superblock
// written and synced) BEFORE it returns; on error the list in force is
// the one before. The order of list does not matter; a block listed twice
// is refused, and so is a list longer than MaxBadBlocks
// (ErrBadBlockListFull), each changing nothing.
func (md *MD) SetBadBlocks(list []BadBlock) error {
	if len(list) > MaxBadBlocks {
		return fmt.Errorf("%w: %d entries, the superblock holds %d", ErrBadBlockListFull, len(list), MaxBadBlocks)
	}
	sorted := slices.Clone(list)
	slices.SortFunc(sorted, func(x, y BadBlock) int { return compareUint64(uint64(x.Block), uint64(y.Block)) })
	md.mu.Lock()
	defer md.mu.Unlock()
	if err := checkBadBlocks(sorted, md.sb.DataSize); err != nil {
		return fmt.Errorf("%w: %v", ErrBadOptions, err)
	}
	next := md.sb.clone()
	next.Seq++
	next.BadBlocks = sorted
	if err := md.writeSuperblock(&next); err != nil {
		return err
	}
	md.sb = next
	return nil
}
