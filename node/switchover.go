package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// volumeStatus is what the cluster's status says of volume; found is
// false when it names no such volume.
func (n *Node) volumeStatus(ctx context.Context, volume string) (vs transport.VolumeStatus, found bool, err error) {
	cs, err := n.clusterStatus(ctx, 0)
	if err != nil {
		return vs, false, grpcError(err)
	}
	vs, found = cs.Volume(volume)
	return vs, found, nil
}

// switchover moves a volume's primary role to another node (the control
// API's Primary, once it checked r): the old primary stops IO, flushes and
// checks the target holds everything; then the target is promoted at the
// next epoch. If promotion fails, the old primary takes the role back.
func (n *Node) switchover(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	if n.cl != nil {
		// Raft records the change, and this node reaches no leader.
		if err := n.cl.c.NotAVoter(); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	vs, _, err := n.volumeStatus(ctx, r.Volume)
	if err != nil {
		return nil, err
	}
	if r.Force {
		return n.forcePrimary(ctx, r, vs)
	}
	if vs.NBDURI == "" {
		for _, rs := range vs.Replicas {
			if rs.Node == vs.Primary && rs.Reachable && rs.Role == string(replication.Primary) {
				return nil, status.Errorf(codes.FailedPrecondition, "%s is primary of %s but not serving IO (%s): a switchover needs a serving primary to hand over; nothing changed", vs.Primary, r.Volume, rs.Reason)
			}
		}
		return nil, status.Errorf(codes.FailedPrecondition, "%s has no reachable primary (last known: %q); a switchover needs the old primary to hand over, or promote %s with --force --yes", r.Volume, vs.Primary, r.Node)
	}
	if vs.Primary == r.Node {
		return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: vs.Epoch, NBDURI: vs.NBDURI}, nil
	}
	for _, rs := range vs.Replicas {
		if rs.Node == r.Node && !rs.Reachable {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s is unreachable; %s stays on %s", r.Node, r.Volume, vs.Primary)
		}
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	oldAPI, err := n.peerAPI(vs.Primary)
	if err != nil {
		return nil, grpcError(err)
	}
	newAPI, err := n.peerAPI(r.Node)
	if err != nil {
		return nil, grpcError(err)
	}
	dctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	d, err := oldAPI.Demote(dctx, &transport.DemoteRequest{Volume: r.Volume, To: r.Node, Timeout: timeout})
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "switchover aborted, %s stays primary: %s", vs.Primary, status.Convert(err).Message())
	}
	if n.cl != nil && n.cl.auto {
		return n.switchoverByRaft(dctx, r, vs.Primary, d, oldAPI)
	}
	p, err := newAPI.Promote(dctx, &transport.PromoteRequest{Volume: r.Volume, Epoch: d.Epoch + 1, Generation: d.Generation})
	if err != nil {
		msg := status.Convert(err).Message()
		if _, rerr := oldAPI.Promote(dctx, &transport.PromoteRequest{Volume: r.Volume, Epoch: d.Epoch + 1, Generation: d.Generation}); rerr != nil {
			return nil, status.Errorf(codes.Internal, "promotion of %s failed (%s) and %s could not take the role back (%s): no node is primary; run replctl primary again", r.Node, msg, vs.Primary, status.Convert(rerr).Message())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "promotion of %s failed (%s); %s is primary again", r.Node, msg, vs.Primary)
	}
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: d.Epoch + 1, NBDURI: p.NBDURI}, nil
}

