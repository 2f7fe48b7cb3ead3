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
// internal metadata at its end. For size: max not resolved yet, one block
// of data.
func RequiredSize(cfg *config.Config, self string, vc config.VolumeConfig) (int64, error) {
	size := int64(vc.Size)
	if vc.Size == config.SizeMax {
		size = metadata.MDBlockSize
	}
	if vc.External() {
		return size, nil
	}
	return metadata.InternalDeviceSize(size, vc.ALExtents, max(1, len(PeerIDs(cfg, self, vc))))
}

// UsableSize is the largest volume node self's disk holds after its
// metadata: what size: max means on this node.
func UsableSize(cfg *config.Config, self string, vc config.VolumeConfig, disk Disk) (int64, error) {
	placement, peers := metadata.Internal, max(1, len(PeerIDs(cfg, self, vc)))
	if vc.External() {
		placement = metadata.External
	}
	size, err := metadata.UsableSize(placement, disk.Size(), vc.ALExtents, peers)
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
// peers bitmaps; 0 when vc has no valid size.
func ExternalSize(vc config.VolumeConfig, peers int) int64 {
	n, err := metadata.ExternalSize(int64(vc.Size), vc.ALExtents, peers)
	if err != nil {
		return 0
	}
	return n
}
