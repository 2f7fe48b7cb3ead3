package metadata

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
)

// Turning checksums on for an existing volume (MD.EnableChecksums,
// docs/integrity.md): format-1 metadata gains a checksum area and becomes
// format 2, with every bit of its bitmaps and every extent of its
// activity log kept, and no byte of the volume's data changed.

// ErrNoRoomForChecksums: the backing device, or the external metadata
// file, has no room for a checksum area beside the volume and its
// metadata. Nothing changed; the error says how many bytes are needed.
var ErrNoRoomForChecksums = errors.New("no room for a checksum area")

// EnableChecksumsOptions say where the metadata may lay out its area.
type EnableChecksumsOptions struct {
	// DeviceSize is, for internal metadata, the backing device's size
	// now (zero asks the device): larger than the metadata was laid out
	// for once the operator grew the device to make room. External
	// metadata measures its file.
	DeviceSize int64
	// DataDevice and ChecksumCachePages are MDOptions' fields of the
	// same name, for the checksum store the metadata opens with its new
	// area.
	DataDevice         Syncer
	ChecksumCachePages int
}

// EnableChecksumsReport says what MD.EnableChecksums did.
type EnableChecksumsReport struct {
	// Already: the metadata had a checksum area; nothing was done.
	Already bool
	// Moved: the metadata was written whole at a new place (internal:
	// the end of the grown device; external: its bitmaps after the new
	// area in the same file), as Grow moves it. Otherwise only the
	// superblock changed: the area took bytes past the volume's end that
	// the metadata's old layout left unused.
	Moved bool
	// OldDeviceSize and DeviceSize are the device sizes the metadata was
	// and is laid out for (internal: open it with DeviceSize from now on);
	// OldOffset and Offset where its area starts.
	OldDeviceSize, DeviceSize int64
	OldOffset, Offset         int64
	// AreaBytes is the size of the checksum area.
	AreaBytes int64
}

// EnableChecksums converts format-1 metadata (no checksum area) to
// format 2, so that the volume keeps checksums from now on. Every block
// starts with no known sum: nothing is verified until a write or a
// scrub (the node's build pass) stores a block's sum. Call it right after
// OpenMD, BEFORE the metadata is shared (no write admitted, no flush
// running): it changes what Checksums returns.
//
// Where the area goes, in the order tried:
//
//   - internal metadata whose layout leaves the volume room for the
//     area (the volume is smaller than the usable size by at least the
//     area): the area takes the bytes just below the metadata, past the
//     volume's end; the bitmaps and the activity log stay where they are,
//     and one superblock (written to the slot not in force, as every
//     update is) switches. A crash leaves the old superblock or the new.
//   - internal metadata on a device grown (GrowOptions.DeviceSize) by
//     enough for the whole metadata with the area to lie past the old
//     end: the metadata moves there, as MD.Grow moves it (the activity
//     log and the bitmaps written at the new place and synced BEFORE the
//     new superblock). A crash leaves the old metadata, at the end of the
//     old size, or the new one, each whole.
//   - external metadata: the area goes after the activity log, and the
//     bitmaps move after it, within the file, which must be long enough
//     (ExternalSizeFor with checksums). A crash before the switch leaves
//     the old superblock in force; where the new bitmap pages overlap the
//     old ones (a small volume with several peers), those fail their
//     checksums and their ranges are resynced in full, never taken as in
//     sync.
//
// Otherwise it refuses with ErrNoRoomForChecksums, saying how large the
// device or file must grow, and changes no byte. It never shrinks the
// volume.
func (md *MD) EnableChecksums(opts EnableChecksumsOptions) (EnableChecksumsReport, error) {
	md.growMu.Lock()
	defer md.growMu.Unlock()
	md.mu.Lock()
	geo, volume := md.geo, md.volumeSize
	md.mu.Unlock()
	rep := EnableChecksumsReport{OldDeviceSize: geo.deviceSize, DeviceSize: geo.deviceSize, OldOffset: geo.mdOffset, Offset: geo.mdOffset}
	if geo.checksums {
		rep.Already = true
		return rep, nil
	}
	target, move, err := md.checksumGeometry(opts, geo, volume)
	if err != nil {
		return rep, err
	}
	rep.AreaBytes = target.checksumPages * MDBlockSize
	seed, err := newChecksumSeed()
	if err != nil {
		return rep, err
	}
	if move {
		if _, err := md.move(target, volume, seed); err != nil {
			return rep, fmt.Errorf("enable checksums: %w", err)
		}
		rep.Moved = true
	} else if err := md.switchInPlace(target, seed); err != nil {
		return rep, fmt.Errorf("enable checksums: %w", err)
	}
	md.sums = newChecksums(md, MDOptions{DataDevice: opts.DataDevice, ChecksumCachePages: opts.ChecksumCachePages})
	md.mu.Lock()
	rep.DeviceSize, rep.Offset = md.geo.deviceSize, md.geo.mdOffset
	md.mu.Unlock()
	return rep, nil
}