// forcePrimary promotes a node without a handover, for when the primary is
// gone. It refuses while a primary is reachable (use a switchover) and
// without Yes, saying what may be lost.
func (n *Node) forcePrimary(ctx context.Context, r *transport.PrimaryRequest, vs transport.VolumeStatus) (*transport.PrimaryReply, error) {
	if vs.NBDURI != "" && vs.Primary != r.Node {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is primary for %s and reachable: use a clean switchover (replctl primary %s --node %s, without --force)", vs.Primary, r.Volume, r.Volume, r.Node)
	}
	var target transport.ReplicaStatus
	for _, rs := range vs.Replicas {
		if rs.Node == r.Node {
			target = rs
		}
	}
	if vs.Primary == r.Node && vs.NBDURI != "" && target.Disk != string(replication.Inconsistent) {
		return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: vs.Epoch, NBDURI: vs.NBDURI}, nil
	}
	if !target.Reachable {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s is unreachable", r.Node)
	}
	if !r.Yes {
		return nil, status.Errorf(codes.FailedPrecondition, "--force makes %s primary without a handover from %q: writes %q acknowledged after it lost %s are not on %s (its disk is %s, generation %s), and if %q still serves clients the two will diverge (split brain). Add --yes to go ahead", r.Node, vs.Primary, vs.Primary, r.Node, r.Node, target.Disk, target.Generation, vs.Primary)
	}
	// Between two raft leaders (the old one just died) a quorum is about
	// to form: the promotion goes through raft then, not around it.
	if cl := n.cl; cl != nil && cl.auto && cl.c.AwaitQuorum(ctx) {
		return n.forceByRaft(ctx, r)
	}
	api, err := n.peerAPI(r.Node)
	if err != nil {
		return nil, grpcError(err)
	}
	p, err := api.Promote(ctx, &transport.PromoteRequest{Volume: r.Volume, Force: true})
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "forced promotion of %s failed: %s", r.Node, status.Convert(err).Message())
	}
	now, _, _ := n.volumeStatus(ctx, r.Volume)
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: now.Epoch, NBDURI: p.NBDURI}, nil
}

// switchoverByRaft finishes a planned switchover in authority mode: the old
// primary handed over (d); raft records the new primary at the next epoch
// and the new primary takes over when it sees that. If raft does not record
// it, the old primary takes the volume back.
func (n *Node) switchoverByRaft(ctx context.Context, r *transport.PrimaryRequest, old string, d *transport.DemoteReply, oldAPI transport.ControlServer) (*transport.PrimaryReply, error) {
	// The old primary stopped its IO and found r.Node holding every
	// write: raft may know that before it is told the reconnection
	// finished.
	va, err := n.cl.c.Propose(ctx, replication.MarkUpToDateCommand(r.Volume, d.Epoch, r.Node))
	if err == nil {
		va, err = n.cl.c.Propose(ctx, replication.PromoteCommand(r.Volume, d.Epoch, r.Node, false))
	}
	if errors.Is(err, replication.ErrStaleEpoch) && va.Primary == r.Node && va.Epoch > d.Epoch {
		// The cluster promoted r.Node itself meanwhile (the old
		// primary's lease ran out during the handover, say): what the
		// operator asked for is done, and the old primary, which
		// handed over, stays a secondary.
		n.log.Info("switchover: the cluster made the node primary first", "volume", r.Volume, "node", r.Node, "epoch", va.Epoch)
		err = nil
	}
	if err != nil {
		msg := err.Error()
		if _, rerr := oldAPI.Promote(ctx, &transport.PromoteRequest{Volume: r.Volume, Epoch: d.Epoch, Generation: d.Generation, Retake: true}); rerr != nil {
			return nil, status.Errorf(codes.Internal, "raft did not record %s as primary (%s) and %s could not take the volume back (%s): see replctl status", r.Node, msg, old, status.Convert(rerr).Message())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "raft did not record %s as primary (%s); %s is primary again", r.Node, msg, old)
	}
	uri, err := n.waitServing(ctx, r.Volume, r.Node, va.Epoch)
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "raft made %s primary at epoch %d, but it does not serve yet: %v", r.Node, va.Epoch, err)
	}
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: va.Epoch, NBDURI: uri}, nil
}

// forceByRaft promotes r.Node through raft without a handover: the old
// primary's lease is waited out, every other node becomes Outdated.
func (n *Node) forceByRaft(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	va, _ := n.cl.c.Authority().Volume(r.Volume)
	nva, err := n.cl.c.Propose(ctx, replication.FailoverCommand(r.Volume, va.Epoch, r.Node, true, n.clock.Now().UTC(), "forced by the operator (replctl primary --force)"))
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "forced promotion of %s through raft failed: %v", r.Node, err)
	}
	uri, err := n.waitServing(ctx, r.Volume, r.Node, nva.Epoch)
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "raft made %s primary at epoch %d, but it does not serve yet: %v", r.Node, nva.Epoch, err)
	}
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: nva.Epoch, NBDURI: uri}, nil
}

