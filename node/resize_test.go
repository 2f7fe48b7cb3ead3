package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An online resize (replctl resize) grows every replica while IO runs:
// the secondaries first, then the primary, which only then exposes the new
// size; the range gained is zeroes on every replica without a byte copied
// or resynced; a smaller size, and a size a disk cannot hold, are refused
// naming the disk, with nothing changed; a node that was down catches up
// alone; and a resize cut short by a crash leaves a node at its old size
// or its new one.

const (
	mib        = int64(1) << 20
	resizeFrom = 64 * mib
	resizeTo   = 256 * mib
)

// growDisk makes node name's backing file size bytes, as an operator grows
// a LUN or a file before a resize.
func (c *testCluster) growDisk(name string, size int64) {
	c.t.Helper()
	if err := os.Truncate(c.cfg.Volumes[0].Disks[name].Paths[0].Path, size); err != nil {
		c.t.Fatal(err)
	}
}

// scribble writes a pattern of seed at off on node name's disk, past the
// volume: what a grown LUN may hold where the volume grows.
func (c *testCluster) scribble(name string, off int64, seed byte) {
	c.t.Helper()
	f, err := os.OpenFile(c.cfg.Volumes[0].Disks[name].Paths[0].Path, os.O_RDWR, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(pattern(seed, int(mib)), off); err != nil {
		c.t.Fatal(err)
	}
}

// resize runs the control API's Resize on node via (as replctl resize
// does against --addr).
func (c *testCluster) resize(via string, r *transport.ResizeRequest) (*transport.ResizeReply, error) {
	c.t.Helper()
	if r.Volume == "" {
		r.Volume = "vol0"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.nodes[via].api.Resize(ctx, r)
}

// nbdSize is the export size a new NBD connection to node name is told.
func (c *testCluster) nbdSize(name string) int64 {
	c.t.Helper()
	conn, err := net.Dial("tcp", c.nodes[name].NBDAddr())
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	h, err := nbdtest.Greet(conn, nbdtest.ClientFixedNewstyle)
	if err != nil {
		c.t.Fatal(err)
	}
	_, info, err := h.Go("vol0")
	if err != nil {
		c.t.Fatalf("NBD_OPT_GO vol0 on %s: %v", name, err)
	}
	return info.Size
}

// writer writes random 4 KiB blocks below limit through v until stopped,
// flushing now and then; any failed write fails the test.
type writer struct {
	stop   chan struct{}
	done   sync.WaitGroup
	writes atomic.Int64
}

func startWriter(t *testing.T, v *Volume, limit int64) *writer {
	w := &writer{stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		r := rand.New(rand.NewPCG(7, 7))
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			off := r.Int64N(limit/4096) * 4096
			if err := v.WriteAt(context.Background(), pattern(byte(i), 4096), off, false); err != nil {
				t.Errorf("write at %d while resizing: %v", off, err)
				return
			}
			if i%64 == 0 {
				if err := v.Flush(context.Background()); err != nil {
					t.Errorf("flush while resizing: %v", err)
					return
				}
			}
			w.writes.Add(1)
		}
	}()
	return w
}

func (w *writer) end() int64 {
	close(w.stop)
	w.done.Wait()
	return w.writes.Load()
}

// waitWrites waits until the writer has completed n more writes.
func (w *writer) waitWrites(t *testing.T, n int64, what string) {
	t.Helper()
	from := w.writes.Load()
	eventually(t, func() bool { return w.writes.Load() >= from+n }, what)
}

// TestResizeWhileWritingGrowsEveryReplicaWithoutAResync: alpha serves
// writes all along while vol0 grows from 64 MiB to 256 MiB, on disks that
// hold 256 MiB from the start and on disks grown under the running nodes
// (their metadata moves to the new end). The secondary grows first, the
// primary last; status and a new NBD connection show 256 MiB; writes past
// the old end replicate; nothing is resynced; the replicas are identical
// (the range gained held different bytes on each disk: it is zeroes on
// both); and both nodes restart at 256 MiB.
func TestResizeWhileWritingGrowsEveryReplicaWithoutAResync(t *testing.T) {
	beside(t)
	for _, tc := range []struct {
		name       string
		growFirst  bool // the disks hold 256 MiB before the nodes start
		wantMoved  bool
		wantNoMove bool
	}{
		{name: "the disks hold the new size from the start", growFirst: true, wantNoMove: true},
		{name: "the disks grow under the running nodes", wantMoved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, resizeFrom)
			big := deviceSizeFor(t, resizeTo, 1)
			if tc.growFirst {
				c.growDisk("alpha", big)
				c.growDisk("beta", big)
			}
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			before := replica(c.status(), "beta").ResyncedBytes
			if !tc.growFirst {
				c.growDisk("alpha", big+64*mib)
				c.growDisk("beta", big+64*mib)
			}
			// The range gained holds whatever the disks held there,
			// different on each: the resize makes it zeroes on both.
			for i, name := range []string{"alpha", "beta"} {
				c.scribble(name, 100*mib, byte(10+i))
				c.scribble(name, resizeTo-mib, byte(20+i))
			}
			w := startWriter(t, c.vol("alpha"), resizeFrom)
			w.waitWrites(t, 64, "writes before the resize")
			reply, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
			if err != nil {
				t.Fatalf("resize: %v", err)
			}
			w.waitWrites(t, 64, "writes after the resize")
			writes := w.end()
			if len(reply.Nodes) != 2 || reply.Nodes[0].Node != "beta" || reply.Nodes[1].Node != "alpha" {
				t.Fatalf("resize went %+v, want beta then alpha", reply.Nodes)
			}
			for _, d := range reply.Nodes {
				t.Logf("%s: %s", d.Node, d.Text)
				if d.Action != transport.ResizeGrew || d.OldSize != resizeFrom || d.Size != resizeTo || d.ZeroedBytes != resizeTo-resizeFrom {
					t.Fatalf("%s: %+v", d.Node, d)
				}
				if (tc.wantMoved && !d.MetadataMoved) || (tc.wantNoMove && d.MetadataMoved) {
					t.Fatalf("%s: metadata moved %v", d.Node, d.MetadataMoved)
				}
			}
			if !strings.Contains(reply.Nodes[1].Text, "new NBD connections see 256.0MiB") {
				t.Fatalf("the primary's account does not say what NBD clients see: %q", reply.Nodes[1].Text)
			}
			t.Logf("%d writes while resizing", writes)

			if got := c.nbdSize("alpha"); got != resizeTo {
				t.Fatalf("a new NBD connection is told %d bytes, want %d", got, resizeTo)
			}
			ctx := context.Background()
			a := c.vol("alpha")
			for _, off := range []int64{resizeFrom - 4096, resizeFrom, 200 * mib, resizeTo - 8192} {
				if err := a.WriteAt(ctx, pattern(byte(off>>20), 8192), off, false); err != nil {
					t.Fatalf("write at %d after the resize: %v", off, err)
				}
			}
			c.waitInSync()
			st := c.status()
			if st.Volumes[0].Size != resizeTo {
				t.Fatalf("status says size %d, want %d", st.Volumes[0].Size, resizeTo)
			}
			for _, name := range []string{"alpha", "beta"} {
				if r := replica(st, name); r.Size != resizeTo {
					t.Fatalf("%s reports size %d, want %d", name, r.Size, resizeTo)
				}
			}
			if moved := replica(st, "beta").ResyncedBytes - before; moved != 0 {
				t.Fatalf("the resize resynced %d bytes, want none", moved)
			}
			c.requireIdenticalUpTo(resizeTo)
			waitForEvent(t, c.nodes["beta"], "resized", nil)

			// Both restart at the recorded size; the file still says
			// 64 MiB, which they warn about.
			c.stop("beta")
			c.stop("alpha")
			alpha := c.start("alpha")
			beta := c.start("beta")
			c.waitInSync()
			if c.vol("alpha").size.Load() != resizeTo || c.vol("beta").size.Load() != resizeTo {
				t.Fatalf("after a restart: sizes %d and %d, want %d", c.vol("alpha").size.Load(), c.vol("beta").size.Load(), resizeTo)
			}
			for _, n := range []*Node{alpha, beta} {
				e := waitForEvent(t, n, "size-differs", nil)
				if !strings.Contains(e.Message, "Put size: 256MiB in volumes[vol0]") {
					t.Fatalf("the warning does not say what to put in the file: %q", e.Message)
				}
			}
			c.requireIdenticalUpTo(resizeTo)
		})
	}
}

