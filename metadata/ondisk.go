package metadata

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/replication"
)

// Refusals of OpenMD and CreateMD. Each changes no byte of the device.
var (
	// ErrNotOurVolume: the metadata belongs to another volume or node.
	ErrNotOurVolume = errors.New("metadata belongs to another volume or node")
	// ErrCorrupt: neither superblock copy passes its checksum.
	ErrCorrupt = errors.New("metadata is corrupt")
	// ErrNewerFormat: a newer replvol wrote the metadata.
	ErrNewerFormat = errors.New("metadata has a newer format")
	// ErrNoMetadata: the device holds no replvol metadata.
	ErrNoMetadata = errors.New("no metadata")
	// ErrMetadataExists: CreateMD found valid metadata and was not told to
	// overwrite it.
	ErrMetadataExists = errors.New("metadata already exists")
	// ErrBadOptions: the options cannot describe a metadata area.
	ErrBadOptions = errors.New("bad metadata options")
	// ErrVolumeTooLarge: MDOptions.VolumeSize exceeds what the device
	// leaves usable beside its metadata.
	ErrVolumeTooLarge = errors.New("volume larger than the usable size")
)

func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadOptions}, args...)...)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MDDevice is where metadata is stored: the backing device itself for
// internal placement, a separate file or device for external placement.
// Sync makes every completed write durable (fdatasync, or a cache flush).
type MDDevice interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
}

// VolumeUUID names a volume across nodes.
type VolumeUUID [16]byte

// String renders the UUID in hex.
func (u VolumeUUID) String() string { return hex.EncodeToString(u[:]) }

// Flags are the superblock's state bits.
type Flags uint32

// Superblock flags.
const (
	// FlagConsistent: the data is one generation, not a resync target
	// caught half-way.
	FlagConsistent Flags = 1 << iota
	// FlagUpToDate: the data was the newest generation when last known.
	FlagUpToDate
	// FlagPrimary is the primary indicator. It is on stable storage BEFORE
	// the first write as primary and cleared only once every write is done
	// and the bitmaps are flushed; found set at open, it means the node
	// crashed as primary (CrashedPrimary).
	FlagPrimary
	// FlagReplica is the replica indicator: on stable storage BEFORE the
	// first replicated write this node applies as a secondary, cleared at
	// a clean stop once the data is synced. Found set at open, the node
	// went down while applying writes it may hold only in a volatile cache
	// (CrashedReplica).
	FlagReplica
)

// PeerSlot is one peer's bitmap slot in the superblock.
type PeerSlot struct {
	NodeID uint32
	InUse  bool
	// Bitmap is the generation this peer's bitmap tracks changes from
	// (zero while connected and in sync).
	Bitmap replication.Generation
}

// Superblock is the decoded superblock. Geometry fields are fixed at
// CreateMD; UpdateSuperblock changes only flags and generations.
type Superblock struct {
	Version      uint32
	Flags        Flags
	Seq          uint64
	Volume       VolumeUUID
	NodeID       uint32
	Placement    Placement
	DeviceSize   int64
	DataSize     int64
	MDOffset     int64
	MDSize       int64
	ALOffset     int64
	ALBlocks     uint32
	ALExtents    uint32
	BitmapOffset int64
	BitmapPages  uint32
	BytesPerBit  uint32
	ExtentShift  uint32
	Current      replication.Generation
	History      [HistorySlots]replication.Generation
	Peers        []PeerSlot
	// Format 2 (FormatChecksums) only: the checksum area, and the seed
	// its pages' checksums start from (a new one at every create-md, so
	// that pages an earlier create-md wrote hold no known sum).
	ChecksumOffset int64
	ChecksumPages  int64
	ChecksumSeed   uint64
	// BadBlocks is the bad-block list (badblocks.go), in block order.
	BadBlocks []BadBlock
}

const (
	sbPeersOffset    = 200
	sbPeerSize       = 24
	sbChecksumOffset = sbPeersOffset + sbPeerSize*MaxPeerSlots // 968
)

// HasChecksums reports whether the superblock describes a checksum area.
func (sb *Superblock) HasChecksums() bool { return sb.Version >= FormatChecksums }

