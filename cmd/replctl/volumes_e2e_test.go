package main

// End-to-end: a volume added to the cluster file and applied with SIGHUP
// (systemctl reload replnode), then removed the same way (issue 18).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
)

// TestE2EAVolumeAddedWithSIGHUPServesAndRemovingItKeepsItsDisk: two
// replnode processes run vol0. vol1 is added to the file and alpha, its
// primary, gets a SIGHUP: it serves vol1 to qemu-io at once, beta refuses
// the stream in words (no-such-volume), and status warns that the files
// disagree. beta gets its SIGHUP: vol1 is UpToDate on both and the warning
// is gone. Then vol1 is taken out of the file and both get a SIGHUP: it is
// stopped on both, its export is gone, both disks hold what was written,
// and vol0 serves on.
func TestE2EAVolumeAddedWithSIGHUPServesAndRemovingItKeepsItsDisk(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 32 << 20
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	c.waitInSync("alpha")

	orig, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	devSize, err := metadata.InternalDeviceSizeFor(size, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	disks := map[string]string{}
	for _, n := range []string{"alpha", "beta"} {
		disks[n] = filepath.Join(c.dir, n+"-vol1.img")
		if err := os.WriteFile(disks[n], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(disks[n], devSize); err != nil {
			t.Fatal(err)
		}
	}
	withVol1 := string(orig) + fmt.Sprintf("  - {name: vol1, size: %d, protocol: C, primary: alpha, al_extents: 61, disks: {alpha: %q, beta: %q}}\n",
		size, disks["alpha"], disks["beta"])
	if err := os.WriteFile(c.cfgPath, []byte(withVol1), 0o644); err != nil {
		t.Fatal(err)
	}
	hup := func(name string) {
		t.Helper()
		if err := c.procs[name].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	vol1 := "nbd://" + c.nodes["alpha"].NBD + "/vol1"

	hup("alpha")
	qemuIOEventually(t, 20*time.Second, "once alpha's file has vol1", vol1, "write -P 0x5c 0 1M", "flush", "read -P 0x5c 0 1M")
	var st transport.ClusterStatus
	configWaitUntil(t, "beta refuses vol1's stream (no-such-volume) and status warns", func() bool {
		st = clusterStatusOf(t, c, "beta")
		vs := volumeOf(&st, "vol1")
		return vs == nil && len(st.ConfigDiffers) == 1 && refusedNoVolume(clusterStatusOf(t, c, "alpha"))
	})
	if d := st.ConfigDiffers[0]; d.Volume != "vol1" || !slices.Equal(d.In, []string{"alpha"}) || !slices.Equal(d.NotIn, []string{"beta"}) {
		t.Fatalf("config_differs %+v: want vol1 in alpha's file, not in beta's", st.ConfigDiffers)
	}
	if out := c.mustCtl("beta", "status"); !strings.Contains(out, "Volume vol1 is in the cluster file of alpha but not in beta's.") || !strings.Contains(out, "systemctl reload replnode") {
		t.Fatalf("replctl status does not warn that the files differ:\n%s", out)
	}

	hup("beta")
	configWaitUntil(t, "vol1 UpToDate on both, the warning gone", func() bool {
		st = clusterStatusOf(t, c, "alpha")
		vs := volumeOf(&st, "vol1")
		if vs == nil || vs.Primary != "alpha" || len(vs.Replicas) != 2 || st.ConfigDiffers != nil {
			return false
		}
		for _, r := range vs.Replicas {
			if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSyncBytes != 0 {
				return false
			}
		}
		return true
	})
	qemuIOEventually(t, 10*time.Second, "with both nodes in sync", vol1, "write -P 0x5d 4M 64k", "flush", "read -P 0x5c 0 1M", "read -P 0x5d 4M 64k")
	if out := c.mustCtl("alpha", "status"); strings.Contains(out, "cluster file of") {
		t.Fatalf("replctl status still warns once the files agree:\n%s", out)
	}

	// Removed: both get the file without vol1.
	if err := os.WriteFile(c.cfgPath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	hup("beta")
	hup("alpha")
	for _, n := range []string{"alpha", "beta"} {
		configWaitUntil(t, n+" stops vol1", func() bool {
			evs, err := c.eventsSince(n, "volume-removed", began)
			return err == nil && len(evs) == 1 && strings.Contains(evs[0].Message, "stopped it cleanly and keeps its disk")
		})
		lv, err := c.localView(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(lv.Volumes) != 1 || lv.Volumes[0].Name != volName {
			t.Fatalf("%s runs %+v after vol1's removal", n, lv.Volumes)
		}
	}
	if r, ok := tryQemuIOWithin(t, 20*time.Second, vol1, "read 0 4k"); ok || !strings.Contains(r.out, "vol1") {
		t.Fatalf("vol1 is still exported after its removal, or the refusal does not name it: %s", r)
	}
	want := append(bytes.Repeat([]byte{0x5c}, 1<<20), bytes.Repeat([]byte{0x5d}, 64<<10)...)
	for _, n := range []string{"alpha", "beta"} {
		b, err := os.ReadFile(disks[n])
		if err != nil {
			t.Fatalf("%s's disk of vol1: %v", n, err)
		}
		if got := append(b[:1<<20:1<<20], b[4<<20:4<<20+64<<10]...); !bytes.Equal(got, want) {
			t.Fatalf("%s's disk of vol1 lost what was written to it", n)
		}
	}
	st = clusterStatusOf(t, c, "alpha")
	if volumeOf(&st, "vol1") != nil || st.ConfigDiffers != nil {
		t.Fatalf("status after the removal: volumes %+v, config_differs %+v", st.Volumes, st.ConfigDiffers)
	}
	qemuIOEventually(t, 10*time.Second, "vol0 after vol1's removal", c.uri("alpha"), "write -P 0x11 0 64k", "read -P 0x11 0 64k")
	c.waitInSync("alpha")
}

// clusterStatusOf is replctl status --json through node.
func clusterStatusOf(t *testing.T, c *procCluster, node string) transport.ClusterStatus {
	t.Helper()
	var st transport.ClusterStatus
	if err := json.Unmarshal([]byte(c.mustCtl(node, "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func volumeOf(st *transport.ClusterStatus, name string) *transport.VolumeStatus {
	for i := range st.Volumes {
		if st.Volumes[i].Name == name {
			return &st.Volumes[i]
		}
	}
	return nil
}

// refusedNoVolume reports whether st (from alpha) says beta refuses vol1's
// stream because its file does not list vol1.
func refusedNoVolume(st transport.ClusterStatus) bool {
	vs := volumeOf(&st, "vol1")
	if vs == nil {
		return false
	}
	r := vs.Replica("beta")
	return r != nil && r.ReasonCode == "no-such-volume" && strings.Contains(r.Reason, "beta runs no volume \"vol1\": its cluster file does not list it")
}
