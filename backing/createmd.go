package backing

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
)

// CreateMetadata initialises a volume's metadata on node name's disk, as
// DRBD's create-md: offline (the node must be stopped), and over existing
// metadata only with force. The node's data then counts as Inconsistent,
// so it gets a full resync from its peer, unless the volume is new.
func CreateMetadata(cfg *config.Config, name, volume, stateDir string, force bool) (string, error) {
	var vc *config.VolumeConfig
	for i := range cfg.Volumes {
		if cfg.Volumes[i].Name == volume {
			vc = &cfg.Volumes[i]
		}
	}
	if vc == nil {
		return "", fmt.Errorf("no volume %q in the config", volume)
	}
	dc, ok := vc.Disks[name]
	if !ok {
		return "", fmt.Errorf("node %s holds no disk of %s", name, volume)
	}
	self, _ := cfg.Node(name)
	if stateDir == "" {
		stateDir = self.StateDir
	}
	st, err := statefile.Open(filepath.Join(stateDir, "state.db"))
	if err != nil {
		return "", err
	}
	defer st.Close()
	required, err := RequiredSize(cfg, name, *vc)
	if err != nil {
		return "", err
	}
	disk, _, err := Open(*vc, dc, required, OpenOptions{})
	if err != nil {
		return "", err
	}
	defer disk.Close()
	if vc.Size == config.SizeMax {
		// The copy on this node starts over: size: max is what its disk
		// holds now.
		size, err := UsableSize(cfg, name, *vc, disk)
		if err != nil {
			return "", err
		}
		resolved := *vc
		resolved.Size = config.VolumeSize(size)
		vc = &resolved
	}
	opts := metadata.MDOptions{
		Placement: metadata.Internal, DeviceSize: disk.Size(), Volume: vc.VolumeUUID(),
		NodeID: cfg.NodeID(name), Peers: PeerIDs(cfg, name, *vc), ALExtents: vc.ALExtents, Overwrite: force,
		VolumeSize: int64(vc.Size), Checksums: vc.ChecksumsOn(), DataDevice: disk,
	}
	if len(opts.Peers) == 0 {
		opts.Peers = []uint32{0}
	}
	var dev metadata.MDDevice = SyncedMDDevice{Disk: disk}
	where := "the end of " + dc.Paths[0].Path
	if vc.External() {
		f, err := os.OpenFile(dc.Meta, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return "", err
		}
		defer f.Close()
		size := ExternalSize(*vc, len(opts.Peers))
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() < size {
			if err := f.Truncate(size); err != nil {
				return "", err
			}
		}
		opts.Placement, opts.DeviceSize, dev, where = metadata.External, int64(vc.Size), MDFile{File: f}, dc.Meta
	}
	md, err := metadata.CreateMD(dev, opts)
	if err != nil {
		return "", fmt.Errorf("create-md at %s: %w", where, err)
	}
	md.Close()
	// What this disk holds is no longer tied to any generation.
	vs, known, err := st.Volume(volume)
	if err != nil {
		return "", err
	}
	if known {
		// A primary stays primary: it copies everything from a peer that
		// holds the data, and serves reads from it meanwhile.
		vs.Generation, vs.SyncGeneration, vs.PeerBitmaps, vs.LocalStale = replication.Generation{}, replication.Generation{}, nil, false
		// The copy starts over at the size the file gives now.
		vs.Size = int64(vc.Size)
		if err := st.PutVolume(volume, vs); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("created %s metadata for %s at %s (volume %d bytes, %s; usable %s)", opts.Placement, volume, where, vc.Size, human.Bytes(int64(vc.Size)), human.Bytes(md.UsableSize())), nil
}
