package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/web"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// control implements the control API of a node.
type control struct {
	n *Node
}

var _ transport.ControlServer = (*control)(nil)

// peerAPI returns the control API of a node: this one directly, others over
// gRPC.
func (n *Node) peerAPI(name string) (transport.ControlServer, error) {
	if name == n.name {
		return &control{n: n}, nil
	}
	return n.client(name)
}

// forward hands a request that names another node (node) to that node's
// control API, where call runs it. It reports false, and calls nothing,
// when node is "" or this node: the request is this node's to run. A node
// the config does not name is NotFound.
func forward[Resp any](n *Node, node string, call func(api transport.ControlServer) (*Resp, error)) (*Resp, bool, error) {
	if node == "" || node == n.name {
		return nil, false, nil
	}
	api, err := n.peerAPI(node)
	if err != nil {
		return nil, true, status.Error(codes.NotFound, err.Error())
	}
	reply, err := call(api)
	return reply, true, err
}

// volumeHeldBy is the cluster's config of volume for a command that
// names node ("" for every node that holds it): NotFound when the cluster
// has no such volume, or node holds no disk of it.
func (n *Node) volumeHeldBy(volume, node string) (*VolumeConfig, error) {
	vc := n.config().Volume(volume)
	if vc == nil {
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", volume)
	}
	if node != "" {
		if _, ok := vc.Disks[node]; !ok {
			return nil, status.Errorf(codes.NotFound, "node %q holds no disk of %s", node, volume)
		}
	}
	return vc, nil
}

// volumeStatus is what the cluster's status says of volume; found is
// false when it names no such volume.
func (n *Node) volumeStatus(ctx context.Context, volume string) (vs transport.VolumeStatus, found bool, err error) {
	cs, err := n.clusterStatus(ctx, 0)
	if err != nil {
		return vs, false, grpcError(err)
	}
	for _, v := range cs.Volumes {
		if v.Name == volume {
			vs, found = v, true
		}
	}
	return vs, found, nil
}

// grpcError gives err a status code the CLI can act on.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.FailedPrecondition, err.Error())
	}
}

func (c *control) NodeStatus(ctx context.Context, r *transport.StatusRequest) (*transport.NodeStatus, error) {
	return c.n.nodeStatus(r.Events), nil
}

func (c *control) ClusterStatus(ctx context.Context, r *transport.StatusRequest) (*transport.ClusterStatus, error) {
	st, err := c.n.clusterStatus(ctx, r.Events)
	return st, grpcError(err)
}

func (n *Node) nodeInfo(nc NodeConfig) transport.NodeInfo {
	info := transport.NodeInfo{Name: nc.Name, Control: nc.Control, Replication: nc.Replication, NBD: nc.NBD, Role: RoleData}
	if nc.IsWitness() {
		info.Role = RoleWitness
	}
	if nc.Name != n.name {
		return info
	}
	for _, a := range []struct {
		ln  net.Listener
		dst *string
	}{{n.lnControl, &info.Control}, {n.lnRepl, &info.Replication}, {n.lnNBD, &info.NBD}} {
		if a.ln != nil {
			*a.dst = a.ln.Addr().String()
		}
	}
	return info
}

func (n *Node) nodeStatus(events int) *transport.NodeStatus {
	ns := &transport.NodeStatus{Node: n.nodeInfo(n.self), Failover: n.failoverReasons(), Config: n.configStatus()}
	ns.Node.Alive = true
	vols := n.volumes()
	for _, name := range slices.Sorted(maps.Keys(vols)) {
		ns.Volumes = append(ns.Volumes, vols[name].status())
	}
	if events > 0 {
		evs, err := n.store.Events(events)
		if err == nil {
			for _, e := range evs {
				ns.Events = append(ns.Events, n.transportEvent(e))
			}
		}
	}
	return ns
}

