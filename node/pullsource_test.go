package node

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/transport"
)

// TestAWriteDuringAPullIsAcknowledgedOnlyOnceItsSourceTookIt: beta,
// forced to primary with alpha in sync, copies gamma's newer data (a
// pull: beta's disk holds no generation until it ends; gamma's reads are
// held, so the pull lasts as long as the test needs). gamma's link is cut
// and beta takes a write: alpha acknowledges it, gamma cannot. alpha's
// copy does not make the write safe: once gamma is back, the pull starts
// again from it and copies every block gamma's bitmap marks, this one
// too, over the write. So the write fails (writepath's PullNotTaken), and
// after the pull every node holds the same data, and every byte
// acknowledged. Without raft (these nodes have no raft address) nothing
// else guards it: under raft the write would wait until raft recorded
// gamma Outdated, and no primary pulls from a peer so recorded, which is
// why node/sim, always under raft, cannot tell this rule apart (make
// mutants judges pull-write-any-peer by this test).
func TestAWriteDuringAPullIsAcknowledgedOnlyOnceItsSourceTookIt(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestClusterOf(t, size, "gamma", "alpha", "beta")
	c.startInSync("alpha", "beta", "gamma")
	ctx := context.Background()

	// gamma writes while alpha and beta are away, and stops; beta is
	// forced, with alpha in sync.
	c.stop("alpha")
	c.stop("beta")
	writeRandomBlocks(t, c.vol("gamma"), 200, 17)
	c.stop("gamma")
	c.start("alpha")
	c.start("beta")
	if _, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	b := c.vol("beta")
	eventually(t, func() bool { return b.peers.byName["alpha"].inSync() }, "beta in sync with alpha")

	// gamma comes back behind a link the test cuts, its data held at its
	// disk (a gate starts shut): beta's pull from it runs until the test
	// lets it end.
	gammaReads := fault.NewGate()
	t.Cleanup(gammaReads.Open)
	var gammaConfig NodeConfig
	for _, nc := range c.cfg.Nodes {
		if nc.Name == "gamma" {
			gammaConfig = nc
		}
	}
	ln, err := net.Listen("tcp", gammaConfig.Replication)
	if err != nil {
		t.Fatal(err)
	}
	link := fault.NewLink()
	c.opts["gamma"] = Options{Replication: link.Listen(ln), OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(fault.On(fault.Read).Range(0, size).Hold(gammaReads)) })}
	c.start("gamma")
	bg := b.peers.byName["gamma"]
	eventually(t, func() bool { return bg.pulling.Load() }, "beta copying gamma's newer data")

	// gamma's link is cut; beta, still without a generation of its own,
	// takes a write alpha alone can acknowledge.
	link.Cut()
	eventually(t, func() bool { return !bg.connected() }, "beta sees gamma cut off")
	if !b.currentGeneration().IsZero() {
		t.Fatal("beta's pull ended before the write: the test shows nothing")
	}
	const off = 5 << 20
	written := bytes.Repeat([]byte{0xa5}, 4096)
	onDisk := func(name string) []byte {
		buf := make([]byte, len(written))
		if _, err := c.vol(name).disk.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	wrote := make(chan error, 1)
	go func() { wrote <- b.WriteAt(ctx, written, off, false) }()
	var werr error
	var returned bool
	over := func() bool {
		select {
		case werr = <-wrote:
			returned = true
		default:
		}
		return returned
	}
	// The write fails (gamma cannot take it), or waits for gamma.
	switch {
	case !within(10*time.Second, 10*time.Millisecond, over):
		t.Log("the write during the pull waits for gamma")
	case werr == nil:
		t.Errorf("beta acknowledged a write during its pull that gamma, the pull's source, did not take (alpha holds it: %v)", bytes.Equal(onDisk("alpha"), written))
	default:
		t.Logf("the write during the pull failed, as it must: %v", werr)
	}

	// gamma comes back: the pull starts again and ends; every byte
	// acknowledged is on every node.
	gammaReads.Open()
	link.Heal()
	eventually(t, over, "the write over")
	c.waitInSync()
	if !b.peers.byName["gamma"].inSync() || b.currentGeneration().IsZero() {
		t.Fatal("beta's pull from gamma did not end")
	}
	if werr == nil {
		for _, n := range []string{"alpha", "beta", "gamma"} {
			if !bytes.Equal(onDisk(n), written) {
				t.Errorf("%s does not hold the write beta acknowledged during its pull: the pull copied gamma's older block over it", n)
			}
		}
	}
	c.requireIdentical()
}
