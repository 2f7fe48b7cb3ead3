package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
)

// peerIDs returns the metadata ids of a volume's other nodes.
func (n *Node) peerIDs(vc VolumeConfig) []uint32 {
	var ids []uint32
	cfg := n.config()
	for _, nc := range cfg.Nodes {
		if _, ok := vc.Disks[nc.Name]; ok && nc.Name != n.name {
			ids = append(ids, cfg.NodeID(nc.Name))
		}
	}
	return ids
}

// requiredDiskSize is what the backing device must hold: the volume, plus
// internal metadata at its end. For size: max not resolved yet, one block
// of data.
func (n *Node) requiredDiskSize(vc VolumeConfig) (int64, error) {
	size := int64(vc.Size)
	if vc.Size == SizeMax {
		size = metadata.MDBlockSize
	}
	if vc.External() {
		return size, nil
	}
	return metadata.InternalDeviceSize(size, vc.ALExtents, max(1, len(n.peerIDs(vc))))
}

// usableSize is the largest volume this node's disk holds after its
// metadata: what size: max means on this node.
func (n *Node) usableSize(vc VolumeConfig, disk Disk) (int64, error) {
	placement, peers := metadata.Internal, max(1, len(n.peerIDs(vc)))
	if vc.External() {
		placement = metadata.External
	}
	size, err := metadata.UsableSize(placement, disk.Size(), vc.ALExtents, peers)
	if err != nil || size <= 0 {
		return 0, fmt.Errorf("size: max: the disk %s (%d bytes) holds no volume beside its metadata (%v): give a larger disk", vc.Disks[n.name].Paths[0].Path, disk.Size(), err)
	}
	return size, nil
}

// resolveSizes gives each volume this node holds its size here: the size
// this node recorded when it last ran the volume, whatever the file says,
// since the recorded size is what its disk and metadata hold (an online
// resize grows it before the operator edits the file); for a volume it
// has never run, the file's (size: max: 0, and usableSize decides once
// the disk is open). A file that says another size is warned about, with
// what to do. The config returned is a copy when anything changed.
func (n *Node) resolveSizes(cfg *Config) (*Config, error) {
	var out *Config
	for i, vc := range cfg.Volumes {
		if _, held := vc.Disks[n.name]; !held {
			continue
		}
		st, known, err := n.store.Volume(vc.Name)
		if err != nil {
			return nil, err
		}
		if vc.Size != SizeMax && (!known || st.Size == int64(vc.Size) || st.Size == 0) {
			continue
		}
		if out == nil {
			c := *cfg
			c.Volumes = slices.Clone(cfg.Volumes)
			out = &c
		}
		if !known {
			continue
		}
		out.Volumes[i].Size = VolumeSize(st.Size)
		if vc.Size != SizeMax {
			n.warnSizeDiffers(vc.Name, int64(vc.Size), st.Size)
		}
	}
	if out == nil {
		return cfg, nil
	}
	return out, nil
}

// warnSizeDiffers says that the file gives a volume another size than the
// one this node recorded, and runs at the recorded one.
func (n *Node) warnSizeDiffers(volume string, file, recorded int64) {
	var msg string
	if recorded > file {
		msg = fmt.Sprintf("the config file says size %d (%s) for %s, but it was resized online to %d (%s) on %s: %s runs it at %d. Put size: %d in volumes[%s] of the file on every node (a SIGHUP then takes it)",
			file, sizeText(file), volume, recorded, sizeText(recorded), n.name, n.name, recorded, recorded, volume)
	} else {
		msg = fmt.Sprintf("the config file says size %d (%s) for %s, but %s's copy is %d (%s): it runs at %d, and its peers refuse it while theirs is larger. To grow it to the file's size: make its disk hold that size with its metadata, then replctl resize %s %d --node %s",
			file, sizeText(file), volume, n.name, recorded, sizeText(recorded), recorded, volume, file, n.name)
	}
	n.log.Warn(msg, "volume", volume)
	n.event(volume, "size-differs", msg)
}

// syncedMDDevice is the metadata device of internal metadata: every write
// is durable on its own (pwritev2 with RWF_DSYNC), so Sync has nothing
// left to do. A Sync of the backing device itself would also flush every
// dirty data page of the volume: metadata IO would cost what the data
// costs, the slowdown DRBD users met with internal metadata (seeds/003).
type syncedMDDevice struct{ d Disk }

func (s syncedMDDevice) ReadAt(p []byte, off int64) (int, error) { return s.d.ReadAt(p, off) }

