package node

import (
	"bytes"
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// TestAFailoverReconcilesAWriteThatReachedOneSecondary: three data nodes
// under raft. alpha, the primary, writes a block that reaches gamma and
// not beta (beta's link holds it), and crashes before it acknowledges the
// write or gives up on beta: raft still has both UpToDate, and nothing on
// beta or gamma marks the block. Whichever of them raft promotes, the two
// must not count each other in sync while the block differs: the
// activity logs are marked across the change of primary (volstate's
// MarkActivityLog) and the block is resynced from the new primary. This
// was the sim's finding unacked-write-divergence.
func TestAFailoverReconcilesAWriteThatReachedOneSecondary(t *testing.T) {
	const size = 8 << 20
	c, link := startThreeUnderRaft(t, size)
	a := c.vol("alpha")

	const off = 3 << 20
	written := pattern(9, 4096)
	onDisk := writeOnlyGammaGets(t, c, link, a, written, off)
	if !within(30*time.Second, 20*time.Millisecond, func() bool {
		st := c.status()
		if len(st.Volumes) == 0 || st.Volumes[0].Primary == "alpha" || st.Volumes[0].Primary == "" {
			return false
		}
		other := map[string]string{"beta": "gamma", "gamma": "beta"}[st.Volumes[0].Primary]
		r := replica(st, other)
		return r.Disk == "UpToDate" && r.Replication == "Connected" && r.OutOfSyncBytes == 0
	}) {
		t.Fatalf("no new primary with the other secondary in sync: %+v", c.status().Volumes[0])
	}
	st := c.status()
	t.Logf("raft promoted %s", st.Volumes[0].Primary)
	if b, g := onDisk("beta"), onDisk("gamma"); !bytes.Equal(b, g) {
		t.Fatalf("beta and gamma count each other in sync, but the block at %d differs (beta holds the write: %v, gamma: %v)",
			off, bytes.Equal(b, written), bytes.Equal(g, written))
	}
	// The whole volume, not only that block.
	for _, name := range []string{"beta", "gamma"} {
		if err := c.vol(name).disk.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	x, y := c.disk("beta"), c.disk("gamma")
	if !bytes.Equal(x[:size], y[:size]) {
		t.Fatal("beta's and gamma's copies differ")
	}
}

// startThreeUnderRaft starts vol0 on alpha (primary), beta and gamma, the
// three of them raft voters with tight timings, beta's replication
// listener behind the returned link; it returns once alpha serves under
// its lease and raft knows beta and gamma UpToDate.
func startThreeUnderRaft(t *testing.T, size int64) (*testCluster, *fault.Link) {
	t.Helper()
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	for i := range c.cfg.Nodes {
		c.cfg.Nodes[i].Raft, c.cfg.Nodes[i].Gossip = freeAddr(t), freeAddr(t)
	}
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	link := fault.NewLink()
	timing := cluster.Timing{HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaseDuration: 900 * time.Millisecond}
	for _, nc := range c.cfg.Nodes {
		o := c.opts[nc.Name]
		o.ClusterTiming = timing
		if nc.Name == "beta" {
			ln, err := net.Listen("tcp", nc.Replication)
			if err != nil {
				t.Fatal(err)
			}
			o.Replication = link.Listen(ln)
		}
		c.opts[nc.Name] = o
	}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(context.Background(), pattern(1, 64<<10), 0, false) == nil }, "alpha serves under its lease")
	eventually(t, func() bool {
		va, ok := c.nodes["alpha"].cl.c.Authority().Volume("vol0")
		return ok && va.IsUpToDate("beta") && va.IsUpToDate("gamma")
	}, "raft knows beta and gamma UpToDate")
	return c, link
}

// TestASwitchoverReconcilesNothing: a planned switchover hands over with
// no write in flight, so it marks no activity log: after it, with writes
// all over the volume before, nobody is resynced and every node stays
// UpToDate (a reconciliation would make the secondaries Inconsistent for
// as long as it copies their logs' extents).
func TestASwitchoverReconcilesNothing(t *testing.T) {
	const size = 16 << 20
	c, _ := startThreeUnderRaft(t, size)
	ctx := context.Background()
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 64, 47) // every extent of the log is hot
	c.waitInSync()
	before := map[string]int64{}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		before[n] = c.vol(n).counters.resynced.Load()
	}
	if _, err := c.nodes["gamma"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("switchover to beta: %v", err)
	}
	// Both peers stream from beta before it writes: a write that beta
	// served while one of them was still connecting would reach it by
	// resync, rightly (under load a loaded CI machine once saw gamma take
	// those 4096 bytes so). A reconciliation would already show here:
	// what it marks keeps the replicas out of sync until it is resynced.
	b := c.vol("beta")
	eventually(t, func() bool { return b.peers.byName["alpha"].connected() && b.peers.byName["gamma"].connected() }, "beta streams to alpha and gamma")
	c.waitInSync()
	if err := b.WriteAt(ctx, pattern(5, 4096), 0, false); err != nil {
		t.Fatalf("beta serves after the switchover: %v", err)
	}
	c.waitInSync()
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if moved := c.vol(n).counters.resynced.Load() - before[n]; moved != 0 {
			t.Errorf("%s received %d bytes by resync after a switchover, want none", n, moved)
		}
	}
	c.requireIdentical()
}

