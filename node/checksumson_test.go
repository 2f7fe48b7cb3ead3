package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
)

// Turning checksums on for an existing volume (docs/integrity.md): a
// node whose metadata has no checksum area, started with checksums: on,
// lays the area out when it opens the volume, then builds the sum of
// every block in the background (a scrub marked as the build), resuming
// after a restart, while writes go on; once built, every block verifies,
// and a flipped byte is caught and repaired from the peer. Without room
// it runs on without checksums and says how much room to make.

// buildOf is name's build of vol0's checksums as its status says (nil:
// none runs or is paused).
func (c *testCluster) buildOf(name string) *transport.ChecksumBuild {
	c.t.Helper()
	for _, lv := range c.nodes[name].nodeStatus(0).Volumes {
		if lv.Name == "vol0" && lv.Integrity != nil {
			return lv.Integrity.Build
		}
	}
	return nil
}

// waitBuilt waits until name's build of the checksums has ended.
func (c *testCluster) waitBuilt(t *testing.T, name string) {
	t.Helper()
	waitForEvent(t, c.nodes[name], "checksums-built", nil)
	if b := c.buildOf(name); b != nil {
		t.Fatalf("%s: the build ended, but status shows %+v", name, b)
	}
}

// writeWhile writes blocks of random data through alpha, the primary,
// until stop is closed, and returns the blocks written last, once wait
// returns.
func (c *testCluster) writeWhile(t *testing.T, stop <-chan struct{}, seed uint64) (wait func() map[int64][]byte) {
	t.Helper()
	var wg sync.WaitGroup
	written := map[int64][]byte{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		v := c.vol("alpha")
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b := int64((i*7919 + int(seed)) % 2048)
			data := randomBytes(seed*100000+uint64(i), 4096)
			if err := v.WriteAt(ctx, data, b*4096, i%7 == 0); err != nil {
				t.Error(err)
				return
			}
			written[b] = data
			time.Sleep(time.Millisecond)
		}
	}()
	return func() map[int64][]byte {
		wg.Wait()
		return written
	}
}

// TestTurningChecksumsOnBuildsThemInTheBackground: a volume made with
// checksums: off and full of data, then started with checksums: on, one
// node at a time (the secondary, then the primary): each gains the area
// (event checksums-on), shows the build's progress in status, resumes it
// after a crash from its checkpoint, not from 0, and ends it
// (checksums-built) with every block's stored sum that of the data on its
// disk, the blocks written while it ran included; then a byte flipped on
// the primary's disk is caught by a read, which returns the data written
// and repairs the block from the secondary.
func TestTurningChecksumsOnBuildsThemInTheBackground(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].Checksums = "off"
	// The build reads at a quarter of the resync rate: 1 MiB/s, 8 s.
	c.cfg.Volumes[0].ResyncRate = 4 << 20
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(61, size), 0)
	c.waitInSync()
	for _, name := range []string{"alpha", "beta"} {
		if _, ok := c.vol(name).durable.md.Checksums(); ok {
			t.Fatalf("%s: checksums: off laid out a checksum area", name)
		}
	}

	c.cfg.Volumes[0].Checksums = "on"
	c.stop("beta")
	c.start("beta")
	waitForEvent(t, c.nodes["beta"], "checksums-on", nil)
	if on, _, _ := c.integrityOf("beta"); !on {
		t.Fatal("beta: checksums turned on, but status says none")
	}
	// Past its first checkpoint (every 5 s), beta goes down as kill -9
	// does: the sums it built were made durable BEFORE the checkpoint
	// that passes them, so the build resumes there and misses none.
	eventually(t, func() bool { b := c.buildOf("beta"); return b != nil && b.Percent >= 70 }, "beta's build reaches 70%")
	c.crash("beta")
	c.start("beta")
	if b := c.buildOf("beta"); b == nil || b.State != "running" || b.Percent <= 0 {
		t.Fatalf("after a crash beta's build is %+v, want running from its checkpoint, not from 0", b)
	}
	c.waitInSync()
	c.vol("beta").adjustRate(t, 1<<40)
	c.waitBuilt(t, "beta")

	// The primary: restarted with the setting, as the secondary was,
	// its build racing writes (which beta applies, storing their sums).
	c.stop("alpha")
	c.start("alpha")
	waitForEvent(t, c.nodes["alpha"], "checksums-on", nil)
	c.waitInSync()
	stop := make(chan struct{})
	wait := c.writeWhile(t, stop, 2)
	eventually(t, func() bool { b := c.buildOf("alpha"); return b != nil && b.Percent >= 10 }, "alpha's build reaches 10%")
	c.vol("alpha").adjustRate(t, 1<<40)
	c.waitBuilt(t, "alpha")
	close(stop)
	racing := wait()
	if err := c.vol("alpha").Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
	if len(racing) == 0 {
		t.Fatal("no write raced the build")
	}

	// Every block has the sum of what its disk holds, on both nodes.
	disk := c.disk("alpha")
	all := map[int64][]byte{}
	for b := int64(0); b < size/4096; b++ {
		all[b] = disk[b*4096 : (b+1)*4096]
	}
	for b, data := range racing {
		if !bytes.Equal(all[b], data) {
			t.Fatalf("block %d does not hold the last write to it", b)
		}
	}
	c.sumsMatchDisk("alpha", all, nil)
	c.sumsMatchDisk("beta", all, nil)

	// From now on reads verify: a flipped byte is repaired from beta.
	const block = 777
	want := bytes.Clone(all[block])
	flipFileBytes(t, c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path, block*4096+100, 1)
	got := make([]byte, 4096)
	if err := c.vol("alpha").ReadAt(context.Background(), got, block*4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the read returned the flipped byte")
	}
	if e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil); e.Offset != block*4096 {
		t.Fatalf("block-repaired event: %+v", e)
	}
	if !bytes.Equal(c.disk("alpha")[block*4096:(block+1)*4096], want) {
		t.Fatal("the flipped block was not rewritten")
	}
}