// encodeSuperblock renders sb as one 4 KiB block with its checksum.
func encodeSuperblock(sb *Superblock) []byte {
	b := make([]byte, MDBlockSize)
	le := binary.LittleEndian
	copy(b[0:8], superblockMagic)
	le.PutUint32(b[8:], sb.Version)
	le.PutUint32(b[12:], uint32(sb.Flags))
	le.PutUint64(b[16:], sb.Seq)
	copy(b[24:40], sb.Volume[:])
	le.PutUint32(b[40:], sb.NodeID)
	le.PutUint32(b[44:], uint32(sb.Placement))
	le.PutUint64(b[48:], uint64(sb.DeviceSize))
	le.PutUint64(b[56:], uint64(sb.DataSize))
	le.PutUint64(b[64:], uint64(sb.MDOffset))
	le.PutUint64(b[72:], uint64(sb.MDSize))
	le.PutUint64(b[80:], uint64(sb.ALOffset))
	le.PutUint32(b[88:], sb.ALBlocks)
	le.PutUint32(b[92:], sb.ALExtents)
	le.PutUint64(b[96:], uint64(sb.BitmapOffset))
	le.PutUint32(b[104:], sb.BitmapPages)
	le.PutUint32(b[108:], sb.BytesPerBit)
	le.PutUint32(b[112:], sb.ExtentShift)
	le.PutUint32(b[116:], uint32(len(sb.Peers)))
	copy(b[120:136], sb.Current[:])
	for i, h := range sb.History {
		copy(b[136+16*i:], h[:])
	}
	for i, p := range sb.Peers {
		o := sbPeersOffset + sbPeerSize*i
		le.PutUint32(b[o:], p.NodeID)
		if p.InUse {
			le.PutUint32(b[o+4:], 1)
		}
		copy(b[o+8:o+24], p.Bitmap[:])
	}
	if sb.HasChecksums() {
		le.PutUint64(b[sbChecksumOffset:], uint64(sb.ChecksumOffset))
		le.PutUint64(b[sbChecksumOffset+8:], uint64(sb.ChecksumPages))
		le.PutUint64(b[sbChecksumOffset+16:], sb.ChecksumSeed)
	}
	encodeBadBlocks(b, sb.BadBlocks)
	le.PutUint32(b[crcOffset:], crc32.Checksum(b[:crcOffset], castagnoli))
	return b
}

// errNoMagic is a block that is not a superblock at all.
var errNoMagic = errors.New("no superblock magic")

