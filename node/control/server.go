package control

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Node is what the control API asks of the node it runs on: package node
// implements it. Its methods are called concurrently, from the goroutine
// gRPC serves each call on, and may block as long as the node's work
// takes (a status asks every node, a demotion drains the IO, a
// switchover waits for the new primary to serve). Errors are the node's:
// the handlers give them a status code (GRPCError) unless they carry
// one.
type Node interface {
	// Name is the node's name in the cluster's config.
	Name() string
	// Peer is the control API of node name: this node's own Server, or a
	// client of another node's.
	Peer(name string) (transport.ControlServer, error)
	// Volume is the named volume this node holds; an error wrapping
	// ErrNotFound when it holds none.
	Volume(name string) (Volume, error)
	// AwaitVolume is Volume, but a volume the cluster recorded as created
	// on this node, whose open here is under way, is waited for (a
	// while, or until ctx ends).
	AwaitVolume(ctx context.Context, name string) (Volume, error)
	// Disks are the nodes that hold a disk of volume in the cluster's
	// config; found is false when the config names no such volume.
	Disks(volume string) (nodes []string, found bool)
	// NBDURI is this node's export of volume.
	NBDURI(volume string) string
	// NodeStatus is this node's view, with its last events events.
	NodeStatus(events int) *transport.NodeStatus
	// ClusterStatus asks every node for its view and puts the views
	// together.
	ClusterStatus(ctx context.Context, events int) (*transport.ClusterStatus, error)
	// Subscribe returns the node's events from now on; cancel ends them.
	Subscribe() (events <-chan transport.Event, cancel func())
	// History is the node's last max events, oldest first.
	History(max int) ([]transport.Event, error)
	// StateEvents say the state of each volume and link at now.
	StateEvents(now time.Time) []transport.Event
	// Switchover moves r.Volume's primary role to r.Node (or, with
	// r.Force, promotes r.Node without a handover), once the request was
	// checked: the volume is the cluster's, and r.Node holds a disk of it.
	Switchover(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error)
	// Membership adds or removes a raft voter.
	Membership(ctx context.Context, r *transport.MembershipRequest) (*transport.MembershipReply, error)
	// ClusterMessage handles a cluster message (a raft proposal, a lease
	// renewal) another node forwarded, body as it came, and returns the
	// answer's. sender refuses the message, by the node it says it comes
	// from, before anything is done with it; it does not block.
	ClusterMessage(ctx context.Context, body []byte, sender func(from string) error) ([]byte, error)
	// Claim takes, confirms or gives back the mount claim of r.Volume
	// here, once the request was checked: the volume is the cluster's,
	// and the holder is named. It refuses a volume this node is not the
	// primary of, naming the primary.
	Claim(ctx context.Context, r *transport.ClaimRequest) (*transport.ClaimReply, error)
	// Leader is the raft leader ("" when there is none now); clustered
	// is false when the node runs no raft.
	Leader() (leader string, clustered bool)
	// LeaderChanged is closed at the next change of the raft leader
	// (never without a cluster).
	LeaderChanged() <-chan struct{}
	// DataNodes are the nodes of the config that may hold disks.
	DataNodes() []string
	// Pools are this node's storage pools, their size and free space.
	Pools() []transport.PoolStatus
	// CreateVolume places and records a volume made from a pool; it runs
	// on the raft leader, with the request checked and its defaults
	// filled in. Its errors carry their gRPC codes.
	CreateVolume(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error)
	// DeleteVolume forgets a volume made from a pool, on the raft leader;
	// every node that holds it then stops it and frees its storage.
	DeleteVolume(ctx context.Context, name string) (*transport.VolumeDeleteReply, error)
	// ListVolumes lists the volumes of the cluster file and of raft, on
	// the raft leader, as of the call: a create or a delete answered
	// before it is in the list, whichever leader recorded it. Its errors
	// carry their gRPC codes (Aborted: the leader changed midway).
	ListVolumes(ctx context.Context) ([]transport.VolumeInfo, error)
}

