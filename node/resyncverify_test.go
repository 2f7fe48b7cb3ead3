package node

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// TestAResyncNeverShipsABlockThatFailsItsChecksum: beta misses a write
// (disconnected), and the block it would get rots on alpha, the only
// replica that holds it. The resync does not ship it as good: beta is
// never UpToDate while the block is bad, alpha's event names the block
// and the peer's reason is source-unrecoverable; beta's copy of the
// block never becomes the rotten bytes. A write of the block lets the
// resync finish, and the replicas are equal.
func TestAResyncNeverShipsABlockThatFailsItsChecksum(t *testing.T) {
	beside(t)
	const block = 300
	c := newSyncedCluster(t, 8<<20)
	a := c.vol("alpha")
	ctx := context.Background()
	a.setAdminDown(true)
	data := randomBytes(71, 4*4096)
	if err := a.WriteAt(ctx, data, block*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	flipFileBytes(t, img, (block+2)*4096+100, 4)
	rotten := fileBytes(t, img, (block+2)*4096, 4096)
	a.setAdminDown(false)

	e := waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", nil)
	if e.Offset != (block+2)*4096 || e.Length != 4096 {
		t.Fatalf("block-unrecoverable event: %+v; want the block at %d", e, (block+2)*4096)
	}
	eventually(t, func() bool {
		for _, p := range a.status().Peers {
			if p.Node == "beta" && p.ReasonCode == string(CauseSourceUnrecoverable) {
				return true
			}
		}
		return false
	}, "beta's reason is source-unrecoverable")
	betaImg := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r := replica(c.status(), "beta"); r.Disk == "UpToDate" && r.OutOfSyncBytes == 0 {
			t.Fatalf("beta is UpToDate although alpha holds a block bad that beta lacks: %+v", r)
		}
		if bytes.Equal(fileBytes(t, betaImg, (block+2)*4096, 4096), rotten) {
			t.Fatal("the resync shipped the rotten block to beta")
		}
		time.Sleep(50 * time.Millisecond)
	}

	fresh := randomBytes(72, 4096)
	if err := a.WriteAt(ctx, fresh, (block+2)*4096, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
	if got := fileBytes(t, betaImg, (block+2)*4096, 4096); !bytes.Equal(got, fresh) {
		t.Fatal("beta does not hold the block written after the rot")
	}
}

// TestAResyncHoldsBackOnlyTheBadBlockAndTheTargetRecordsIt: beta misses
// 64 blocks (disconnected) and one of them rots on alpha, the only
// replica that holds it. The resync ships the 63 good blocks around it
// and holds back that one only: beta is out of sync in 4 KiB, not in the
// run. beta records the block as unrecoverable (event, status, and a
// verified read of it there fails with EIO, never its older data). A
// write of the block clears it on both, and the replicas are equal.
func TestAResyncHoldsBackOnlyTheBadBlockAndTheTargetRecordsIt(t *testing.T) {
	const first, rot = 256, 300
	c := newSyncedCluster(t, 8<<20)
	a := c.vol("alpha")
	ctx := context.Background()
	data := writeApartThenRot(t, c, 73, first, 64, rot*4096+100, 4)

	e := waitForEvent(t, c.nodes["beta"], "block-unrecoverable", nil)
	if e.Offset != rot*4096 || e.Length != 4096 || e.Peer != "alpha" || e.Reason != string(CauseSourceUnrecoverable) {
		t.Fatalf("beta's block-unrecoverable event: %+v; want the block at %d from alpha", e, rot*4096)
	}
	eventually(t, func() bool { return a.peers.byName["beta"].bm.Bytes() == 4096 }, "beta out of sync in the bad block only")
	betaImg := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	for b := int64(first); b < first+64; b++ {
		if b == rot {
			continue
		}
		if got := fileBytes(t, betaImg, b*4096, 4096); !bytes.Equal(got, data[(b-first)*4096:][:4096]) {
			t.Fatalf("beta's block %d is not the data written: the resync held back more than the bad block", b)
		}
	}
	if _, _, unrecoverable := c.integrityOf("beta"); unrecoverable != 1 {
		t.Fatalf("beta's status says %d blocks unrecoverable, want 1", unrecoverable)
	}
	// beta's own read of the block (as if it were promoted) fails: its
	// older copy, which matches its older sum, is no good copy.
	got := make([]byte, 4096)
	if _, err := c.vol("beta").disk.ReadAt(got, rot*4096); err != nil {
		t.Fatal(err)
	}
	// (It asks its primary, while a stream from it runs: the resync's
	// retries end it now and then.)
	var rerr error
	if !within(10*time.Second, 20*time.Millisecond, func() bool {
		rerr = c.vol("beta").verifyRead(ctx, got, rot*4096)
		return !errors.Is(rerr, errRepairLater)
	}) || !errors.Is(rerr, syscall.EIO) {
		t.Fatalf("beta's verified read of the unrecoverable block: %v, want EIO", rerr)
	}
	if r := replica(c.status(), "beta"); r.Disk == "UpToDate" && r.OutOfSyncBytes == 0 {
		t.Fatalf("beta is UpToDate although alpha holds a block bad that beta lacks: %+v", r)
	}

	fresh := randomBytes(74, 4096)
	if err := a.WriteAt(ctx, fresh, rot*4096, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
	for _, name := range []string{"alpha", "beta"} {
		if _, _, unrecoverable := c.integrityOf(name); unrecoverable != 0 {
			t.Fatalf("%s's status says %d blocks unrecoverable once the block was written again, want 0", name, unrecoverable)
		}
	}
}

// TestOnlineVerifyRepairsABlockRottenOnThePrimary: a block rots on the
// primary's disk; the online verify checks each run against alpha's own
// sums before it compares: the block is repaired from beta (event
// block-repaired), alpha's file holds the data again, and the verify
// finds nothing out of sync.
func TestOnlineVerifyRepairsABlockRottenOnThePrimary(t *testing.T) {
	const rot = 100
	c := newSyncedCluster(t, 8<<20)
	data := randomBytes(75, 1<<20)
	c.writeFlushed(t, data, 0)
	c.waitInSync()
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	flipFileBytes(t, img, rot*4096+9, 3)

	ctx := context.Background()
	if r, err := c.nodes["alpha"].api.Verify(ctx, &transport.VerifyRequest{Volume: "vol0"}); err != nil || r.Primary != "alpha" {
		t.Fatalf("verify: %+v %v", r, err)
	}
	eventually(t, func() bool {
		b := replica(c.status(), "beta")
		return b.VerifyTotalBytes > 0 && b.VerifyDoneBytes == b.VerifyTotalBytes && !c.vol("alpha").peers.byName["beta"].verifying.Load()
	}, "verify finished")
	if b := replica(c.status(), "beta"); b.VerifyFoundBytes != 0 || b.OutOfSyncBytes != 0 {
		t.Fatalf("verify found %d bytes, out of sync %d; want none (the rotten block is repaired, not compared)", b.VerifyFoundBytes, b.OutOfSyncBytes)
	}
	e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil)
	if e.Peer != "beta" || e.Reason != "checksum" || e.Offset != rot*4096 || e.Length != 4096 {
		t.Fatalf("block-repaired event: %+v", e)
	}
	if !bytes.Equal(fileBytes(t, img, 0, len(data)), data) {
		t.Fatal("alpha's backing file does not hold the data written again")
	}
	waitForEvent(t, c.nodes["alpha"], "verify-done", nil)
	c.requireIdentical()

	// The same block rotten alike on both: it is never compared as if
	// good (the two rotten copies are equal), but reported as the
	// resync does: unrecoverable, and out of sync for beta.
	const both = 200
	for _, name := range []string{"alpha", "beta"} {
		flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, both*4096+9, 3)
	}
	if _, err := c.nodes["alpha"].api.Verify(ctx, &transport.VerifyRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		b := replica(c.status(), "beta")
		return b.VerifyDoneBytes == b.VerifyTotalBytes && !c.vol("alpha").peers.byName["beta"].verifying.Load()
	}, "second verify finished")
	if b := replica(c.status(), "beta"); b.VerifyFoundBytes != 4096 || b.OutOfSyncBytes != 4096 {
		t.Fatalf("verify found %d bytes, out of sync %d; want the block bad on both (4096)", b.VerifyFoundBytes, b.OutOfSyncBytes)
	}
	e = waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", nil)
	if e.Offset != both*4096 || e.Length != 4096 {
		t.Fatalf("block-unrecoverable event: %+v", e)
	}
}

