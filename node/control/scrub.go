package control

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Scrub starts, pauses, resumes or stops a volume's scrub on every node
// that holds a disk of it (on r.Node alone, when set), as Adjust fans
// out. A request the first node refuses as bad input (a bad rate, no
// scrub to pause) is answered at once: it is the same on every node.
func (s *Server) Scrub(ctx context.Context, r *transport.ScrubRequest) (*transport.ScrubReply, error) {
	switch n := btoi(r.Pause) + btoi(r.Resume) + btoi(r.Stop) + btoi(r.Query); {
	case n > 1:
		return nil, status.Error(codes.InvalidArgument, "give one of --pause, --resume and --stop (or a query alone)")
	case r.Rate < 0:
		return nil, status.Errorf(codes.InvalidArgument, "scrub rate %d: give a rate above 0 (e.g. 50MiB), or none for the default", r.Rate)
	case n == 1 && r.Rate != 0:
		return nil, status.Error(codes.InvalidArgument, "--rate goes with the start of a scrub, not with --pause, --resume or --stop")
	}
	if r.Node == s.node.Name() {
		v, err := s.node.Volume(r.Volume)
		if err != nil {
			return nil, GRPCError(err)
		}
		one, err := v.Scrub(r.Rate, r.Pause, r.Resume, r.Stop, r.Query)
		if err != nil {
			return nil, GRPCError(err)
		}
		return &transport.ScrubReply{Nodes: []transport.ScrubbedNode{{Node: s.node.Name(), Scrub: one}}}, nil
	}
	holders, err := s.volumeHeldBy(r.Volume, r.Node)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, name := range holders {
		if r.Node == "" || r.Node == name {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(nodes)
	reply := &transport.ScrubReply{}
	var refused, errs []string
	took := 0
	for _, name := range nodes {
		api, err := s.node.Peer(name)
		if err == nil {
			fwd := *r
			fwd.Node = name
			var one *transport.ScrubReply
			if one, err = api.Scrub(ctx, &fwd); err == nil {
				reply.Nodes = append(reply.Nodes, one.Nodes...)
				took++
				continue
			}
			switch status.Code(err) {
			case codes.InvalidArgument:
				return nil, err // the same on every node
			case codes.FailedPrecondition, codes.NotFound:
				// This node's scrub is not in a state for the command
				// (nothing to pause, one running already): it says why.
				msg := status.Convert(err).Message()
				reply.Nodes = append(reply.Nodes, transport.ScrubbedNode{Node: name, Refused: msg})
				refused = append(refused, msg)
				continue
			}
		}
		errs = append(errs, fmt.Sprintf("%s: %s", name, status.Convert(err).Message()))
	}
	switch {
	case took == 0 && len(errs) == 0:
		return nil, status.Error(codes.FailedPrecondition, strings.Join(refused, "; "))
	case len(errs) > 0:
		return reply, status.Errorf(codes.Unavailable, "%d of %d nodes took the scrub command; not reached: %s (run replctl scrub again with --node once they are up)", took, len(nodes), strings.Join(errs, "; "))
	}
	return reply, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ReadBlocks reads a range of a volume on this node, its primary, as a
// client's read is: a secondary's scrub repairs a bad block with it. It
// is not forwarded: the secondary asks the primary its stream comes from.
func (s *Server) ReadBlocks(ctx context.Context, r *transport.ReadBlocksRequest) (*transport.ReadBlocksReply, error) {
	if r.Length <= 0 || r.Length > transport.MaxReadBlocks || r.Offset < 0 || r.Offset%SizeUnit != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "read %d bytes at %d: give whole 4 KiB blocks, at most %d bytes", r.Length, r.Offset, transport.MaxReadBlocks)
	}
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	data, err := v.ReadBlocks(ctx, r.Offset, r.Length)
	if err != nil {
		return nil, GRPCError(err)
	}
	return &transport.ReadBlocksReply{Data: data}, nil
}
