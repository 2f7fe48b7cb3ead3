package node

import (
	"context"
	"slices"
	"time"

	"github.com/replvol/replvol/node/control"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// The control API (package node/control) runs the node through these
// adapters: controlNode is its control.Node, controlVolume its
// control.Volume. They only translate: what a call decides is decided
// by the node's and the volume's own methods they call.

// peerAPI returns the control API of a node: this one directly, others over
// gRPC.
func (n *Node) peerAPI(name string) (transport.ControlServer, error) {
	if name == n.name {
		return n.api, nil
	}
	return n.client(name)
}

// grpcError gives err a status code the CLI can act on.
func grpcError(err error) error { return control.GRPCError(err) }

// controlNode is the node as the control API sees it.
type controlNode struct{ n *Node }

var _ control.Node = controlNode{}

func (c controlNode) Name() string { return c.n.name }

func (c controlNode) Peer(name string) (transport.ControlServer, error) { return c.n.peerAPI(name) }

func (c controlNode) Volume(name string) (control.Volume, error) {
	v, err := c.n.volume(name)
	if err != nil {
		return nil, err
	}
	return controlVolume{v}, nil
}

func (c controlNode) AwaitVolume(ctx context.Context, name string) (control.Volume, error) {
	v, err := c.n.awaitVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	return controlVolume{v}, nil
}

func (c controlNode) Disks(volume string) ([]string, bool) {
	vc := c.n.config().Volume(volume)
	if vc == nil {
		return nil, false
	}
	var nodes []string
	for name := range vc.Disks {
		nodes = append(nodes, name)
	}
	slices.Sort(nodes)
	return nodes, true
}

func (c controlNode) NBDURI(volume string) string { return c.n.nbdURI(c.n.name, volume) }

func (c controlNode) NodeStatus(events int) *transport.NodeStatus { return c.n.nodeStatus(events) }

func (c controlNode) ClusterStatus(ctx context.Context, events int) (*transport.ClusterStatus, error) {
	return c.n.clusterStatus(ctx, events)
}

func (c controlNode) Subscribe() (<-chan transport.Event, func()) { return c.n.subscribe() }

func (c controlNode) History(max int) ([]transport.Event, error) {
	past, err := c.n.store.Events(max)
	if err != nil {
		return nil, err
	}
	events := make([]transport.Event, 0, len(past))
	for _, e := range past {
		events = append(events, c.n.transportEvent(e))
	}
	return events, nil
}

func (c controlNode) StateEvents(now time.Time) []transport.Event { return c.n.stateEvents(now) }

func (c controlNode) Switchover(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	return c.n.switchover(ctx, r)
}

func (c controlNode) Membership(ctx context.Context, r *transport.MembershipRequest) (*transport.MembershipReply, error) {
	return c.n.membership(ctx, r)
}

func (c controlNode) ClusterMessage(ctx context.Context, body []byte, sender func(from string) error) ([]byte, error) {
	return c.n.clusterMessage(ctx, body, sender)
}

func (c controlNode) Claim(_ context.Context, r *transport.ClaimRequest) (*transport.ClaimReply, error) {
	return c.n.claim(r)
}

func (c controlNode) Leader() (string, bool) { return c.n.leader() }

func (c controlNode) LeaderChanged() <-chan struct{} {
	if c.n.cl == nil {
		return nil
	}
	return c.n.cl.c.LeaderChanged()
}

func (c controlNode) DataNodes() []string { return dataNodes(c.n.config()) }

func (c controlNode) Pools() []transport.PoolStatus { return c.n.pools() }

func (c controlNode) CreateVolume(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	return c.n.createVolume(ctx, r)
}

func (c controlNode) DeleteVolume(ctx context.Context, name string) (*transport.VolumeDeleteReply, error) {
	return c.n.deleteVolume(ctx, name)
}

func (c controlNode) ListVolumes(ctx context.Context) ([]transport.VolumeInfo, error) {
	return c.n.listVolumes(ctx)
}

// controlVolume is a volume as the control API sees it.
type controlVolume struct{ v *Volume }

var _ control.Volume = controlVolume{}

func (c controlVolume) Demote(ctx context.Context, to string, timeout time.Duration) (uint64, replication.Generation, error) {
	return c.v.demote(ctx, to, timeout)
}

func (c controlVolume) Promote(epoch uint64, gen replication.Generation) error {
	return c.v.promote(epoch, gen)
}

func (c controlVolume) Retake(epoch uint64, gen replication.Generation) error {
	return c.v.retake(epoch, gen)
}

func (c controlVolume) ForcePromote() error { return c.v.forcePromote() }

func (c controlVolume) SetConnected(up bool) {
	c.v.setAdminDown(!up)
	if up {
		c.v.resumePeers()
	}
}

func (c controlVolume) DiscardMyData(ctx context.Context, yes bool) (*transport.ConnectReply, error) {
	return c.v.resolveSplitBrain(ctx, yes)
}

func (c controlVolume) Replication() string { return c.v.status().Replication }

func (c controlVolume) PathAction(r *transport.PathRequest) (*transport.PathReply, error) {
	return c.v.pathAction(r)
}

func (c controlVolume) Adjust(protocol, onCongestion string, resyncRate *int64) (transport.AdjustedNode, error) {
	s, err := c.v.adjust(protocol, onCongestion, resyncRate)
	if err != nil {
		return transport.AdjustedNode{}, err
	}
	return transport.AdjustedNode{Node: c.v.node.name, Protocol: string(s.protocol),
		OnCongestion: string(s.congestion.Policy), ResyncRate: s.resyncRate}, nil
}

func (c controlVolume) Grow(ctx context.Context, size int64, check bool) (transport.ResizedNode, error) {
	return c.v.grow(ctx, size, check)
}

func (c controlVolume) IsPrimary() bool { return c.v.state().role() == replication.Primary }

func (c controlVolume) Resync(pause, resume bool, only string) (*transport.ResyncReply, error) {
	return c.v.resync(pause, resume, only)
}

func (c controlVolume) Scrub(rate int64, pause, resume, stop, query bool) (transport.ScrubStatus, error) {
	return c.v.scrubCommand(rate, pause, resume, stop, query)
}

func (c controlVolume) ReadBlocks(ctx context.Context, off, length int64) ([]byte, error) {
	return c.v.readBlocks(ctx, off, length)
}

func (c controlVolume) AwaitServing(ctx context.Context, epoch uint64) (uint64, error) {
	return c.v.awaitServing(ctx, epoch)
}

func (c controlVolume) StartVerify(repair bool) (*transport.VerifyReply, error) {
	return c.v.startVerify(repair)
}
