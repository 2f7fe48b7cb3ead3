package control

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Adjust changes a volume's settings on every node holding it (on r.Node
// only, when set): the protocol and the congestion policy, online.
func (s *Server) Adjust(ctx context.Context, r *transport.AdjustRequest) (*transport.AdjustReply, error) {
	if r.Node == s.node.Name() {
		v, err := s.node.Volume(r.Volume)
		if err != nil {
			return nil, GRPCError(err)
		}
		one, err := v.Adjust(r.Protocol, r.OnCongestion, r.ResyncRate)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return &transport.AdjustReply{Nodes: []transport.AdjustedNode{one}}, nil
	}
	holders, err := s.volumeHeldBy(r.Volume, r.Node)
	if err != nil {
		return nil, err
	}
	reply := &transport.AdjustReply{}
	var nodes []string
	for _, name := range holders {
		if r.Node == "" || r.Node == name {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(nodes)
	var errs []string
	for _, name := range nodes {
		api, err := s.node.Peer(name)
		if err == nil {
			var one *transport.AdjustReply
			fwd := *r
			fwd.Node = name
			if one, err = api.Adjust(ctx, &fwd); err == nil {
				reply.Nodes = append(reply.Nodes, one.Nodes...)
				continue
			}
			if status.Code(err) == codes.InvalidArgument {
				return nil, err // the same on every node: nothing changed
			}
		}
		errs = append(errs, fmt.Sprintf("%s: %s", name, status.Convert(err).Message()))
	}
	if len(errs) > 0 {
		return reply, status.Errorf(codes.Unavailable, "adjusted %d of %d nodes; not: %s (run replctl adjust again once they are up)", len(reply.Nodes), len(nodes), strings.Join(errs, "; "))
	}
	return reply, nil
}

// SizeUnit is what a volume's size is a multiple of: the block of its
// on-disk metadata (metadata.MDBlockSize; node's tests check they agree).
const SizeUnit = 4096

// Resize grows a volume online: on r.Node alone when set (this node:
// here), otherwise on every node that holds it, after each said it can,
// the secondaries first and the primary last.
func (s *Server) Resize(ctx context.Context, r *transport.ResizeRequest) (*transport.ResizeReply, error) {
	if r.Size <= 0 || r.Size%SizeUnit != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "size %d: want a positive multiple of 4096 bytes", r.Size)
	}
	reply := &transport.ResizeReply{Volume: r.Volume, Size: r.Size}
	if r.Node == s.node.Name() {
		// A volume created a moment ago may still be opening here (a
		// resize right after the create).
		v, err := s.node.AwaitVolume(ctx, r.Volume)
		if err != nil {
			return nil, GRPCError(err)
		}
		one, err := v.Grow(ctx, r.Size, r.Check)
		if err != nil {
			return nil, GRPCError(err)
		}
		reply.Nodes = append(reply.Nodes, one)
		return reply, nil
	}
	holders, err := s.volumeHeldBy(r.Volume, r.Node)
	if err != nil {
		return nil, err
	}
	if r.Node != "" {
		there, _, err := forward(s, r.Node, func(api transport.ControlServer) (*transport.ResizeReply, error) {
			return api.Resize(ctx, r)
		})
		return there, err
	}
	order, err := s.resizeOrder(ctx, r.Volume, holders)
	if err != nil {
		return nil, err
	}
	// Every node says it can, or nothing changes anywhere. A check costs
	// no I/O: a size no disk holds is refused at once.
	var refusals []string
	limit, now := int64(-1), int64(0)
	for _, name := range order {
		one, err := s.resizeOn(ctx, name, r, true)
		if err == nil {
			now = max(now, one.OldSize)
		}
		switch {
		case err != nil:
			refusals = append(refusals, name+": "+status.Convert(err).Message())
			limit = 0
			continue
		case one.MaxSize <= 0:
			limit = 0
		case limit < 0:
			limit = one.MaxSize
		default:
			limit = min(limit, one.MaxSize)
		}
		if one.Action == transport.ResizeCannot {
			refusals = append(refusals, one.Text)
			continue
		}
		reply.Nodes = append(reply.Nodes, one)
	}
	if len(refusals) > 0 {
		return nil, status.Error(codes.FailedPrecondition, resizeRefusal(r, refusals, limit, now))
	}
	if r.Check {
		return reply, nil
	}
	reply.Nodes = nil
	for _, name := range order {
		one, err := s.resizeOn(ctx, name, r, false)
		if err != nil {
			var grew []string
			for _, d := range reply.Nodes {
				grew = append(grew, d.Node)
			}
			done := "no node grew"
			if len(grew) > 0 {
				done = strings.Join(grew, ", ") + " grew (and stays so: a volume only grows)"
			}
			return reply, status.Errorf(codes.FailedPrecondition, "%s; %s did not: %s; once that is fixed, run replctl resize %s %d again (the nodes grown say they are already)",
				done, name, status.Convert(err).Message(), r.Volume, r.Size)
		}
		reply.Nodes = append(reply.Nodes, one)
	}
	return reply, nil
}