// Volume is what the control API asks of one volume the node holds. Its
// methods are called concurrently, and change the volume through the
// node's rules: the decisions (may it be promoted, does its data go) are
// the node's.
type Volume interface {
	// Demote hands the primary role over to node to: IO stops, every
	// replica is flushed, and to must be in sync (within timeout); on
	// any failure the volume goes on serving as primary.
	Demote(ctx context.Context, to string, timeout time.Duration) (epoch uint64, gen replication.Generation, err error)
	// Promote makes this node primary at epoch, after a handover that
	// left gen.
	Promote(epoch uint64, gen replication.Generation) error
	// Retake takes the primary role back after a handover raft did not
	// record.
	Retake(epoch uint64, gen replication.Generation) error
	// ForcePromote makes this node primary without a handover.
	ForcePromote() error
	// SetConnected starts (up) or stops the volume's replication, as the
	// operator says.
	SetConnected(up bool)
	// DiscardMyData resolves a split brain by giving up this node's
	// changes (with yes; without, says what would go).
	DiscardMyData(ctx context.Context, yes bool) (*transport.ConnectReply, error)
	// Replication is the volume's replication state, in words.
	Replication() string
	// PathAction fails, restores or rotates a path of the volume's
	// multipath disk, or sets its policy, as r says.
	PathAction(r *transport.PathRequest) (*transport.PathReply, error)
	// Adjust changes the volume's settings online on this node.
	Adjust(protocol, onCongestion string, resyncRate *int64) (transport.AdjustedNode, error)
	// Grow grows this node's copy to size (with check, says whether it
	// can).
	Grow(ctx context.Context, size int64, check bool) (transport.ResizedNode, error)
	// IsPrimary says whether this node is the volume's primary.
	IsPrimary() bool
	// Resync starts, pauses or resumes the resync of the volume's peers
	// (only: that one alone).
	Resync(pause, resume bool, only string) (*transport.ResyncReply, error)
	// StartVerify starts an online verify of the volume's peers.
	StartVerify(repair bool) (*transport.VerifyReply, error)
	// AwaitServing returns once this node serves the volume as its
	// primary at epoch or a later one, with the epoch it serves at; an
	// error wrapping context.DeadlineExceeded when ctx ends first. It
	// waits on the volume's changes, never polling.
	AwaitServing(ctx context.Context, epoch uint64) (uint64, error)
	// Scrub starts a scrub of this node's disk at rate bytes per second
	// (0: the default), or pauses, resumes or stops the one running, and
	// says where it is (query: only that).
	Scrub(rate int64, pause, resume, stop, query bool) (transport.ScrubStatus, error)
	// ReadBlocks reads length bytes at off as a client's read on the
	// primary is: verified, and repaired from a peer when bad.
	ReadBlocks(ctx context.Context, off, length int64) ([]byte, error)
}

// ErrNotFound classes the node's errors about what it does not hold: the
// control API answers them NotFound.
var ErrNotFound = errors.New("not found")

// GRPCError gives err a status code the CLI can act on.
func GRPCError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.FailedPrecondition, err.Error())
	}
}

// Server implements the control API of a node (transport.ControlServer)
// on the node it is given.
type Server struct {
	node  Node
	gate  *Gate
	clock clock.Clock
}

var _ transport.ControlServer = (*Server)(nil)

// NewServer returns the control API of node, whose calls gate authorized.
// clk is the node's time, at which the state events say the state (nil:
// clock.Real()).
func NewServer(node Node, gate *Gate, clk clock.Clock) *Server {
	return &Server{node: node, gate: gate, clock: clock.Or(clk)}
}

// forward hands a request that names another node (node) to that node's
// control API, where call runs it. It reports false, and calls nothing,
// when node is "" or this node: the request is this node's to run. A node
// the config does not name is NotFound.
func forward[Resp any](s *Server, node string, call func(api transport.ControlServer) (*Resp, error)) (*Resp, bool, error) {
	if node == "" || node == s.node.Name() {
		return nil, false, nil
	}
	api, err := s.node.Peer(node)
	if err != nil {
		return nil, true, status.Error(codes.NotFound, err.Error())
	}
	reply, err := call(api)
	return reply, true, err
}

// onPrimary runs a volume command where it belongs: here when this node
// is the volume's primary, else forwarded to the primary.
func onPrimary[Resp any](ctx context.Context, s *Server, volume, what string,
	here func(v Volume) (*Resp, error), there func(api transport.ControlServer) (*Resp, error)) (*Resp, error) {
	if v, err := s.node.Volume(volume); err == nil && v.IsPrimary() {
		return here(v)
	}
	vs, found, err := s.volumeStatus(ctx, volume)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", volume)
	case vs.NBDURI == "" || vs.Primary == s.node.Name():
		return nil, status.Errorf(codes.FailedPrecondition, "%s has no reachable primary to %s", volume, what)
	}
	reply, _, err := forward(s, vs.Primary, there)
	return reply, err
}

// volumeHeldBy is the nodes that hold a disk of volume, for a command
// that names node ("" for every node that holds it): NotFound when the
// cluster has no such volume, or node holds no disk of it.
func (s *Server) volumeHeldBy(volume, node string) ([]string, error) {
	nodes, found := s.node.Disks(volume)
	if !found {
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", volume)
	}
	if node != "" && !slices.Contains(nodes, node) {
		return nil, status.Errorf(codes.NotFound, "node %q holds no disk of %s", node, volume)
	}
	return nodes, nil
}

