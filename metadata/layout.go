// On-disk metadata of one volume on one node (OpenMD, CreateMD).
//
// Every metadata block is 4 KiB; every integer is little-endian; every
// checksum is CRC32C (Castagnoli). The metadata area holds, for internal
// placement, at the END of the backing device (the usable data size
// shrinks to MDOffset, which status shows):
//
//	MDOffset (ChecksumOffset)                 checksums: ChecksumPages × 4 KiB (format 2)
//	BitmapOffset                              bitmap, peer slot 0: BitmapPages × 4 KiB
//	  + s×BitmapPages×4K                      bitmap, peer slot s
//	ALOffset                                  activity-log ring: ALBlocks × 4 KiB
//	floor4K(device size) − 8 KiB              superblock slot 0
//	floor4K(device size) − 4 KiB              superblock slot 1
//
// and for external placement, from offset 0 of a separate file or device:
//
//	0        superblock slot 0
//	4 KiB    superblock slot 1
//	8 KiB    activity-log ring (ALOffset)
//	...      checksums (ChecksumOffset; format 2)
//	...      bitmaps, peer slot 0 first (BitmapOffset)
//
// Superblock (4 KiB; two slots written alternately, each followed by a sync;
// the valid slot with the higher Seq wins, so a torn write leaves the
// previous copy in force):
//
//	  0  8  magic "RVOLMETA"
//	  8  4  format version: 1, or 2 with a checksum area; a higher one is
//	        refused (ErrNewerFormat), so a build that reads only format 1
//	        refuses metadata with checksums rather than misread it
//	        (and writes over the area as a bitmap's)
//	 12  4  flags (FlagConsistent, FlagUpToDate, FlagPrimary, FlagReplica)
//	 16  8  Seq, incremented by every write
//	 24 16  volume UUID
//	 40  4  node id
//	 44  4  placement (1 internal, 2 external)
//	 48  8  device size (internal: the backing device; external: the data device)
//	 56  8  data size: what the volume may use
//	 64  8  MDOffset, 72 8 MDSize: the metadata area on the metadata device
//	 80  8  ALOffset, 88 4 ALBlocks, 92 4 ALExtents (hot extents, "al-extents")
//	 96  8  BitmapOffset, 104 4 BitmapPages (per peer), 108 4 bytes per bit (4096)
//	112  4  AL extent shift (22: 4 MiB), 116 4 peer slots (1..32)
//	120 16  current generation
//	136 64  history generations ×4, newest first
//	200 24× peer slot: node id u32, flags u32 (1: in use), bitmap generation [16]
//	968  8  format 2: ChecksumOffset, 976 8 ChecksumPages,
//	984  8  ChecksumSeed (random at create-md; zero in format 1)
//	1024 4  bad-block list (both formats; zeroes: empty; badblocks.go):
//	        count (≤ 382), 1028 4 zero, from 1032 count × u64 in
//	        ascending block order: block number (low 56 bits), kind
//	        (top 8 bits: 1 could not be rewritten, 2 lost)
//	4092 4  CRC32C of bytes [0, 4092)
//
// Activity-log transaction (4 KiB; the ring slot of transaction Seq is
// Seq mod ALBlocks):
//
//	  0  4  magic "RVAL", 4 4 type (1 update, 2 initialise)
//	  8  8  Seq
//	 16  4  ALExtents (must match the superblock)
//	 20  2  number of updates (≤ 64), 22 2 number of context entries (≤ 920)
//	 24  4  first AL slot the context covers
//	 28 128 update slot numbers, u16 ×64
//	156 256 update extent numbers, u32 ×64 (0xFFFFFFFF: slot emptied)
//	412 3680 context: the extent in each covered slot, u32 ×920
//	4092 4  CRC32C of the volume UUID then bytes [0, 4092)
//
// The context rolls over the AL slots, so any ceil(ALExtents/920)
// consecutive transactions describe every slot. Loading replays every valid
// transaction of the ring in Seq order; the ring is long enough
// (ALBlocks ≥ ceil(ALExtents/920) + 2, at least 8) that a commit tearing
// its own unsynced blocks never destroys what the replay needs.
//
// Bitmap page (4 KiB; 1 bit per 4 KiB block, 32704 blocks = 127.75 MiB per
// page; bit b of the page is bit b%64 of little-endian word b/64):
//
//	0 4  CRC32C of the volume UUID, the peer slot (u32), then bytes [4, 4096)
//	4 4  page index
//	8 4088 bits
//
// A page whose checksum fails on load is taken as all-set: that range is
// resynced in full, and the load report names it.
//
// Checksum page (format 2; 4 KiB; the block checksums of 990 blocks =
// 3.87 MiB of data per page, internal/blocksum's CRC-32C of each block;
// ChecksumPages are sized for the device, like the bitmaps):
//
//	  0   4  CRC32C of the volume UUID, ChecksumSeed (u64), then bytes [4, 4096)
//	  4   4  page index
//	  8 128  known: bit b%64 of little-endian word b/64 says block b's sum is stored
//	136 3960 sums, u32 ×990
//
// create-md writes no checksum page: a page that fails its checksum on
// load (never written since this create-md, whose seed it lacks, or torn)
// holds no known sum. That is never a corruption of data: a block without
// a known sum is not verified until it is written or a scrub builds it.
//
// The bitmap area is sized for the data size (BitmapPages), but a bitmap
// covers only the volume (MDOptions.VolumeSize, which is not stored): the
// pages past the volume's last page are neither read nor written, and the
// bits of the last page past the volume's end are written clear and
// ignored on load.
//
// Growing a volume (MD.Grow, grow.go) writes the pages it gains clear
// where the layout holds them. Where it does not, the layout is computed
// again for the new size (internal: the grown device's, so the whole area
// moves to its new end; external: the volume's, so the bitmaps of the
// peer slots after the first move within the file), written whole at the
// new place and switched to by a superblock: the format stays the one
// above, for a larger device.