// decodeSuperblock parses one superblock slot. It returns errNoMagic for a
// block that is not a superblock, ErrNewerFormat for a newer version and
// ErrCorrupt for a bad checksum or impossible contents.
func decodeSuperblock(b []byte) (Superblock, error) {
	var sb Superblock
	le := binary.LittleEndian
	if len(b) != MDBlockSize {
		return sb, fmt.Errorf("%w: superblock of %d bytes", ErrCorrupt, len(b))
	}
	if string(b[0:8]) != superblockMagic {
		return sb, errNoMagic
	}
	// The version is read before the checksum: a newer format may
	// checksum differently, and must be refused as newer, not as corrupt.
	sb.Version = le.Uint32(b[8:])
	if sb.Version > FormatVersion {
		return sb, fmt.Errorf("%w: format version %d, this build reads up to %d; upgrade replvol", ErrNewerFormat, sb.Version, FormatVersion)
	}
	if got, want := crc32.Checksum(b[:crcOffset], castagnoli), le.Uint32(b[crcOffset:]); got != want {
		return sb, fmt.Errorf("%w: superblock checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	sb.Flags = Flags(le.Uint32(b[12:]))
	sb.Seq = le.Uint64(b[16:])
	copy(sb.Volume[:], b[24:40])
	sb.NodeID = le.Uint32(b[40:])
	sb.Placement = Placement(le.Uint32(b[44:]))
	sb.DeviceSize = int64(le.Uint64(b[48:]))
	sb.DataSize = int64(le.Uint64(b[56:]))
	sb.MDOffset = int64(le.Uint64(b[64:]))
	sb.MDSize = int64(le.Uint64(b[72:]))
	sb.ALOffset = int64(le.Uint64(b[80:]))
	sb.ALBlocks = le.Uint32(b[88:])
	sb.ALExtents = le.Uint32(b[92:])
	sb.BitmapOffset = int64(le.Uint64(b[96:]))
	sb.BitmapPages = le.Uint32(b[104:])
	sb.BytesPerBit = le.Uint32(b[108:])
	sb.ExtentShift = le.Uint32(b[112:])
	nPeers := le.Uint32(b[116:])
	copy(sb.Current[:], b[120:136])
	for i := range sb.History {
		copy(sb.History[i][:], b[136+16*i:])
	}
	if sb.Version == 0 || nPeers == 0 || nPeers > MaxPeerSlots {
		return sb, fmt.Errorf("%w: superblock version %d with %d peer slots", ErrCorrupt, sb.Version, nPeers)
	}
	sb.Peers = make([]PeerSlot, nPeers)
	for i := range sb.Peers {
		o := sbPeersOffset + sbPeerSize*i
		sb.Peers[i].NodeID = le.Uint32(b[o:])
		sb.Peers[i].InUse = le.Uint32(b[o+4:])&1 != 0
		copy(sb.Peers[i].Bitmap[:], b[o+8:o+24])
	}
	if sb.HasChecksums() {
		sb.ChecksumOffset = int64(le.Uint64(b[sbChecksumOffset:]))
		sb.ChecksumPages = int64(le.Uint64(b[sbChecksumOffset+8:]))
		sb.ChecksumSeed = le.Uint64(b[sbChecksumOffset+16:])
	}
	if err := sb.checkGeometry(); err != nil {
		return sb, err
	}
	var err error
	if sb.BadBlocks, err = decodeBadBlocks(b, sb.DataSize); err != nil {
		return sb, err
	}
	return sb, nil
}

// checkGeometry verifies that the layout fields are the ones this format
// computes for the placement, sizes and counts: anything else is corrupt.
func (sb *Superblock) checkGeometry() error {
	if sb.BytesPerBit != bytesPerBit || sb.ExtentShift != ExtentShift {
		return fmt.Errorf("%w: %d bytes per bit, extent shift %d", ErrCorrupt, sb.BytesPerBit, sb.ExtentShift)
	}
	g, err := computeGeometry(sb.Placement, sb.DeviceSize, int(sb.ALExtents), len(sb.Peers), sb.HasChecksums())
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if sb.DataSize != g.dataSize || sb.MDOffset != g.mdOffset || sb.MDSize != g.mdSize ||
		sb.ALOffset != g.alOffset || int(sb.ALBlocks) != g.alBlocks ||
		sb.BitmapOffset != g.bitmapOffset || int64(sb.BitmapPages) != g.bitmapPages ||
		sb.ChecksumOffset != g.checksumOffset || sb.ChecksumPages != g.checksumPages {
		return fmt.Errorf("%w: superblock geometry does not add up", ErrCorrupt)
	}
	return nil
}

func (sb *Superblock) geometry() geometry {
	g, err := computeGeometry(sb.Placement, sb.DeviceSize, int(sb.ALExtents), len(sb.Peers), sb.HasChecksums())
	if err != nil {
		panic(err) // checked by decodeSuperblock or CreateMD
	}
	return g
}

func (sb *Superblock) clone() Superblock {
	c := *sb
	c.Peers = append([]PeerSlot(nil), sb.Peers...)
	c.BadBlocks = slices.Clone(sb.BadBlocks)
	return c
}

// MDOptions describe the metadata of one volume on one node.
type MDOptions struct {
	// Placement is Internal or External.
	Placement Placement
	// DeviceSize is, for Internal, the size of the backing device (the
	// superblock is found from its end); zero asks the device (a Size
	// method, or Stat, or Seek). For External it is the size of the data
	// device, needed by CreateMD only.
	DeviceSize int64
	// VolumeSize is the number of bytes the volume uses: the size it
	// exports, and the only range its bitmaps cover (so the only range a
	// resync or verify driven by them touches). Zero means the whole
	// usable size (MD.UsableSize). A backing device is seldom exactly
	// the volume plus its metadata: pass the volume's configured size
	// here, to OpenMD and CreateMD alike, or a resync sends the blocks
	// past the volume's end. More than the usable size is refused with
	// ErrVolumeTooLarge, naming both numbers.
	//
	// It changes nothing on disk: the metadata area, its geometry and the
	// superblock stay sized for the device, so metadata opens with any
	// VolumeSize up to the usable size. The bitmap pages past the
	// volume's last page are neither loaded nor written, and the bits of
	// the last page past the volume's end are ignored on load (an older
	// build may have set them). Opening with a larger VolumeSize than
	// before is not a resize: the range gained holds whatever its pages
	// say. MD.Grow is the resize: it writes those pages clear first.
	VolumeSize int64
	// Volume and NodeID must match the metadata OpenMD finds. A zero
	// Volume skips the check (for inspection tools).
	Volume VolumeUUID
	NodeID uint32
	// Peers are the node ids that get a bitmap each (CreateMD).
	Peers []uint32
	// ALExtents is the number of hot extents (CreateMD; 0: 1237).
	ALExtents int
	// Overwrite lets CreateMD replace valid metadata.
	Overwrite bool
	// Checksums makes CreateMD lay out a checksum area (format 2, the
	// block checksums at rest of issue 29; MD.Checksums). OpenMD takes
	// what the superblock says.
	Checksums bool
	// DataDevice is, for external metadata with checksums, the data
	// device: an activity-log eviction syncs it BEFORE it writes the
	// checksums of the extent it evicts. Without it the checksums are
	// read-only (ErrNoDataDevice). Internal metadata shares the data's
	// device, whose Sync is used without it; give it when the metadata
	// device's Sync does not sync the data (a device whose writes are
	// durable on their own, as the node's internal metadata device).
	DataDevice Syncer
	// ChecksumCachePages bounds the clean checksum pages kept in memory
	// (0: DefaultChecksumCachePages).
	ChecksumCachePages int
}

// LoadReport says what OpenMD found that was not in order, and what it did.
type LoadReport struct {
	// SuperblockSlot is the slot in use; OtherSlot says why the other was
	// not ("" when it was an older valid copy).
	SuperblockSlot int
	OtherSlot      string
	// CorruptBitmapPages lists the bitmap pages that failed their checksum.
	// Their range is now all-set (resynced in full) and written back so.
	CorruptBitmapPages []CorruptPage
	// ALTransactions is the number of valid transactions replayed;
	// ALInvalid the ring blocks ignored (torn, never written or stale).
	ALTransactions int
	ALInvalid      int
	// ALIncomplete: the valid transactions do not describe every AL slot.
	// After a primary crash the hot set is then unknown and the caller must
	// mark the whole volume out of sync.
	ALIncomplete bool
}

// CorruptPage is a bitmap page whose checksum failed on load.
type CorruptPage struct {
	Peer   uint32
	Page   int64
	Offset int64 // first data byte the page covers
	Length int64 // data bytes it covers
}

// MD is the open metadata of one volume on one node. It is safe for
// concurrent use.
type MD struct {
	dev            MDDevice
	volume         VolumeUUID
	crashedPrimary bool
	crashedReplica bool
	bitmaps        []*PeerBitmap
	al             *ActivityLog
	sums           *Checksums // nil without a checksum area
	report         LoadReport

	// growMu serialises Grow.
	growMu lockorder.Mutex

	mu lockorder.Mutex // guards sb, superblock writes, geo and volumeSize
	sb Superblock
	// geo is where the metadata lives. Only Grow changes it, holding mu,
	// every bitmap's flushMu and the activity log's ring: read it
	// holding one of those (or before md is shared).
	geo        geometry
	volumeSize int64 // bytes the bitmaps cover: MDOptions.VolumeSize, ≤ geo.dataSize
}

// deviceSize finds the size of dev when the caller did not give it.
func deviceSize(dev MDDevice, given int64) (int64, error) {
	if given > 0 {
		return given, nil
	}
	switch d := dev.(type) {
	case interface{ Size() int64 }:
		return d.Size(), nil
	case interface{ Size() (int64, error) }:
		return d.Size()
	case interface {
		Stat() (os.FileInfo, error)
		io.Seeker
	}: // an *os.File, or a type embedding one
		fi, err := d.Stat()
		if err != nil {
			return 0, err
		}
		if fi.Mode().IsRegular() {
			return fi.Size(), nil
		}
		return d.Seek(0, io.SeekEnd) // a block device
	}
	return 0, errorf("device size unknown: give MDOptions.DeviceSize")
}

// volumeSize checks the size the volume uses against the usable size of
// geo and returns it (the usable size when the caller gave none).
func volumeSize(opts MDOptions, geo geometry) (int64, error) {
	switch {
	case opts.VolumeSize < 0:
		return 0, errorf("volume size %d: want 0 (the usable size) or more", opts.VolumeSize)
	case opts.VolumeSize == 0:
		return geo.dataSize, nil
	case opts.VolumeSize > geo.dataSize:
		return 0, fmt.Errorf("%w: the volume needs %d bytes, the %v metadata leaves %d usable bytes of the %d-byte device; grow the device",
			ErrVolumeTooLarge, opts.VolumeSize, geo.placement, geo.dataSize, geo.deviceSize)
	}
	return opts.VolumeSize, nil
}

// readSuperblocks reads and decodes both slots.
func readSuperblocks(dev MDDevice, offs [superblockSlots]int64) ([superblockSlots]Superblock, [superblockSlots]error) {
	var sbs [superblockSlots]Superblock
	var errs [superblockSlots]error
	for i, off := range offs {
		b := make([]byte, MDBlockSize)
		if _, err := dev.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
			errs[i] = fmt.Errorf("read superblock slot %d: %w", i, err)
			continue
		}
		sbs[i], errs[i] = decodeSuperblock(b)
	}
	return sbs, errs
}

// pickSuperblock chooses the slot in force, or says why there is none.
func pickSuperblock(sbs [superblockSlots]Superblock, errs [superblockSlots]error) (int, string, error) {
	for i, err := range errs {
		if errors.Is(err, ErrNewerFormat) {
			return -1, "", fmt.Errorf("metadata: slot %d: %w", i, err)
		}
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, errNoMagic) {
			return -1, "", err // an I/O error
		}
	}
	switch {
	case errs[0] == nil && errs[1] == nil:
		if sbs[1].Seq > sbs[0].Seq {
			return 1, "", nil
		}
		return 0, "", nil
	case errs[0] == nil:
		return 0, errs[1].Error(), nil
	case errs[1] == nil:
		return 1, errs[0].Error(), nil
	case errors.Is(errs[0], errNoMagic) && errors.Is(errs[1], errNoMagic):
		return -1, "", fmt.Errorf("%w on this device: run create-md to initialise it", ErrNoMetadata)
	}
	return -1, "", fmt.Errorf("%w: both superblock copies are unreadable (slot 0: %v; slot 1: %v); "+
		"check that this is the right disk, or run create-md to start over (a full resync follows)", ErrCorrupt, errs[0], errs[1])
}