// volumeStatus is what the cluster's status says of volume; found is
// false when it names no such volume.
func (s *Server) volumeStatus(ctx context.Context, volume string) (vs transport.VolumeStatus, found bool, err error) {
	cs, err := s.node.ClusterStatus(ctx, 0)
	if err != nil {
		return vs, false, GRPCError(err)
	}
	vs, found = cs.Volume(volume)
	return vs, found, nil
}

func (s *Server) NodeStatus(ctx context.Context, r *transport.StatusRequest) (*transport.NodeStatus, error) {
	return s.node.NodeStatus(r.Events), nil
}

func (s *Server) ClusterStatus(ctx context.Context, r *transport.StatusRequest) (*transport.ClusterStatus, error) {
	st, err := s.node.ClusterStatus(ctx, r.Events)
	return st, GRPCError(err)
}

// Primary moves a volume's primary role to another node: the old primary
// stops IO, flushes and checks the target holds everything; then the
// target is promoted at the next epoch. If promotion fails, the old
// primary takes the role back.
func (s *Server) Primary(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	nodes, found := s.node.Disks(r.Volume)
	if !found {
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", r.Volume)
	}
	if !slices.Contains(nodes, r.Node) {
		return nil, status.Errorf(codes.InvalidArgument, "node %q holds no disk of %s; choose one of the nodes in volumes[].disks", r.Node, r.Volume)
	}
	return s.node.Switchover(ctx, r)
}

func (s *Server) Demote(ctx context.Context, r *transport.DemoteRequest) (*transport.DemoteReply, error) {
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	epoch, gen, err := v.Demote(ctx, r.To, r.Timeout)
	if err != nil {
		return nil, GRPCError(err)
	}
	g, _ := gen.MarshalText()
	return &transport.DemoteReply{Epoch: epoch, Generation: string(g)}, nil
}

func (s *Server) Promote(ctx context.Context, r *transport.PromoteRequest) (*transport.PromoteReply, error) {
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	if r.Retake {
		var gen replication.Generation
		if err := gen.UnmarshalText([]byte(r.Generation)); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "generation: %v", err)
		}
		if err := v.Retake(r.Epoch, gen); err != nil {
			return nil, GRPCError(err)
		}
		return &transport.PromoteReply{NBDURI: s.node.NBDURI(r.Volume)}, nil
	}
	if r.Force {
		if err := v.ForcePromote(); err != nil {
			return nil, GRPCError(err)
		}
		return &transport.PromoteReply{NBDURI: s.node.NBDURI(r.Volume)}, nil
	}
	var gen replication.Generation
	if err := gen.UnmarshalText([]byte(r.Generation)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "generation: %v", err)
	}
	if err := v.Promote(r.Epoch, gen); err != nil {
		return nil, GRPCError(err)
	}
	return &transport.PromoteReply{NBDURI: s.node.NBDURI(r.Volume)}, nil
}

func (s *Server) Connect(ctx context.Context, r *transport.ConnectRequest) (*transport.ConnectReply, error) {
	return s.setConnected(ctx, r, true)
}

func (s *Server) Disconnect(ctx context.Context, r *transport.ConnectRequest) (*transport.ConnectReply, error) {
	return s.setConnected(ctx, r, false)
}

func (s *Server) setConnected(ctx context.Context, r *transport.ConnectRequest, up bool) (*transport.ConnectReply, error) {
	if reply, ok, err := forward(s, r.Node, func(api transport.ControlServer) (*transport.ConnectReply, error) {
		fwd := &transport.ConnectRequest{Volume: r.Volume, Node: r.Node, DiscardMyData: r.DiscardMyData, Yes: r.Yes}
		if up {
			return api.Connect(ctx, fwd)
		}
		return api.Disconnect(ctx, fwd)
	}); ok {
		return reply, err
	}
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	if r.DiscardMyData {
		if !up {
			return nil, status.Error(codes.InvalidArgument, "--discard-my-data goes with connect")
		}
		reply, err := v.DiscardMyData(ctx, r.Yes)
		return reply, GRPCError(err)
	}
	v.SetConnected(up)
	return &transport.ConnectReply{Node: s.node.Name(), Replication: v.Replication(), Done: true}, nil
}

// Resync runs on any node: the volume's primary starts, pauses or resumes
// the resync of its peers.
func (s *Server) Resync(ctx context.Context, r *transport.ResyncRequest) (*transport.ResyncReply, error) {
	return onPrimary(ctx, s, r.Volume, "resync from", func(v Volume) (*transport.ResyncReply, error) {
		if r.From != "" && r.From != s.node.Name() {
			return nil, status.Errorf(codes.FailedPrecondition, "%s is primary for %s; a resync runs from the primary: drop --from, or first run replctl primary %s --node %s", s.node.Name(), r.Volume, r.Volume, r.From)
		}
		return v.Resync(r.Pause, r.Resume, r.Node)
	}, func(api transport.ControlServer) (*transport.ResyncReply, error) { return api.Resync(ctx, r) })
}

