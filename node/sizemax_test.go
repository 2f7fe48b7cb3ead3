package node

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
)

// waitForEvent waits for an event of kind in n's history and returns it.
func waitForEvent(t *testing.T, n *Node, kind string, match func(statefile.Event) bool) statefile.Event {
	t.Helper()
	var found statefile.Event
	eventually(t, func() bool {
		evs, err := n.store.Events(500)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == kind && (match == nil || match(e)) {
				found = e
				return true
			}
		}
		return false
	}, "an event "+kind+" on "+n.name)
	return found
}

// TestSizeMaxIsWhatTheDisksHold: with size: max and disks of one size,
// every node takes the largest size its disk holds after its metadata
// (the same on each), records it, and the nodes replicate; a disk that
// grows later does not change the volume's size.
func TestSizeMaxIsWhatTheDisksHold(t *testing.T) {
	const base = 8 << 20
	c := newTestCluster(t, base)
	c.cfg.Volumes[0].Size = SizeMax
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	img := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	want, err := metadata.UsableSizeFor(metadata.Internal, fi.Size(), 0, 1, true)
	if err != nil || want < base {
		t.Fatalf("usable size of a %d-byte disk: %d, %v", fi.Size(), want, err)
	}
	alpha := c.start("alpha")
	beta := c.start("beta")
	c.waitInSync()
	for _, name := range []string{"alpha", "beta"} {
		if got := c.vol(name).size.Load(); got != want {
			t.Fatalf("%s: size %d, want %d (what its disk holds after the metadata)", name, got, want)
		}
	}
	if got := c.status().Volumes[0].Size; got != want {
		t.Fatalf("status size %d, want %d", got, want)
	}
	if c.cfg.Volumes[0].Size != SizeMax {
		t.Fatal("New changed the config it was given")
	}
	for _, n := range []*Node{alpha, beta} {
		waitForEvent(t, n, "size-max", func(e statefile.Event) bool { return strings.Contains(e.Message, "stays so") })
	}

}

// TestSizeMaxStaysWhenTheDiskGrows: the size a node took for size: max is
// recorded; a disk that grows later does not change it (external
// metadata: the data disk can grow under it).
func TestSizeMaxStaysWhenTheDiskGrows(t *testing.T) {
	const size = 16 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].Size = SizeMax
	c.cfg.Volumes[0].Metadata = "external"
	for _, name := range []string{"alpha", "beta"} {
		dc := c.cfg.Volumes[0].Disks[name]
		if err := os.Truncate(dc.Paths[0].Path, size); err != nil {
			t.Fatal(err)
		}
		dc.Meta = dc.Paths[0].Path + ".md"
		n, _ := metadata.ExternalSizeFor(size, 0, 1, true)
		os.WriteFile(dc.Meta, nil, 0o644)
		os.Truncate(dc.Meta, n)
		c.cfg.Volumes[0].Disks[name] = dc
	}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if got := c.status().Volumes[0].Size; got != size {
		t.Fatalf("size: max with external metadata on %d-byte disks: %d", size, got)
	}
	c.stop("beta")
	if err := os.Truncate(c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, 2*size); err != nil {
		t.Fatal(err)
	}
	c.start("beta")
	c.waitInSync()
	if got := c.vol("beta").size.Load(); got != size {
		t.Fatalf("after beta's disk grew: size %d, want %d as before", got, size)
	}
}

// TestSizeMaxOnDisksOfDifferentSizes: size: max on disks that hold
// different sizes gives the nodes different sizes; the secondary refuses
// the primary's stream, naming both sizes, why, and the fix, and no byte
// of its data area changes.
func TestSizeMaxOnDisksOfDifferentSizes(t *testing.T) {
	beside(t)
	const base = 8 << 20
	c := newTestCluster(t, base)
	c.cfg.Volumes[0].Size = SizeMax
	img := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, fi.Size()+1<<20); err != nil {
		t.Fatal(err)
	}
	// beta's data area holds a pattern the refusal must leave alone.
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := pattern(7, base)
	if _, err := f.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	alphaSize, _ := metadata.UsableSizeFor(metadata.Internal, fi.Size(), 0, 1, true)
	betaSize, _ := metadata.UsableSizeFor(metadata.Internal, fi.Size()+1<<20, 0, 1, true)
	c.start("alpha")
	beta := c.start("beta")
	e := waitForEvent(t, beta, "refused", nil)
	for _, part := range []string{
		"size-mismatch",
		itoa(betaSize) + " bytes on beta but " + itoa(alphaSize) + " on alpha",
		"size: max gave each node the largest size its own disk holds",
		"Give size: " + itoa(alphaSize) + " (alpha's) in the file on every node",
		"replctl create-md vol0 --node beta --force --yes",
	} {
		if !strings.Contains(e.Reason+" "+e.Message, part) {
			t.Errorf("refusal %q %q does not say %q", e.Reason, e.Message, part)
		}
	}
	if r := replica(c.status(), "beta"); r.Disk == "UpToDate" {
		t.Fatalf("beta is UpToDate although refused: %+v", r)
	}
	c.stop("beta")
	after, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if string(after[:base]) != string(before) {
		t.Fatal("the refused secondary's data changed")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestCreateMetadataWithSizeMax: replctl create-md on a volume with size:
// max sizes the volume by the disk, says so, and the node then starts at
// that size.
func TestCreateMetadataWithSizeMax(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.cfg.Volumes[0].Size = SizeMax
	fi, err := os.Stat(c.cfg.Volumes[0].Disks["beta"].Paths[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := metadata.UsableSizeFor(metadata.Internal, fi.Size(), 0, 1, true)
	msg, err := CreateMetadata(c.cfg, "beta", "vol0", c.cfg.Nodes[1].StateDir, false)
	if err != nil || !strings.Contains(msg, "volume "+itoa(want)+" bytes") {
		t.Fatalf("create-md: %q, %v; want it to name the volume's size %d", msg, err, want)
	}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if got := c.vol("beta").size.Load(); got != want {
		t.Fatalf("beta: size %d after create-md, want %d", got, want)
	}
}
