package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/poll"
	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport"
)

// TestE2EAPublishedVolumeRidesThroughAKill9OfThePrimary pins the promise for
// Kubernetes: a file system staged and published through replcsi on a host that holds no
// replica takes fio's writes with verify while the primary alpha is killed -9; beta takes
// over, the attachment follows it, no I/O error reaches fio and its verify passes; the
// attachment then says it serves from beta, and unpublish and unstage leave nothing.
func TestE2EAPublishedVolumeRidesThroughAKill9OfThePrimary(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	fio := requireTool(t, "fio", "the Debian package fio")
	t.Parallel()
	c := startCluster(t, false)
	top := sharedTop(t)
	h := startCSI(t, "client", c.control["witness"], top)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	staging := filepath.Join(top, "staging")
	target := filepath.Join(top, "pods", "target")
	stage := &csi.NodeStageVolumeRequest{VolumeId: volName, StagingTargetPath: staging, VolumeCapability: mountCap()}
	if _, err := h.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	publish := &csi.NodePublishVolumeRequest{VolumeId: volName, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()}
	if _, err := h.node.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}

	before := c.writeBytes("alpha")
	fioCmd := exec.Command(fio, "--name=csi", "--filename="+filepath.Join(target, "fio.dat"), "--size=32M", "--rw=randwrite", "--bs=4k",
		"--ioengine=libaio", "--iodepth=16", "--direct=1", "--verify=crc32c", "--do_verify=1",
		"--verify_fatal=1", "--randrepeat=0", "--output-format=json")
	fioCmd.Dir = t.TempDir()
	out := &strings.Builder{}
	fioCmd.Stdout, fioCmd.Stderr = out, out
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fioCmd.Wait() }()
	t.Cleanup(func() {
		if fioCmd.ProcessState == nil {
			_ = fioCmd.Process.Kill()
			<-fioDone
		}
	})
	// alpha is killed in the middle of fio's writes, with requests in flight.
	var wrote uint64
	if !poll.Within(2*time.Minute, 20*time.Millisecond, func() bool {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended (%v) before alpha wrote 8 MiB of it:\n%s", err, out)
		default:
		}
		wrote = c.writeBytes("alpha")
		return wrote >= before+8<<20
	}) {
		t.Fatalf("alpha wrote %d bytes of fio's in 2 minutes", wrote-before)
	}
	c.kill("alpha")
	killed := time.Now()
	var fioErr error
	select {
	case fioErr = <-fioDone:
	case <-time.After(5 * time.Minute):
		t.Fatalf("fio did not end 5 minutes after alpha was killed:\n%s", out)
	}
	if fioErr != nil {
		t.Fatalf("fio across the kill -9 of the primary: %v\n%s", fioErr, out)
	}
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	js := out.String()
	if i := strings.IndexByte(js, '{'); i >= 0 {
		js = js[i:]
	}
	if err := json.Unmarshal([]byte(js), &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio's report: %v\n%s", err, out)
	}
	if j := res.Jobs[0]; j.Error != 0 || j.Write.IOBytes != 32<<20 || j.Read.IOBytes != 32<<20 {
		t.Fatalf("fio: error %d, wrote %d, verified %d bytes (want 32 MiB each)\n%s", j.Error, j.Write.IOBytes, j.Read.IOBytes, out)
	}
	t.Logf("fio wrote and verified 32 MiB; it ended %s after alpha was killed", time.Since(killed).Round(time.Millisecond))
	f, err := volmount.Registry{Dir: h.runDir}.Following(volmount.AttachKey(volName))
	if err != nil || f == nil || f.Primary != "beta" {
		t.Fatalf("the attachment follows %+v (%v); want beta", f, err)
	}
	if _, err := h.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volName, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := h.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volName, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if m := mountsUnder(t, top); len(m) != 0 {
		t.Fatalf("after unstaging, still mounted: %v", m)
	}
	if recs := h.attached(); len(recs) != 0 {
		t.Fatalf("after unstaging, still attached: %+v", recs)
	}
}

// writeBytes is what node name's vol0 wrote as primary (its node status); the test fails
// if the node does not answer.
func (c *cluster) writeBytes(name string) uint64 {
	c.t.Helper()
	client, err := transport.DialControl(c.control[name])
	if err != nil {
		c.t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ns, err := client.NodeStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		c.t.Fatalf("status of %s: %v", name, err)
	}
	for _, v := range ns.Volumes {
		if v.Name == volName {
			return v.WriteBytes
		}
	}
	c.t.Fatalf("%s lists no volume %s", name, volName)
	return 0
}