// TestAThirdReplicaRepairsABlockRottenOnTwo: alpha (primary), beta and
// gamma. A block rotten on alpha and on beta, good on gamma: a read on
// alpha returns the data written, repaired from gamma (beta's copy fails
// its own check), and a scrub on beta repairs beta from alpha; all three
// are equal. Then beta misses a write of another block (disconnected),
// gamma goes away, and the block rots on alpha: the resync to beta holds
// it back, and both alpha and beta record it unrecoverable. Once gamma,
// which holds it good, is back in sync, the resync's retry repairs alpha
// from gamma and ships the good block to beta: all three hold the data
// written and nothing is unrecoverable any more.
func TestAThirdReplicaRepairsABlockRottenOnTwo(t *testing.T) {
	beside(t)
	const both, missed = 400, 500
	c := startThreeInSync(t, 8<<20)
	a := c.vol("alpha")
	ctx := context.Background()
	data := randomBytes(81, 1<<20)
	c.writeFlushed(t, data, 300*4096)
	c.waitInSync()
	img := func(name string) string { return c.cfg.Volumes[0].Disks[name].Paths[0].Path }
	for _, name := range []string{"alpha", "beta"} {
		flipFileBytes(t, img(name), both*4096+17, 2)
	}
	got := make([]byte, 4096)
	if err := a.ReadAt(ctx, got, both*4096); err != nil || !bytes.Equal(got, data[(both-300)*4096:][:4096]) {
		t.Fatalf("read on alpha of the block rotten on alpha and beta: %v", err)
	}
	e := waitForEvent(t, c.nodes["alpha"], "block-repaired", nil)
	if e.Peer != "gamma" || e.Offset != both*4096 {
		t.Fatalf("alpha's block-repaired event: %+v, want the block from gamma", e)
	}
	if _, err := c.vol("beta").scrubCommand(0, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	if st := c.waitScrubFinished(t, "beta"); st.LastRepaired != 1 || st.LastUnrecoverable != 0 {
		t.Fatalf("beta's scrub: %+v, want the one block repaired", st)
	}
	c.requireIdentical()

	// beta misses a write of the block; gamma takes it, then goes away.
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return !a.peers.byName["beta"].connected() }, "beta disconnected")
	fresh := randomBytes(82, 4096)
	c.writeFlushed(t, fresh, missed*4096)
	eventually(t, func() bool { return a.peers.byName["beta"].bm.Bytes() == 4096 }, "the block marked for beta")
	c.vol("gamma").setAdminDown(true)
	eventually(t, func() bool { return !a.peers.byName["gamma"].connected() }, "gamma disconnected")
	flipFileBytes(t, img("alpha"), missed*4096+33, 2)
	c.vol("beta").setAdminDown(false)
	e = waitForEvent(t, c.nodes["beta"], "block-unrecoverable", nil)
	if e.Offset != missed*4096 || e.Length != 4096 {
		t.Fatalf("beta's block-unrecoverable event: %+v", e)
	}
	waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", func(e statefile.Event) bool { return e.Offset == missed*4096 })
	for _, name := range []string{"alpha", "beta"} {
		if _, _, n := c.integrityOf(name); n != 1 {
			t.Fatalf("%s: %d blocks unrecoverable while gamma is away, want 1", name, n)
		}
	}
	c.vol("gamma").setAdminDown(false)
	c.waitInSync()
	c.requireIdentical()
	if got := fileBytes(t, img("beta"), missed*4096, 4096); !bytes.Equal(got, fresh) {
		t.Fatal("beta does not hold the block written while it was away")
	}
	for _, name := range []string{"alpha", "beta", "gamma"} {
		if _, _, n := c.integrityOf(name); n != 0 {
			t.Fatalf("%s: %d blocks unrecoverable once gamma repaired the block, want 0", name, n)
		}
	}
	waitForEvent(t, c.nodes["alpha"], "block-repaired", func(e statefile.Event) bool { return e.Offset == missed*4096 && e.Peer == "gamma" })
}

