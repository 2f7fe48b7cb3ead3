package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newGatedCluster is alpha and beta in sync, beta's disk writing behind a
// gate (open until the test shuts it: a slow or stuck disk).
func newGatedCluster(t *testing.T) (*testCluster, *fault.Gate) {
	t.Helper()
	c := newTestCluster(t, 8<<20)
	g := fault.NewGate()
	g.Open()
	c.opts["beta"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(fault.On(fault.Write).Hold(g)) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	t.Cleanup(g.Open)
	return c, g
}

// writeWithin reports whether a 4 KiB write at off completed within d.
func writeWithin(t *testing.T, v *Volume, off int64, d time.Duration) (done chan error, within bool) {
	t.Helper()
	done = make(chan error, 1)
	go func() { done <- v.WriteAt(context.Background(), pattern(byte(off>>12), 4096), off, false) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		return nil, true
	case <-time.After(d):
		return done, false
	}
}

// TestEachProtocolCompletesAWriteWhenItPromises: beta's disk is stuck.
// Under C a write waits for beta's disk; under B it completes once beta
// received it; under A once it is written locally and queued, and the
// lag says what beta does not hold yet. When the disk moves again the
// lag drains and the replicas end identical.
func TestEachProtocolCompletesAWriteWhenItPromises(t *testing.T) {
	c, gate := newGatedCluster(t)
	a := c.vol("alpha")
	gate.Shut()
	pendingC, ok := writeWithin(t, a, 0, 500*time.Millisecond)
	if ok {
		t.Fatal("protocol C: a write completed while the peer's disk had not written it")
	}
	if _, err := a.adjust("B", "", nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := writeWithin(t, a, 4096, 2*time.Second); !ok {
		t.Fatal("protocol B: a write the peer received did not complete")
	}
	if _, err := a.adjust("A", "", nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := writeWithin(t, a, 8192, 2*time.Second); !ok {
		t.Fatal("protocol A: a write written locally did not complete")
	}
	if lag := a.peers.byName["beta"].status().LagBytes; lag < 8192 {
		t.Fatalf("lag %d bytes with two acknowledged writes beta does not hold, want at least 8192", lag)
	}
	gate.Open()
	if err := <-pendingC; err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return a.peers.byName["beta"].status().LagBytes == 0 }, "the lag drained")
	c.waitInSync()
	c.requireIdentical()
}

// TestAdjustChangesTheProtocolWhileWriting: the protocol changes back and
// forth on every node, through the control API, while writes go on: no
// write fails and no resync follows.
func TestAdjustChangesTheProtocolWhileWriting(t *testing.T) {
	c := newSyncedCluster(t, 16<<20)
	api := c.nodes["beta"].api
	ctx := context.Background()
	stop := make(chan struct{})
	errs := make(chan error, 1)
	var wrote atomic.Int64
	go func() {
		defer close(errs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.vol("alpha").WriteAt(ctx, pattern(byte(i), 8192), int64(i%1000)*8192, false); err != nil {
				errs <- err
				return
			}
			wrote.Add(1)
		}
	}()
	resynced := replica(c.status(), "beta").ResyncedBytes
	for _, p := range []string{"A", "B", "C", "A", "C"} {
		r, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Protocol: p})
		if err != nil || len(r.Nodes) != 2 {
			t.Fatalf("adjust to %s: %+v, %v", p, r, err)
		}
		from := wrote.Load()
		eventually(t, func() bool { return wrote.Load() >= from+64 || len(errs) > 0 }, "writes run under protocol "+p)
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("a write failed while the protocol changed: %v", err)
	}
	if _, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Protocol: "B", OnCongestion: "pull-ahead"}); err == nil {
		t.Fatal("pull-ahead under protocol B was accepted")
	}
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - resynced; moved != 0 {
		t.Fatalf("changing the protocol resynced %d bytes", moved)
	}
	if p := c.status().Volumes[0].Protocol; p != "C" {
		t.Fatalf("status shows protocol %q, want C", p)
	}
	c.requireIdentical()
}

// TestResyncPacerStartsAgainWhenTheRateChanges: the pace follows the
// rate in force; a new rate counts from the moment it is seen, so a cap
// set late does not stall to make up for bytes sent uncapped.
func TestResyncPacerStartsAgainWhenTheRateChanges(t *testing.T) {
	var pc resyncPacer
	t0 := time.Unix(1000, 0)
	if due := pc.due(0, 0, t0); !due.IsZero() {
		t.Fatalf("no cap: due %v, want now", due)
	}
	if due := pc.due(0, 500<<20, t0.Add(time.Second)); !due.IsZero() {
		t.Fatalf("no cap after 500 MiB: due %v, want now", due)
	}
	// A cap of 10 MiB/s set now: the 500 MiB already out are not paid for.
	capAt := t0.Add(2 * time.Second)
	if due := pc.due(10<<20, 500<<20, capAt); !due.Equal(capAt) {
		t.Fatalf("cap set: due %v, want %v", due, capAt)
	}
	if due := pc.due(10<<20, 520<<20, capAt.Add(time.Second)); !due.Equal(capAt.Add(2 * time.Second)) {
		t.Fatalf("20 MiB at 10 MiB/s: due %v, want %v", due, capAt.Add(2*time.Second))
	}
	// Raised to 40 MiB/s: the next 40 MiB take a second from the change.
	raiseAt := capAt.Add(1500 * time.Millisecond)
	pc.due(40<<20, 520<<20, raiseAt)
	if due := pc.due(40<<20, 560<<20, raiseAt.Add(100*time.Millisecond)); !due.Equal(raiseAt.Add(time.Second)) {
		t.Fatalf("40 MiB at 40 MiB/s: due %v, want %v", due, raiseAt.Add(time.Second))
	}
}