// OpenMD attaches the metadata on dev. It refuses, changing no byte, a
// device whose metadata belongs to another volume or node
// (ErrNotOurVolume), is corrupt in both superblock copies (ErrCorrupt), is
// of a newer format (ErrNewerFormat) or is absent (ErrNoMetadata).
//
// A bitmap page that fails its checksum is loaded as all-set and written
// back so; the torn or stale AL blocks are ignored. Report says which.
func OpenMD(dev MDDevice, opts MDOptions) (*MD, error) {
	if opts.Placement != Internal && opts.Placement != External {
		return nil, errorf("placement %d: want internal or external", opts.Placement)
	}
	var size int64
	if opts.Placement == Internal {
		var err error
		if size, err = deviceSize(dev, opts.DeviceSize); err != nil {
			return nil, err
		}
	}
	sbs, errs := readSuperblocks(dev, superblockOffsets(opts.Placement, size))
	slot, other, err := pickSuperblock(sbs, errs)
	if err != nil {
		return nil, err
	}
	sb := sbs[slot]
	if sb.Placement != opts.Placement || (opts.Placement == Internal && sb.DeviceSize != size) {
		return nil, fmt.Errorf("%w: the superblock describes %v metadata for a %d-byte device, opened as %v on %d bytes; "+
			"open it with its own placement and size", ErrCorrupt, sb.Placement, sb.DeviceSize, opts.Placement, size)
	}
	if opts.Volume != (VolumeUUID{}) && (sb.Volume != opts.Volume || sb.NodeID != opts.NodeID) {
		return nil, fmt.Errorf("%w: found volume %v node %d, want volume %v node %d; "+
			"attach the disk of this volume, or run create-md on this one to discard what it holds",
			ErrNotOurVolume, sb.Volume, sb.NodeID, opts.Volume, opts.NodeID)
	}
	geo := sb.geometry()
	volSize, err := volumeSize(opts, geo)
	if err != nil {
		return nil, err
	}
	md := &MD{dev: dev, geo: geo, volumeSize: volSize, volume: sb.Volume, sb: sb,
		crashedPrimary: sb.Flags&FlagPrimary != 0, crashedReplica: sb.Flags&FlagReplica != 0}
	md.report.SuperblockSlot, md.report.OtherSlot = slot, other
	for i, p := range sb.Peers {
		bm, corrupt, err := loadPeerBitmap(md, i, p.NodeID)
		if err != nil {
			return nil, err
		}
		md.bitmaps = append(md.bitmaps, bm)
		md.report.CorruptBitmapPages = append(md.report.CorruptBitmapPages, corrupt...)
	}
	if sb.HasChecksums() {
		md.sums = newChecksums(md, opts)
	}
	if md.al, err = loadActivityLog(md); err != nil {
		return nil, err
	}
	if len(md.report.CorruptBitmapPages) > 0 {
		// Write the all-set pages back with a good checksum, so that
		// the next load agrees and the range stays marked until resynced.
		if err := md.FlushBitmaps(); err != nil {
			return nil, err
		}
	}
	return md, nil
}