package metadata

import "github.com/replvol/replvol/replication"

// Sizes of the on-disk format.
const (
	// MDBlockSize is the size of every metadata block.
	MDBlockSize = 4096
	// ExtentShift gives the activity-log extent: 1<<22 = 4 MiB.
	ExtentShift = 22
	// ExtentSize is the span of data one activity-log extent covers.
	ExtentSize = 1 << ExtentShift
	// DefaultALExtents is the default number of hot extents ("al-extents").
	DefaultALExtents = 1237
	// MinALExtents and MaxALExtents bound al-extents.
	MinALExtents = 7
	MaxALExtents = 65536
	// MaxPeerSlots bounds the bitmaps (peers) one metadata area holds.
	MaxPeerSlots = 32
	// HistorySlots is the number of history generations kept.
	HistorySlots = 4
	// FormatVersion is the newest format this build reads and writes.
	// CreateMD writes format 1 when it makes no checksum area (so that
	// older builds open it) and FormatChecksums when it does.
	FormatVersion = 2
	// FormatChecksums is the first format with a checksum area.
	FormatChecksums = 2
	// SumsPerPage is the number of 4 KiB blocks one checksum page covers.
	SumsPerPage = (MDBlockSize - sumPageHeaderSize) / 4 // 990

	superblockSlots = 2
	superblockMagic = "RVOLMETA"

	alMagic              = "RVAL"
	alUpdatesPerTx       = 64
	alHeaderSize         = 28
	alUpdatesOffset      = alHeaderSize
	alExtentsOffset      = alUpdatesOffset + 2*alUpdatesPerTx
	alContextOffset      = alExtentsOffset + 4*alUpdatesPerTx
	crcOffset            = MDBlockSize - 4
	alContextPerTx       = (crcOffset - alContextOffset) / 4 // 920
	alMinRingBlocks      = 8
	bitmapPageHeaderSize = 8
	sumKnownOffset       = 8
	sumKnownWords        = 16 // 1024 bits, SumsPerPage used
	sumPageHeaderSize    = sumKnownOffset + 8*sumKnownWords
	bitmapPageWords      = (MDBlockSize - bitmapPageHeaderSize) / 8 // 511
	// BitsPerPage is the number of 4 KiB blocks one bitmap page covers.
	BitsPerPage = bitmapPageWords * 64 // 32704

	bytesPerBit = replication.BlockSize
	// maxDataSize bounds a volume (1 PiB) so that geometry fits in the
	// format's fields.
	maxDataSize = 1 << 50
)

// Placement says where the metadata lives.
type Placement uint32

// Placements.
const (
	// Internal metadata sits at the end of the backing device, which it
	// shares with the data.
	Internal Placement = 1
	// External metadata lives on a separate file or device.
	External Placement = 2
)

func (p Placement) String() string {
	switch p {
	case Internal:
		return "internal"
	case External:
		return "external"
	}
	return "unknown placement"
}

// alRingBlocks is the ring length for a number of hot extents.
func alRingBlocks(alExtents int) int {
	return max(alMinRingBlocks, ceilDiv(alExtents, alContextPerTx)+2)
}

