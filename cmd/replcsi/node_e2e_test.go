package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// mountCap is a single-node-writer ext4 mount capability.
func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	}
}

// TestE2EStagePublishWriteAndUndoOnAHostWithoutAReplica pins the node service on a host that
// holds no replica of the volume (a run directory of its own, not a node of the cluster): a
// volume of the cluster file with no file system is staged (attached following its primary,
// ext4 made, mounted), staged again (nothing to do), published, written, unpublished and
// unstaged, through replcsi's gRPC over its unix socket; then staged and published again
// read-only, where the file is still there and a write is refused; and so for a stage of a
// reader-only capability, published without the read-only flag. A second host cannot
// stage it while the first holds it (FailedPrecondition); nothing is left mounted or
// attached at the end.
func TestE2EStagePublishWriteAndUndoOnAHostWithoutAReplica(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	t.Parallel()
	c := startCluster(t, false)
	top := sharedTop(t)
	h := startCSI(t, "client", c.control["beta"], top)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	if r, err := h.ident.Probe(ctx, &csi.ProbeRequest{}); err != nil || !r.GetReady().GetValue() {
		t.Fatalf("Probe = %v, %v; want ready", r, err)
	}
	if r, err := h.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil || r.GetNodeId() != "client" {
		t.Fatalf("NodeGetInfo = %v, %v; want node client", r, err)
	}
	staging := filepath.Join(top, "staging")
	target := filepath.Join(top, "pods", "target")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	stage := &csi.NodeStageVolumeRequest{VolumeId: volName, StagingTargetPath: staging, VolumeCapability: mountCap()}
	for i := range 2 {
		if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
			t.Fatalf("NodeStageVolume (%d): %v", i+1, err)
		}
	}
	if recs := h.attached(); len(recs) != 1 || !recs[0].Follow || recs[0].Volume != volName {
		t.Fatalf("after staging, the attachments are %+v; want vol0's, following the primary", recs)
	}

	// A second host: the mount claim keeps the volume to one.
	other := startCSI(t, "other", c.control["alpha"], top)
	otherStaging := filepath.Join(top, "other-staging")
	if err := os.MkdirAll(otherStaging, 0o750); err != nil {
		t.Fatal(err)
	}
	_, err := other.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: volName, StagingTargetPath: otherStaging, VolumeCapability: mountCap()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("staging vol0 on a second host: %v; want FailedPrecondition", err)
	}
	if recs := other.attached(); len(recs) != 0 {
		t.Fatalf("the refused stage left attachments on the second host: %+v", recs)
	}

	publish := &csi.NodePublishVolumeRequest{VolumeId: volName, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()}
	if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	data := bytes.Repeat([]byte("replcsi "), 64<<10)
	if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(target, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, err := h.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: volName, VolumePath: target})
	if err != nil || len(st.GetUsage()) == 0 || st.GetUsage()[0].GetUsed() < int64(len(data)) {
		t.Fatalf("NodeGetVolumeStats = %v, %v; want at least %d bytes used", st, err, len(data))
	}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: volName, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: volName, StagingTargetPath: staging}
	for i := range 2 {
		if _, err := h.node.NodeUnpublishVolume(ctx, unpublish); err != nil {
			t.Fatalf("NodeUnpublishVolume (%d): %v", i+1, err)
		}
	}
	if fileExists(target) {
		t.Fatalf("NodeUnpublishVolume left the target path %s", target)
	}
	for i := range 2 {
		if _, err := h.node.NodeUnstageVolume(ctx, unstage); err != nil {
			t.Fatalf("NodeUnstageVolume (%d): %v", i+1, err)
		}
	}
	if m := mountsUnder(t, top); len(m) != 0 {
		t.Fatalf("after unstaging, still mounted: %v", m)
	}
	if recs := h.attached(); len(recs) != 0 {
		t.Fatalf("after unstaging, still attached: %+v", recs)
	}

	// Again, read-only: the file is there, and a write is refused.
	if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume again: %v", err)
	}
	publish.Readonly = true
	if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("NodePublishVolume read-only: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(target, "data"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file written before, read back through a new stage: %d bytes, %v; want the %d written", len(got), err, len(data))
	}
	if err := os.WriteFile(filepath.Join(target, "more"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("a write to the read-only publish: %v; want EROFS", err)
	}
	if _, err := h.node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := h.node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}

	// Staged for a reader only: the file system is mounted read-only, even where the
	// publish does not ask for it.
	readerOnly := mountCap()
	readerOnly.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	stage.VolumeCapability, publish.VolumeCapability, publish.Readonly = readerOnly, readerOnly, false
	if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume for a reader only: %v", err)
	}
	if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("NodePublishVolume for a reader only: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file read through a reader-only stage: %d bytes, %v", len(got), err)
	}
	if err := os.WriteFile(filepath.Join(target, "more"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("a write to a volume staged for a reader only: %v; want EROFS", err)
	}
	if _, err := h.node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := h.node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if m := mountsUnder(t, top); len(m) != 0 {
		t.Fatalf("at the end, still mounted: %v", m)
	}
	if recs := h.attached(); len(recs) != 0 {
		t.Fatalf("at the end, still attached: %+v", recs)
	}
}

// blockCap is a single-node-writer raw block capability.
func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

// TestE2EARawBlockVolumeIsPublishedAsADeviceFile pins block volumes: staging only attaches
// (no file system is made), publishing binds the device on a file the driver creates at the
// target path, the stats give the volume's size, and what is written through the target is
// read back through a new attachment; unpublish removes the file, and nothing is left.
func TestE2EARawBlockVolumeIsPublishedAsADeviceFile(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	t.Parallel()
	c := startCluster(t, false)
	top := sharedTop(t)
	h := startCSI(t, "client", c.control["alpha"], top)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	staging := filepath.Join(top, "staging")
	target := filepath.Join(top, "pods", "dev", "target")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	stage := &csi.NodeStageVolumeRequest{VolumeId: volName, StagingTargetPath: staging, VolumeCapability: blockCap()}
	publish := &csi.NodePublishVolumeRequest{VolumeId: volName, StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockCap()}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: volName, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: volName, StagingTargetPath: staging}
	data := bytes.Repeat([]byte("block!!!"), 512)
	for round := range 2 {
		if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
		for i := range 2 {
			if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
				t.Fatalf("NodePublishVolume (%d): %v", i+1, err)
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat(target, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFBLK {
			t.Fatalf("the target %s is not a block device: mode %o, %v", target, st.Mode, err)
		}
		stats, err := h.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: volName, VolumePath: target})
		if err != nil || len(stats.GetUsage()) != 1 || stats.GetUsage()[0].GetTotal() != 64<<20 {
			t.Fatalf("NodeGetVolumeStats of the block volume = %v, %v; want a total of 64 MiB", stats, err)
		}
		f, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			if _, err := f.WriteAt(data, 1<<20); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		} else {
			got := make([]byte, len(data))
			if _, err := f.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back through a new attachment: %q..., %v", got[:16], err)
			}
		}
		f.Close()
		if _, err := h.node.NodeUnpublishVolume(ctx, unpublish); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
		if fileExists(target) {
			t.Fatalf("NodeUnpublishVolume left %s", target)
		}
		if _, err := h.node.NodeUnstageVolume(ctx, unstage); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
		if m := mountsUnder(t, top); len(m) != 0 {
			t.Fatalf("after unstaging, still mounted: %v", m)
		}
		if recs := h.attached(); len(recs) != 0 {
			t.Fatalf("after unstaging, still attached: %+v", recs)
		}
	}
}