// olderPeerLink hides from the primary that its peer takes OpResyncLost
// (a HelloReply without "lost", as a node of the release before sends),
// and counts the entries of that op the primary sends anyway.
type olderPeerLink struct {
	r    *transport.ReplStream
	sent *atomic.Int64
}

func (l olderPeerLink) SendMsg(m any) error {
	f := m.(*transport.Frame)
	if b := f.AppendContents(nil); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameBatch {
		if es, err := replication.DecodeBatch(b, nil); err == nil {
			for _, e := range es {
				if e.Op == replication.OpResyncLost {
					l.sent.Add(1)
				}
			}
		}
	}
	return l.r.Send(f)
}

func (l olderPeerLink) RecvMsg(m any) error {
	f := m.(*transport.Frame)
	if err := l.r.Recv(f); err != nil {
		return err
	}
	if b := f.Bytes(); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameHelloReply {
		f.SetBytes(bytes.Replace(b, []byte(`"lost":true`), []byte(`"lost":false`), 1))
	}
	return nil
}

func (l olderPeerLink) Context() context.Context { return l.r.Context() }

// TestAPeerThatDoesNotTakeLostRangesIsNotSentThem: a peer whose
// HelloReply does not say it takes OpResyncLost (the release before) is
// never sent one: the resync still holds the bad block back, alone, and
// the stream goes on working (a write of the block lets it through).
func TestAPeerThatDoesNotTakeLostRangesIsNotSentThem(t *testing.T) {
	const first, rot = 256, 270
	c := newTestCluster(t, 8<<20)
	sent := &atomic.Int64{}
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(olderPeerLink{r: s, sent: sent}, s.Close)
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	ctx := context.Background()
	writeApartThenRot(t, c, 79, first, 32, rot*4096+5, 2)
	waitForEvent(t, c.nodes["alpha"], "block-unrecoverable", nil)
	eventually(t, func() bool { return a.peers.byName["beta"].bm.Bytes() == 4096 }, "beta out of sync in the bad block only")
	if n := sent.Load(); n != 0 {
		t.Fatalf("alpha sent %d OpResyncLost entries to a peer that does not take them", n)
	}
	if _, _, n := c.integrityOf("beta"); n != 0 {
		t.Fatalf("beta counts %d blocks unrecoverable though it was told none", n)
	}
	if err := a.WriteAt(ctx, randomBytes(80, 4096), rot*4096, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
}

// writeApartThenRot writes n random blocks (from seed) at block first on
// alpha while alpha streams to nobody (its link down), flushes them, flips
// count bytes of alpha's disk at byte at, and brings the link back: the
// resync that follows meets a block rotten on its source. It returns
// what was written.
func writeApartThenRot(t *testing.T, c *testCluster, seed uint64, first int64, n int, at int64, count int) []byte {
	t.Helper()
	a, ctx := c.vol("alpha"), context.Background()
	a.setAdminDown(true)
	data := randomBytes(seed, n*4096)
	if err := a.WriteAt(ctx, data, first*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	flipFileBytes(t, c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path, at, count)
	a.setAdminDown(false)
	return data
}