// Status asks of a peer wait statusWait for its answer, or statusRetryWait
// while its last answer failed: a node that stopped answering costs each
// later status a fraction of a second, not seconds.
const (
	statusWait      = 2 * time.Second
	statusRetryWait = 500 * time.Millisecond
)

// probeTimeout bounds the look at a node gossip reports gone.
const probeTimeout = 300 * time.Millisecond

// probeControl says why a node gossip reports gone does not answer, from a
// TCP connect to its control port: transport.ReachRefused (nothing
// listens: it is stopped), transport.ReachNoAnswer (it accepts: it is hung
// or paused, since a running node answers gossip) or
// transport.ReachNoConnection; and the same in words.
func probeControl(ctx context.Context, addr string) (code, why string) {
	d := net.Dialer{Timeout: probeTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	switch {
	case err == nil:
		conn.Close()
		return transport.ReachNoAnswer, addr + " accepts connections but the node answers nothing: is replnode hung or paused?"
	case errors.Is(err, syscall.ECONNREFUSED):
		return transport.ReachRefused, "nothing listens at " + addr + ": replnode is not running there"
	}
	return transport.ReachNoConnection, "no TCP connection to " + addr + ": " + transport.DialWords(err)
}

// askStatus asks one peer for its view, remembering whether it answered.
func (n *Node) askStatus(ctx context.Context, name string, events int) (*transport.NodeStatus, error) {
	api, err := n.peerAPI(name)
	if err != nil {
		return nil, err
	}
	wait := statusWait
	n.mu.Lock()
	if n.statusFailed[name] {
		wait = statusRetryWait
	}
	n.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ns, err := api.NodeStatus(cctx, &transport.StatusRequest{Events: events})
	n.mu.Lock()
	n.statusFailed[name] = err != nil && ctx.Err() == nil
	n.mu.Unlock()
	return ns, err
}

// clusterStatus asks every node for its view and puts the views together.
func (n *Node) clusterStatus(ctx context.Context, events int) (*transport.ClusterStatus, error) {
	cs := &transport.ClusterStatus{From: n.name}
	var membership map[string]string
	cs.Cluster, membership = n.clusterInfo()

	cfg := n.config()
	views := make([]*transport.NodeStatus, len(cfg.Nodes))
	errs := make([]error, len(cfg.Nodes))
	reach := make([]string, len(cfg.Nodes)) // why a node was not reached
	var wg sync.WaitGroup
	for i, nc := range cfg.Nodes {
		if nc.Name == n.name {
			views[i] = n.nodeStatus(events)
			continue
		}
		if m := cluster.Liveness(membership[nc.Name]); m == cluster.Dead || m == cluster.Left {
			// Asking a node cut off by a partition would hold every
			// status for the whole timeout, just when operators look. A
			// glance at its port still tells a stopped node from a hung
			// one.
			wg.Add(1)
			go func() {
				defer wg.Done()
				var why string
				reach[i], why = probeControl(ctx, nc.Control)
				errs[i] = fmt.Errorf("not asked while gossip reports %s %s: %s", nc.Name, m, why)
			}()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i], errs[i] = n.askStatus(ctx, nc.Name, events)
		}()
	}
	wg.Wait()
	for i, nc := range cfg.Nodes {
		// Only the leader decides failovers: its reasons are the ones.
		if nc.Name == cs.Cluster.Leader && nc.Name != n.name && views[i] != nil && views[i].Failover != "" {
			cs.Cluster.Reason = human.Join(cs.Cluster.Reason, views[i].Failover)
		}
	}
	byNode := map[string]map[string]transport.LocalVolume{}
	for i, nc := range cfg.Nodes {
		info := n.nodeInfo(nc)
		info.Membership = membership[nc.Name]
		if views[i] != nil {
			info.Alive = true
			byNode[nc.Name] = map[string]transport.LocalVolume{}
			for _, lv := range views[i].Volumes {
				byNode[nc.Name][lv.Name] = lv
			}
		} else if errs[i] != nil {
			var se *transport.StreamError
			if errors.As(errs[i], &se) {
				errs[i], reach[i] = se.Named(nc.Name), se.Reach
			}
			info.Error, info.ErrorCode = status.Convert(errs[i]).Message(), reach[i]
		}
		cs.Nodes = append(cs.Nodes, info)
	}
	files := map[string]*transport.NodeConfigStatus{}
	for i, nc := range cfg.Nodes {
		if views[i] != nil {
			files[nc.Name] = views[i].Config
		}
	}
	cs.ConfigDiffers = configDifferences(files)
	var auth replication.Authority
	if n.cl != nil {
		auth = n.cl.c.Authority()
	}
	for _, vc := range cfg.Volumes {
		vs := transport.VolumeStatus{Name: vc.Name, Size: int64(vc.Size), Protocol: vc.ProtocolOrDefault(), ResyncRate: int64(vc.ResyncRate),
			OnCongestion: string(settingsOf(vc).congestion.Policy)}
		va, _ := auth.Volume(vc.Name)
		if f := va.LastFailover; f != nil {
			vs.LastFailover = &transport.Failover{From: f.From, To: f.To, Epoch: f.Epoch, At: f.At, Reason: f.Reason, Forced: f.Forced}
		}
		// A forced promotion that raft did not record (no raft, or no
		// quorum yet) is known to the node forced: the newest wins.
		for _, vols := range byNode {
			if f := vols[vc.Name].LastFailover; f != nil && (vs.LastFailover == nil || f.Epoch > vs.LastFailover.Epoch) {
				vs.LastFailover = f
			}
		}
		// The primary is the reachable node that says so at the highest
		// epoch; failing that, the one the others last agreed to.
		var primaryView *transport.LocalVolume
		for node, vols := range byNode {
			lv, ok := vols[vc.Name]
			if !ok {
				continue
			}
			if lv.Role == string(replication.Primary) && (primaryView == nil || lv.Epoch > primaryView.Epoch || (lv.Epoch == primaryView.Epoch && lv.Serving && !primaryView.Serving)) {
				lv := lv
				primaryView = &lv
				vs.Primary, vs.Epoch = node, lv.Epoch
			}
		}
		switch {
		case primaryView == nil:
			for _, vols := range byNode {
				if lv, ok := vols[vc.Name]; ok && lv.Epoch >= vs.Epoch {
					vs.Primary, vs.Epoch = lv.Primary, lv.Epoch
				}
			}
		case primaryView.Serving:
			// Only a primary that serves IO has an export to give out.
			vs.NBDURI = n.nbdURIFromStatus(cs.Nodes, vs.Primary, vc.Name)
		}
		if vs.Size == int64(SizeMax) || primaryView == nil {
			// size: max: what the nodes that hold the volume resolved;
			// and without a primary, what they run at (an online resize
			// grows it past the file's).
			var resolved int64
			for _, node := range slices.Sorted(maps.Keys(byNode)) {
				if lv, ok := byNode[node][vc.Name]; ok && lv.Size > resolved {
					resolved = lv.Size
				}
			}
			if resolved > 0 || vs.Size == int64(SizeMax) {
				vs.Size = resolved
			}
		}
		if primaryView != nil && primaryView.Size > 0 {
			vs.Size = primaryView.Size
		}
		if primaryView != nil && primaryView.Protocol != "" {
			// replctl adjust may have changed them.
			vs.Protocol, vs.ResyncRate, vs.OnCongestion = primaryView.Protocol, primaryView.ResyncRate, primaryView.OnCongestion
		}
		vs.SettingMismatches = settingMismatches(vc.Name, vs.Primary, byNode)
		nodes := make([]string, 0, len(vc.Disks))
		for node := range vc.Disks {
			nodes = append(nodes, node)
		}
		sort.Strings(nodes)
		for _, node := range nodes {
			rs := transport.ReplicaStatus{Node: node}
			switch {
			case va.IsUpToDate(node):
				rs.Raft = string(replication.UpToDate)
			case va.IsOutdated(node):
				rs.Raft = string(replication.Outdated)
			}
			var pv *transport.PeerStatus
			if primaryView != nil {
				for i := range primaryView.Peers {
					if primaryView.Peers[i].Node == node {
						pv = &primaryView.Peers[i]
					}
				}
			}
			if lv, ok := byNode[node][vc.Name]; ok {
				rs.Reachable = true
				rs.Role, rs.Disk, rs.Replication = lv.Role, lv.Disk, lv.Replication
				rs.ResyncedBytes, rs.Generation, rs.Reason, rs.ReasonCode = lv.ResyncedBytes, lv.Generation, lv.Reason, lv.ReasonCode
				rs.Paths = lv.Paths
				rs.Metadata, rs.UsableBytes, rs.Size = lv.Metadata, lv.UsableBytes, lv.Size
				if lv.Role == string(replication.Primary) {
					rs.OutOfSyncBytes = lv.LocalMissingBytes
				}
			} else {
				rs.Role, rs.Disk, rs.Replication = "Unknown", "DUnknown", "Unknown"
				if pv != nil {
					rs.Disk = pv.PeerDisk
				}
			}
			if pv != nil {
				rs.OutOfSyncBytes = pv.OutOfSyncBytes
				rs.ResyncDoneBytes, rs.ResyncTotalBytes = pv.ResyncDoneBytes, pv.ResyncTotalBytes
				rs.ResyncRate = pv.ResyncRate
				rs.LagBytes, rs.LagSeconds = pv.LagBytes, pv.LagSeconds
				rs.VerifyDoneBytes, rs.VerifyTotalBytes, rs.VerifyFoundBytes = pv.VerifyDoneBytes, pv.VerifyTotalBytes, pv.VerifyFoundBytes
				rs.VerifyRate = pv.VerifyRate
				rs.LastResyncBytes, rs.LastResyncSeconds, rs.LastResyncEnded = pv.LastResyncBytes, pv.LastResyncSeconds, pv.LastResyncEnded
				if pv.Replication == string(replication.VerifyS) && rs.Reachable {
					rs.Replication = string(replication.VerifyT)
				}
				if pv.Replication == string(replication.Ahead) && rs.Reachable {
					rs.Replication = string(replication.Behind)
				}
				if pv.Replication == string(replication.PausedSyncS) && rs.Reachable {
					rs.Replication = string(replication.PausedSyncT)
				}
				if pv.Replication == string(replication.SyncTarget) && rs.Reachable {
					// The primary copies from this replica.
					rs.Replication = string(replication.SyncSource)
				}
				if pv.Replication == string(replication.PausedSyncT) && rs.Reachable {
					rs.Replication = string(replication.PausedSyncS)
				}
				if rs.Reason == "" {
					rs.Reason, rs.ReasonCode = pv.Reason, pv.ReasonCode
				}
				rs.SyncRule, rs.SyncDecision = pv.SyncRule, pv.SyncDecision
			}
			switch {
			case rs.ResyncTotalBytes > 0:
				rs.SyncProgress = 100 * float64(rs.ResyncDoneBytes) / float64(rs.ResyncTotalBytes)
			case rs.Disk == string(replication.UpToDate):
				rs.SyncProgress = 100
			case vs.Size > 0:
				rs.SyncProgress = 100 * (1 - float64(rs.OutOfSyncBytes)/float64(vs.Size))
			}
			vs.Replicas = append(vs.Replicas, rs)
		}
		cs.Volumes = append(cs.Volumes, vs)
	}
	cs.Warnings = web.Warnings(cs)
	return cs, nil
}