// CreateMD initialises metadata on dev: clear bitmaps, an empty activity
// log, and a superblock with no generation (the data is not consistent
// until an initial sync or a forced promotion). It refuses valid existing
// metadata unless opts.Overwrite, and changes no byte when it refuses.
//
// Order: the old superblocks are invalidated (and synced) BEFORE anything
// else is written, and the new superblock is written last, after a sync,
// so that a crash in between leaves no metadata rather than a mix.
func CreateMD(dev MDDevice, opts MDOptions) (*MD, error) {
	if opts.Placement != Internal && opts.Placement != External {
		return nil, errorf("placement %d: want internal or external", opts.Placement)
	}
	size, err := deviceSize(dev, opts.DeviceSize)
	if err != nil {
		return nil, err
	}
	if opts.ALExtents == 0 {
		opts.ALExtents = DefaultALExtents
	}
	geo, err := computeGeometry(opts.Placement, size, opts.ALExtents, len(opts.Peers), opts.Checksums)
	if err != nil {
		return nil, err
	}
	volSize, err := volumeSize(opts, geo)
	if err != nil {
		return nil, err
	}
	sbs, errs := readSuperblocks(dev, geo.sbOffset)
	if slot, _, err := pickSuperblock(sbs, errs); err == nil && !opts.Overwrite {
		return nil, fmt.Errorf("%w (volume %v, node %d)", ErrMetadataExists, sbs[slot].Volume, sbs[slot].NodeID)
	}

	sb := Superblock{
		Version: 1, Seq: 1, Volume: opts.Volume, NodeID: opts.NodeID, Placement: opts.Placement,
		DeviceSize: size, DataSize: geo.dataSize, MDOffset: geo.mdOffset, MDSize: geo.mdSize,
		ALOffset: geo.alOffset, ALBlocks: uint32(geo.alBlocks), ALExtents: uint32(geo.alExtents),
		BitmapOffset: geo.bitmapOffset, BitmapPages: uint32(geo.bitmapPages),
		BytesPerBit: bytesPerBit, ExtentShift: ExtentShift,
	}
	for _, p := range opts.Peers {
		sb.Peers = append(sb.Peers, PeerSlot{NodeID: p, InUse: true})
	}
	if opts.Checksums {
		// A new seed: the pages an earlier create-md wrote fail their
		// checksums and hold no known sum, so the area needs no writing.
		var seed [8]byte
		if _, err := rand.Read(seed[:]); err != nil {
			return nil, fmt.Errorf("create-md: checksum seed: %w", err)
		}
		sb.Version = FormatChecksums
		sb.ChecksumOffset, sb.ChecksumPages = geo.checksumOffset, geo.checksumPages
		sb.ChecksumSeed = binary.LittleEndian.Uint64(seed[:])
	}
	zero := make([]byte, MDBlockSize)
	for _, off := range geo.sbOffset {
		if _, err := dev.WriteAt(zero, off); err != nil {
			return nil, fmt.Errorf("create-md: clear superblock: %w", err)
		}
	}
	if err := dev.Sync(); err != nil {
		return nil, fmt.Errorf("create-md: sync: %w", err)
	}
	md := &MD{dev: dev, geo: geo, volumeSize: volSize, volume: sb.Volume, sb: sb}
	for i, p := range opts.Peers {
		bm := newPeerBitmap(md, i, p)
		if err := bm.writeAllPages(); err != nil {
			return nil, fmt.Errorf("create-md: %w", err)
		}
		md.bitmaps = append(md.bitmaps, bm)
	}
	if md.al, err = createActivityLog(md); err != nil {
		return nil, fmt.Errorf("create-md: %w", err)
	}
	if opts.Checksums {
		md.sums = newChecksums(md, opts)
	}
	if err := dev.Sync(); err != nil {
		return nil, fmt.Errorf("create-md: sync: %w", err)
	}
	if err := md.writeSuperblock(&md.sb); err != nil {
		return nil, fmt.Errorf("create-md: %w", err)
	}
	return md, nil
}