// readAt returns n bytes of the file at path from off.
func readAt(t *testing.T, path string, off, n int64) []byte {
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

// TestResizeRefusesWhatItCannotDoAndChangesNothing: a smaller size is
// refused; so is a size one node's disk cannot hold, naming that disk and
// what it lacks, even though the other node could grow. Both stay at
// 64 MiB with their metadata where it was, and the bytes past the volume
// that a resize would zero (here a pattern, as a grown LUN holds
// whatever it held) are unchanged.
func TestResizeRefusesWhatItCannotDoAndChangesNothing(t *testing.T) {
	c := newTestCluster(t, resizeFrom)
	c.growDisk("alpha", deviceSizeFor(t, resizeTo, 1))
	alphaDisk := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	f, err := os.OpenFile(alphaDisk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	past := pattern(5, int(mib))
	for _, off := range []int64{resizeFrom, 200 * mib} {
		if _, err := f.WriteAt(past, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	betaDisk := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	need := deviceSizeFor(t, resizeTo, 1)
	fi, _ := os.Stat(betaDisk)
	sb := map[string]metadata.Superblock{"alpha": c.vol("alpha").durable.md.Superblock(), "beta": c.vol("beta").durable.md.Superblock()}
	alphaSize, _ := os.Stat(alphaDisk)
	for _, tc := range []struct {
		name  string
		size  int64
		words []string
	}{
		{"a smaller size", 32 * mib, []string{"a volume only grows", "vol0 is 67108864 bytes (64.0MiB) on alpha", "32.0MiB", "nothing changed"}},
		{"a size beta's disk cannot hold", resizeTo, []string{
			"on beta", "the disk " + betaDisk + " holds " + itoa(fi.Size()),
			"needs " + itoa(need), "it lacks " + itoa(need-fi.Size()), "truncate -s " + itoa(need) + " " + betaDisk, "nothing changed",
			"vol0 is 64.0MiB, the most every node's disk holds now"}},
		// No disk holds 1 PiB with its metadata (the format's largest;
		// 1022.9TiB with the checksum area the metadata has by default):
		// each node names its disk, what it holds and the largest size
		// it holds the volume at. (The check looped for ever before.)
		{"a size no disk holds", 1 << 50, []string{
			"vol0 cannot grow to 1.0PiB (1125899906842624 bytes); nothing changed:",
			"no room to grow on alpha: the disk " + alphaDisk + " holds " + itoa(alphaSize.Size()), "vol0 fits on it at up to 256.0MiB (268435456 bytes) now",
			"no room to grow on beta: the disk " + betaDisk + " holds " + itoa(fi.Size()), "vol0 fits on it at up to 64.0MiB (67108864 bytes) now",
			"no disk holds vol0 at 1.0PiB with its metadata (the most one holds is 1022.9TiB): give a smaller size",
			"vol0 is 64.0MiB, the most every node's disk holds now"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.resize("alpha", &transport.ResizeRequest{Size: tc.size})
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("resize to %d: %v, want FailedPrecondition", tc.size, err)
			}
			msg := status.Convert(err).Message()
			t.Logf("refused: %s", msg)
			for _, w := range tc.words {
				if !strings.Contains(msg, w) {
					t.Errorf("the refusal does not say %q", w)
				}
			}
			if n := strings.Count(msg, "nothing changed"); n != 1 {
				t.Errorf("the refusal says %d times that nothing changed, want once", n)
			}
			for _, n := range []string{"alpha", "beta"} {
				v := c.vol(n)
				if v.size.Load() != resizeFrom || v.durable.md.VolumeSize() != resizeFrom {
					t.Fatalf("%s is %d bytes (metadata %d) after a refusal", n, v.size.Load(), v.durable.md.VolumeSize())
				}
				if got := v.durable.md.Superblock(); got.DeviceSize != sb[n].DeviceSize || got.MDOffset != sb[n].MDOffset {
					t.Fatalf("%s's metadata moved after a refusal: %+v", n, got)
				}
			}
			for _, off := range []int64{resizeFrom, 200 * mib} {
				if string(readAt(t, alphaDisk, off, mib)) != string(past) {
					t.Fatalf("alpha's disk past the volume changed at %d although the resize was refused", off)
				}
			}
		})
	}
	// A refusal leaves nothing behind that holds the volume: once beta's
	// disk is grown, the resize goes through (it waited behind the
	// endless check before).
	c.growDisk("beta", need)
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo}); err != nil {
		t.Fatalf("resize to %d after the refusals, with every disk grown: %v", int64(resizeTo), err)
	}
}

// TestAPrimaryGrowsOnlyAfterItsPeersAndRefusesWritesPastTheOldEnd: grown
// alone while its secondary is connected and still small, the primary is
// refused, naming the secondary; once the secondary grew, a write past
// the old end is still refused (EINVAL) until the primary grew too, and
// then replicates.
func TestAPrimaryGrowsOnlyAfterItsPeersAndRefusesWritesPastTheOldEnd(t *testing.T) {
	c := newTestCluster(t, resizeFrom)
	c.growDisk("alpha", deviceSizeFor(t, resizeTo, 1))
	c.growDisk("beta", deviceSizeFor(t, resizeTo, 1))
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	_, err := c.resize("beta", &transport.ResizeRequest{Size: resizeTo, Node: "alpha"})
	if !strings.Contains(status.Convert(err).Message(), "alpha streams vol0 to beta, which is still 64.0MiB") {
		t.Fatalf("the primary grown before its peer: %v", err)
	}
	if got := c.vol("alpha").size.Load(); got != resizeFrom {
		t.Fatalf("alpha is %d bytes after the refusal", got)
	}
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo, Node: "beta"}); err != nil {
		t.Fatalf("beta alone: %v", err)
	}
	ctx := context.Background()
	err = c.vol("alpha").WriteAt(ctx, pattern(1, 4096), resizeFrom, false)
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a write past the old end before the primary grew: %v, want EINVAL", err)
	}
	if got := c.nbdSize("alpha"); got != resizeFrom {
		t.Fatalf("NBD clients are told %d bytes before the primary grew, want %d", got, resizeFrom)
	}
	if _, err := c.resize("beta", &transport.ResizeRequest{Size: resizeTo, Node: "alpha"}); err != nil {
		t.Fatalf("alpha after beta: %v", err)
	}
	if err := c.vol("alpha").WriteAt(ctx, pattern(1, 4096), resizeFrom, false); err != nil {
		t.Fatalf("a write past the old end once both grew: %v", err)
	}
	c.waitInSync()
	c.requireIdenticalUpTo(resizeTo)
}

