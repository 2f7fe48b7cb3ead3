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
	"github.com/replvol/replvol/metadata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestE2ENodeExpandGrowsTheFileSystemOnceTheAttachmentSeesTheNewSize pins NodeExpandVolume:
// vol0 is staged and published (ext4 over 64 MiB), then grown to 96 MiB on both nodes
// (their disks first, then replctl resize). The attachment still has the size it connected
// with, so NodeExpandVolume answers Unavailable and grows nothing; once the volume is
// staged again (a new connection sees 96 MiB), it grows the file system, and the stats show
// it larger. ext4's online resize needs CAP_SYS_RESOURCE: without it the last step is
// skipped (a failure under CI=true).
func TestE2ENodeExpandGrowsTheFileSystemOnceTheAttachmentSeesTheNewSize(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	t.Parallel()
	c := startCluster(t, false)
	top := sharedTop(t)
	h := startCSI(t, "client", c.control["alpha"], top)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	staging := filepath.Join(top, "staging")
	target := filepath.Join(top, "pods", "target")
	stage := &csi.NodeStageVolumeRequest{VolumeId: volName, StagingTargetPath: staging, VolumeCapability: mountCap()}
	publish := &csi.NodePublishVolumeRequest{VolumeId: volName, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: volName, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: volName, StagingTargetPath: staging}
	total := func() int64 {
		t.Helper()
		st, err := h.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: volName, VolumePath: target})
		if err != nil || len(st.GetUsage()) == 0 {
			t.Fatalf("NodeGetVolumeStats = %v, %v", st, err)
		}
		return st.GetUsage()[0].GetTotal()
	}
	if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	before := total()

	const grown = 96 << 20
	devSize, err := metadata.InternalDeviceSizeFor(grown, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alpha", "beta"} {
		if err := os.Truncate(filepath.Join(c.dir, n+".img"), devSize); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(bin("replctl"), "--addr", c.control["alpha"], "resize", volName, strconv.Itoa(grown)).CombinedOutput(); err != nil {
		t.Fatalf("replctl resize: %v\n%s", err, out)
	}
	expand := &csi.NodeExpandVolumeRequest{VolumeId: volName, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: mountCap()}
	if _, err := h.node.NodeExpandVolume(ctx, expand); status.Code(err) != codes.Unavailable {
		t.Fatalf("NodeExpandVolume while the attachment has the old size: %v; want Unavailable", err)
	}
	if got := total(); got != before {
		t.Fatalf("the refused NodeExpandVolume changed the file system: %d bytes, was %d", got, before)
	}

	for _, step := range []func() error{
		func() error { _, err := h.node.NodeUnpublishVolume(ctx, unpublish); return err },
		func() error { _, err := h.node.NodeUnstageVolume(ctx, unstage); return err },
		func() error { _, err := h.node.NodeStageVolume(ctx, stage); return err },
		func() error { _, err := h.node.NodePublishVolume(ctx, publish); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("staging again: %v", err)
		}
	}
	if !haveCapability(t, capSysResource) {
		// Unpublish and unstage first: the skip (or failure) of missing runs no more steps.
		_, _ = h.node.NodeUnpublishVolume(ctx, unpublish)
		_, _ = h.node.NodeUnstageVolume(ctx, unstage)
		missing(t, "growing a mounted ext4 (resize2fs) needs CAP_SYS_RESOURCE, which this process lacks: run the test as root with every capability")
	}
	r, err := h.node.NodeExpandVolume(ctx, expand)
	if err != nil || r.GetCapacityBytes() != grown {
		t.Fatalf("NodeExpandVolume after staging again = %v, %v; want %d bytes", r, err, grown)
	}
	if after := total(); after < before+(grown-64<<20)*9/10 {
		t.Fatalf("the file system has %d bytes after NodeExpandVolume, %d before: it did not grow by about 32 MiB", after, before)
	}
	if _, err := h.node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := h.node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// capSysResource is CAP_SYS_RESOURCE's bit: ext4's online resize asks for it.
const capSysResource = 24

// haveCapability says whether this process's effective capabilities hold bit c.
func haveCapability(t *testing.T, c uint) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatalf("CapEff %q: %v", hex, err)
			}
			return v&(1<<c) != 0
		}
	}
	t.Fatal("/proc/self/status has no CapEff line")
	return false
}