// Verify runs on any node: the primary compares every block of the volume
// with each connected secondary, online, while IO goes on.
func (s *Server) Verify(ctx context.Context, r *transport.VerifyRequest) (*transport.VerifyReply, error) {
	return onPrimary(ctx, s, r.Volume, "verify against",
		func(v Volume) (*transport.VerifyReply, error) { return v.StartVerify(r.Repair) },
		func(api transport.ControlServer) (*transport.VerifyReply, error) { return api.Verify(ctx, r) })
}

// PathAction runs an operator's path command on the node that owns the
// paths, forwarding it there when needed.
func (s *Server) PathAction(ctx context.Context, r *transport.PathRequest) (*transport.PathReply, error) {
	if reply, ok, err := forward(s, r.Node, func(api transport.ControlServer) (*transport.PathReply, error) {
		return api.PathAction(ctx, r)
	}); ok {
		return reply, err
	}
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	return v.PathAction(r)
}

// AwaitServing answers once this node serves r.Volume as its primary at
// r.Epoch or a later one (a switchover's coordinator waits on it for the
// new primary), DeadlineExceeded when the call's deadline passes first.
// It is not forwarded: the node asked is the one waited for.
func (s *Server) AwaitServing(ctx context.Context, r *transport.AwaitServingRequest) (*transport.AwaitServingReply, error) {
	v, err := s.node.Volume(r.Volume)
	if err != nil {
		return nil, GRPCError(err)
	}
	epoch, err := v.AwaitServing(ctx, r.Epoch)
	if err != nil {
		return nil, GRPCError(err)
	}
	return &transport.AwaitServingReply{Epoch: epoch, NBDURI: s.node.NBDURI(r.Volume)}, nil
}

// ClusterForward hands a cluster message another node forwarded to the
// node's cluster, once its sender is the node whose certificate sent it.
func (s *Server) ClusterForward(ctx context.Context, r *transport.ClusterMessage) (*transport.ClusterMessage, error) {
	body, err := s.node.ClusterMessage(ctx, r.Body, func(from string) error { return s.gate.speaksFor(ctx, from) })
	if err != nil {
		return nil, err
	}
	return &transport.ClusterMessage{Body: body}, nil
}

func (s *Server) Membership(ctx context.Context, r *transport.MembershipRequest) (*transport.MembershipReply, error) {
	return s.node.Membership(ctx, r)
}

// Claim runs replctl mount's claim on this node, which must be the
// volume's primary: it is not forwarded, since the claim covers the
// connections to this node's export, which the mount uses.
func (s *Server) Claim(ctx context.Context, r *transport.ClaimRequest) (*transport.ClaimReply, error) {
	if _, found := s.node.Disks(r.Volume); !found {
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", r.Volume)
	}
	switch r.Action {
	case transport.ClaimTake, transport.ClaimConfirm, transport.ClaimRelease:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "claim action %q: want %s, %s or %s", r.Action, transport.ClaimTake, transport.ClaimConfirm, transport.ClaimRelease)
	}
	h := r.Holder
	switch {
	case h.ID == "":
		return nil, status.Error(codes.InvalidArgument, "a claim needs the holder's ID (replctl mount makes one and keeps it in the mount's record)")
	case r.Action != transport.ClaimRelease && (h.Host == "" || !strings.HasPrefix(h.Dir, "/")):
		return nil, status.Errorf(codes.InvalidArgument, "a claim names its holder: the host (%q) and the mount point, an absolute path (%q)", h.Host, h.Dir)
	case r.Grace < 0:
		return nil, status.Errorf(codes.InvalidArgument, "claim grace %s: give 0 or more", r.Grace)
	}
	reply, err := s.node.Claim(ctx, r)
	return reply, GRPCError(err)
}

// Events streams this node's events: the last r.History first (oldest
// first), then, with r.State, its current state (StateEvents), then every
// new one as it happens, until ctx ends. It subscribes before it looks, so
// nothing that happens meanwhile is missed (it may show twice).
func (s *Server) Events(ctx context.Context, r *transport.EventsRequest, send func(*transport.Event) error) error {
	live, cancel := s.node.Subscribe()
	defer cancel()
	var last uint64
	if r.History > 0 {
		past, err := s.node.History(r.History)
		if err != nil {
			return GRPCError(err)
		}
		for _, e := range past {
			if !r.Since.IsZero() && e.Time.Before(r.Since) {
				continue
			}
			if err := send(&e); err != nil {
				return err
			}
			last = e.Seq
		}
	}
	if r.State {
		for _, e := range s.node.StateEvents(s.clock.Now()) {
			if err := send(&e); err != nil {
				return err
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-live:
			if e.Seq != 0 && e.Seq <= last {
				continue // already sent from the history
			}
			if err := send(&e); err != nil {
				return err
			}
		}
	}
}