// servingWait is how long waitServing waits.
const servingWait = 15 * time.Second

// waitServing waits until node serves volume as its primary at epoch (or
// a later one); it returns the export. The node is asked once
// (AwaitServing), and answers when it serves: it waits on its volume's
// changes, so no one polls.
func (n *Node) waitServing(ctx context.Context, volume, node string, epoch uint64) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := afterFunc(n.clock, servingWait, cancel)
	defer stop()
	notServing := fmt.Errorf("%s is not serving %s after %.0f s", node, volume, servingWait.Seconds())
	if api, err := n.peerAPI(node); err == nil {
		_, err := api.AwaitServing(ctx, &transport.AwaitServingRequest{Volume: volume, Epoch: epoch})
		switch {
		case err == nil:
			// The export as the cluster's status gives it (the address
			// of node that the config names), which the switchover
			// reports.
			return n.servingURI(node, volume), nil
		case ctx.Err() != nil:
			return "", notServing
		}
	}
	// A node of an earlier release has no AwaitServing (it answers
	// codes.Unimplemented); and a call that failed otherwise (the node
	// restarting) is no answer either: ask the cluster's status instead,
	// as those releases did, until the deadline.
	if uri, ok := n.askServing(ctx, volume, node); ok {
		return uri, nil
	}
	return "", notServing
}

// servingURI is the export of volume on node as the cluster's status
// gives it.
func (n *Node) servingURI(node, volume string) string {
	nc, ok := n.config().Node(node)
	if !ok {
		return ""
	}
	return n.nbdURIFromStatus([]transport.NodeInfo{n.nodeInfo(nc)}, node, volume)
}

// servingAskEvery is how often askServing asks the cluster again.
// Nothing on the wire of a node of an earlier release notifies its every
// change of what it serves (AwaitServing is newer): it is asked, each
// time after the last answer came.
const servingAskEvery = 20 * time.Millisecond

// askServing asks the cluster's status whether node serves volume until
// it does (true, with the export) or ctx ends (false): waitServing's way
// with a node that cannot be waited on.
func (n *Node) askServing(ctx context.Context, volume, node string) (string, bool) {
	var last string
	serving := func() bool {
		cs, err := n.clusterStatus(ctx, 0)
		if err != nil {
			return false
		}
		if vs, ok := cs.Volume(volume); ok && vs.Primary == node && vs.NBDURI != "" {
			last = vs.NBDURI
			return true
		}
		return false
	}
	ok := serving()
	for !ok && waitOut(ctx, n.clock, servingAskEvery) {
		ok = serving()
	}
	return last, ok
}

// awaitServingMax bounds how long a volume waits to serve for one
// AwaitServing call, whose caller gives no shorter deadline.
const awaitServingMax = time.Minute

// awaitServing waits until this node serves the volume as its primary at
// epoch or a later one, and returns the epoch it serves at. It looks
// again at each change of the volume (its role, serving state and epoch
// change only where v.changed is notified), and gives up when ctx ends or
// awaitServingMax passed on the volume's clock, with an error wrapping
// context.DeadlineExceeded.
func (v *Volume) awaitServing(ctx context.Context, epoch uint64) (uint64, error) {
	var at uint64
	serving := func() bool {
		// Published BEFORE v.changed is notified.
		s := v.state()
		at = s.st.Durable.Epoch
		return s.serving() && s.st.Durable.Epoch >= epoch
	}
	if waitUntil(ctx, v.clock, awaitServingMax, &v.changed, serving) {
		return at, nil
	}
	return 0, fmt.Errorf("%s does not serve %s at epoch %d or later (epoch %d now): %w", v.self, v.name, epoch, at, context.DeadlineExceeded)
}
