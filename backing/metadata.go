package backing

import (
	"fmt"
	"os"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/metadata"
)

// PeerIDs returns the metadata ids of volume vc's nodes other than self.
func PeerIDs(cfg *config.Config, self string, vc config.VolumeConfig) []uint32 {
	var ids []uint32
	for _, nc := range cfg.Nodes {
		if _, ok := vc.Disks[nc.Name]; ok && nc.Name != self {
			ids = append(ids, cfg.NodeID(nc.Name))
		}
	}
	return ids
}

// RequiredSize is what node self's backing device must hold: the volume, plus
// the internal metadata create-md lays out at its end (with a checksum
// area when vc.ChecksumsOn()). For size: max not resolved yet, one block
// of data.
func RequiredSize(cfg *config.Config, self string, vc config.VolumeConfig) (int64, error) {
	return RequiredSizeFor(cfg, self, vc, vc.ChecksumsOn())
}

// RequiredSizeFor is RequiredSize for metadata with a checksum area when
// checksums, whatever the config says. Without one it is the smallest
// device any existing metadata of vc opens on (format 1 metadata, made
// before checksums, has none).
func RequiredSizeFor(cfg *config.Config, self string, vc config.VolumeConfig, checksums bool) (int64, error) {
	size := int64(vc.Size)
	if vc.Size == config.SizeMax {
		size = metadata.MDBlockSize
	}
	if vc.External() {
		return size, nil
	}
	return metadata.InternalDeviceSizeFor(size, vc.ALExtents, max(1, len(PeerIDs(cfg, self, vc))), checksums)
}

// UsableSize is the largest volume node self's disk holds after the
// metadata create-md lays out (with a checksum area when
// vc.ChecksumsOn()): what size: max means on this node.
func UsableSize(cfg *config.Config, self string, vc config.VolumeConfig, disk Disk) (int64, error) {
	placement, peers := metadata.Internal, max(1, len(PeerIDs(cfg, self, vc)))
	if vc.External() {
		placement = metadata.External
	}
	size, err := metadata.UsableSizeFor(placement, disk.Size(), vc.ALExtents, peers, vc.ChecksumsOn())
	if err != nil || size <= 0 {
		return 0, fmt.Errorf("size: max: the disk %s (%d bytes) holds no volume beside its metadata (%v): give a larger disk", vc.Disks[self].Paths[0].Path, disk.Size(), err)
	}
	return size, nil
}

// SyncedMDDevice is the metadata device of internal metadata: every write
// is durable on its own (pwritev2 with RWF_DSYNC), so Sync has nothing
// left to do. A Sync of the backing device itself would also flush every
// dirty data page of the volume: metadata IO would cost what the data
// costs, the slowdown DRBD users met with internal metadata (seeds/003).
type SyncedMDDevice struct{ Disk Disk }

func (s SyncedMDDevice) ReadAt(p []byte, off int64) (int, error) { return s.Disk.ReadAt(p, off) }

func (s SyncedMDDevice) WriteAt(p []byte, off int64) (int, error) {
	if err := WriteSync(s.Disk, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s SyncedMDDevice) Sync() error { return nil }

// MDFile is an external metadata file.
type MDFile struct{ *os.File }

func (f MDFile) Sync() error { return f.File.Sync() }

// ExternalSize is the size of volume vc's external metadata file with
// peers bitmaps, as create-md lays it out (with a checksum area when
// vc.ChecksumsOn()); 0 when vc has no valid size.
func ExternalSize(vc config.VolumeConfig, peers int) int64 {
	n, err := metadata.ExternalSizeFor(int64(vc.Size), vc.ALExtents, peers, vc.ChecksumsOn())
	if err != nil {
		return 0
	}
	return n
}