func (n *Node) nbdURIFromStatus(nodes []transport.NodeInfo, node, volume string) string {
	for _, ni := range nodes {
		if ni.Name == node {
			return fmt.Sprintf("%s://%s/%s", n.nbdScheme(), ni.NBD, volume)
		}
	}
	return ""
}

// Primary moves a volume's primary role to another node: the old primary
// stops IO, flushes and checks the target holds everything; then the
// target is promoted at the next epoch. If promotion fails, the old
// primary takes the role back.
func (c *control) Primary(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	n := c.n
	vc := n.config().Volume(r.Volume)
	if vc == nil {
		return nil, status.Errorf(codes.NotFound, "no volume %q in the cluster", r.Volume)
	}
	if _, ok := vc.Disks[r.Node]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "node %q holds no disk of %s; choose one of the nodes in volumes[].disks", r.Node, r.Volume)
	}
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
		return c.forcePrimary(ctx, r, vs)
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
		return c.switchoverByRaft(dctx, r, vs.Primary, d, oldAPI)
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

func (c *control) Demote(ctx context.Context, r *transport.DemoteRequest) (*transport.DemoteReply, error) {
	v, err := c.n.volume(r.Volume)
	if err != nil {
		return nil, grpcError(err)
	}
	epoch, gen, err := v.demote(ctx, r.To, r.Timeout)
	if err != nil {
		return nil, grpcError(err)
	}
	g, _ := gen.MarshalText()
	return &transport.DemoteReply{Epoch: epoch, Generation: string(g)}, nil
}

