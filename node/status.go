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
	"google.golang.org/grpc/status"
)

func (n *Node) nodeInfo(nc NodeConfig) transport.NodeInfo {
	info := transport.NodeInfo{Name: nc.Name, Control: nc.Control, Replication: nc.Replication, NBD: nc.NBD, Role: RoleData}
	if nc.IsWitness() {
		info.Role = RoleWitness
	}
	if nc.Name != n.name {
		return info
	}
	info.Version = n.opts.Version
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
	ns := &transport.NodeStatus{Node: n.nodeInfo(n.self), Failover: n.failoverReasons(), Config: n.configStatus(), Pools: n.pools()}
	ns.Node.Alive = true
	ns.Node.FailedReload = n.failedReloadView()
	vols := n.volumes()
	for _, name := range slices.Sorted(maps.Keys(vols)) {
		lv := vols[name].status()
		if c := n.mountClaimOf(vols[name], n.nbdClients(name)); c != nil {
			lv.Mount = &transport.MountStatus{Holder: c.holder, Since: c.taken, Connections: c.open}
		}
		ns.Volumes = append(ns.Volumes, lv)
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
			info.Version = views[i].Node.Version
			info.FailedReload = views[i].Node.FailedReload
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
	for i := range cfg.Nodes {
		if views[i] != nil {
			cs.Pools = append(cs.Pools, views[i].Pools...)
		}
	}
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
		if primaryView != nil {
			vs.Mount = primaryView.Mount
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
				rs.SplitBrainRule = lv.SplitBrainRule
				rs.Paths = lv.Paths
				rs.Integrity = lv.Integrity.Replica()
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
			if _, runs := byNode[node][vc.Name]; !runs {
				if f, answered := files[node]; answered && f != nil && !slices.Contains(f.Volumes, vc.Name) {
					// The node is alive and answered: it runs no replica
					// because its file does not list the volume (the
					// primary's refusal, when it has one, says so too).
					rs.Reachable = true
					if rs.ReasonCode != transport.ReasonNoSuchVolume {
						rs.Reason = fmt.Sprintf("%s is alive, but %s is not in its cluster file: it runs no replica of %s until its file has it and it is reloaded", node, vc.Name, vc.Name)
						rs.ReasonCode = transport.ReasonNoSuchVolume
					}
				}
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
