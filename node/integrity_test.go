package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/transport"
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
	if _, ok := c.vol("beta").durable.md.Checksums(); ok {
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
	if _, ok := c.vol("alpha").durable.md.Checksums(); !ok {
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
	sums, ok := v.durable.md.Checksums()
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

// randomBytes is n bytes of the random stream seed gives.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// corruptLink flips a byte of the first frame that carries target, once
// armed: a frame damaged on its way to the peer.
type corruptLink struct {
	r      *transport.ReplStream
	target []byte
	armed  *atomic.Bool
	done   *atomic.Bool
}

func (l corruptLink) SendMsg(m any) error {
	f := m.(*transport.Frame)
	if !l.armed.Load() || l.done.Load() {
		return l.r.Send(f)
	}
	b := f.AppendContents(nil)
	i := bytes.Index(b, l.target)
	if i < 0 {
		return l.r.Send(f)
	}
	l.done.Store(true)
	b[i+100] ^= 0x40
	nf := transport.NewFrame(len(b))
	nf.SetBytes(append(nf.Bytes(), b...))
	f.Release()
	return l.r.Send(nf)
}

func (l corruptLink) RecvMsg(m any) error      { return l.r.Recv(m.(*transport.Frame)) }
func (l corruptLink) Context() context.Context { return l.r.Context() }

// writeWatch is a disk that keeps a copy of every write that touches
// the 4 KiB block at off.
type writeWatch struct {
	Disk
	off    int64
	mu     sync.Mutex
	writes [][]byte
}

func (w *writeWatch) WriteAt(p []byte, off int64) (int, error) {
	if off < w.off+4096 && off+int64(len(p)) > w.off {
		w.mu.Lock()
		w.writes = append(w.writes, bytes.Clone(p[max(0, w.off-off):min(int64(len(p)), w.off+4096-off)]))
		w.mu.Unlock()
	}
	return w.Disk.WriteAt(p, off)
}

// corruptingLinkToBeta makes alpha's streams pass through a link that,
// once armed, damages the first frame carrying data (corruptLink), and
// beta's disk record its writes to block; it starts both and waits until
// they are in sync.
func corruptingLinkToBeta(c *testCluster, data []byte, block int64) (armed, done *atomic.Bool, watch *writeWatch) {
	armed, done = &atomic.Bool{}, &atomic.Bool{}
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(corruptLink{r: s, target: data, armed: armed, done: done}, s.Close)
	}}
	c.opts["beta"] = Options{OpenDisk: func(path string, size int64) (Disk, error) {
		d, err := OpenDisk(path, size)
		if err != nil {
			return nil, err
		}
		watch = &writeWatch{Disk: d, off: block * 4096}
		return watch, nil
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	return armed, done, watch
}

// requireOnly fails t unless the block got writes and every one of them
// was want: nothing of a corrupted frame was applied.
func (w *writeWatch) requireOnly(t *testing.T, want []byte, block int64) {
	t.Helper()
	w.mu.Lock()
	writes := slices.Clone(w.writes)
	w.mu.Unlock()
	if len(writes) == 0 {
		t.Fatal("beta never got the block")
	}
	for i, got := range writes {
		if !bytes.Equal(got, want) {
			t.Fatalf("beta's write %d of block %d is not the data written (the corrupted frame was applied)", i, block)
		}
	}
}

// TestAFrameCorruptedInFlightIsRefused: a write's frame whose payload no
// longer matches the checksums it carries is refused by the secondary,
// which writes nothing of it; the stream ends, the primary marks the
// blocks, and the reconnection's resync brings the right data.
func TestAFrameCorruptedInFlightIsRefused(t *testing.T) {
	const block = 77
	c := newTestCluster(t, 8<<20)
	data := randomBytes(29, 8192)
	armed, done, watch := corruptingLinkToBeta(c, data, block)
	armed.Store(true)
	if err := c.vol("alpha").WriteAt(context.Background(), data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if !done.Load() {
		t.Fatal("the link corrupted no frame")
	}
	c.waitInSync()
	c.requireIdentical()
	watch.requireOnly(t, data[:4096], block)
	// alpha says why the stream ended.
	waitForEvent(t, c.nodes["alpha"], "peer-lost", func(e statefile.Event) bool {
		return strings.Contains(e.Message, "refused a frame whose blocks did not match their checksums")
	})
}

// TestAResyncFrameCorruptedInFlightIsRefused: the resync source sends
// each run's checksums with it; a run damaged on its way is refused by
// the target, which writes nothing of it, and the next resync brings the
// right data, with its sums stored.
func TestAResyncFrameCorruptedInFlightIsRefused(t *testing.T) {
	const block = 300
	c := newTestCluster(t, 8<<20)
	data := randomBytes(31, 8192)
	armed, done, watch := corruptingLinkToBeta(c, data, block)
	a := c.vol("alpha")
	a.setAdminDown(true)
	if err := a.WriteAt(context.Background(), data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	a.setAdminDown(false)
	c.waitInSync()
	if !done.Load() {
		t.Fatal("the link corrupted no frame")
	}
	c.requireIdentical()
	watch.requireOnly(t, data[:4096], block)
	c.sumsMatchDisk("beta", map[int64][]byte{block: data[:4096], block + 1: data[4096:]}, nil)
}

// flipFileBytes flips the bits of n bytes of the file at path from off,
// behind the node's back: rot on the disk.
func flipFileBytes(t *testing.T, path string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// fileBytes reads n bytes of the file at path from off.
func fileBytes(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestARottenBlockIsReadFromThePeerAndRepaired: bytes flipped inside a
// written block of the primary's backing file: a read returns the data
// written, the event and the counter say the block was repaired from
// beta, and the file holds the right bytes again. A read of part of the
// block is checked too.
func TestARottenBlockIsReadFromThePeerAndRepaired(t *testing.T) {
	const block = 500
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	data := randomBytes(41, 3*4096)
	if err := v.WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	flipFileBytes(t, img, (block+1)*4096+1000, 3)
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, block*4096); err != nil {
		t.Fatalf("read of a rotten block: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the read returned other data than was written")
	}
	e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil)
	if e.Peer != "beta" || e.Reason != "checksum" || e.Offset != (block+1)*4096 || e.Length != 4096 {
		t.Fatalf("block-repaired event: %+v", e)
	}
	if _, repaired, _ := c.integrityOf("alpha"); repaired != 1 {
		t.Fatalf("status says %d blocks repaired, want 1", repaired)
	}
	waitMetric(t, c.nodes["alpha"], "the repair", metricIs(1), "replvol_blocks_repaired_total", "volume=vol0", "node=alpha", "cause=checksum")
	waitMetric(t, c.nodes["alpha"], "no read error", metricIs(0), "replvol_blocks_repaired_total", "volume=vol0", "node=alpha", "cause=read-error")
	if !bytes.Equal(fileBytes(t, img, block*4096, len(data)), data) {
		t.Fatal("the backing file does not hold the right bytes again")
	}
	// A read of 512 bytes inside a rotten block is checked whole.
	flipFileBytes(t, img, (block+2)*4096+10, 1)
	part := make([]byte, 512)
	if err := v.ReadAt(ctx, part, (block+2)*4096+2048); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(part, data[2*4096+2048:][:512]) {
		t.Fatal("a read of part of a rotten block returned other data than was written")
	}
	if _, repaired, _ := c.integrityOf("alpha"); repaired != 2 {
		t.Fatalf("status says %d blocks repaired, want 2", repaired)
	}
	c.requireIdentical()
}

// TestABlockRottenOnBothReplicasFailsWithEIO: the same block corrupted on
// both replicas: its read fails with EIO (never wrong data), the event
// names its range, and the other blocks read fine.
func TestABlockRottenOnBothReplicasFailsWithEIO(t *testing.T) {
	const block = 600
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	data := randomBytes(43, 2*4096)
	if err := v.WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alpha", "beta"} {
		flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, block*4096+7, 2)
	}
	got := make([]byte, len(data))
	err := v.ReadAt(ctx, got, block*4096)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a block bad on both replicas: %v, want EIO", err)
	}
	e := waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", nil)
	if e.Offset != block*4096 || e.Length != 4096 || !strings.Contains(e.Message, "Write the range again") {
		t.Fatalf("block-unrecoverable event: %+v", e)
	}
	// Read again: still EIO, still one block.
	if err := v.ReadAt(ctx, got, block*4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second read of a block bad on both replicas: %v, want EIO", err)
	}
	if _, _, unrecoverable := c.integrityOf("alpha"); unrecoverable != 1 {
		t.Fatalf("status says %d blocks unrecoverable after two reads of one, want 1", unrecoverable)
	}
	waitMetric(t, c.nodes["alpha"], "the unrecoverable block", metricIs(1), "replvol_blocks_unrecoverable", "volume=vol0", "node=alpha")
	// The cluster's status, as beta assembles it, carries each node's
	// integrity on its replica.
	_, vs := c.statusOf("beta", "vol0")
	if vs == nil {
		t.Fatal("no vol0 in beta's cluster status")
	}
	for _, name := range []string{"alpha", "beta"} {
		in := vs.Replica(name).Integrity
		if in == nil || !in.Checksums || in.Scrub.State != "idle" {
			t.Fatalf("%s's replica in the cluster status: integrity %+v, want checksums and an idle scrub", name, in)
		}
	}
	if got := vs.Replica("alpha").Integrity.UnrecoverableBlocks; got != 1 {
		t.Fatalf("alpha's replica in the cluster status: %d blocks unrecoverable, want 1", got)
	}
	other := make([]byte, 4096)
	if err := v.ReadAt(ctx, other, (block+1)*4096); err != nil || !bytes.Equal(other, data[4096:]) {
		t.Fatalf("the next block: %v", err)
	}
	if v.isDetached() {
		t.Fatal("the disk was detached")
	}
	// A write to the block clears it: it reads back, here and on beta.
	again := randomBytes(44, 4096)
	if err := v.WriteAt(ctx, again, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.ReadAt(ctx, other, block*4096); err != nil || !bytes.Equal(other, again) {
		t.Fatalf("the block written again: %v", err)
	}
	if _, _, unrecoverable := c.integrityOf("alpha"); unrecoverable != 0 {
		t.Fatalf("status says %d blocks unrecoverable once the block was written again, want 0", unrecoverable)
	}
	waitMetric(t, c.nodes["alpha"], "no unrecoverable block", metricIs(0), "replvol_blocks_unrecoverable", "volume=vol0", "node=alpha")
	c.waitInSync()
	c.requireIdentical()
}

// TestAReadErrorOnOneBlockIsRepairedInPlace: the primary's disk fails to
// read one block (EIO from the fault disk): the client sees no error and
// the data written, the block is written back, and the disk stays
// attached.
func TestAReadErrorOnOneBlockIsRepairedInPlace(t *testing.T) {
	const block = 700
	c := newTestCluster(t, 8<<20)
	rec := &opRecorder{}
	c.opts["alpha"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(rec) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	ctx := context.Background()
	data := randomBytes(47, 4*4096)
	if err := v.WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.faultDisk("alpha").Add(fault.On(fault.Read).Range((block+2)*4096, 4096).Err(syscall.EIO))
	got := make([]byte, len(data))
	if err := v.ReadAt(ctx, got, block*4096); err != nil {
		t.Fatalf("read with one unreadable block: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the read returned other data than was written")
	}
	e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil)
	if e.Peer != "beta" || e.Reason != "read-error" || e.Offset != (block+2)*4096 {
		t.Fatalf("block-repaired event: %+v", e)
	}
	rewritten := false
	rec.mu.Lock()
	for _, op := range rec.ops {
		rewritten = rewritten || op == fmt.Sprintf("fua@%d", (block+2)*4096) || op == fmt.Sprintf("write@%d", (block+2)*4096)
	}
	rec.mu.Unlock()
	if !rewritten {
		t.Fatal("the unreadable block was not written back")
	}
	if v.isDetached() {
		t.Fatal("a read error on one block detached the disk")
	}
	waitMetric(t, c.nodes["alpha"], "the repair", metricIs(1), "replvol_blocks_repaired_total", "volume=vol0", "node=alpha", "cause=read-error")
}

// TestASumsRoomIsReusedOnlyOnceTheWriteIsDone: a write too large for its
// countdown's own room for sums takes a kept one (no allocation per 1 MiB
// write), and the room goes back for another write only when the last
// holder of the write, the write itself or a peer's entry, is done: until
// then a peer's stream may still send the sums.
func TestASumsRoomIsReusedOnlyOnceTheWriteIsDone(t *testing.T) {
	in := &integrity{rooms: make(chan *sumsRoom, keptRooms)}
	r := in.takeRoom()
	c := &countdown{room: r, rooms: in}
	c.add() // the write
	c.add() // a peer's entry
	c.Done()
	if got := in.takeRoom(); got == r {
		t.Fatal("the room was given to another write while a peer's entry still held the write")
	}
	c.Done()
	if got := in.takeRoom(); got != r {
		t.Fatal("the room was not kept for another write once the write was done")
	}
}

// TestLargeWritesUnderProtocolAShipTheirOwnSums: under protocol A a write
// returns before its peer has its entry, so the room holding its sums
// must outlive the write: 1 MiB writes in a row, 8 at a time, each
// reaching the peer with its own sums (a frame with another write's sums
// would be refused and the peer resynced), leave both replicas in sync,
// no frame refused, and each block's sum right on both.
func TestLargeWritesUnderProtocolAShipTheirOwnSums(t *testing.T) {
	c := newTestCluster(t, 64<<20)
	c.cfg.Volumes[0].Protocol = "A"
	// A resync is what a refused frame costs, and what a stream lost to
	// a peer timeout costs too: on a starved machine beta answered nothing
	// for more than the default 2 s. A minute, longer than the test's
	// waits, leaves only a refused frame to resync beta, and a lost stream
	// is told as such.
	c.cfg.Volumes[0].PeerTimeout = Duration(time.Minute)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	since := c.lastEventSeq("alpha")
	a := c.vol("alpha")
	ctx := context.Background()
	resyncedBefore := replica(c.status(), "beta").ResyncedBytes
	want := map[int64][]byte{}
	var mu mutex
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				off := int64(w*8+i) << 20
				data := pattern(byte(w*8+i+1), 1<<20)
				if err := a.WriteAt(ctx, data, off, false); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for k := int64(0); k < 256; k++ {
					want[off/4096+k] = data[k*4096 : (k+1)*4096]
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	if _, lost := c.streamsSince("alpha", "beta", since); len(lost) > 0 {
		t.Fatalf("alpha lost beta's stream (a refused frame is what the test looks for; any other cause, a stream lost under it): %q", lost)
	}
	if got := replica(c.status(), "beta").ResyncedBytes; got != resyncedBefore {
		t.Fatalf("beta was resynced (%d bytes, %d before): a frame was refused", got, resyncedBefore)
	}
	c.sumsMatchDisk("alpha", want, nil)
	c.sumsMatchDisk("beta", want, nil)
}