func (c *control) Promote(ctx context.Context, r *transport.PromoteRequest) (*transport.PromoteReply, error) {
	v, err := c.n.volume(r.Volume)
	if err != nil {
		return nil, grpcError(err)
	}
	if r.Retake {
		var gen replication.Generation
		if err := gen.UnmarshalText([]byte(r.Generation)); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "generation: %v", err)
		}
		if err := v.retake(r.Epoch, gen); err != nil {
			return nil, grpcError(err)
		}
		return &transport.PromoteReply{NBDURI: c.n.nbdURI(c.n.name, r.Volume)}, nil
	}
	if r.Force {
		if err := v.forcePromote(); err != nil {
			return nil, grpcError(err)
		}
		return &transport.PromoteReply{NBDURI: c.n.nbdURI(c.n.name, r.Volume)}, nil
	}
	var gen replication.Generation
	if err := gen.UnmarshalText([]byte(r.Generation)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "generation: %v", err)
	}
	if err := v.promote(r.Epoch, gen); err != nil {
		return nil, grpcError(err)
	}
	return &transport.PromoteReply{NBDURI: c.n.nbdURI(c.n.name, r.Volume)}, nil
}

func (c *control) Connect(ctx context.Context, r *transport.ConnectRequest) (*transport.ConnectReply, error) {
	return c.setConnected(ctx, r, true)
}

