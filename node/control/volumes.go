package control

import (
	"context"

	"slices"
	"strings"
	"sync"
	"time"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Volumes created at run time from storage pools (transport/volumes.go).
// The handlers check and complete the request here, then run it on the
// raft leader, which places and records it (the node's CreateVolume and
// DeleteVolume): a node that does not lead forwards the call there.

// defaultReplicas is the copies of a volume a create names none of.
const defaultReplicas = 2

// leaderChangeGrace is how long a call forwarded to a leader that lost
// its office may still take before it is made again on the next one.
const leaderChangeGrace = 5 * time.Second

// poolAskTimeout bounds the wait for one node's pools: a node down is
// reported so, and does not hold a create or a status back.
const poolAskTimeout = 3 * time.Second

// VolumeCreate creates a volume from a storage pool, on the leader.
func (s *Server) VolumeCreate(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	req, err := checkCreate(r)
	if err != nil {
		return nil, err
	}
	return onLeader(ctx, s, func(ctx context.Context) (*transport.VolumeCreateReply, error) {
		reply, err := s.node.CreateVolume(ctx, req)
		return reply, GRPCError(err)
	}, func(ctx context.Context, api transport.ControlServer) (*transport.VolumeCreateReply, error) {
		return api.VolumeCreate(ctx, req)
	})
}

// checkCreate refuses a request no node can take, and fills in the
// defaults: 2 replicas, pool default, protocol C, a request ID; a size
// rounded up to a whole 4 KiB block.
func checkCreate(r *transport.VolumeCreateRequest) (*transport.VolumeCreateRequest, error) {
	req := *r
	if err := checkVolumeName(req.Name); err != nil {
		return nil, err
	}
	if req.Size == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: no size: give its size in bytes (replctl volume create %s --size 10GiB)", req.Name, req.Name)
	}
	if req.Size > 1<<62 {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: size %d is too large", req.Name, req.Size)
	}
	req.Size = (req.Size + SizeUnit - 1) / SizeUnit * SizeUnit
	switch {
	case req.Replicas < 0:
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %d replicas: give 1 or more (0: %d)", req.Name, req.Replicas, defaultReplicas)
	case req.Replicas == 0:
		req.Replicas = defaultReplicas
	}
	if req.Pool == "" {
		req.Pool = "default"
	} else if err := checkWord("pool", req.Pool); err != nil {
		return nil, err
	}
	switch req.Protocol {
	case "":
		req.Protocol = "C"
	case "A", "B", "C":
	default:
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: protocol %q: want A, B or C", req.Name, req.Protocol)
	}
	switch {
	case req.RequestID == "":
		// A caller of an older version chose none: one chosen here still
		// carries the create through the leader changes onLeader rides.
		req.RequestID = transport.NewRequestID()
	case len(req.RequestID) > maxRequestID:
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: a request ID of %d characters: give at most %d (or none)", req.Name, len(req.RequestID), maxRequestID)
	default:
		if err := checkWord("request ID", req.RequestID); err != nil {
			return nil, err
		}
	}
	return &req, nil
}

// maxRequestID bounds a create's request ID, which raft records with the
// volume.
const maxRequestID = 64

// checkVolumeName is the config's rule for names: letters, digits, '-'
// and '_'.
func checkVolumeName(name string) error {
	if name == "" {
		return status.Error(codes.InvalidArgument, "no volume name given")
	}
	return checkWord("volume name", name)
}

func checkWord(what, s string) error {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return status.Errorf(codes.InvalidArgument, "%s %q: use letters, digits, '-' and '_' only", what, s)
		}
	}
	return nil
}

// VolumeDelete deletes a volume created at run time, on the leader.
func (s *Server) VolumeDelete(ctx context.Context, r *transport.VolumeDeleteRequest) (*transport.VolumeDeleteReply, error) {
	if err := checkVolumeName(r.Name); err != nil {
		return nil, err
	}
	return onLeader(ctx, s, func(ctx context.Context) (*transport.VolumeDeleteReply, error) {
		reply, err := s.node.DeleteVolume(ctx, r.Name)
		return reply, GRPCError(err)
	}, func(ctx context.Context, api transport.ControlServer) (*transport.VolumeDeleteReply, error) {
		return api.VolumeDelete(ctx, r)
	})
}