// TestANodeDownDuringAResizeIsRefusedAndCatchesUpAlone: with beta down, a
// resize of the whole volume is refused naming it; alpha grown alone
// serves the new size; beta comes back at 64 MiB and is refused, naming
// both sizes and the command that grows it; grown alone, it catches up
// with only what alpha wrote meanwhile.
func TestANodeDownDuringAResizeIsRefusedAndCatchesUpAlone(t *testing.T) {
	beside(t)
	c := newTestCluster(t, resizeFrom)
	c.growDisk("alpha", deviceSizeFor(t, resizeTo, 1))
	c.growDisk("beta", deviceSizeFor(t, resizeTo, 1))
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	_, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "beta") || !strings.Contains(msg, "cannot be reached") || !strings.Contains(msg, "--node") {
		t.Fatalf("a resize with beta down: %v", err)
	}
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo, Node: "alpha"}); err != nil {
		t.Fatalf("alpha alone with beta down: %v", err)
	}
	written := writeRandomBlocks(t, c.vol("alpha"), 200, 3)
	if err := c.vol("alpha").WriteAt(context.Background(), pattern(9, 8192), 200*mib, false); err != nil {
		t.Fatal(err)
	}
	beta := c.start("beta")
	e := waitForEvent(t, beta, "refused", func(e statefile.Event) bool {
		return e.Reason == "size-mismatch" || strings.Contains(e.Message, "size")
	})
	for _, part := range []string{"67108864 bytes on beta but 268435456 on alpha", "replctl resize vol0 268435456 --node beta"} {
		if !strings.Contains(e.Message, part) {
			t.Fatalf("beta's refusal %q does not say %q", e.Message, part)
		}
	}
	before := replica(c.status(), "beta").ResyncedBytes
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo, Node: "beta"}); err != nil {
		t.Fatalf("beta alone once back: %v", err)
	}
	c.waitInSync()
	moved := replica(c.status(), "beta").ResyncedBytes - before
	if moved > int64(written+2)*4096 {
		t.Fatalf("beta caught up with %d bytes, more than the %d blocks alpha wrote", moved, written+2)
	}
	c.requireIdenticalUpTo(resizeTo)
}

