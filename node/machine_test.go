package node

import (
	"context"
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
	if p := machinePeer(alpha, "beta"); p.Session != alpha.peers["beta"].snapshot().sid {
		t.Fatalf("alpha's machine has beta in session %d, its stream is %d", p.Session, alpha.peers["beta"].snapshot().sid)
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
	eventually(t, func() bool { return alpha.peers["beta"].session() != nil }, "alpha streams to beta")
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
