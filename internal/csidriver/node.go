package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/caps"
	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// replctl's exit codes (cmd/replctl/errors.go): 1 the node refused or the operation failed, 2
// a wrong command line, 3 a node could not be reached.
const (
	replctlRefused     = 1
	replctlUnreachable = 3
)

// NodeGetInfo names this node.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

// NodeGetCapabilities: staging (the attachment), growing the file system, and volume stats.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// attachment is the device replctl attach made here for volume, with a helper that runs;
// "" when there is none.
func (d *Driver) attachment(volume string) (string, error) {
	recs, err := volmount.Registry{Dir: d.cfg.RunDir}.List()
	if err != nil {
		return "", status.Errorf(codes.Internal, "read the attachments in %s: %v", d.cfg.RunDir, err)
	}
	for _, r := range recs {
		if r.Attached && r.Volume == volume && r.Device != "" && r.Helper.Stays() {
			return r.Device, nil
		}
	}
	return "", nil
}

// replctl runs replctl with the control address and certificates; its stdout, or an error
// whose code says what replctl's exit code says: FailedPrecondition for a refusal (another
// host holds the volume's claim), Unavailable when no node could be reached.
func (d *Driver) replctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AttachTimeout)
	defer cancel()
	full := []string{"--addr", d.cfg.Addr, "--timeout", d.cfg.AttachTimeout.String()}
	if d.cfg.TLSDir != "" {
		full = append(full, "--tls-dir", d.cfg.TLSDir)
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, d.cfg.Replctl, full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		return string(out), nil
	}
	words := strings.TrimSpace(stderr.String())
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "", status.Errorf(codes.DeadlineExceeded, "replctl %s: no answer within %s: %s", args[0], d.cfg.AttachTimeout, words)
	case errors.As(err, &ee) && ee.ExitCode() == replctlRefused:
		return "", status.Errorf(codes.FailedPrecondition, "replctl %s: %s", args[0], words)
	case errors.As(err, &ee) && ee.ExitCode() == replctlUnreachable:
		return "", status.Errorf(codes.Unavailable, "replctl %s: %s", args[0], words)
	}
	return "", status.Errorf(codes.Internal, "replctl %s: %v: %s", args[0], err, words)
}

// knownVolume is nil when the cluster has volume, codes.NotFound when it has not: the
// control API's list of volumes, of the cluster file and of raft (a node without it: the
// volumes of its cluster status).
func (d *Driver) knownVolume(ctx context.Context, volume string) error {
	ctx, cancel := d.call(ctx)
	defer cancel()
	list, err := d.client.VolumeList(ctx, &transport.VolumeListRequest{})
	if status.Code(err) == codes.Unimplemented {
		st, err := d.client.ClusterStatus(ctx, &transport.StatusRequest{})
		if err != nil {
			return apiError("ask the cluster for its volumes", err)
		}
		for _, v := range st.Volumes {
			if v.Name == volume {
				return nil
			}
		}
		return status.Errorf(codes.NotFound, "no volume %s in the cluster", volume)
	}
	if err != nil {
		return apiError("list the volumes", err)
	}
	for _, v := range list.Volumes {
		if v.Name == volume {
			return nil
		}
	}
	return status.Errorf(codes.NotFound, "no volume %s in the cluster", volume)
}

// started is how far a volume just created must have started for what comes next
// (waitStarted).
type started int

const (
	// served: a primary serves its export (replctl attach --follow refuses a volume the
	// status does not list, or whose primary does not serve yet).
	served started = iota
	// heldEverywhere: every replica's node holds it (has opened it): a resize grows every
	// replica, and refuses, changing nothing, while one does not hold the volume yet.
	heldEverywhere
)

