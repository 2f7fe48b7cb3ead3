package node

import (
	"os"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata"
)

// integrityOf is the integrity part of name's own status of vol0.
func (c *testCluster) integrityOf(name string) (checksums bool, repaired, unrecoverable int64) {
	c.t.Helper()
	for _, lv := range c.nodes[name].nodeStatus(0).Volumes {
		if lv.Name == "vol0" {
			if lv.Integrity == nil {
				c.t.Fatalf("%s: status of vol0 has no integrity", name)
			}
			return lv.Integrity.Checksums, lv.Integrity.RepairedBlocks, lv.Integrity.UnrecoverableBlocks
		}
	}
	c.t.Fatalf("%s: no vol0 in its status", name)
	return
}

// TestNewMetadataHasChecksumsAndOldMetadataKeepsWorking: a volume new
// here gets metadata with a checksum area (checksums: on, the default),
// and status says so; with checksums: off it gets none; metadata made
// without one keeps opening with none, whatever the file says later; and
// a disk too small for the area is refused with what to do, unchanged.
func TestNewMetadataHasChecksumsAndOldMetadataKeepsWorking(t *testing.T) {
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].Checksums = "off"
	c.start("beta")
	if on, _, _ := c.integrityOf("beta"); on {
		t.Fatal("beta: checksums: off, but status says checksums")
	}
	if _, ok := c.vol("beta").md.Checksums(); ok {
		t.Fatal("beta: checksums: off laid out a checksum area")
	}
	c.stop("beta")

	c.cfg.Volumes[0].Checksums = ""
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if on, _, _ := c.integrityOf("alpha"); !on {
		t.Fatal("alpha: a new volume with checksums on, but status says none")
	}
	if _, ok := c.vol("alpha").md.Checksums(); !ok {
		t.Fatal("alpha: a new volume's metadata has no checksum area")
	}
	// beta's metadata was made without the area: it keeps working
	// without checksums.
	if on, _, _ := c.integrityOf("beta"); on {
		t.Fatal("beta: metadata without a checksum area, but status says checksums")
	}
	writeRandomBlocks(t, c.vol("alpha"), 20, 3)
	c.waitInSync()

	// A disk sized for metadata without checksums holds no new volume
	// with them.
	c2 := newTestCluster(t, size)
	img := c2.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	small, err := metadata.InternalDeviceSizeFor(size, 0, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, small); err != nil {
		t.Fatal(err)
	}
	sum := fileSum(t, img)
	_, err = New(cloneConfig(c2.cfg), "alpha", Options{})
	if err == nil || !strings.Contains(err.Error(), "set checksums: off") || !strings.Contains(err.Error(), "Grow it to") {
		t.Fatalf("a disk too small for the checksum area: %v", err)
	}
	if fileSum(t, img) != sum {
		t.Fatal("the refused disk was changed")
	}
	c2.cfg.Volumes[0].Checksums = "off"
	c2.start("alpha")
	if on, _, _ := c2.integrityOf("alpha"); on {
		t.Fatal("checksums: off, but status says checksums")
	}
}