// CheckEnableChecksums says, changing nothing, whether EnableChecksums
// with opts would find room (nil, or the refusal it would return).
func (md *MD) CheckEnableChecksums(opts EnableChecksumsOptions) error {
	md.growMu.Lock()
	defer md.growMu.Unlock()
	md.mu.Lock()
	geo, volume := md.geo, md.volumeSize
	md.mu.Unlock()
	if geo.checksums {
		return nil
	}
	_, _, err := md.checksumGeometry(opts, geo, volume)
	return err
}

// checksumGeometry is the layout with a checksum area that EnableChecksums
// switches geo to for a volume of volume bytes, and whether the metadata
// moves to get there; a refusal says how much room is missing.
func (md *MD) checksumGeometry(opts EnableChecksumsOptions, geo geometry, volume int64) (geometry, bool, error) {
	if geo.placement == External {
		g, err := computeGeometry(External, geo.deviceSize, geo.alExtents, geo.peerSlots, true)
		if err != nil {
			return geo, false, err
		}
		need := g.bitmapOffset + int64(g.peerSlots)*g.bitmapPages*MDBlockSize
		have, err := deviceSize(md.dev, 0)
		if err != nil {
			return geo, false, err
		}
		if have < need {
			return geo, false, fmt.Errorf("%w: the metadata file holds %d bytes; with a checksum area of %d bytes it needs %d, %d more: "+
				"extend it (truncate -s %d FILE, or lvextend the device it is) and start the volume again; nothing was changed",
				ErrNoRoomForChecksums, have, g.checksumPages*MDBlockSize, need, need-have, need)
		}
		return g, true, nil
	}
	in, err := computeGeometry(Internal, geo.deviceSize, geo.alExtents, geo.peerSlots, true)
	if err == nil && in.dataSize >= volume {
		return in, false, nil
	}
	dev, err := deviceSize(md.dev, opts.DeviceSize)
	if err != nil {
		return geo, false, err
	}
	oldEnd := floorBlock(geo.deviceSize)
	if dev > geo.deviceSize {
		g, err := computeGeometry(Internal, dev, geo.alExtents, geo.peerSlots, true)
		if err == nil && g.dataSize >= volume && g.mdOffset >= oldEnd {
			return g, true, nil
		}
	}
	need := deviceFor(volume, oldEnd, 0, geo.alExtents, geo.peerSlots, true)
	area := checksumPagesFor(max(dev, need)) * MDBlockSize
	if need == 0 {
		return geo, false, fmt.Errorf("%w: no device the format allows holds a %d-byte volume with its metadata and a checksum area; nothing was changed",
			ErrNoRoomForChecksums, volume)
	}
	return geo, false, fmt.Errorf("%w: the backing device holds %d bytes; a %d-byte volume with its internal metadata and a checksum area of about %d bytes "+
		"needs the device to hold %d, %d more (the metadata moves past its old end, which it leaves whole until the new one is in force): "+
		"grow the device (truncate -s %d FILE, or lvextend) and start the volume again; nothing was changed, and the volume is not shrunk",
		ErrNoRoomForChecksums, dev, volume, area, need, need-dev, need)
}

// newChecksumSeed is a random seed for a new checksum area: pages an
// earlier area (or anything else) left there fail their checksums.
func newChecksumSeed() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("checksum seed: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// withChecksums makes sb describe layout g with a checksum area of the
// given seed: format 2.
func (sb *Superblock) withChecksums(g geometry, seed uint64) {
	sb.setGeometry(g)
	sb.Version = FormatChecksums
	sb.ChecksumSeed = seed
}

// switchInPlace switches internal metadata to layout g, which differs
// from the one in force only by the checksum area below the bitmaps:
// one superblock, in the slot not in force, durably.
func (md *MD) switchInPlace(g geometry, seed uint64) error {
	md.mu.Lock()
	defer md.mu.Unlock()
	next := md.sb.clone()
	next.Seq++
	next.withChecksums(g, seed)
	if err := md.writeSuperblockAt(g, &next); err != nil {
		return err
	}
	md.geo, md.sb = g, next
	return nil
}
