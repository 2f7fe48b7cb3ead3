package node

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/replication"
)

// TestAFlushAfterThePeersLinkDiedTracksWhatThePeerHeldInItsCache: beta
// acknowledges alpha's writes from its page cache (a volatile cache: its
// fault disk loses what was not synced). Its replication link dies after
// it acknowledged them and before a FLUSH; the FLUSH completes on alpha
// without beta. It may do so only once beta cannot be taken for holding
// those writes: by then raft records beta Outdated (it is never promoted
// without them), alpha tracks it, and every block beta held only in its
// cache is marked in beta's bitmap. beta's disk then loses its cache; once
// the link is back, the marked blocks are resynced and the replicas are
// identical again.
func TestAFlushAfterThePeersLinkDiedTracksWhatThePeerHeldInItsCache(t *testing.T) {
	const size = 16 << 20
	c := newRaftCluster(t, size)
	link := fault.NewLink()
	for _, nc := range c.cfg.Nodes {
		if nc.Replication == "" {
			continue // the witness holds no data
		}
		ln, err := net.Listen("tcp", nc.Replication)
		if err != nil {
			t.Fatal(err)
		}
		o := c.opts[nc.Name]
		o.Replication = link.Listen(ln)
		c.opts[nc.Name] = o
	}
	var cache atomic.Pointer[fault.Disk]
	o := c.opts["beta"]
	o.OpenDisk = openFaulty(func(d *fault.Disk) {
		d.Add(fault.On(fault.Write, fault.Zero).Lose())
		cache.Store(d)
	})
	c.opts["beta"] = o
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(1, 4096), 0, false) == nil }, "alpha serves under its lease")
	authority := func() replication.VolumeAuthority {
		va, _ := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return va
	}
	eventually(t, func() bool { return authority().IsUpToDate("beta") }, "raft knows beta UpToDate")
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// beta acknowledges the writes from its cache.
	writeRandomBlocks(t, a, 40, 41)
	if cache.Load().Unsynced() == 0 {
		t.Fatal("beta holds no write only in its cache: the test shows nothing")
	}
	if a.tracking("beta") {
		t.Fatal("alpha tracks beta before its link died")
	}

	// The link dies before beta acknowledges a flush; the FLUSH completes
	// on alpha without it.
	link.Cut()
	if err := a.Flush(ctx); err != nil {
		t.Fatalf("a FLUSH with beta's link dead: %v", err)
	}
	if !a.tracking("beta") {
		t.Fatal("a FLUSH completed over writes beta held only in its cache, and alpha does not track beta")
	}
	// raft committed the record before the FLUSH completed; the witness's
	// state machine may apply it a moment later.
	if !within(5*time.Second, 10*time.Millisecond, func() bool { return authority().IsOutdated("beta") }) {
		t.Fatalf("a FLUSH completed over writes beta held only in its cache, and raft does not have beta Outdated: %+v", authority())
	}

	// beta's disk loses its cache; every block that then differs was
	// marked for beta when the FLUSH completed.
	marked := a.peers.byName["beta"].bm
	if lost, err := cache.Load().LoseUnsynced(nil); err != nil || lost == 0 {
		t.Fatalf("beta's disk lost %d sectors (%v): the test shows nothing", lost, err)
	}
	da, db := c.disk("alpha")[:size], c.disk("beta")[:size]
	differ := 0
	for b := int64(0); b < size/4096; b++ {
		if string(da[b*4096:(b+1)*4096]) == string(db[b*4096:(b+1)*4096]) {
			continue
		}
		differ++
		if !marked.Test(b) {
			t.Fatalf("block %d, which beta lost with its cache, is not marked for beta", b)
		}
	}
	if differ == 0 {
		t.Fatal("beta's disk lost nothing alpha holds: the test shows nothing")
	}

	link.Heal()
	c.waitInSync()
	c.requireIdentical()
	eventually(t, func() bool { return authority().IsUpToDate("beta") }, "raft knows beta UpToDate again")
}

// TestAPullsSourceHoldsWhatAnEarlierStreamLeftInItsCacheOnItsDisk: beta
// acknowledges alpha's writes from its page cache (its fault disk loses
// what was not synced), and alpha dies before a FLUSH. alpha comes back
// with an empty disk and copies the volume from beta (a pull: beta is its
// source). From the moment beta takes that stream the primary counts it
// in sync (raft records it UpToDate), so beta syncs its disk BEFORE it
// accepts the stream: while the pull runs, nothing beta acknowledged on
// the earlier stream is in its cache only. Until the simulation's seed
// 39814 found it, it stayed there until the pull's end.
func TestAPullsSourceHoldsWhatAnEarlierStreamLeftInItsCacheOnItsDisk(t *testing.T) {
	beside(t)
	const size = 4 << 20
	c := newTestCluster(t, size)
	var cache atomic.Pointer[fault.Disk]
	c.opts["beta"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) {
		d.Add(fault.On(fault.Write, fault.Zero).Lose())
		cache.Store(d)
	})}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeRandomBlocks(t, a, 40, 7)
	held := cache.Load().Unsynced()
	if held == 0 {
		t.Fatal("beta holds no write only in its cache: the test shows nothing")
	}

	c.crash("alpha")
	if _, err := CreateMetadata(c.cfg, "alpha", "vol0", "", true); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].ResyncRate = 1 << 20 // the pull takes seconds: it runs when looked at
	c.start("alpha")
	eventually(t, func() bool { return c.vol("alpha").peers.byName["beta"].pulling.Load() }, "alpha copying from beta")
	if n := cache.Load().Unsynced(); n != 0 {
		t.Fatalf("alpha pulls from beta, which holds %d sectors (of %d) it acknowledged on the earlier stream in its cache only", n, held)
	}
	c.waitInSync()
	c.requireIdentical()
}