// waitStarted waits, up to within, until volume has started as far as want says (a volume
// just created is recorded in raft before its nodes start it, each in its own time). Not
// in time is codes.Unavailable, saying what was seen.
func (d *Driver) waitStarted(ctx context.Context, volume string, want started, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	seen := "not listed"
	for {
		st, err := d.client.ClusterStatus(ctx, &transport.StatusRequest{})
		if err != nil {
			seen = err.Error()
		} else {
			seen = "not listed in the cluster's status yet"
			for _, v := range st.Volumes {
				if v.Name != volume {
					continue
				}
				switch missing := notHolding(v); {
				case want == served && (v.Primary == "" || v.NBDURI == ""):
					seen = fmt.Sprintf("no primary serves it yet (primary %q)", v.Primary)
				case want == heldEverywhere && len(missing) > 0:
					seen = fmt.Sprintf("not held yet by %s (not started there, or not reachable)", strings.Join(missing, ", "))
				default:
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return status.Errorf(codes.Unavailable, "volume %s is not started after %s: %s; try again", volume, within, seen)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// notHolding names the replicas of v whose node does not hold it: not reachable, or not
// running it yet.
func notHolding(v transport.VolumeStatus) []string {
	var missing []string
	for _, r := range v.Replicas {
		if !r.Reachable {
			missing = append(missing, r.Node)
		}
	}
	return missing
}

// attach attaches volume here, following its primary, unless it is already: its device.
func (d *Driver) attach(ctx context.Context, volume string) (string, error) {
	if dev, err := d.attachment(volume); dev != "" || err != nil {
		return dev, err
	}
	if err := d.knownVolume(ctx, volume); err != nil {
		return "", err
	}
	if err := d.waitStarted(ctx, volume, served, d.cfg.AttachTimeout); err != nil {
		return "", err
	}
	out, err := d.replctl(ctx, "attach", volume, "--follow", "--run-dir", d.cfg.RunDir, "--io-timeout", d.cfg.IOTimeout.String())
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) == 0 || !strings.HasPrefix(f[0], "/dev/") {
		return "", status.Errorf(codes.Internal, "replctl attach %s printed %q, not the device", volume, out)
	}
	return f[0], nil
}

// NodeStageVolume attaches the volume on this host, following its primary (replctl attach
// --follow); a mount volume then gets a file system (ext4, or the capability's fs_type) when
// it has none and is mounted on the staging path, read-only for SINGLE_NODE_READER_ONLY
// (which makes no file system). Staging again what is staged is done; a
// staging path that holds another volume is codes.AlreadyExists; a volume another host
// holds (its primary's mount claim) is codes.FailedPrecondition.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	volume, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"staging_target_path", staging, "the staging path"},
		arg{"volume_capability", present(req.GetVolumeCapability() != nil), "the volume's capability"}); err != nil {
		return nil, err
	}
	if why := supported(req.GetVolumeCapability()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	mount := req.GetVolumeCapability().GetMount()
	if mount != nil {
		mounted, err := isMountPoint(staging)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "staging path %s: %v", staging, err)
		}
		if mounted {
			dev, err := d.attachment(volume)
			if err != nil {
				return nil, err
			}
			if dev == "" || !holds(staging, dev) {
				return nil, status.Errorf(codes.AlreadyExists, "staging path %s holds another mount, not volume %s: unstage what is there first", staging, volume)
			}
			return &csi.NodeStageVolumeResponse{}, nil
		}
	}
	dev, err := d.attach(ctx, volume)
	if err != nil {
		return nil, err
	}
	if mount == nil {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	fs, err := fsType(ctx, dev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s on %s: %v", volume, dev, err)
	}
	want := mount.GetFsType()
	if want == "" {
		want = "ext4"
	}
	readOnly := req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	switch {
	case fs == "" && readOnly:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s holds no file system, and it is staged read-only: nothing is made on it; stage it for a writer first", volume)
	case fs == "":
		d.cfg.Logf("volume %s holds no file system: making %s on %s", volume, want, dev)
		if err := run(ctx, "mkfs."+want, "-q", dev); err != nil {
			return nil, status.Errorf(codes.Internal, "make a file system on volume %s: %v", volume, err)
		}
		fs = want
	case mount.GetFsType() != "" && fs != want:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s holds %s, not the %s asked for: it is left as it is", volume, fs, want)
	}
	if !readOnly && (fs == "ext4" || fs == "ext3" || fs == "ext2") {
		// Where the node plugin lacks CAP_SYS_RESOURCE a mounted ext4 cannot grow
		// (NodeExpandVolume is refused): one the volume outgrew is grown here, unmounted.
		if err := growExtOffline(ctx, dev, d.cfg.Logf); err != nil {
			return nil, status.Errorf(codes.Internal, "grow the ext4 of volume %s to its device: %v", volume, err)
		}
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "staging path %s: %v", staging, err)
	}
	opts := strings.Join(mount.GetMountFlags(), ",")
	var flags uintptr
	if readOnly {
		flags = unix.MS_RDONLY
	}
	if err := unix.Mount(dev, staging, fs, flags, opts); err != nil {
		return nil, status.Errorf(codes.Internal, "mount volume %s (%s, %s) on %s: %v", volume, dev, fs, staging, err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume unmounts the staging path and detaches the volume: the helper process
// and the loop device go, and the claim goes back to the primary. What is not staged is done.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	volume, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"staging_target_path", staging, "the staging path"}); err != nil {
		return nil, err
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	dev, err := d.attachment(volume)
	if err != nil {
		return nil, err
	}
	mounted, err := isMountPoint(staging)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "staging path %s: %v", staging, err)
	}
	if mounted {
		if dev == "" || !holds(staging, dev) {
			return nil, status.Errorf(codes.FailedPrecondition, "staging path %s holds another mount, not volume %s: it is left as it is", staging, volume)
		}
		if err := unmount(ctx, staging, busyPatience); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "unmount volume %s from %s: %v (is it still published?)", volume, staging, err)
		}
	}
	if dev == "" {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if _, err := d.replctl(ctx, "detach", volume, "--run-dir", d.cfg.RunDir); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume binds the staging path on the target path (a directory it creates), or,
// for a block volume, the device on the target (a file it creates); read-only when asked.
// Publishing again what is published there is done; another mount there is AlreadyExists.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	volume, staging, target := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"staging_target_path", staging, "the staging path (the volume is staged first)"},
		arg{"target_path", target, "the target path"}, arg{"volume_capability", present(req.GetVolumeCapability() != nil), "the volume's capability"}); err != nil {
		return nil, err
	}
	if why := supported(req.GetVolumeCapability()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	dev, err := d.attachment(volume)
	if err != nil {
		return nil, err
	}
	if dev == "" {
		if err := d.knownVolume(ctx, volume); err != nil {
			return nil, err
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on this node: stage it first", volume)
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	source := staging
	if block {
		source = dev
	} else if mounted, err := isMountPoint(staging); err != nil || !mounted || !holds(staging, dev) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not mounted on the staging path %s: stage it there first", volume, staging)
	}
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "target path %s: %v", target, err)
	}
	if mounted {
		if holds(target, dev) {
			return &csi.NodePublishVolumeResponse{}, nil
		}
		return nil, status.Errorf(codes.AlreadyExists, "target path %s holds another mount, not volume %s", target, volume)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "target path %s: %v", target, err)
	}
	if block {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "target path %s: %v", target, err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "target path %s: %v", target, err)
	}
	if err := bind(source, target, req.GetReadonly()); err != nil {
		return nil, status.Errorf(codes.Internal, "publish volume %s: %v", volume, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target path and removes it; what is not published is done.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	volume, target := req.GetVolumeId(), req.GetTargetPath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"target_path", target, "the target path"}); err != nil {
		return nil, err
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "target path %s: %v", target, err)
	}
	if mounted {
		if err := unmount(ctx, target, busyPatience); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove the target path %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// published is the device of volume when path holds it here (staged or published), or
// codes.NotFound.
func (d *Driver) published(ctx context.Context, volume, path string) (string, error) {
	if err := d.knownVolume(ctx, volume); err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err != nil {
		return "", status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	dev, err := d.attachment(volume)
	if err != nil {
		return "", err
	}
	if dev == "" || !holds(path, dev) {
		return "", status.Errorf(codes.NotFound, "volume %s is not at %s on this node", volume, path)
	}
	return dev, nil
}

// NodeGetVolumeStats is the file system's bytes and inodes (statfs), or a block volume's size.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	volume, path := req.GetVolumeId(), req.GetVolumePath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"volume_path", path, "the path the volume is at"}); err != nil {
		return nil, err
	}
	dev, err := d.published(ctx, volume, path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
		size, err := deviceSize(dev)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "size of %s: %v", dev, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bs := int64(fs.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}

// NodeExpandVolume makes the attachment see the volume's new size (the loop device's capacity
// read again) and grows the file system on it (resize2fs, xfs_growfs); a block volume only
// needs the first.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	volume, path := req.GetVolumeId(), req.GetVolumePath()
	if err := required(arg{"volume_id", volume, "the volume's ID"}, arg{"volume_path", path, "the path the volume is at"}); err != nil {
		return nil, err
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	dev, err := d.published(ctx, volume, path)
	if err != nil {
		return nil, err
	}
	// NBD tells no client that the volume grew: the attachment's helper is asked now, and
	// when it grew the helper grows its loop device (replctl attach --refresh).
	if _, err := d.replctl(ctx, "attach", "--refresh", volume, "--run-dir", d.cfg.RunDir); err != nil {
		return nil, err
	}
	size, err := deviceSize(dev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "size of %s: %v", dev, err)
	}
	if want := req.GetCapacityRange().GetRequiredBytes(); want > 0 && size < want {
		return nil, status.Errorf(codes.Unavailable, "volume %s is %d bytes on this node, not yet the %d asked for: try again once the cluster grew it", volume, size, want)
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	fs, err := fsType(ctx, dev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	// resize2fs and xfs_growfs do nothing, and ask the kernel for nothing, when the file
	// system fills the device already (a volume grown before it was staged); only a growth
	// asks for the capability.
	switch fs {
	case "ext4", "ext3", "ext2":
		err = run(ctx, "resize2fs", dev)
	case "xfs":
		err = run(ctx, "xfs_growfs", path)
	default:
		err = fmt.Errorf("replvol.csi.io grows ext4 and xfs, and the volume holds %q", fs)
	}
	if err == nil {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	capEff, cerr := caps.Effective()
	if cerr != nil {
		return nil, status.Errorf(codes.Internal, "grow the file system of volume %s: %v (and this process's capabilities cannot be read: %v)", volume, err, cerr)
	}
	if name := missingGrowCapability(fs, capEff); name != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is %d bytes on this node, and its %s file system cannot grow online: the kernel asks for %s, which replcsi lacks (run the node plugin's container with it: privileged, or securityContext.capabilities.add %s); %v", volume, size, fs, name, strings.TrimPrefix(name, "CAP_"), err)
	}
	return nil, status.Errorf(codes.Internal, "grow the file system of volume %s: %v", volume, err)
}

// arg is one field of a request that must be given: its name in the CSI
// spec, its value ("" when missing), and what to give in words.
type arg struct{ field, value, what string }

// present is a value for arg of a field that is a message: set or not.
func present(ok bool) string {
	if ok {
		return "set"
	}
	return ""
}

// required refuses a request that lacks one of args, naming the first
// missing (codes.InvalidArgument), as CSI asks.
func required(args ...arg) error {
	for _, a := range args {
		if a.value == "" {
			return status.Errorf(codes.InvalidArgument, "%s: give %s", a.field, a.what)
		}
	}
	return nil
}