// writeSuperblock writes sb into the slot its Seq selects and syncs.
// The caller holds md.mu (or owns md exclusively).
func (md *MD) writeSuperblock(sb *Superblock) error { return md.writeSuperblockAt(md.geo, sb) }

// writeSuperblockAt writes sb into the slot of geometry g its Seq selects
// and syncs.
func (md *MD) writeSuperblockAt(g geometry, sb *Superblock) error {
	off := g.sbOffset[sb.Seq%superblockSlots]
	if _, err := md.dev.WriteAt(encodeSuperblock(sb), off); err != nil {
		return fmt.Errorf("write superblock: %w", err)
	}
	if err := md.dev.Sync(); err != nil {
		return fmt.Errorf("sync superblock: %w", err)
	}
	return nil
}

// Superblock returns a copy of the superblock in force.
func (md *MD) Superblock() Superblock {
	md.mu.Lock()
	defer md.mu.Unlock()
	return md.sb.clone()
}

// UpdateSuperblock applies fn to a copy of the superblock and writes it to
// the other slot, durably (synced) BEFORE it returns. Only Flags, Current,
// History and the peers' Bitmap generations are taken from fn's result.
func (md *MD) UpdateSuperblock(fn func(*Superblock)) error {
	md.mu.Lock()
	defer md.mu.Unlock()
	edit := md.sb.clone()
	fn(&edit)
	next := md.sb.clone()
	next.Seq++
	next.Flags, next.Current, next.History = edit.Flags, edit.Current, edit.History
	for i := range next.Peers {
		if i < len(edit.Peers) {
			next.Peers[i].Bitmap = edit.Peers[i].Bitmap
		}
	}
	if err := md.writeSuperblock(&next); err != nil {
		return err
	}
	md.sb = next
	return nil
}

