package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestADiskOfAnotherVolumeOrCorruptMetadataIsRefused: the node names what
// is wrong and changes no byte of the disk.
func TestADiskOfAnotherVolumeOrCorruptMetadataIsRefused(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.stop("alpha")
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path

	// The same disk under another volume's name.
	other := *c.cfg
	other.Volumes = append([]VolumeConfig(nil), c.cfg.Volumes...)
	other.Volumes[0].Name = "vol1"
	sum := fileSum(t, img)
	_, err := New(&other, "alpha", Options{StateDir: t.TempDir()})
	if !errors.Is(err, metadata.ErrNotOurVolume) {
		t.Fatalf("a disk of another volume: %v", err)
	}
	if fileSum(t, img) != sum {
		t.Fatal("the refused disk was changed")
	}

	// The metadata area overwritten: the node ran this volume before, so
	// it refuses rather than start over.
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	end := st.Size() &^ 4095
	saved := make([]byte, 8192)
	f.ReadAt(saved, end-8192)
	junk := make([]byte, 8192)
	for i := range junk {
		junk[i] = 0x5a
	}
	f.WriteAt(junk, end-8192)
	sum = fileSum(t, img)
	_, err = New(c.cfg, "alpha", Options{})
	if err == nil || !strings.Contains(err.Error(), "has run volume vol0 before") {
		t.Fatalf("overwritten metadata: %v", err)
	}
	if fileSum(t, img) != sum {
		t.Fatal("the refused disk was changed")
	}

	// Both superblock copies with a bad checksum: corrupt.
	for _, slot := range []int64{end - 8192, end - 4096} {
		b := append([]byte(nil), saved[slot-(end-8192):][:4096]...)
		b[100] ^= 0xff
		f.WriteAt(b, slot)
	}
	f.Close()
	sum = fileSum(t, img)
	_, err = New(c.cfg, "alpha", Options{})
	if !errors.Is(err, metadata.ErrCorrupt) {
		t.Fatalf("corrupt metadata: %v", err)
	}
	if fileSum(t, img) != sum {
		t.Fatal("the refused disk was changed")
	}
	t.Log(err)
}

// TestExternalMetadataLeavesTheWholeDeviceToData runs a cluster with
// external metadata files: the volume uses the backing file to its last
// byte and catch-up still moves only what changed.
func TestExternalMetadataLeavesTheWholeDeviceToData(t *testing.T) {
	const size = 16 << 20
	c := newTestCluster(t, size)
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
	if r := replica(c.status(), "alpha"); r.Metadata != "external" || r.UsableBytes != size {
		t.Fatalf("alpha: metadata %q usable %d", r.Metadata, r.UsableBytes)
	}
	c.vol("alpha").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("alpha"), 100, 13)
	before := replica(c.status(), "beta").ResyncedBytes
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - before; moved != int64(blocks)*4096 {
		t.Fatalf("moved %d, want %d", moved, blocks*4096)
	}
	c.requireIdentical()
}

// TestCreateMetadataOverwritesOnlyWithForceAndForcesAFullResync.
func TestCreateMetadataOverwritesOnlyWithForceAndForcesAFullResync(t *testing.T) {
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	if _, err := CreateMetadata(c.cfg, "beta", "vol0", "", false); !errors.Is(err, metadata.ErrMetadataExists) {
		t.Fatalf("create-md over metadata without force: %v", err)
	}
	msg, err := CreateMetadata(c.cfg, "beta", "vol0", "", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(msg)
	n := c.start("beta")
	if d := n.volumes()["vol0"].status().Disk; d != "Inconsistent" {
		t.Fatalf("after create-md beta's disk is %s, want Inconsistent", d)
	}
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != size {
		t.Fatalf("after create-md the resync moved %d bytes, want the whole %d", moved, size)
	}
}

// TestCorruptBitmapPageFallsBackToResyncingItsRange: a bitmap page of
// alpha's metadata fails its checksum at restart; the range it covers is
// resynced in full (safe), nothing is lost, and the load is reported.
func TestCorruptBitmapPageFallsBackToResyncingItsRange(t *testing.T) {
	beside(t)
	const size = 16 << 20
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	writeRandomBlocks(t, c.vol("alpha"), 20, 51)
	c.stop("alpha")

	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	md, err := metadata.OpenMD(f, metadata.MDOptions{Placement: metadata.Internal, DeviceSize: st.Size(), Volume: c.cfg.Volumes[0].VolumeUUID(), NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	off := md.Superblock().BitmapOffset
	f.WriteAt([]byte{0xde, 0xad}, off+100) // inside bitmap page 0
	f.Close()

	n := c.start("alpha")
	evs, _ := n.store.Events(50)
	var reported bool
	for _, e := range evs {
		reported = reported || e.Kind == "metadata-repaired"
	}
	if !reported {
		t.Fatal("the corrupt bitmap page was not reported")
	}
	c.start("beta")
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != size {
		t.Fatalf("resync after a corrupt bitmap page moved %d bytes, want the page's whole range (%d)", moved, size)
	}
	c.requireIdentical()
}

// TestUnrelatedDataIsNeverOverwritten: beta comes back with a generation
// alpha never had; alpha refuses to sync (StandAlone, reason) and beta's
// disk is untouched until the operator re-creates its metadata.
func TestUnrelatedDataIsNeverOverwritten(t *testing.T) {
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	st, err := statefile.Open(filepath.Join(c.dir, "beta", "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	vs, _, _ := st.Volume("vol0")
	vs.Generation = replication.NewGeneration()
	st.PutVolume("vol0", vs)
	st.Close()
	betaImg := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	f, _ := os.OpenFile(betaImg, os.O_RDWR, 0)
	f.WriteAt([]byte("data alpha never saw"), 4096)
	// No ancestor in common either: beta's history is of another lineage.
	fi, _ := f.Stat()
	md, err := metadata.OpenMD(f, metadata.MDOptions{Placement: metadata.Internal, DeviceSize: fi.Size(), Volume: c.cfg.Volumes[0].VolumeUUID(), NodeID: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := md.UpdateSuperblock(func(sb *metadata.Superblock) {
		for i := range sb.History {
			sb.History[i] = replication.NewGeneration()
		}
	}); err != nil {
		t.Fatal(err)
	}
	md.Close()
	f.Close()
	data := func() [32]byte { // the data area only: metadata follows it
		b, err := os.ReadFile(betaImg)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b[:size])
	}
	sum := data()
	c.start("beta")
	eventually(t, func() bool {
		p := c.vol("alpha").peers.byName["beta"].status()
		return p.Replication == "StandAlone" && strings.HasPrefix(p.Reason, "unrelated data") && p.SyncRule == replication.RuleUnrelated
	}, "alpha refuses beta's unrelated data")
	c.stop("beta")
	if data() != sum {
		t.Fatal("beta's unrelated data was changed")
	}
	if _, err := CreateMetadata(c.cfg, "beta", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	c.start("beta")
	if _, err := c.nodes["alpha"].api.Connect(context.Background(), &transport.ConnectRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
}
