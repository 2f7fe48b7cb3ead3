package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/caps"
	"github.com/replvol/replvol/metadata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// capabilityOf is a mount volume's capability with file system fs.
func capabilityOf(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
	}
}

// TestE2ENodeExpandGrowsAMountedFileSystem pins NodeExpandVolume on volumes of the cluster
// file, staged and published on a host with no replica (the attachment follows the
// primary):
//   - vol0 holds xfs (fs_type xfs, 320 MiB: mkfs.xfs's least). NodeExpandVolume asking for
//     more than the cluster holds is Unavailable and grows nothing; once the disks and
//     replctl resize grew vol0 to 384 MiB, NodeExpandVolume (no unstage) has the attachment
//     see the new size and grows the mounted xfs by about 64 MiB (xfs_growfs asks for
//     CAP_SYS_ADMIN, which a node plugin has).
//   - vol1 holds ext4 (64 MiB, grown to 96 MiB). NodeExpandVolume while the file system
//     fills the device is done, whatever the process's capabilities. Growing a mounted ext4
//     asks for CAP_SYS_RESOURCE: a process without it gets FailedPrecondition naming it, and
//     the file system is left as it was, until the volume is staged again (the ext4 is then
//     grown before it is mounted); with it, the file system grows at once.
func TestE2ENodeExpandGrowsAMountedFileSystem(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	requireTool(t, "mkfs.xfs", "the Debian package xfsprogs")
	requireTool(t, "xfs_growfs", "the Debian package xfsprogs")
	t.Parallel()
	const (
		xfsFrom, xfsTo = 320 << 20, 384 << 20
		extFrom, extTo = 64 << 20, 96 << 20
	)
	c := startClusterWith(t, false, map[string]int64{volName: xfsFrom, "vol1": extFrom})
	top := sharedTop(t)
	h := startCSI(t, "client", c.control["alpha"], top)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	type staged struct {
		volume, fs, target string
		cap                *csi.VolumeCapability
		restage            func()
	}
	stage := func(volume, fs string) staged {
		t.Helper()
		s := staged{volume: volume, fs: fs, target: filepath.Join(top, "pods", volume), cap: capabilityOf(fs)}
		staging := filepath.Join(top, "staging-"+volume)
		if _, err := h.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: volume, StagingTargetPath: staging, VolumeCapability: s.cap}); err != nil {
			t.Fatalf("NodeStageVolume %s: %v", volume, err)
		}
		t.Cleanup(func() {
			_, _ = h.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: volume, TargetPath: s.target})
			_, _ = h.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: volume, StagingTargetPath: staging})
		})
		publish := func() {
			t.Helper()
			if _, err := h.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: volume, StagingTargetPath: staging, TargetPath: s.target, VolumeCapability: s.cap}); err != nil {
				t.Fatalf("NodePublishVolume %s: %v", volume, err)
			}
		}
		publish()
		s.restage = func() {
			t.Helper()
			if _, err := h.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volume, TargetPath: s.target}); err != nil {
				t.Fatalf("NodeUnpublishVolume %s: %v", volume, err)
			}
			if _, err := h.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volume, StagingTargetPath: staging}); err != nil {
				t.Fatalf("NodeUnstageVolume %s: %v", volume, err)
			}
			if _, err := h.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: volume, StagingTargetPath: staging, VolumeCapability: s.cap}); err != nil {
				t.Fatalf("NodeStageVolume %s again: %v", volume, err)
			}
			publish()
		}
		return s
	}
	total := func(s staged) int64 {
		t.Helper()
		st, err := h.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: s.volume, VolumePath: s.target})
		if err != nil || len(st.GetUsage()) == 0 {
			t.Fatalf("NodeGetVolumeStats %s = %v, %v", s.volume, st, err)
		}
		return st.GetUsage()[0].GetTotal()
	}
	expand := func(s staged, to int64) (*csi.NodeExpandVolumeResponse, error) {
		return h.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: s.volume, VolumePath: s.target,
			CapacityRange: &csi.CapacityRange{RequiredBytes: to}, VolumeCapability: s.cap})
	}
	grow := func(volume string, to int64) {
		t.Helper()
		devSize, err := metadata.InternalDeviceSizeFor(to, 61, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"alpha", "beta"} {
			if err := os.Truncate(c.disk(volume, n), devSize); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := exec.Command(bin("replctl"), "--addr", c.control["alpha"], "resize", volume, strconv.FormatInt(to, 10)).CombinedOutput(); err != nil {
			t.Fatalf("replctl resize %s: %v\n%s", volume, err, out)
		}
	}

	x := stage(volName, "xfs")
	before := total(x)
	if _, err := expand(x, xfsTo); status.Code(err) != codes.Unavailable {
		t.Fatalf("NodeExpandVolume of %s before the cluster grew it: %v; want Unavailable", volName, err)
	}
	if got := total(x); got != before {
		t.Fatalf("the refused NodeExpandVolume changed the file system: %d bytes, was %d", got, before)
	}
	grow(volName, xfsTo)
	r, err := expand(x, xfsTo)
	if err != nil || r.GetCapacityBytes() != xfsTo {
		t.Fatalf("NodeExpandVolume of the xfs on %s = %v, %v; want %d bytes", volName, r, err, xfsTo)
	}
	if after := total(x); after < before+(xfsTo-xfsFrom)*9/10 {
		t.Fatalf("the xfs has %d bytes after NodeExpandVolume, %d before: it did not grow by about 64 MiB", after, before)
	}

	e := stage("vol1", "ext4")
	before = total(e)
	// A file system that fills the device already (csi-sanity grows a volume before it
	// stages it) needs no growth, and no capability.
	if r, err := expand(e, extFrom); err != nil || r.GetCapacityBytes() != extFrom {
		t.Fatalf("NodeExpandVolume of an ext4 that fills vol1 already = %v, %v; want done, %d bytes", r, err, extFrom)
	}
	grow("vol1", extTo)
	r, err = expand(e, extTo)
	if !hasCapability(t, caps.SysResource) {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Fatalf("NodeExpandVolume of a mounted ext4 without CAP_SYS_RESOURCE = %v, %v; want FailedPrecondition naming CAP_SYS_RESOURCE", r, err)
		}
		if got := total(e); got != before {
			t.Fatalf("the refused NodeExpandVolume changed the ext4: %d bytes, was %d", got, before)
		}
		t.Logf("without CAP_SYS_RESOURCE: %v", err)
		// Staged again, the ext4 is grown before it is mounted: no capability is asked.
		e.restage()
		if r, err := expand(e, extTo); err != nil || r.GetCapacityBytes() != extTo {
			t.Fatalf("NodeExpandVolume of the ext4 on vol1 staged again = %v, %v; want done, %d bytes", r, err, extTo)
		}
	} else if err != nil || r.GetCapacityBytes() != extTo {
		t.Fatalf("NodeExpandVolume of the ext4 on vol1 = %v, %v; want %d bytes", r, err, extTo)
	}
	if after := total(e); after < before+(extTo-extFrom)*9/10 {
		t.Fatalf("the ext4 has %d bytes after NodeExpandVolume, %d before: it did not grow by about 32 MiB", after, before)
	}
}

// hasCapability says whether this process holds capability bit.
func hasCapability(t *testing.T, bit uint) bool {
	t.Helper()
	has, err := caps.Has(bit)
	if err != nil {
		t.Fatal(err)
	}
	return has
}
