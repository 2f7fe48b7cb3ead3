package node

import (
	"errors"
	"fmt"
	"os"

	"github.com/replvol/replvol/metadata"
)

// peerIDs returns the metadata ids of a volume's other nodes.
func (n *Node) peerIDs(vc VolumeConfig) []uint32 {
	var ids []uint32
	for _, nc := range n.cfg.Nodes {
		if _, ok := vc.Disks[nc.Name]; ok && nc.Name != n.name {
			ids = append(ids, n.cfg.NodeID(nc.Name))
		}
	}
	return ids
}

// requiredDiskSize is what the backing device must hold: the volume, plus
// internal metadata at its end.
func (n *Node) requiredDiskSize(vc VolumeConfig) (int64, error) {
	if vc.External() {
		return int64(vc.Size), nil
	}
	return metadata.InternalDeviceSize(int64(vc.Size), vc.ALExtents, max(1, len(n.peerIDs(vc))))
}

// mdFile is an external metadata file.
type mdFile struct{ *os.File }

func (f mdFile) Sync() error { return f.File.Sync() }

// openMD opens the volume's on-disk metadata on this node, creating it on
// a disk that has none yet (a new volume). It refuses metadata of another
// volume or node, of a newer format, or corrupt, and says which.
func (n *Node) openMD(vc VolumeConfig, disk Disk) (*metadata.MD, func() error, error) {
	opts := metadata.MDOptions{
		Placement: metadata.Internal, DeviceSize: disk.Size(), Volume: vc.VolumeUUID(),
		NodeID: n.cfg.NodeID(n.name), Peers: n.peerIDs(vc), ALExtents: vc.ALExtents,
	}
	if len(opts.Peers) == 0 {
		opts.Peers = []uint32{0}
	}
	var dev metadata.MDDevice = disk
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
	if errors.Is(err, metadata.ErrNoMetadata) {
		md, err = metadata.CreateMD(dev, opts)
		if err == nil {
			n.event(vc.Name, "create-md", fmt.Sprintf("created %s metadata at %s", opts.Placement, where))
		}
	}
	if err != nil {
		closeDev()
		return nil, nil, fmt.Errorf("metadata at %s: %w", where, err)
	}
	if md.UsableSize() < int64(vc.Size) {
		md.Close()
		closeDev()
		return nil, nil, fmt.Errorf("metadata at %s leaves %d usable bytes, the volume needs %d: grow the device", where, md.UsableSize(), vc.Size)
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