func (s syncedMDDevice) WriteAt(p []byte, off int64) (int, error) {
	if err := writeSync(s.d, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s syncedMDDevice) Sync() error { return nil }

// mdFile is an external metadata file.
type mdFile struct{ *os.File }

func (f mdFile) Sync() error { return f.File.Sync() }

// openMD opens the volume's on-disk metadata on this node, creating it on
// a disk that has none yet (a new volume). It refuses metadata of another
// volume or node, of a newer format, or corrupt, and says which.
func (n *Node) openMD(vc VolumeConfig, disk Disk) (*metadata.MD, func() error, error) {
	opts := metadata.MDOptions{
		Placement: metadata.Internal, DeviceSize: disk.Size(), Volume: vc.VolumeUUID(),
		NodeID: n.config().NodeID(n.name), Peers: n.peerIDs(vc), ALExtents: vc.ALExtents,
		// The bitmaps cover the volume, not whatever the device holds
		// beyond it and its metadata.
		VolumeSize: int64(vc.Size),
	}
	if len(opts.Peers) == 0 {
		opts.Peers = []uint32{0}
	}
	var dev metadata.MDDevice = syncedMDDevice{disk}
	closeDev := func() error { return nil }
	where := fmt.Sprintf("the end of %s", vc.Disks[n.name].Paths[0].Path)
	if vc.External() {
		path := vc.Disks[n.name].Meta
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("external metadata %s: %w (create it: truncate -s %d %s)", path, err, externalSize(vc, len(opts.Peers)), path)
		}
		opts.Placement, opts.DeviceSize = metadata.External, int64(vc.Size)
		dev, closeDev, where = mdFile{f}, f.Close, path
	}
	md, err := metadata.OpenMD(dev, opts)
	if (errors.Is(err, metadata.ErrNoMetadata) || errors.Is(err, metadata.ErrCorrupt)) && opts.Placement == metadata.Internal {
		// The disk grew since the metadata was laid out at its end (and
		// no resize moved it yet): it is where this node last saw it.
		if st, known, serr := n.store.Volume(vc.Name); serr == nil && known && st.MDDeviceSize > 0 && st.MDDeviceSize < opts.DeviceSize {
			at := opts
			at.DeviceSize = st.MDDeviceSize
			if found, ferr := metadata.OpenMD(dev, at); ferr == nil {
				md, err = found, nil
				n.event(vc.Name, "disk-grew", fmt.Sprintf("%s holds %d bytes (%s), more than the %d it held when its metadata was laid out: the metadata is at the end of that size; replctl resize %s SIZE moves it to the new end once the volume needs the room",
					vc.Disks[n.name].Paths[0].Path, opts.DeviceSize, sizeText(opts.DeviceSize), st.MDDeviceSize, vc.Name))
			}
		}
	}
	if errors.Is(err, metadata.ErrNoMetadata) {
		// Only a volume this node has never run gets new metadata: if the
		// node has state for it, the metadata was lost or the disk swapped,
		// and starting fresh would forget which blocks the peers miss.
		if _, known, serr := n.store.Volume(vc.Name); serr != nil || known {
			closeDev()
			return nil, nil, fmt.Errorf("no replvol metadata at %s, but this node has run volume %s before: the metadata was overwritten or the disk replaced; nothing was changed. If the disk was replaced on purpose, move this node's state file away so the volume starts over (it then needs a full resync from its peer)", where, vc.Name)
		}
		md, err = metadata.CreateMD(dev, opts)
		if err == nil {
			n.event(vc.Name, "create-md", fmt.Sprintf("created %s metadata at %s", opts.Placement, where))
		}
	}
	if err != nil {
		closeDev()
		return nil, nil, fmt.Errorf("metadata at %s: %w", where, err)
	}
	return md, closeDev, nil
}

func externalSize(vc VolumeConfig, peers int) int64 {
	n, err := metadata.ExternalSize(int64(vc.Size), vc.ALExtents, peers)
	if err != nil {
		return 0
	}
	return n
}

// CreateMetadata initialises a volume's metadata on this node's disk, as
// DRBD's create-md: offline (the node must be stopped), and over existing
// metadata only with force. The node's data then counts as Inconsistent,
// so it gets a full resync from its peer, unless the volume is new.
func CreateMetadata(cfg *Config, name, volume, stateDir string, force bool) (string, error) {
	var vc *VolumeConfig
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
	n := &Node{name: name, self: self, log: discardLogger()}
	n.cfg.Store(cfg)
	st, err := statefile.Open(filepath.Join(stateDir, "state.db"))
	if err != nil {
		return "", err
	}
	defer st.Close()
	n.store = st
	disk, mp, err := n.openDisk(*vc, dc, 0, Options{})
	if err != nil {
		return "", err
	}
	defer disk.Close()
	_ = mp
	if vc.Size == SizeMax {
		// The copy on this node starts over: size: max is what its disk
		// holds now.
		size, err := n.usableSize(*vc, disk)
		if err != nil {
			return "", err
		}
		resolved := *vc
		resolved.Size = VolumeSize(size)
		vc = &resolved
	}
	opts := metadata.MDOptions{
		Placement: metadata.Internal, DeviceSize: disk.Size(), Volume: vc.VolumeUUID(),
		NodeID: cfg.NodeID(name), Peers: n.peerIDs(*vc), ALExtents: vc.ALExtents, Overwrite: force,
		VolumeSize: int64(vc.Size),
	}
	if len(opts.Peers) == 0 {
		opts.Peers = []uint32{0}
	}
	var dev metadata.MDDevice = syncedMDDevice{disk}
	where := "the end of " + dc.Paths[0].Path
	if vc.External() {
		f, err := os.OpenFile(dc.Meta, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return "", err
		}
		defer f.Close()
		size := externalSize(*vc, len(opts.Peers))
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() < size {
			if err := f.Truncate(size); err != nil {
				return "", err
			}
		}
		opts.Placement, opts.DeviceSize, dev, where = metadata.External, int64(vc.Size), mdFile{f}, dc.Meta
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

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// sizeText is a size for people: "1.5GiB", "512.0MiB", "4096B".
func sizeText(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if n < 1<<10 {
		return fmt.Sprintf("%dB", n)
	}
	f, i := float64(n)/(1<<10), 0
	for f >= 1<<10 && i < len(units)-1 {
		f, i = f/(1<<10), i+1
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}
