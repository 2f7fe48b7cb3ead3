package node

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/blocksum"
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

// sumsMatchDisk checks, for each block of want (block -> its data), that
// name's stored checksum is known and is the sum of want's data, and
// that its disk holds that data; for each block of unknown, that it has
// no known sum.
func (c *testCluster) sumsMatchDisk(name string, want map[int64][]byte, unknown []int64) {
	c.t.Helper()
	v := c.vol(name)
	sums, ok := v.md.Checksums()
	if !ok {
		c.t.Fatalf("%s keeps no checksums", name)
	}
	seed := blocksum.NewSeed(c.cfg.Volumes[0].VolumeUUID())
	for b, data := range want {
		got := make([]byte, len(data))
		if _, err := v.disk.ReadAt(got, b*blocksum.BlockSize); err != nil {
			c.t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			c.t.Fatalf("%s: block %d does not hold what was written", name, b)
		}
		sum, known, err := sums.Get(b)
		if err != nil || !known || sum != seed.Sum(uint64(b), data) {
			c.t.Fatalf("%s: block %d: stored sum %08x known %v (%v), want %08x", name, b, sum, known, err, seed.Sum(uint64(b), data))
		}
	}
	for _, b := range unknown {
		if _, known, err := sums.Get(b); err != nil || known {
			c.t.Fatalf("%s: block %d has a known sum (%v); a trim or a write of part of it leaves none", name, b, err)
		}
	}
}

// TestWritesStoreTheirChecksumsOnBothReplicas: each block the primary
// writes gets its checksum, on the primary and on the secondary, durable
// at FLUSH (a restart reads them back); a trim and a write of part of a
// block leave the blocks they touch without one.
func TestWritesStoreTheirChecksumsOnBothReplicas(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	want := map[int64][]byte{}
	for i, b := range []int64{0, 1, 7, 300, 1000} {
		data := pattern(byte(i+1), 8192)
		if err := v.WriteAt(ctx, data, b*4096, i%2 == 0); err != nil {
			t.Fatal(err)
		}
		want[b], want[b+1] = data[:4096], data[4096:]
	}
	if err := v.WriteAt(ctx, pattern(9, 4096), 1500*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Trim(ctx, 1500*4096, 4096); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteAt(ctx, pattern(10, 512), 1600*4096+512, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	unknown := []int64{1500, 1600}
	c.sumsMatchDisk("alpha", want, unknown)
	c.sumsMatchDisk("beta", want, unknown)
	c.stop("beta")
	c.stop("alpha")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.sumsMatchDisk("alpha", want, unknown)
	c.sumsMatchDisk("beta", want, unknown)
}

// TestACrashedPrimaryRebuildsTheChecksumsOfItsActivityLog: a block
// written again after its sum was made durable, then a crash before the
// next FLUSH: at the restart the stored sum is the new data's (the
// activity log's extents are computed again), never the old one.
func TestACrashedPrimaryRebuildsTheChecksumsOfItsActivityLog(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	if err := v.WriteAt(ctx, pattern(1, 4096), 40*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	again := pattern(2, 4096)
	if err := v.WriteAt(ctx, again, 40*4096, false); err != nil {
		t.Fatal(err)
	}
	c.crash("alpha")
	n := c.start("alpha")
	c.sumsMatchDisk("alpha", map[int64][]byte{40: again}, nil)
	waitForEvent(t, n, "checksums-rebuilt", nil)
}