// alTxPerCommit bounds the transactions one commit writes before its sync,
// so that tearing them never reaches what a replay needs.
func alTxPerCommit(alExtents, ringBlocks int) int {
	return max(1, ringBlocks-ceilDiv(alExtents, alContextPerTx)-1)
}

// bitmapPagesFor is the number of bitmap pages covering size bytes.
func bitmapPagesFor(size int64) int64 {
	blocks := ceilDiv64(size, bytesPerBit)
	return ceilDiv64(blocks, BitsPerPage)
}

// checksumPagesFor is the number of checksum pages covering size bytes.
func checksumPagesFor(size int64) int64 { return ceilDiv64(blocksOf(size), SumsPerPage) }

func ceilDiv(a, b int) int          { return (a + b - 1) / b }
func ceilDiv64(a, b int64) int64    { return (a + b - 1) / b }
func floorBlock(n int64) int64      { return n &^ (MDBlockSize - 1) }
func extentOf(off int64) uint64     { return uint64(off) >> ExtentShift }
func extentStart(e uint64) int64    { return int64(e << ExtentShift) }
func blocksOf(size int64) int64     { return ceilDiv64(size, bytesPerBit) }
func pageBlocks(total, i int64) int { return int(min(BitsPerPage, total-i*BitsPerPage)) }

// geometry is where each part of the metadata lives.
type geometry struct {
	placement    Placement
	deviceSize   int64
	dataSize     int64
	mdOffset     int64
	mdSize       int64
	sbOffset     [superblockSlots]int64
	alOffset     int64
	alBlocks     int
	alExtents    int
	bitmapOffset int64
	bitmapPages  int64
	peerSlots    int
	// checksums: the layout has a checksum area (format 2) of
	// checksumPages pages at checksumOffset.
	checksums      bool
	checksumOffset int64
	checksumPages  int64
}

// superblockOffsets returns where the two superblock slots are.
func superblockOffsets(p Placement, deviceSize int64) [superblockSlots]int64 {
	if p == Internal {
		end := floorBlock(deviceSize)
		return [superblockSlots]int64{end - 2*MDBlockSize, end - MDBlockSize}
	}
	return [superblockSlots]int64{0, MDBlockSize}
}

// computeGeometry lays out a new metadata area, with a checksum area when
// checksums.
func computeGeometry(p Placement, deviceSize int64, alExtents, peerSlots int, checksums bool) (geometry, error) {
	g := geometry{placement: p, deviceSize: deviceSize, alExtents: alExtents, peerSlots: peerSlots, checksums: checksums}
	switch {
	case p != Internal && p != External:
		return g, errorf("placement %d: want internal or external", p)
	case alExtents < MinALExtents || alExtents > MaxALExtents:
		return g, errorf("al-extents %d: want %d..%d", alExtents, MinALExtents, MaxALExtents)
	case peerSlots < 1 || peerSlots > MaxPeerSlots:
		return g, errorf("%d peers: want 1..%d", peerSlots, MaxPeerSlots)
	case deviceSize <= 0 || deviceSize > maxDataSize:
		return g, errorf("device size %d: want 1..%d bytes", deviceSize, int64(maxDataSize))
	}
	g.alBlocks = alRingBlocks(alExtents)
	g.bitmapPages = bitmapPagesFor(deviceSize)
	if checksums {
		g.checksumPages = checksumPagesFor(deviceSize)
	}
	g.sbOffset = superblockOffsets(p, deviceSize)
	g.mdSize = int64(superblockSlots+g.alBlocks)*MDBlockSize + (int64(peerSlots)*g.bitmapPages+g.checksumPages)*MDBlockSize
	if p == Internal {
		g.mdOffset = floorBlock(deviceSize) - g.mdSize
		if g.mdOffset <= 0 {
			return g, errorf("device of %d bytes is too small for %d bytes of internal metadata", deviceSize, g.mdSize)
		}
		g.dataSize = g.mdOffset
		g.checksumOffset = g.mdOffset
		g.bitmapOffset = g.checksumOffset + g.checksumPages*MDBlockSize
		g.alOffset = g.bitmapOffset + int64(peerSlots)*g.bitmapPages*MDBlockSize
	} else {
		g.dataSize = deviceSize
		g.alOffset = superblockSlots * MDBlockSize
		g.checksumOffset = g.alOffset + int64(g.alBlocks)*MDBlockSize
		g.bitmapOffset = g.checksumOffset + g.checksumPages*MDBlockSize
	}
	if !checksums {
		g.checksumOffset = 0
	}
	return g, nil
}