// resizeRefusal says once that a resize to r.Size was refused and that
// nothing changed, each node's refusal on a line of its own (they name
// the disk and what to do), and, when every node said it (limit > 0), the
// largest size all of them hold the volume at now (the volume is now
// bytes).
func resizeRefusal(r *transport.ResizeRequest, refusals []string, limit, now int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s cannot grow to %s (%d bytes); nothing changed:", r.Volume, human.Bytes(r.Size), r.Size)
	for _, why := range refusals {
		b.WriteString("\n  " + why)
	}
	switch {
	case limit <= 0 || limit >= r.Size:
	case limit > now:
		fmt.Fprintf(&b, "\nevery node's disk holds %s at up to %s (%d bytes) now: grow the disks named first, or give a size of at most that",
			r.Volume, human.Bytes(limit), limit)
	default:
		fmt.Fprintf(&b, "\n%s is %s, the most every node's disk holds now: grow the disks named first", r.Volume, human.Bytes(now))
	}
	return b.String()
}

// resizeOn asks node name to grow its copy (or, with check, whether it can).
func (s *Server) resizeOn(ctx context.Context, name string, r *transport.ResizeRequest, check bool) (transport.ResizedNode, error) {
	api, err := s.node.Peer(name)
	if err != nil {
		return transport.ResizedNode{}, err
	}
	one, err := api.Resize(ctx, &transport.ResizeRequest{Volume: r.Volume, Size: r.Size, Node: name, Check: check})
	if err != nil {
		return transport.ResizedNode{}, err
	}
	if len(one.Nodes) != 1 {
		return transport.ResizedNode{}, fmt.Errorf("%s answered for %d nodes", name, len(one.Nodes))
	}
	return one.Nodes[0], nil
}

// resizeOrder lists the nodes that hold volume (holders), the primary
// last; it refuses while one of them cannot be reached.
func (s *Server) resizeOrder(ctx context.Context, volume string, holders []string) ([]string, error) {
	cs, err := s.node.ClusterStatus(ctx, 0)
	if err != nil {
		return nil, GRPCError(err)
	}
	vs, _ := cs.Volume(volume)
	var order, down []string
	for _, rs := range vs.Replicas {
		if !rs.Reachable {
			why := ""
			for _, ni := range cs.Nodes {
				if ni.Name == rs.Node && ni.Error != "" {
					why = " (" + ni.Error + ")"
				}
			}
			down = append(down, rs.Node+why)
			continue
		}
		if rs.Node != vs.Primary {
			order = append(order, rs.Node)
		}
	}
	if len(down) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "%s cannot be reached: a resize grows every node of %s, the secondaries first; start it and run the resize again, or grow the nodes that are up one at a time with --node (the primary last) and the others with --node once they are back (their peers refuse them until then); nothing changed",
			strings.Join(down, ", "), volume)
	}
	sort.Strings(order)
	if slices.Contains(holders, vs.Primary) {
		order = append(order, vs.Primary)
	}
	return order, nil
}