// TestAResizeCutShortLeavesTheOldSizeOrTheNew: beta's state store fails
// the write of its new size (after its metadata moved to the end of its
// grown disk and the range gained was zeroed), and beta crashes there: it
// restarts at 64 MiB, finding its metadata at the new end, replicates, and
// a second resize grows it. A node whose disk grew while it was down
// opens its metadata at the end of the old size.
func TestAResizeCutShortLeavesTheOldSizeOrTheNew(t *testing.T) {
	beside(t)
	c := newTestCluster(t, resizeFrom)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	big := deviceSizeFor(t, resizeTo, 1) + 64*mib
	c.growDisk("alpha", big)
	c.growDisk("beta", big)
	wrapStore(c.nodes["beta"]).set(func(st statefile.VolumeState) bool { return st.Size == resizeTo })
	_, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
	if err == nil || !strings.Contains(status.Convert(err).Message(), "record the new size") {
		t.Fatalf("resize with beta's store failing: %v", err)
	}
	c.crash("beta")
	c.start("beta")
	c.waitInSync()
	if got := c.vol("beta").size.Load(); got != resizeFrom {
		t.Fatalf("beta restarted at %d bytes, want the old %d", got, resizeFrom)
	}
	if sb := c.vol("beta").durable.md.Superblock(); sb.DeviceSize != big {
		t.Fatalf("beta's metadata is laid out for %d bytes, want the grown disk's %d (it moved before the cut)", sb.DeviceSize, big)
	}
	writeRandomBlocks(t, c.vol("alpha"), 50, 4)
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo}); err != nil {
		t.Fatalf("the second resize: %v", err)
	}
	c.waitInSync()
	c.requireIdenticalUpTo(resizeTo)

	// The disk grows while beta is down: it starts from the metadata at
	// the end of the size it had.
	c.stop("beta")
	c.growDisk("beta", big+128*mib)
	beta := c.start("beta")
	waitForEvent(t, beta, "disk-grew", nil)
	c.waitInSync()
	if sb := c.vol("beta").durable.md.Superblock(); sb.DeviceSize != big {
		t.Fatalf("beta's metadata is laid out for %d bytes, want %d", sb.DeviceSize, big)
	}
}

