package node

import (
	"net"
	"testing"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/replication"
)

// partitionableCluster is alpha and beta with their replication
// listeners on one fault.Link: partitioning it cuts every replication
// connection between them, both ways, while control stays up.
func partitionableCluster(t *testing.T, size int64) (*testCluster, *fault.Link) {
	t.Helper()
	c := newTestCluster(t, size)
	link := fault.NewLink()
	for _, nc := range c.cfg.Nodes {
		ln, err := net.Listen("tcp", nc.Replication)
		if err != nil {
			t.Fatal(err)
		}
		c.opts[nc.Name] = Options{Replication: link.Listen(ln)}
	}
	return c, link
}

// TestAPartitionedSecondaryCatchesUpByBitmapAfterTheHeal: the link
// between the primary and its secondary is cut both ways. The primary
// gives up on beta, goes on writing and marks what beta misses; beta is
// no longer Connected. Once the link heals, beta receives the marked
// blocks, not a full resync, and the replicas are identical.
func TestAPartitionedSecondaryCatchesUpByBitmapAfterTheHeal(t *testing.T) {
	beside(t)
	const size = 16 << 20
	c, link := partitionableCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	moved := replica(c.status(), "beta").ResyncedBytes

	link.Partition()
	blocks := writeRandomBlocks(t, a, 40, 29)
	eventually(t, func() bool { return a.tracking("beta") }, "alpha tracks what beta misses")
	ps := a.peers.byName["beta"].status()
	if ps.Replication == string(replication.Connected) || ps.OutOfSyncBytes == 0 {
		t.Fatalf("alpha's peer beta across a partition: %s with %d bytes out of sync; want it not Connected with the writes it missed", ps.Replication, ps.OutOfSyncBytes)
	}
	t.Logf("across the partition alpha sees beta %s: %s", ps.Replication, ps.Reason)

	link.Heal()
	c.waitInSync()
	got := replica(c.status(), "beta").ResyncedBytes - moved
	if got == 0 || got > int64(blocks)*4096 {
		t.Fatalf("after the partition beta received %d bytes, want the %d blocks it missed at most (%d bytes), not a full resync", got, blocks, blocks*4096)
	}
	c.requireIdentical()
}

// TestADroppedReplicationLinkReconnects: every replication connection
// between alpha and beta is reset while alpha writes. The writes go on,
// the nodes connect again by themselves, and the replicas end identical.
func TestADroppedReplicationLinkReconnects(t *testing.T) {
	c, link := partitionableCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 20, 31)
	if n := link.Drop(); n == 0 {
		t.Fatal("no replication connection to drop: the test shows nothing")
	}
	writeRandomBlocks(t, a, 20, 37)
	c.waitInSync()
	if link.Open() == 0 {
		t.Fatal("in sync again, but over no connection of the link")
	}
	c.requireIdentical()
}
