package node

import (
	"fmt"
	"sort"
	"strings"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// resyncRefusal says why a full resync of p cannot happen: a refusal that
// holds until an operator acts stands between this primary and p.
func (p *peer) resyncRefusal() error {
	v := p.v
	pv := p.snapshot()
	state, cause := pv.state, pv.why.cause
	split := v.state().st.Peers[p.name].SplitBrainRule != ""
	switch {
	case split:
		// Found from either side: p refused this node's stream, or this
		// node refused p's.
		cause = CauseSplitBrain
	case state != replication.StandAlone:
		return nil
	}
	switch cause {
	case CauseSplitBrain:
		return status.Errorf(codes.FailedPrecondition,
			"%v: %s and %s both changed %s since their last common generation, and %s refuses this primary's stream: a resync cannot reach it. "+
				"Give up %s's changes with replctl connect %s --discard-my-data --node %s --yes (only what either side changed is copied); nothing changed",
			ErrSplitBrain, v.self, p.name, v.name, p.name, p.name, v.name, p.name)
	case CauseUnrelated:
		return status.Errorf(codes.FailedPrecondition,
			"%s and %s share no generation of %s, and %s refuses this primary's stream: a resync cannot reach it. If %s's data should go, run replctl create-md %s --force --yes on %s (a full resync follows); nothing changed",
			v.self, p.name, v.name, p.name, p.name, v.name, p.name)
	}
	return nil
}

// resync acts on every peer of this primary, or on the one named only.
func (v *Volume) resync(pause, resume bool, only string) (*transport.ResyncReply, error) {
	if pause && resume {
		return nil, status.Error(codes.InvalidArgument, "--pause and --resume exclude each other")
	}
	v.mu.Lock()
	peers := make([]*peer, 0, len(v.peers.byName))
	names := make([]string, 0, len(v.peers.byName))
	for _, p := range v.peers.byName {
		names = append(names, p.name)
		if only == "" || p.name == only {
			peers = append(peers, p)
		}
	}
	v.mu.Unlock()
	sort.Strings(names)
	switch {
	case only == v.self:
		return nil, status.Errorf(codes.FailedPrecondition,
			"%s is the primary of %s: a resync copies the primary's data to its secondaries; to give %s a peer's data, first make another node primary (replctl primary %s --node NODE)",
			only, v.name, only, v.name)
	case only != "" && len(peers) == 0:
		return nil, status.Errorf(codes.NotFound, "%s holds no replica of %s; its secondaries are %s", only, v.name, strings.Join(names, ", "))
	}
	if !pause && !resume {
		// All or nothing: a peer the resync cannot reach refuses it whole.
		for _, p := range peers {
			if err := p.resyncRefusal(); err != nil {
				return nil, err
			}
		}
	}
	reply := &transport.ResyncReply{Primary: v.self}
	for _, p := range peers {
		reply.Peers = append(reply.Peers, p.name)
		switch {
		case pause:
			p.setPaused(true)
			reply.Action = "paused"
		case resume:
			p.setPaused(false)
			reply.Action = "resumed"
		default:
			if err := p.fullResync(); err != nil {
				return nil, grpcError(err)
			}
			reply.Action = "full resync started"
		}
	}
	sort.Strings(reply.Peers)
	v.log.Info("resync", "action", reply.Action, "peers", reply.Peers)
	v.node.event(v.name, "resync", fmt.Sprintf("%s: %s for %v", v.self, reply.Action, reply.Peers))
	return reply, nil
}
