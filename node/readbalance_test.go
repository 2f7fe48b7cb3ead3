package node

import (
	"bytes"
	"context"
	"testing"
)

// TestRoundRobinReadsUseBothReplicasButNeverAStaleBlock: with
// read_balancing round-robin, reads alternate between the local disk and
// beta and return the data written; a block marked out of sync for beta
// is always read locally.
func TestRoundRobinReadsUseBothReplicasButNeverAStaleBlock(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.cfg.Volumes[0].ReadBalancing = "round-robin"
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	ctx := context.Background()
	want := pattern(5, 64<<10)
	if err := a.WriteAt(ctx, want, 0, false); err != nil {
		t.Fatal(err)
	}
	p := a.peers.byName["beta"]
	sent := p.entriesSent.Load()
	got := make([]byte, len(want))
	for range 20 {
		if err := a.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read: %v, data equal %v", err, bytes.Equal(got, want))
		}
	}
	if remote := p.entriesSent.Load() - sent; remote < 8 || remote > 12 {
		t.Fatalf("%d of 20 round-robin reads went to beta, want about half", remote)
	}
	// beta misses block 3 (as a verify would find): it is read locally only.
	p.bm.SetBits(3*4096, 4096)
	sent = p.entriesSent.Load()
	for range 10 {
		if err := a.ReadAt(ctx, got[:4096], 3*4096); err != nil || !bytes.Equal(got[:4096], want[3*4096:4*4096]) {
			t.Fatalf("read of the block beta misses: %v", err)
		}
	}
	if remote := p.entriesSent.Load() - sent; remote != 0 {
		t.Fatalf("%d reads of a block out of sync on beta went to beta", remote)
	}
}