// SetPrimary sets or clears the primary indicator. Set it BEFORE the first
// write as primary; clear it only after every admitted write is Done and
// FlushBitmaps returned.
func (md *MD) SetPrimary(primary bool) error { return md.setFlag(FlagPrimary, primary) }

// setFlag sets or clears one superblock flag, durably.
func (md *MD) setFlag(f Flags, on bool) error {
	return md.UpdateSuperblock(func(sb *Superblock) {
		if on {
			sb.Flags |= f
		} else {
			sb.Flags &^= f
		}
	})
}

// CrashedPrimary reports whether the primary indicator was set when the
// metadata was opened: the node went down as primary, so every extent of
// the activity log may hold writes its peers never saw (ApplyActivityLog).
func (md *MD) CrashedPrimary() bool { return md.crashedPrimary }

// SetReplica sets or clears the replica indicator. Set it BEFORE the first
// replicated write applied as a secondary; clear it only at a clean stop,
// after the data device is synced.
func (md *MD) SetReplica(applying bool) error { return md.setFlag(FlagReplica, applying) }

// CrashedReplica reports whether the replica indicator was set when the
// metadata was opened: the node went down while applying replicated
// writes, and a power loss may have taken some it acknowledged out of a
// volatile cache. They lie in the activity log's extents
// (ApplyActivityLog), which a secondary keeps too.
func (md *MD) CrashedReplica() bool { return md.crashedReplica }

// UsableSize is the number of bytes the volume may use: with internal
// metadata, the backing device less the metadata area.
func (md *MD) UsableSize() int64 {
	md.mu.Lock()
	defer md.mu.Unlock()
	return md.geo.dataSize
}

// VolumeSize is the number of bytes the volume uses and its bitmaps cover:
// MDOptions.VolumeSize, or UsableSize when that was zero; Grow makes it
// larger.
func (md *MD) VolumeSize() int64 {
	md.mu.Lock()
	defer md.mu.Unlock()
	return md.volumeSize
}

