package main

// replctl attach and detach (issue 30, item 2): a raw block device of the
// volume, on the FUSE path here (no nbd module).

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/metadata"
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

// TestE2EAFollowingAttachmentGrowsWithTheVolume: NBD tells no client that
// an export grew. An attachment following the primary asks every
// --refresh-every: after replctl resize its loop device grows without a
// detach, and the new range is written through it and read back from the
// primary's export. replctl attach --refresh then asks at once and prints
// the size.
func TestE2EAFollowingAttachmentGrowsWithTheVolume(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	const from, to = 64 << 20, 96 << 20
	disk, err := metadata.InternalDeviceSizeFor(to, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	c := newProcClusterN(t, clusterOpts{Size: from, DiskSize: disk})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "client")
	runs.cleanUpAtTheEnd()
	run := runs.dirs["client"]

	r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("beta", []string{"attach", volName, "--follow", "--refresh-every", "1s", "--run-dir", run})...)
	if !r.ok() || !strings.Contains(r.out, "following the primary") {
		t.Fatalf("replctl attach --follow: %s", r)
	}
	dev := strings.Fields(r.out)[0]
	size := func() int64 {
		t.Helper()
		f, err := os.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := size(); got != from {
		t.Fatalf("%s is %d bytes, want %d", dev, got, from)
	}

	if r := c.ctl("alpha", "resize", volName, "96MiB"); !r.ok() {
		t.Fatalf("replctl resize: %s", r)
	}
	if !within(2*time.Minute, 100*time.Millisecond, func() bool { return size() == to }) {
		log, _ := os.ReadFile(volmount.Registry{Dir: run}.LogPath(volmount.AttachKey(volName)))
		t.Fatalf("%s is %d bytes 2 minutes after the resize, want %d; the helper's log:\n%s", dev, size(), to, log)
	}
	data := strings.Repeat("grown", 1000)
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(data), 90<<20); err != nil {
		t.Fatalf("a write past the old end through %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 90<<20); err != nil || string(got) != data {
		t.Fatalf("a read past the old end through %s: %v", dev, err)
	}
	f.Close()
	if got := qemuIO(t, "nbd://"+c.nodes["alpha"].NBD+"/"+volName, "read -v 94371840 5"); !strings.Contains(got, "grown") {
		t.Fatalf("the export does not hold what was written past the old end:\n%s", got)
	}

	r = runCmd(time.Minute, nil, replctlBin, "attach", "--refresh", volName, "--run-dir", run)
	if !r.ok() || strings.TrimSpace(strings.Split(r.out, "\n")[0]) != itoa(to) {
		t.Fatalf("replctl attach --refresh: %s; want %d", r, to)
	}
	if r := runCmd(time.Minute, nil, replctlBin, "detach", dev, "--run-dir", run); !r.ok() {
		t.Fatalf("replctl detach %s: %s", dev, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl detach left %v", left)
	}
}
