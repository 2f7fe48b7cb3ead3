package node

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
)

// peerIDs returns the metadata ids of a volume's other nodes.
func (n *Node) peerIDs(vc VolumeConfig) []uint32 { return backing.PeerIDs(n.config(), n.name, vc) }

// requiredDiskSize is what the backing device must hold to open the
// volume's metadata: the smallest layout, without a checksum area
// (backing.RequiredSizeFor), since metadata made before checksums, or with
// checksums: off, has none. openMD checks that a disk whose metadata it
// creates holds the checksum area too.
func (n *Node) requiredDiskSize(vc VolumeConfig) (int64, error) {
	return backing.RequiredSizeFor(n.config(), n.name, vc, false)
}

// usableSize is the largest volume this node's disk holds after its
// metadata (backing.UsableSize).
func (n *Node) usableSize(vc VolumeConfig, disk Disk) (int64, error) {
	return backing.UsableSize(n.config(), n.name, vc, disk)
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
		msg = fmt.Sprintf("the config file says size %d (%s) for %s, but it was resized online to %d (%s) on %s: %s runs it at %d. Put size: %s in volumes[%s] of the file on every node (a SIGHUP then takes it)",
			file, sizeText(file), volume, recorded, sizeText(recorded), n.name, n.name, recorded, human.ExactBytes(recorded), volume)
	} else {
		msg = fmt.Sprintf("the config file says size %d (%s) for %s, but %s's copy is %d (%s): it runs at %d, and its peers refuse it while theirs is larger. To grow it to the file's size: make its disk hold that size with its metadata, then replctl resize %s %d --node %s",
			file, sizeText(file), volume, n.name, recorded, sizeText(recorded), recorded, volume, file, n.name)
	}
	n.log.Warn(msg, "volume", volume)
	n.event(volume, "size-differs", msg)
}

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
		// Only CreateMD reads Checksums: existing metadata keeps the
		// format it has (format 1: checksums off, whatever the file says).
		Checksums: vc.ChecksumsOn(),
		// The data device itself: the metadata device of internal
		// metadata syncs nothing (its writes are durable on their own),
		// and the checksums need the data synced BEFORE them.
		DataDevice: disk,
	}
	if len(opts.Peers) == 0 {
		opts.Peers = []uint32{0}
	}
	var dev metadata.MDDevice = backing.SyncedMDDevice{Disk: disk}
	var metaFile *os.File // external metadata's file
	closeDev := func() error { return nil }
	where := fmt.Sprintf("the end of %s", vc.Disks[n.name].Paths[0].Path)
	if vc.External() {
		path := vc.Disks[n.name].Meta
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("external metadata %s: %w (create it: truncate -s %d %s)", path, err, backing.ExternalSize(vc, len(opts.Peers)), path)
		}
		opts.Placement, opts.DeviceSize = metadata.External, int64(vc.Size)
		dev, closeDev, where = backing.MDFile{File: f}, f.Close, path
		metaFile = f
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
		if need, serr := backing.RequiredSize(n.config(), n.name, vc); serr == nil && opts.Placement == metadata.Internal && disk.Size() < need {
			closeDev()
			return nil, nil, fmt.Errorf("%s holds %d bytes (%s), but volume %s of %d bytes and its metadata with checksums need %d (%s); nothing was changed. Grow it to %d bytes, or set checksums: off in volumes[%s] of the config to lay out metadata without checksums",
				vc.Disks[n.name].Paths[0].Path, disk.Size(), sizeText(disk.Size()), vc.Name, vc.Size, need, sizeText(need), need, vc.Name)
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
	switch _, has := md.Checksums(); {
	case !has && vc.Checksums == "on":
		n.enableChecksums(vc, md, disk, metaFile, where)
	case has:
		if err := n.checksumsOffOrBack(vc, md); err != nil {
			closeDev()
			return nil, nil, fmt.Errorf("metadata at %s: %w", where, err)
		}
	}
	return md, closeDev, nil
}

// checksumsOffOrBack keeps the state file in step with checksums: off on
// metadata that has a checksum area. Off: the area stays, and the node
// neither computes nor verifies sums (newVolume); the state file says so
// BEFORE the volume runs, stopping any scrub. Back on (or unset) after
// that: the sums on disk missed every write made meanwhile, so they are
// all dropped, durably, BEFORE the volume runs, and a build (a scrub
// marked Build) makes them again; the state file says so after the drop,
// so that a node going down between the two drops them again.
func (n *Node) checksumsOffOrBack(vc VolumeConfig, md *metadata.MD) error {
	rec, _, err := n.store.Scrub(vc.Name)
	if err != nil {
		return fmt.Errorf("read the scrub record: %w", err)
	}
	switch {
	case vc.Checksums == "off" && !rec.ChecksumsOff:
		rec.ChecksumsOff = true
		rec.State, rec.Build, rec.Offset, rec.Built = "", false, 0, 0
		rec.Checked, rec.Repaired, rec.Unrecoverable = 0, 0, 0
		if err := n.store.PutScrub(vc.Name, rec); err != nil {
			return fmt.Errorf("record that checksums are off: %w", err)
		}
		n.event(vc.Name, "checksums-off", fmt.Sprintf("checksums: off for %s: its metadata keeps its checksum area, but %s stores and verifies no sum from now on; checksums: on (or unset) builds them again", vc.Name, n.name))
	case vc.Checksums != "off" && rec.ChecksumsOff:
		if err := md.ForgetChecksums(); err != nil {
			return fmt.Errorf("drop the checksums that missed the writes made while they were off: %w", err)
		}
		rec.ChecksumsOff = false
		rec.State, rec.Build, rec.Offset, rec.Built, rec.Rate = scrubRunning.String(), true, 0, 0, 0
		rec.Checked, rec.Repaired, rec.Unrecoverable = 0, 0, 0
		if err := n.store.PutScrub(vc.Name, rec); err != nil {
			return fmt.Errorf("record the build of the checksums: %w", err)
		}
		n.event(vc.Name, "checksums-on", fmt.Sprintf("checksums turned on again for %s: the sums kept from before they were off were dropped; they are being built in the background (status: checksums building)", vc.Name))
	}
	return nil
}