// adjustRate makes the running scrub (the build) read at rate from now
// on: paused and resumed at that rate.
func (v *Volume) adjustRate(t *testing.T, rate int64) {
	t.Helper()
	sc := &v.scrub
	sc.mu.Lock()
	sc.rec.Rate = rate
	sc.mu.Unlock()
	if _, err := v.scrubCommand(0, true, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := v.scrubCommand(0, false, true, false, false); err != nil {
		t.Fatal(err)
	}
}

// TestChecksumsOnWithoutRoomRunsWithoutThem: a disk that holds the volume
// and its metadata without a checksum area, and has not grown: started
// with checksums: on, the node says how much room it needs (event
// checksums-refused), changes no byte of its data and keeps its metadata
// format 1 (metadata's TestEnableChecksumsWithoutRoomChangesNothing pins
// that no byte of the device changes), and serves the volume without
// checksums; once the file grows to that size, the next start converts
// it (the metadata moves to the new end) and builds the sums.
func TestChecksumsOnWithoutRoomRunsWithoutThem(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestCluster(t, size)
	img := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	small, err := metadata.InternalDeviceSizeFor(size, 0, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, small); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].Checksums = "off"
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(62, 1<<20), 0)
	c.waitInSync()
	c.stop("beta")
	data := c.disk("beta")[:size]
	c.cfg.Volumes[0].Checksums = "on"
	c.start("beta")
	e := waitForEvent(t, c.nodes["beta"], "checksums-refused", nil)
	if !strings.Contains(e.Message, "truncate -s") || !strings.Contains(e.Message, "nothing was changed") {
		t.Fatalf("checksums-refused says %q; want how to make room", e.Message)
	}
	if on, _, _ := c.integrityOf("beta"); on {
		t.Fatal("beta: no room for checksums, but status says checksums")
	}
	if sb := c.vol("beta").durable.md.Superblock(); sb.HasChecksums() {
		t.Fatalf("beta's metadata is format %d after a refused conversion", sb.Version)
	}
	c.stop("beta")
	if !bytes.Equal(c.disk("beta")[:size], data) {
		t.Fatal("the refused conversion changed beta's data")
	}
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(63, 1<<20), 2<<20)
	c.waitInSync()
	c.requireIdentical()

	// The operator grows the file to the size the event gave: the
	// metadata moves to the new end with the area, and the sums are
	// built; the data is what it was.
	var need int64
	if _, err := fmt.Sscanf(e.Message[strings.Index(e.Message, "truncate -s ")+len("truncate -s "):], "%d", &need); err != nil {
		t.Fatalf("no size in %q: %v", e.Message, err)
	}
	c.stop("beta")
	data = c.disk("beta")[:size]
	if err := os.Truncate(img, need); err != nil {
		t.Fatal(err)
	}
	c.start("beta")
	waitForEvent(t, c.nodes["beta"], "checksums-on", nil)
	if sb := c.vol("beta").durable.md.Superblock(); !sb.HasChecksums() || sb.DeviceSize != need {
		t.Fatalf("beta's metadata is format %d laid out for %d bytes; want format 2 at the end of the %d-byte disk", sb.Version, sb.DeviceSize, need)
	}
	c.waitInSync()
	c.waitBuilt(t, "beta")
	if !bytes.Equal(c.disk("beta")[:size], data) {
		t.Fatal("the conversion changed beta's data")
	}
	c.stop("beta")
	c.start("beta")
	if _, ok := c.vol("beta").durable.md.Checksums(); !ok {
		t.Fatal("beta's converted metadata opens without checksums after a restart")
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestChecksumsOffThenOnAgainRebuildsThem: checksums: off on a node whose
// metadata has the area keeps the area but stores and verifies no sum
// (status says checksums false) while writes go on; turned on again, the
// sums kept from before, stale for the blocks written meanwhile, are
// dropped and built again, so every block's sum is its data's.
func TestChecksumsOffThenOnAgainRebuildsThem(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(64, size), 0)
	c.waitInSync()

	c.stop("beta")
	c.cfg.Volumes[0].Checksums = "off"
	c.start("beta")
	waitForEvent(t, c.nodes["beta"], "checksums-off", nil)
	if on, _, _ := c.integrityOf("beta"); on {
		t.Fatal("beta: checksums: off, but status says checksums")
	}
	if _, ok := c.vol("beta").durable.md.Checksums(); !ok {
		t.Fatal("beta: checksums: off dropped the checksum area")
	}
	c.waitInSync()
	c.writeFlushed(t, randomBytes(65, 2<<20), 1<<20)
	c.waitInSync()

	c.stop("beta")
	c.cfg.Volumes[0].Checksums = ""
	c.start("beta")
	waitForEvent(t, c.nodes["beta"], "checksums-on", nil)
	c.waitInSync()
	c.waitBuilt(t, "beta")
	c.requireIdentical()
	disk := c.disk("beta")
	all := map[int64][]byte{}
	for b := int64(0); b < size/4096; b++ {
		all[b] = disk[b*4096 : (b+1)*4096]
	}
	c.sumsMatchDisk("beta", all, nil)
	c.sumsMatchDisk("alpha", all, nil)
}