func (c *control) Disconnect(ctx context.Context, r *transport.ConnectRequest) (*transport.ConnectReply, error) {
	return c.setConnected(ctx, r, false)
}

func (c *control) setConnected(ctx context.Context, r *transport.ConnectRequest, up bool) (*transport.ConnectReply, error) {
	n := c.n
	if reply, ok, err := forward(n, r.Node, func(api transport.ControlServer) (*transport.ConnectReply, error) {
		fwd := &transport.ConnectRequest{Volume: r.Volume, Node: r.Node, DiscardMyData: r.DiscardMyData, Yes: r.Yes}
		if up {
			return api.Connect(ctx, fwd)
		}
		return api.Disconnect(ctx, fwd)
	}); ok {
		return reply, err
	}
	v, err := n.volume(r.Volume)
	if err != nil {
		return nil, grpcError(err)
	}
	if r.DiscardMyData {
		if !up {
			return nil, status.Error(codes.InvalidArgument, "--discard-my-data goes with connect")
		}
		return c.resolveSplitBrain(ctx, v, r.Yes)
	}
	v.setAdminDown(!up)
	if up {
		v.resumePeers()
	}
	return &transport.ConnectReply{Node: n.name, Replication: v.status().Replication, Done: true}, nil
}

// forcePrimary promotes a node without a handover, for when the primary is
// gone. It refuses while a primary is reachable (use a switchover) and
// without Yes, saying what may be lost.
func (c *control) forcePrimary(ctx context.Context, r *transport.PrimaryRequest, vs transport.VolumeStatus) (*transport.PrimaryReply, error) {
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
	if cl := c.n.cl; cl != nil && cl.auto && cl.c.AwaitQuorum(ctx) {
		return c.forceByRaft(ctx, r)
	}
	api, err := c.n.peerAPI(r.Node)
	if err != nil {
		return nil, grpcError(err)
	}
	p, err := api.Promote(ctx, &transport.PromoteRequest{Volume: r.Volume, Force: true})
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "forced promotion of %s failed: %s", r.Node, status.Convert(err).Message())
	}
	now, _, _ := c.n.volumeStatus(ctx, r.Volume)
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: now.Epoch, NBDURI: p.NBDURI}, nil
}