// enableChecksums turns checksums on for a volume whose metadata has no
// checksum area (made before checksums, or with checksums: off) when the
// file says checksums: on in so many words (unset turns them on only for
// metadata this version creates). It runs when the node opens the volume,
// BEFORE the volume serves or applies anything, so no write races the
// conversion (metadata.MD.EnableChecksums); the node's peers serve the
// volume meanwhile when the node restarts for it. The pass that builds
// the sums (a scrub marked Build) is recorded in the state file BEFORE
// the conversion, so that a node going down between the two resumes the
// pass once the metadata has its area, and runs when the volume starts
// (resumeScrubAtStart). Without room the metadata stays as it is, not a
// byte changed, and the volume runs without checksums; an event and the
// log say how much room to make.
func (n *Node) enableChecksums(vc VolumeConfig, md *metadata.MD, disk Disk, metaFile *os.File, where string) {
	fail := func(msg string) {
		msg = fmt.Sprintf("checksums: on for %s, but %s; it runs without checksums on %s (status says checksums: false)", vc.Name, msg, n.name)
		n.log.Error(msg, "volume", vc.Name)
		n.event(vc.Name, "checksums-refused", msg)
	}
	if metaFile != nil {
		// A regular file is lengthened to the format-2 size: that
		// changes none of the metadata's bytes, and none of the data's.
		sb := md.Superblock()
		need, err := metadata.ExternalSizeFor(sb.DeviceSize, int(sb.ALExtents), len(sb.Peers), true)
		if err != nil {
			fail(err.Error())
			return
		}
		if fi, err := metaFile.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() < need {
			if err := metaFile.Truncate(need); err != nil {
				fail(fmt.Sprintf("lengthening its metadata file %s to %d bytes failed: %v", where, need, err))
				return
			}
			if err := metaFile.Sync(); err != nil {
				fail(fmt.Sprintf("syncing its metadata file %s failed: %v", where, err))
				return
			}
		}
	}
	opts := metadata.EnableChecksumsOptions{DeviceSize: disk.Size(), DataDevice: disk}
	if err := md.CheckEnableChecksums(opts); err != nil {
		fail(fmt.Sprintf("its metadata at %s has no room for a checksum area: %v", where, err))
		return
	}
	prev, _, err := n.store.Scrub(vc.Name)
	if err != nil {
		fail(fmt.Sprintf("the state file cannot be read: %v", err))
		return
	}
	rec := prev
	rec.State, rec.Build, rec.Offset, rec.Rate = scrubRunning.String(), true, 0, 0
	rec.Checked, rec.Repaired, rec.Unrecoverable = 0, 0, 0
	if err := n.store.PutScrub(vc.Name, rec); err != nil {
		fail(fmt.Sprintf("the pass that builds the checksums cannot be recorded in the state file: %v", err))
		return
	}
	rep, err := md.EnableChecksums(opts)
	if err != nil {
		prev.State, prev.Build = "", false
		if perr := n.store.PutScrub(vc.Name, prev); perr != nil {
			n.log.Warn("take back the record of the checksum build", "volume", vc.Name, "err", perr)
		}
		fail(fmt.Sprintf("its metadata at %s could not take a checksum area: %v", where, err))
		return
	}
	how := fmt.Sprintf("a checksum area of %s was laid out beside the bitmaps", human.Bytes(rep.AreaBytes))
	if rep.Moved {
		how = fmt.Sprintf("the metadata was laid out again with a checksum area of %s", human.Bytes(rep.AreaBytes))
	}
	n.event(vc.Name, "checksums-on", fmt.Sprintf("checksums turned on for %s at %s: %s; the checksums of the blocks written before are being built in the background (status: checksums building), and every block is verified once it has one",
		vc.Name, where, how))
}

// CreateMetadata initialises a volume's metadata on node name's disk,
// offline (backing.CreateMetadata).
func CreateMetadata(cfg *Config, name, volume, stateDir string, force bool) (string, error) {
	return backing.CreateMetadata(cfg, name, volume, stateDir, force)
}

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