// TestResizeWithExternalMetadataNeedsTheDiskAndTheFileGrown: with
// external metadata the data disk must hold the new size and the metadata
// file the bitmaps for it: each is refused in turn, naming the disk, then
// the file, and what it lacks; grown, the volume grows and the replicas
// are identical.
func TestResizeWithExternalMetadataNeedsTheDiskAndTheFileGrown(t *testing.T) {
	c := newTestCluster(t, resizeFrom)
	c.cfg.Volumes[0].Metadata = "external"
	for _, name := range []string{"alpha", "beta"} {
		dc := c.cfg.Volumes[0].Disks[name]
		c.growDisk(name, 0)
		c.growDisk(name, resizeFrom)
		dc.Meta = dc.Paths[0].Path + ".md"
		n, _ := metadata.ExternalSizeFor(resizeFrom, 0, 1, true)
		if err := os.WriteFile(dc.Meta, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(dc.Meta, n); err != nil {
			t.Fatal(err)
		}
		c.cfg.Volumes[0].Disks[name] = dc
	}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	writeRandomBlocks(t, c.vol("alpha"), 100, 5)

	alphaDisk := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	_, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "the disk "+alphaDisk+" holds 67108864 bytes (64.0MiB); vol0 at 256.0MiB needs 268435456: it lacks 201326592 bytes") {
		t.Fatalf("data disks not grown: %v", err)
	}
	c.growDisk("alpha", resizeTo)
	c.growDisk("beta", resizeTo)
	_, err = c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
	need, _ := metadata.ExternalSizeFor(resizeTo, 0, 1, true)
	meta := c.cfg.Volumes[0].Disks["alpha"].Meta
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "the metadata file "+meta+" holds") || !strings.Contains(msg, "truncate -s "+itoa(need)+" "+meta) {
		t.Fatalf("metadata files not grown: %v", err)
	}
	for _, name := range []string{"alpha", "beta"} {
		if err := os.Truncate(c.cfg.Volumes[0].Disks[name].Meta, need); err != nil {
			t.Fatal(err)
		}
	}
	reply, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo})
	if err != nil {
		t.Fatalf("resize with everything grown: %v", err)
	}
	for _, d := range reply.Nodes {
		if !d.MetadataMoved || !strings.Contains(d.Text, "its bitmaps were laid out again in") {
			t.Fatalf("%s: %+v", d.Node, d)
		}
	}
	if err := c.vol("alpha").WriteAt(context.Background(), pattern(3, 8192), resizeTo-8192, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdenticalUpTo(resizeTo)
	c.stop("beta")
	c.start("beta")
	c.waitInSync()
	if got := c.vol("beta").size.Load(); got != resizeTo {
		t.Fatalf("beta restarted at %d bytes", got)
	}
}
