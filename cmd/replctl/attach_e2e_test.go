package main

// replctl attach and detach (issue 30, item 2): a raw block device of the
// volume, on the FUSE path here (no nbd module).

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestE2EAttachAndDetachABlockDevice: replctl attach prints a loop device
// over the FUSE file, which reads and writes the volume; the listing shows
// it; replctl detach leaves no loop device, no helper process and no
// record, and gives the claim back; a second detach is nothing to do.
func TestE2EAttachAndDetachABlockDevice(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	c := newProcClusterN(t, clusterOpts{Size: 64 << 20})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "client")
	runs.cleanUpAtTheEnd()
	run := runs.dirs["client"]

	r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("alpha", []string{"attach", volName, "--run-dir", run})...)
	if !r.ok() {
		t.Fatalf("replctl attach: %s", r)
	}
	dev := strings.Fields(r.out)[0]
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("replctl attach printed %q first, want the loop device\n%s", dev, r)
	}
	if out := runCmd(30*time.Second, nil, replctlBin, "mount", "--run-dir", run); !out.ok() || !strings.Contains(out.out, dev) || !strings.Contains(out.out, "replctl detach "+volName) {
		t.Fatalf("the listing does not show the attachment: %s", out)
	}
	// The device is the volume: what is written through it the primary's export holds.
	data := strings.Repeat("attached", 512)
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(data), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := qemuIO(t, "nbd://"+c.nodes["alpha"].NBD+"/"+volName, "read -v 1048576 8"); !strings.Contains(got, "attached") {
		t.Fatalf("the export does not hold what was written through %s:\n%s", dev, got)
	}
	if r := runCmd(time.Minute, nil, replctlBin, "detach", dev, "--run-dir", run); !r.ok() || !strings.Contains(r.out, "claim on alpha given back") {
		t.Fatalf("replctl detach %s: %s", dev, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl detach left %v", left)
	}
	if r := runCmd(time.Minute, nil, replctlBin, "detach", volName, "--run-dir", run); !r.ok() || !strings.Contains(r.out, "nothing to do") {
		t.Fatalf("a second replctl detach: %s", r)
	}
}
