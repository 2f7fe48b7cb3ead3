package node

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
)

// TestAFlushOfANewPrimaryTracksAPeerItNeverStreamedTo: alpha, the
// primary, acknowledges writes that beta and alpha hold in their caches,
// and dies before a FLUSH. raft promotes beta; alpha, down, is still
// UpToDate in raft (a failover leaves the old primary so), and beta has
// had no stream to it. beta's first IO is a FLUSH, which declares alpha's
// writes durable: alpha may hold them in its cache only (a power loss
// would cost it them), so the FLUSH completes only once raft records
// alpha Outdated and beta tracks it, and a later failover cannot promote
// alpha without them. alpha then comes back and resyncs from beta.
func TestAFlushOfANewPrimaryTracksAPeerItNeverStreamedTo(t *testing.T) {
	const size = 8 << 20
	c := startRaftServing(t, size)
	ctx := context.Background()
	a := c.vol("alpha")
	writeRandomBlocks(t, a, 20, 5)
	c.crash("alpha")
	b := c.vol("beta")
	eventually(t, func() bool { st := b.status(); return st.Role == "Primary" && st.Serving }, "beta promoted and serving")
	authority := func() replication.VolumeAuthority {
		va, _ := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return va
	}
	// beta serves once its own state machine applied the promotion; the
	// witness's may apply it a moment later.
	if !within(5*time.Second, 10*time.Millisecond, func() bool { return authority().Primary == "beta" }) || !authority().IsUpToDate("alpha") {
		t.Fatalf("before beta's FLUSH raft has %+v, want beta primary and alpha UpToDate: the test shows nothing", authority())
	}
	if b.peers.byName["alpha"].session() != nil || b.peers.byName["alpha"].snapshot().ending != nil {
		t.Fatal("beta has had a stream to alpha: the test shows nothing")
	}

	if err := b.Flush(ctx); err != nil {
		t.Fatalf("beta's FLUSH with alpha down: %v", err)
	}
	// raft committed the record before the FLUSH completed; the witness's
	// state machine may apply it a moment later.
	if !within(5*time.Second, 10*time.Millisecond, func() bool { return authority().IsOutdated("alpha") }) {
		t.Fatalf("beta's FLUSH completed over writes alpha may hold in its cache only, and raft does not have alpha Outdated: %+v", authority())
	}
	if !b.tracking("alpha") {
		t.Fatal("beta's FLUSH completed over writes alpha may hold in its cache only, and beta does not track alpha")
	}

	c.start("alpha")
	c.waitInSync()
	c.requireIdentical()
	eventually(t, func() bool { return authority().IsUpToDate("alpha") }, "raft knows alpha UpToDate again")
}