// VolumeList lists the volumes of the cluster file and of raft, as the
// leader knows them (this node's view when it runs no cluster).
func (s *Server) VolumeList(ctx context.Context, r *transport.VolumeListRequest) (*transport.VolumeListReply, error) {
	return onLeader(ctx, s, func(ctx context.Context) (*transport.VolumeListReply, error) {
		list, err := s.node.ListVolumes(ctx)
		if err != nil {
			return nil, err
		}
		return &transport.VolumeListReply{Volumes: list}, nil
	}, func(ctx context.Context, api transport.ControlServer) (*transport.VolumeListReply, error) {
		return api.VolumeList(ctx, r)
	})
}

// onLeader runs a call on the raft leader: here (without a cluster too),
// or forwarded there. Without a leader it waits for one. A forward that
// the old leader does not answer within leaderChangeGrace of a change of
// leader, or a leader that answers Aborted (it lost its office midway),
// is tried again on the next leader, until ctx ends: every call it
// carries may run twice (a create or a delete recorded already is
// answered as such).
func onLeader[Resp any](ctx context.Context, s *Server, here func(ctx context.Context) (*Resp, error),
	there func(ctx context.Context, api transport.ControlServer) (*Resp, error)) (*Resp, error) {
	for {
		changed := s.node.LeaderChanged()
		leader, clustered := s.node.Leader()
		var reply *Resp
		var err error
		switch {
		case !clustered:
			return here(ctx)
		case leader == "":
			select {
			case <-ctx.Done():
				return nil, status.Errorf(codes.Unavailable, "the cluster has no raft leader (no quorum): try again once a majority of the voters is up (%v)", ctx.Err())
			case <-changed:
				continue
			}
		case leader == s.node.Name():
			reply, err = here(ctx)
		default:
			fctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-changed:
				case <-fctx.Done():
					return
				}
				// An old leader that lives answers soon: Aborted, or the
				// call done (a leadership handed off mid-call). One that
				// died would hold the call until its deadline.
				grace := s.clock.NewTimer(leaderChangeGrace)
				defer grace.Stop()
				select {
				case <-grace.C():
					cancel()
				case <-fctx.Done():
				}
			}()
			reply, _, err = forward(s, leader, func(api transport.ControlServer) (*Resp, error) { return there(fctx, api) })
			cut := fctx.Err() != nil && ctx.Err() == nil
			cancel()
			if err != nil && cut {
				continue // the leader changed meanwhile: ask the next one
			}
		}
		if status.Code(err) != codes.Aborted {
			return reply, err
		}
		select {
		case <-ctx.Done():
			return reply, err
		case <-changed:
		}
	}
}

// Pools lists the storage pools of every data node (r.Node "": each
// node is asked; a node not reachable is listed with why), or of r.Node.
func (s *Server) Pools(ctx context.Context, r *transport.PoolsRequest) (*transport.PoolsReply, error) {
	if r.Node == s.node.Name() {
		return &transport.PoolsReply{Pools: s.node.Pools()}, nil
	}
	if r.Node != "" {
		reply, _, err := forward(s, r.Node, func(api transport.ControlServer) (*transport.PoolsReply, error) {
			return api.Pools(ctx, r)
		})
		return reply, err
	}
	return &transport.PoolsReply{Pools: AskPools(ctx, s.node, s.node.DataNodes())}, nil
}

// AskPools asks each of nodes for its pools, at once, and lists them by
// node and name; a node that does not answer within poolAskTimeout gets
// one entry, without a name, whose State says why.
func AskPools(ctx context.Context, node Node, nodes []string) []transport.PoolStatus {
	var wg sync.WaitGroup
	// Each node's answer has its own slot: no lock is shared.
	each := make([][]transport.PoolStatus, len(nodes))
	for i, name := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pools []transport.PoolStatus
			if name == node.Name() {
				pools = node.Pools()
			} else {
				actx, cancel := context.WithTimeout(ctx, poolAskTimeout)
				api, err := node.Peer(name)
				var reply *transport.PoolsReply
				if err == nil {
					reply, err = api.Pools(actx, &transport.PoolsRequest{Node: name})
				}
				cancel()
				if err != nil {
					pools = []transport.PoolStatus{{Node: name, State: "not reachable: " + status.Convert(err).Message()}}
				} else {
					pools = reply.Pools
				}
			}
			each[i] = pools
		}()
	}
	wg.Wait()
	var out []transport.PoolStatus
	for _, pools := range each {
		out = append(out, pools...)
	}
	slices.SortFunc(out, func(a, b transport.PoolStatus) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if out == nil {
		out = []transport.PoolStatus{}
	}
	return out
}

// Unreachable reports whether a pool entry stands for a node that did
// not answer (AskPools), and why.
func Unreachable(p transport.PoolStatus) (string, bool) {
	why, ok := strings.CutPrefix(p.State, "not reachable: ")
	return why, ok && p.Name == ""
}