// TestChecksumsOnWithExternalMetadataLengthensItsFile: external metadata
// files made without checksums, at exactly their size then: started with
// checksums: on, each node lengthens its file, lays the bitmaps out again
// after the new area, and builds the sums; catch-up after an outage still
// moves only what changed (the bitmaps kept working).
func TestChecksumsOnWithExternalMetadataLengthensItsFile(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].Checksums = "off"
	c.useExternalMetadata(size, 0, false)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(66, size), 0)
	c.waitInSync()

	c.cfg.Volumes[0].Checksums = "on"
	for _, name := range []string{"beta", "alpha"} {
		c.stop(name)
		c.start(name)
		waitForEvent(t, c.nodes[name], "checksums-on", nil)
		c.waitInSync()
		c.waitBuilt(t, name)
		meta := c.cfg.Volumes[0].Disks[name].Meta
		want, _ := metadata.ExternalSizeFor(size, 0, 1, true)
		fi, err := os.Stat(meta)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() < want {
			t.Fatalf("%s: the metadata file is %d bytes, want at least %d", name, fi.Size(), want)
		}
	}
	c.vol("alpha").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("alpha"), 50, 14)
	before := replica(c.status(), "beta").ResyncedBytes
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - before; moved != int64(blocks)*4096 {
		t.Fatalf("catch-up moved %d bytes, want %d", moved, blocks*4096)
	}
	c.requireIdentical()
	disk := c.disk("alpha")
	all := map[int64][]byte{}
	for b := int64(0); b < size/4096; b++ {
		all[b] = disk[b*4096 : (b+1)*4096]
	}
	c.sumsMatchDisk("alpha", all, nil)
	c.sumsMatchDisk("beta", all, nil)
}