// switchoverByRaft finishes a planned switchover in authority mode: the old
// primary handed over (d); raft records the new primary at the next epoch
// and the new primary takes over when it sees that. If raft does not record
// it, the old primary takes the volume back.
func (c *control) switchoverByRaft(ctx context.Context, r *transport.PrimaryRequest, old string, d *transport.DemoteReply, oldAPI transport.ControlServer) (*transport.PrimaryReply, error) {
	n := c.n
	// The old primary stopped its IO and found r.Node holding every
	// write: raft may know that before it is told the reconnection
	// finished.
	_, err := n.cl.c.Propose(ctx, replication.MarkUpToDateCommand(r.Volume, d.Epoch, r.Node))
	var va replication.VolumeAuthority
	if err == nil {
		va, err = n.cl.c.Propose(ctx, replication.PromoteCommand(r.Volume, d.Epoch, r.Node, false))
	}
	if err != nil {
		msg := err.Error()
		if _, rerr := oldAPI.Promote(ctx, &transport.PromoteRequest{Volume: r.Volume, Epoch: d.Epoch, Generation: d.Generation, Retake: true}); rerr != nil {
			return nil, status.Errorf(codes.Internal, "raft did not record %s as primary (%s) and %s could not take the volume back (%s): see replctl status", r.Node, msg, old, status.Convert(rerr).Message())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "raft did not record %s as primary (%s); %s is primary again", r.Node, msg, old)
	}
	uri, err := n.waitServing(ctx, r.Volume, r.Node)
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "raft made %s primary at epoch %d, but it does not serve yet: %v", r.Node, va.Epoch, err)
	}
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: va.Epoch, NBDURI: uri}, nil
}

// forceByRaft promotes r.Node through raft without a handover: the old
// primary's lease is waited out, every other node becomes Outdated.
func (c *control) forceByRaft(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	n := c.n
	va, _ := n.cl.c.Authority().Volume(r.Volume)
	nva, err := n.cl.c.Propose(ctx, replication.FailoverCommand(r.Volume, va.Epoch, r.Node, true, time.Now().UTC(), "forced by the operator (replctl primary --force)"))
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "forced promotion of %s through raft failed: %v", r.Node, err)
	}
	uri, err := n.waitServing(ctx, r.Volume, r.Node)
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "raft made %s primary at epoch %d, but it does not serve yet: %v", r.Node, nva.Epoch, err)
	}
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node, Epoch: nva.Epoch, NBDURI: uri}, nil
}

// waitServing waits until node serves volume; it returns the export.
func (n *Node) waitServing(ctx context.Context, volume, node string) (string, error) {
	var last string
	ok := waitFor(ctx, 15*time.Second, func() bool {
		cs, err := n.clusterStatus(ctx, 0)
		if err != nil {
			return false
		}
		for _, vs := range cs.Volumes {
			if vs.Name == volume && vs.Primary == node && vs.NBDURI != "" {
				last = vs.NBDURI
				return true
			}
		}
		return false
	})
	if !ok {
		return "", fmt.Errorf("%s is not serving %s after 15 s", node, volume)
	}
	return last, nil
}