// TestWhatAResyncTargetGotIsMarkedAtAChangeOfPrimary: three data nodes;
// beta misses a write of alpha's (the operator disconnected it) and gets
// it by resync, gamma by the stream. Were alpha then lost, the
// reconciliation of the change of primary marks beta's activity log
// toward the third node (volstate.MarkActivityLog): the block beta got
// by resync must be among what it marks, for a block a primary back from
// a crash resyncs to one peer (its own unacknowledged write) may be on
// no other (the sim's finding resync-not-in-activity-log, seed 264).
func TestWhatAResyncTargetGotIsMarkedAtAChangeOfPrimary(t *testing.T) {
	const size = 16 << 20
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	ctx := context.Background()
	a, b := c.vol("alpha"), c.vol("beta")
	const off = 12 << 20 // an extent no write touched yet
	extent := uint64(off / metadata.ExtentSize)
	if slices.Contains(b.durable.md.ActivityLog().ActiveExtents(), extent) {
		t.Fatalf("beta's activity log holds extent %d before the test wrote it: the test shows nothing", extent)
	}
	towardGamma, ok := b.durable.md.Bitmap(b.node.config().NodeID("gamma"))
	if !ok {
		t.Fatal("beta keeps no bitmap for gamma")
	}

	b.setAdminDown(true)
	eventually(t, func() bool { return a.peers.byName["beta"].status().Replication == "Connecting" }, "alpha sees beta refusing the stream")
	written := pattern(7, 4096)
	if err := a.WriteAt(ctx, written, off, false); err != nil {
		t.Fatal(err)
	}
	before := b.counters.resynced.Load()
	b.setAdminDown(false)
	c.waitInSync()
	if got := b.counters.resynced.Load() - before; got != 4096 {
		t.Fatalf("beta got %d bytes by resync, want the 4096 of the write", got)
	}
	c.requireIdentical()

	if !slices.Contains(b.durable.md.ActivityLog().ActiveExtents(), extent) {
		t.Errorf("beta's activity log %v lacks extent %d, which it got by resync", b.durable.md.ActivityLog().ActiveExtents(), extent)
	}
	b.stateMu.Lock()
	err := b.markActivityLog("gamma")
	b.stateMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !towardGamma.Test(off / replication.BlockSize) {
		t.Errorf("the reconciliation toward gamma does not mark the block at %d beta got by resync", off)
	}
}

// TestAForcedPromotionReconcilesAWriteThatReachedOneSecondary: three data
// nodes, no raft. alpha, the primary, writes a block that reaches gamma
// and not beta, and crashes before it acknowledges it or gives up on
// beta. The operator forces gamma (replctl primary --force): like a
// failover, gamma marks its activity log toward beta BEFORE its promotion
// is durable, so that beta, which never got the block, is resynced with
// it and the two do not count each other in sync while it differs. The
// forced path marked nothing until the simulation showed it (seed 3519,
// once its activity log held fewer blocks than the volume).
func TestAForcedPromotionReconcilesAWriteThatReachedOneSecondary(t *testing.T) {
	const size = 8 << 20
	c := newTestClusterOf(t, size, "alpha", "beta", "gamma")
	link := fault.NewLink()
	for _, nc := range c.cfg.Nodes {
		if nc.Name != "beta" {
			continue
		}
		ln, err := net.Listen("tcp", nc.Replication)
		if err != nil {
			t.Fatal(err)
		}
		o := c.opts[nc.Name]
		o.Replication = link.Listen(ln)
		c.opts[nc.Name] = o
	}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		c.start(n)
	}
	c.waitInSync()
	ctx := context.Background()
	const off = 5 << 20
	written := pattern(11, 4096)
	onDisk := writeOnlyGammaGets(t, c, link, c.vol("alpha"), written, off)
	if _, err := c.nodes["gamma"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "gamma", Force: true, Yes: true}); err != nil {
		t.Fatalf("force gamma: %v", err)
	}
	if !within(30*time.Second, 20*time.Millisecond, func() bool {
		r := replica(c.status(), "beta")
		return r.Disk == "UpToDate" && r.Replication == "Connected" && r.OutOfSyncBytes == 0
	}) {
		t.Fatalf("beta not in sync with the forced gamma: %+v", c.status().Volumes[0])
	}
	if b, g := onDisk("beta"), onDisk("gamma"); !bytes.Equal(b, g) {
		t.Fatalf("beta and gamma count each other in sync, but the block at %d differs (beta holds the write: %v, gamma: %v)",
			off, bytes.Equal(b, written), bytes.Equal(g, written))
	}
}

// writeOnlyGammaGets has alpha (a) write written at off while beta's link
// holds every frame, waits until gamma holds it, then crashes alpha and
// drops what the link held: the write, never acknowledged, is on gamma and
// not on beta. It returns a reader of each node's copy at off.
func writeOnlyGammaGets(t *testing.T, c *testCluster, link *fault.Link, a *Volume, written []byte, off int64) func(name string) []byte {
	t.Helper()
	link.Partition()
	go a.WriteAt(context.Background(), written, off, false) // never acknowledged: alpha crashes
	onDisk := func(name string) []byte {
		b := make([]byte, len(written))
		if _, err := c.vol(name).disk.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		return b
	}
	eventually(t, func() bool { return bytes.Equal(onDisk("gamma"), written) }, "the write reached gamma")
	c.crash("alpha")
	link.Drop() // what the link held for beta goes with alpha
	link.Heal()
	if bytes.Equal(onDisk("beta"), written) {
		t.Fatal("the write reached beta too: the test shows nothing")
	}
	return onDisk
}