// TestAdjustResyncRateOnline: replctl adjust --resync-rate caps a resync
// and lifts the cap while it runs; status shows the cap in force.
func TestAdjustResyncRateOnline(t *testing.T) {
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	// Data everywhere: zero ranges would go out uncapped (they cost no
	// bandwidth).
	for off := int64(0); off < 16<<20; off += 1 << 20 {
		if err := c.vol("alpha").WriteAt(ctx, pattern(byte(off>>20)+1, 1<<20), off, false); err != nil {
			t.Fatal(err)
		}
	}
	api := c.nodes["beta"].api
	adjust := func(rate int64) {
		t.Helper()
		r, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", ResyncRate: &rate})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range r.Nodes {
			if n.ResyncRate != rate {
				t.Fatalf("adjust --resync-rate %d: %s says %d", rate, n.Node, n.ResyncRate)
			}
		}
	}
	negative := int64(-1)
	if _, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", ResyncRate: &negative}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a negative rate: %v, want InvalidArgument", err)
	}
	const rate = 512 << 10 // 16 MiB at 512 KiB/s: 32 s
	adjust(rate)
	if st, err := api.ClusterStatus(ctx, &transport.StatusRequest{}); err != nil || st.Volumes[0].ResyncRate != rate {
		t.Fatalf("status after the adjust: %v, %v", st, err)
	}
	// The cap bounds the resync from above and the resync moves under it:
	// the pacer lets a run of resyncRunBlocks go at once, then one run per
	// run's worth of the rate. Every sample until 2 MiB more than that
	// first run moved (4 s at the rate) is at most two runs more than the
	// rate allows since before the resync began; and the 2 MiB move
	// within 10 × the 4 s the rate gives them: a stalled or crawling
	// resync fails here, an uncapped one above.
	const (
		run    = resyncRunBlocks * replication.BlockSize
		target = run + 2<<20
		slack  = 2 * run
		factor = 10
	)
	expect := time.Duration(float64(target-run) / rate * float64(time.Second))
	before := c.vol("beta").counters.resynced.Load()
	began := time.Now()
	if _, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	var moved int64
	if !within(factor*expect, 10*time.Millisecond, func() bool {
		moved = c.vol("beta").counters.resynced.Load() - before
		if most := slack + int64(time.Since(began).Seconds()*rate); moved > most {
			t.Fatalf("%d bytes resynced %s after the resync began under a %d B/s cap: want at most %d",
				moved, time.Since(began).Round(time.Millisecond), rate, most)
		}
		return moved >= target
	}) {
		t.Fatalf("the resync under a %d B/s cap moved %d bytes in %s: want %d within %s (%d × what the cap allows)",
			rate, moved, factor*expect, target, factor*expect, factor)
	}
	t.Logf("the capped resync moved %d bytes in %s (the cap allows it in %s after the first run)", moved, time.Since(began).Round(time.Millisecond), expect)
	adjust(0)
	eventually(t, func() bool { return c.vol("beta").counters.resynced.Load()-before == 16<<20 }, "the uncapped resync finished")
	c.waitInSync()
}

// TestCongestionPolicyFollowsTheProtocolUnlessNamed pins which congestion
// policy is in force after replctl adjust: one the file or an adjust named
// holds while it fits the protocol; otherwise the policy is the protocol's
// default (pull-ahead under A, block under B and C), so `adjust --protocol
// A` alone gives pull-ahead.
func TestCongestionPolicyFollowsTheProtocolUnlessNamed(t *testing.T) {
	const (
		block     = replication.CongestionBlock
		pullAhead = replication.CongestionPullAhead
		disc      = replication.CongestionDisconnect
	)
	for _, tc := range []struct {
		name       string
		protocol   byte
		current    replication.OnCongestion
		named      bool
		requested  string
		want       replication.OnCongestion
		wantNamed  bool
		wantRefuse bool
	}{
		{"C to A, policy never named: A's default", 'A', block, false, "", pullAhead, false, false},
		{"A to C, policy never named: C's default", 'C', pullAhead, false, "", block, false, false},
		{"C to A with block named in the file: it holds", 'A', block, true, "", block, true, false},
		{"C to A with disconnect named: it holds", 'A', disc, true, "", disc, true, false},
		{"A to C with pull-ahead named: it no longer fits, C's default", 'C', pullAhead, true, "", block, false, false},
		{"pull-ahead asked for under A", 'A', block, false, "pull-ahead", pullAhead, true, false},
		{"pull-ahead asked for under C is refused", 'C', block, false, "pull-ahead", "", false, true},
		{"back to the protocol's default", 'A', block, true, "default", pullAhead, false, false},
		{"an unknown policy is refused", 'A', block, false, "drop", "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, named, err := congestionPolicy(tc.protocol, tc.current, tc.named, tc.requested)
			if tc.wantRefuse {
				if err == nil {
					t.Fatalf("got %s, want it refused", got)
				}
				return
			}
			if err != nil || got != tc.want || named != tc.wantNamed {
				t.Fatalf("got %s (named %v, %v), want %s (named %v)", got, named, err, tc.want, tc.wantNamed)
			}
		})
	}
}