// Placement says where the metadata lives.
func (md *MD) Placement() Placement {
	md.mu.Lock()
	defer md.mu.Unlock()
	return md.geo.placement
}

// Report returns what OpenMD found out of order.
func (md *MD) Report() LoadReport { return md.report }

// ActivityLog returns the volume's activity log.
func (md *MD) ActivityLog() *ActivityLog { return md.al }

// Bitmap returns the bitmap kept for peer node, if it has a slot.
func (md *MD) Bitmap(node uint32) (*PeerBitmap, bool) {
	for _, bm := range md.bitmaps {
		if bm.node == node {
			return bm, true
		}
	}
	return nil, false
}

// UUIDs returns this node's generation set toward peer node, for
// replication.CompareUUIDs.
func (md *MD) UUIDs(node uint32) replication.UUIDSet {
	md.mu.Lock()
	defer md.mu.Unlock()
	s := replication.UUIDSet{
		Current:        md.sb.Current,
		History:        append([]replication.Generation(nil), md.sb.History[:]...),
		CrashedPrimary: md.crashedPrimary,
		NodeID:         md.sb.NodeID,
	}
	for _, p := range md.sb.Peers {
		if p.NodeID == node {
			s.Bitmap = p.Bitmap
		}
	}
	return s
}

// FlushBitmaps writes every dirty bitmap page of every peer, then syncs.
func (md *MD) FlushBitmaps() error {
	for _, bm := range md.bitmaps {
		if err := bm.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// flushBitmapRange writes the dirty pages covering [off, off+length) of
// every peer's bitmap and syncs if it wrote any; it returns the pages
// written.
func (md *MD) flushBitmapRange(off, length int64) (int, error) {
	n := 0
	for _, bm := range md.bitmaps {
		w, err := bm.FlushRange(off, length)
		n += w
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// ApplyActivityLog marks every extent of the activity log out of sync in
// every peer's bitmap and flushes the bitmaps (DRBD's apply-al). Call it
// after opening the metadata of a CrashedPrimary, BEFORE clearing the
// primary indicator. If the log could not be reconstructed
// (Report().ALIncomplete) the whole volume is marked. Nothing past the
// volume's end (VolumeSize) is marked. It returns the bytes marked per
// peer.
func (md *MD) ApplyActivityLog() (int64, error) {
	if md.report.ALIncomplete {
		for _, bm := range md.bitmaps {
			bm.SetAll()
		}
		return md.VolumeSize(), md.FlushBitmaps()
	}
	marked := md.markActivityLog(md.bitmaps...)
	return marked, md.FlushBitmaps()
}

// MarkActivityLog marks every extent of the activity log out of sync in
// bm (one peer's bitmap) and flushes it: the extents this node wrote last,
// as primary or applying a primary's writes. If the log could not be
// reconstructed when it was opened (Report().ALIncomplete), what was
// written before is unknown and the whole volume is marked. Nothing past
// the volume's end is marked. It returns the bytes marked.
func (md *MD) MarkActivityLog(bm *PeerBitmap) (int64, error) {
	if md.report.ALIncomplete {
		bm.SetAll()
		return md.VolumeSize(), bm.Flush()
	}
	marked := md.markActivityLog(bm)
	if marked == 0 {
		return 0, nil
	}
	return marked, bm.Flush()
}

// markActivityLog sets the bits of every extent of the activity log,
// within the volume, in bms; it returns the bytes marked in each.
func (md *MD) markActivityLog(bms ...*PeerBitmap) int64 {
	var marked int64
	volume := md.VolumeSize()
	for _, e := range md.al.ActiveExtents() {
		start := extentStart(e)
		if start >= volume {
			continue
		}
		n := min(int64(ExtentSize), volume-start)
		for _, bm := range bms {
			bm.SetBits(start, n)
		}
		marked += n
	}
	return marked
}

// Close flushes the bitmaps and the checksums; it does not close the
// device. Call it only after every admitted write is Done and the data
// is synced. It leaves the primary indicator as it is (SetPrimary(false)
// first for a clean stop as primary).
func (md *MD) Close() error {
	if md.sums != nil {
		if err := md.sums.Flush(); err != nil {
			return err
		}
	}
	return md.FlushBitmaps()
}
