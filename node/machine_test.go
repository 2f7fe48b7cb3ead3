package node

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// machinePeer is beta as alpha's state machine sees it.
func machinePeer(v *Volume, name string) volstate.Peer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.modelLocked().Peers[name]
}

// The state machine steps on the peers' real replication states: a peer
// streaming is Connected in it, and a peer whose stream the operator
// ended is not. (It saw every peer Connecting, so its rules that read a
// peer's state never fired in production, and node repeated them.)
func TestTheMachineSeesThePeersRealStates(t *testing.T) {
	c := newSyncedCluster(t, 4<<20)
	alpha := c.vol("alpha")
	eventually(t, func() bool { return machinePeer(alpha, "beta").Repl == replication.Connected }, "beta Connected in alpha's machine")
	if p := machinePeer(alpha, "beta"); p.Session != alpha.peers.byName["beta"].snapshot().sid {
		t.Fatalf("alpha's machine has beta in session %d, its stream is %d", p.Session, alpha.peers.byName["beta"].snapshot().sid)
	}
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool {
		r := machinePeer(alpha, "beta").Repl
		return r == replication.Connecting || r == replication.StandAlone
	}, "beta not streaming in alpha's machine")
}

// A discard of this node's data is refused by the machine's rule, in the
// words the operator knows, and changes nothing: outside a split brain,
// and on a primary that streams to a peer (the victim of a split brain is
// never a primary serving its peers).
func TestDiscardMyDataIsRefusedByTheRules(t *testing.T) {
	c := newSyncedCluster(t, 4<<20)
	ctx := context.Background()
	alpha := c.vol("alpha")
	_, err := c.nodes["alpha"].api.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha", DiscardMyData: true, Yes: true})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is not in a split brain with any peer") {
		t.Fatalf("discard outside a split brain: %v, want FailedPrecondition naming it", err)
	}
	// A split brain marked while beta takes alpha's stream (as with a
	// third node, or a mark the connection has not cleared yet): alpha
	// serves its peer, it is not the victim.
	eventually(t, func() bool { return alpha.peers.byName["beta"].session() != nil }, "alpha streams to beta")
	alpha.mu.Lock()
	alpha.noteSplitBrainLocked("beta", replication.RuleBitmapBoth)
	alpha.mu.Unlock()
	for _, yes := range []bool{false, true} {
		_, err = alpha.discardMyData(ctx, yes)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "streams to beta: it is not the victim of a split brain") {
			t.Fatalf("discard (yes=%v) on a primary streaming to beta: %v, want FailedPrecondition naming beta", yes, err)
		}
	}
	alpha.mu.Lock()
	role, serving, discard := alpha.roleLocked(), alpha.st.Serving, alpha.discard
	alpha.noteSplitBrainLocked("beta", "")
	alpha.mu.Unlock()
	if role != replication.Primary || serving != volstate.Open || discard != nil {
		t.Fatalf("after the refused discards alpha is %s serving %s discarding %v, want Primary, Open, no discard", role, serving, discard != nil)
	}
}

// publishedMismatch says how v's published state differs from v.st, or
// "" when it is v.st (and its why) exactly.
func publishedMismatch(v *Volume) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	got, want := v.state(), published{st: v.st.Clone(), why: reason{cause: Cause(v.st.Why), text: v.whyText}}
	if !reflect.DeepEqual(*got, want) {
		return fmt.Sprintf("%s published %+v, its state is %+v", v.self, *got, want)
	}
	return ""
}

// What a volume publishes of its state (Volume.state: status, metrics,
// the NBD export list read it without v.mu) is its state, after every kind
// of install: a step that writes nothing (the operator's disconnect and
// connect), a step whose state is durable (a write that misses a peer: a
// new generation), the commit of a size (a resize), and at open; and a
// state once published is never changed.
func TestThePublishedStateIsTheVolumesState(t *testing.T) {
	c := newTestCluster(t, resizeFrom)
	c.growDisk("alpha", deviceSizeFor(t, resizeTo, 1))
	c.growDisk("beta", deviceSizeFor(t, resizeTo, 1))
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	alpha, beta := c.vol("alpha"), c.vol("beta")
	check := func(after string) {
		t.Helper()
		for _, v := range []*Volume{alpha, beta} {
			if m := publishedMismatch(v); m != "" {
				t.Fatalf("after %s: %s", after, m)
			}
		}
	}
	check("the start")
	first := alpha.state()
	kept := published{st: first.st.Clone(), why: first.why}

	alpha.setAdminDown(true)
	if !alpha.state().st.AdminDown {
		t.Fatal("alpha's published state does not say the operator disconnected it")
	}
	check("a disconnect")
	gen := alpha.currentGeneration()
	if err := alpha.WriteAt(context.Background(), pattern(3, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	if alpha.currentGeneration() == gen || !alpha.tracking("beta") {
		t.Fatalf("a write that missed beta: published generation %s (was %s), tracking beta %v", alpha.currentGeneration(), gen, alpha.tracking("beta"))
	}
	check("a write that missed beta")
	alpha.setAdminDown(false)
	check("a connect")
	c.waitInSync()
	check("the resync")
	if _, err := c.resize("alpha", &transport.ResizeRequest{Size: resizeTo}); err != nil {
		t.Fatal(err)
	}
	check("a resize")
	if !reflect.DeepEqual(*first, kept) {
		t.Fatalf("a published state changed after it was published: %+v, was %+v", *first, kept)
	}
	// What an install changes in place (a peer's split brain) is not
	// seen through what was published before it.
	alpha.mu.Lock()
	alpha.noteSplitBrainLocked("beta", replication.RuleBitmapBoth)
	rule := alpha.state().st.Peers["beta"].SplitBrainRule
	alpha.noteSplitBrainLocked("beta", "")
	alpha.mu.Unlock()
	if rule != "" {
		t.Fatalf("alpha's published state shares its peers with v.st: it shows the split brain %q nobody published", rule)
	}
}
