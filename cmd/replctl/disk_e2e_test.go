package main

import (
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
)

// TestE2EDiskLargerThanTheVolumeSyncsAndVerifies: a backing disk larger
// than the volume plus its internal metadata is a normal deployment (a
// 1 GiB LUN for a 128 MiB volume, or a disk rounded up by a megabyte). The
// first sync finishes, a verify finds nothing out of sync, the disks hold
// the same data over the volume, a switchover completes, and the export is
// exactly the volume's size.
func TestE2EDiskLargerThanTheVolumeSyncsAndVerifies(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	const (
		size      = 128 << 20
		alExtents = 61
	)
	exact, err := metadata.InternalDeviceSizeFor(size, alExtents, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		diskSize int64
	}{
		{"1 GiB sparse disks", 1 << 30},
		{"disks 1 MiB larger than the volume and its metadata", exact + 1<<20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e2eBeside(t)
			c := newProcClusterOnDisks(t, size, alExtents, tc.diskSize)
			c.start("alpha")
			c.start("beta")
			// More out of sync than the volume holds can never sync: stop there.
			tooMuch := func(v *volumeStatus) *replicaStatus {
				for i := range v.Replicas {
					if v.Replicas[i].OutOfSync > size {
						return &v.Replicas[i]
					}
				}
				return nil
			}
			v := c.waitFor("alpha", "first sync: all replicas UpToDate and Connected", 60*time.Second, func(v *volumeStatus) bool {
				return v.inSync() || tooMuch(v) != nil
			})
			if r := tooMuch(v); r != nil {
				t.Fatalf("first sync: %s has %d bytes out of sync, more than the %d-byte volume (the disk's size leaks into the bitmap): %+v", r.Node, r.OutOfSync, size, *r)
			}

			uri := c.uri("alpha")
			if got := strings.TrimSpace(mustRun(t, 20*time.Second, nbdinfo, "--size", uri)); got != itoa(size) {
				t.Errorf("nbdinfo --size %s = %q, want %d (the volume, not the disk)", uri, got, size)
			}
			var writes []string
			for off := int64(0); off < size; off += 32 << 20 {
				writes = append(writes, "write -P 0x5a "+itoa(off)+" 32M")
			}
			qemuIO(t, uri, append(writes, "flush")...)
			c.waitFor("alpha", "in sync after writing the whole volume", 60*time.Second, (*volumeStatus).inSync)

			r := runCmd(90*time.Second, nil, replctlBin, "verify", volName, "--wait", "--addr", c.nodes["alpha"].Control)
			t.Logf("replctl verify vol0 --wait: %s", r)
			if !r.ok() {
				t.Fatalf("replctl verify vol0 --wait: %s", r)
			}
			if !strings.Contains(r.out, " 0B out of sync") {
				t.Errorf("replctl verify vol0 --wait does not report 0B out of sync: %s", r)
			}
			v = c.mustStatus("alpha")
			if b := v.replica("beta"); b == nil || b.VerifyFound != 0 || b.VerifyTotal == 0 || b.VerifyDone != b.VerifyTotal || b.OutOfSync != 0 {
				t.Errorf("after the verify beta's replica is %+v; want verify done over the volume, 0 found, 0 out of sync", b)
			}
			compareFiles(t, c.disk("alpha"), c.disk("beta"), size)

			r = runCmd(60*time.Second, nil, replctlBin, "primary", volName, "--node", "beta", "--addr", c.nodes["alpha"].Control)
			if !r.ok() {
				t.Fatalf("switchover to beta: %s", r)
			}
			c.waitFor("beta", "beta Primary", 60*time.Second, func(v *volumeStatus) bool {
				b := v.replica("beta")
				return v.Primary == "beta" && b != nil && b.Role == "Primary"
			})
			qemuIO(t, c.uri("beta"), "read -P 0x5a 0 1M", "read -P 0x5a "+itoa(size-(1<<20))+" 1M")
		})
	}
}
