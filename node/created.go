package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/node/control"
	"github.com/replvol/replvol/node/placement"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Volumes created at run time (replctl volume create, the CSI driver).
// The raft leader places the replicas (node/placement: the data nodes
// with the most free space in the pool) and records the volume in raft
// (replication.CreatedVolume). Every node derives the volumes it runs
// from its cluster file and those records (reconcileCreated, after each
// change of the state machine): a node chosen for a volume makes its
// sparse backing file in the pool, then adds the volume exactly as a
// SIGHUP adds one the file lists (addVolume: the metadata is created on
// the new disk, the first chosen node starts as primary); a node that
// holds none only learns of it (status, failover). A delete is a record
// gone: every node that runs the volume stops it as a removal from the
// file does (removeVolume), then removes its file and forgets its
// state. A node that was down meanwhile does so when it is back: each
// backing file has a marker beside it with the raft index of its
// create, and a file whose create the state machine has passed and no
// longer holds is freed.

// markerSuffix names the marker beside a backing file: the raft index of
// the volume's create.
const markerSuffix = ".created"

// errCreatedConflict: the cluster file lists a name raft records as a
// volume created at run time.
var errCreatedConflict = errors.New("a volume created at run time has that name")

// createdConfig is the volume config of def: a plain disk per chosen
// node, its pool's backing file (a path this node's file gives that
// node's pool; "" when it names no such pool there).
func createdConfig(cfg *Config, def replication.CreatedVolume) VolumeConfig {
	vc := VolumeConfig{Name: def.Name, Size: VolumeSize(def.Size), Protocol: def.Protocol, Primary: def.Nodes[0],
		Disks: make(map[string]DiskConfig, len(def.Nodes)), Pool: def.Pool}
	for _, node := range def.Nodes {
		path := ""
		if nc, ok := cfg.Node(node); ok {
			if p, ok := nc.Pool(def.Pool); ok && p.Dir != "" {
				path = poolImage(p.Dir, def.Name)
			}
		}
		vc.Disks[node] = SinglePath(path)
	}
	return vc
}

// dataNodes are the nodes of cfg that may hold disks, by name.
func dataNodes(cfg *Config) []string {
	var out []string
	for _, nc := range cfg.Nodes {
		if !nc.IsWitness() {
			out = append(out, nc.Name)
		}
	}
	slices.Sort(out)
	return out
}

// leader is the raft leader, and whether the node runs raft.
func (n *Node) leader() (string, bool) {
	if n.cl == nil {
		return "", false
	}
	return n.cl.c.Status().Leader, true
}

// noClusterError refuses what needs raft on a node that runs none.
func (n *Node) noClusterError(what string) error {
	return status.Errorf(codes.FailedPrecondition, "%s needs raft: node %s runs no cluster (give every node raft and gossip addresses in the cluster file)", what, n.name)
}

// createVolume places and records the volume r asks for, on the leader
// (the control API forwards it here, its defaults filled in). It looks
// at the state machine only once it is current (a barrier), and records
// the volume in the office it looked in: a node that lost its office
// midway answers Aborted, and the control API asks the next leader.
func (n *Node) createVolume(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	if n.cl == nil {
		return nil, n.noClusterError("volume create")
	}
	cfg := n.config()
	if vc := cfg.Volume(r.Name); vc != nil && !vc.FromAPI() {
		return nil, status.Errorf(codes.AlreadyExists, "%s is a volume of the cluster file: choose another name", r.Name)
	}
	office, err := n.cl.c.Barrier(ctx)
	if err != nil {
		return nil, leaderError(r.Name, err)
	}
	if def, ok := n.cl.c.Authority().Created(r.Name); ok {
		return n.createdAlready(def, r)
	}
	data := dataNodes(cfg)
	need, err := imageSize(cfg, r, data)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %v", r.Name, err)
	}
	chosen, err := placement.Place(placementNodes(control.AskPools(ctx, controlNode{n}, data), data, r.Pool), r.Pool, need, r.Replicas)
	switch {
	case errors.Is(err, placement.ErrTooFewNodes):
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s not created: %v", r.Name, err)
	case errors.Is(err, placement.ErrNoRoom):
		return nil, status.Errorf(codes.ResourceExhausted, "volume %s not created: %v", r.Name, err)
	case err != nil:
		return nil, err
	}
	def := replication.CreatedVolume{Name: r.Name, Size: r.Size, Pool: r.Pool, Protocol: r.Protocol, Nodes: chosen, RequestID: r.RequestID}
	if _, err := n.cl.c.ProposeAsLeader(ctx, replication.CreateVolumeCommand(def), office); err != nil {
		if errors.Is(err, replication.ErrVolumeExists) {
			// Another create of the name was recorded meanwhile, here:
			// this state machine has it.
			if def, ok := n.cl.c.Authority().Created(r.Name); ok {
				return n.createdAlready(def, r)
			}
			return nil, status.Errorf(codes.AlreadyExists, "volume %s not created: %v", r.Name, err)
		}
		return nil, leaderError(r.Name, err)
	}
	n.log.Info("volume created", "volume", r.Name, "size", r.Size, "pool", r.Pool, "nodes", strings.Join(chosen, ","))
	n.event(r.Name, "volume-created", fmt.Sprintf("%s created: %d bytes (%s) in pool %s on %s, protocol %s; %s is its primary",
		r.Name, r.Size, sizeText(int64(r.Size)), r.Pool, strings.Join(chosen, ", "), r.Protocol, chosen[0]))
	return &transport.VolumeCreateReply{Volume: n.createdInfo(def, replication.Authority{}), Created: true}, nil
}

// leaderError is what a create or a delete answers when raft did not
// take it: Aborted when this node no longer leads (the control API asks
// the next leader), Unavailable otherwise.
func leaderError(volume string, err error) error {
	if errors.Is(err, cluster.ErrLeadershipChanged) {
		return status.Errorf(codes.Aborted, "%s: the raft leader changed: %v", volume, err)
	}
	return status.Errorf(codes.Unavailable, "%s: raft did not take it (nothing changed; try again once the cluster has a quorum): %v", volume, err)
}

// createdAlready answers a create of a name raft records: the same
// definition is a retry, and succeeds without change; another is
// refused. Made under the request's own ID, the record is this create's:
// its first answer was cut off (a leader change between the record and
// the answer), and this one says, as that would have, that it was
// created.
func (n *Node) createdAlready(def replication.CreatedVolume, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	if def.Size == r.Size && def.Pool == r.Pool && def.Protocol == r.Protocol && len(def.Nodes) == r.Replicas {
		mine := def.RequestID != "" && def.RequestID == r.RequestID
		return &transport.VolumeCreateReply{Volume: n.createdInfo(def, n.cl.c.Authority()), Created: mine}, nil
	}
	return nil, status.Errorf(codes.AlreadyExists, "a volume %s exists with another definition (%s; asked: %d bytes in pool %s, %d replicas, protocol %s): choose another name, or delete it first",
		r.Name, def.Describe(), r.Size, r.Pool, r.Replicas, r.Protocol)
}

// imageSize is what each replica's backing file of the volume r asks for
// must hold: the volume and its internal metadata (checksums on), for
// r.Replicas nodes (the metadata holds a bitmap per peer).
func imageSize(cfg *Config, r *transport.VolumeCreateRequest, data []string) (uint64, error) {
	nodes := data[:max(1, min(r.Replicas, len(data)))]
	if len(data) == 0 {
		return 0, errors.New("the cluster file names no data node")
	}
	def := replication.CreatedVolume{Name: r.Name, Size: r.Size, Pool: r.Pool, Protocol: r.Protocol, Nodes: nodes}
	need, err := backing.RequiredSize(cfg, nodes[0], createdConfig(cfg, def))
	return uint64(need), err
}

// placementNodes is what placement needs to know of each data node's
// pool named pool, from the nodes' answers.
func placementNodes(pools []transport.PoolStatus, data []string, pool string) []placement.Node {
	byNode := map[string]*placement.Node{}
	for _, name := range data {
		byNode[name] = &placement.Node{Name: name}
	}
	for _, p := range pools {
		pn := byNode[p.Node]
		if pn == nil {
			continue
		}
		if why, ok := control.Unreachable(p); ok {
			pn.Unreachable = why
			continue
		}
		if p.Name == pool {
			pn.HasPool, pn.Unavailable, pn.Free = true, p.State, p.Free
		}
	}
	out := make([]placement.Node, 0, len(byNode))
	for _, name := range data {
		out = append(out, *byNode[name])
	}
	return out
}

// deleteVolume forgets a volume created at run time, on the leader.
func (n *Node) deleteVolume(ctx context.Context, name string) (*transport.VolumeDeleteReply, error) {
	if n.cl == nil {
		return nil, n.noClusterError("volume delete")
	}
	if vc := n.config().Volume(name); vc != nil && !vc.FromAPI() {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is a volume of the cluster file, not one created with replctl volume create: remove it from the file on every node and reload them (systemctl reload replnode); nothing was deleted", name)
	}
	office, err := n.cl.c.Barrier(ctx)
	if err != nil {
		return nil, leaderError(name, err)
	}
	if _, ok := n.cl.c.Authority().Created(name); !ok {
		return &transport.VolumeDeleteReply{}, nil
	}
	cs, err := n.clusterStatus(ctx, 0)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%s: cannot see whether it is mounted: %v; nothing was deleted", name, err)
	}
	if vs, found := cs.Volume(name); found && vs.Mount != nil {
		h := vs.Mount.Holder
		return nil, status.Errorf(codes.FailedPrecondition, "%s is mounted %s (since %s): unmount it first (%s); nothing was deleted",
			name, mountedWords(h), vs.Mount.Since.UTC().Format("2006-01-02 15:04:05 UTC"), umountWords(h))
	}
	if _, err := n.cl.c.ProposeAsLeader(ctx, replication.DeleteVolumeCommand(name), office); err != nil {
		return nil, leaderError(name, err)
	}
	n.log.Info("volume deleted", "volume", name)
	n.event(name, "volume-deleted", fmt.Sprintf("%s deleted: every node that holds it stops it and frees its storage", name))
	return &transport.VolumeDeleteReply{Deleted: true}, nil
}

// listVolumes lists the volumes of the file and of raft, by name.
func (n *Node) listVolumes(ctx context.Context) ([]transport.VolumeInfo, error) {
	cfg := n.config()
	var auth replication.Authority
	if n.cl != nil {
		// Read what raft committed up to now, not what this state
		// machine applied so far: a leader just elected (a primary hands
		// its leadership on by itself) may not have applied yet the
		// create its predecessor answered. A barrier makes it current,
		// and fails on a node that no longer leads.
		if _, err := n.cl.c.Barrier(ctx); err != nil {
			if errors.Is(err, cluster.ErrLeadershipChanged) {
				return nil, status.Errorf(codes.Aborted, "list the volumes: the raft leader changed: %v", err)
			}
			return nil, status.Errorf(codes.Unavailable, "list the volumes: raft cannot say what it records (try again once the cluster has a quorum): %v", err)
		}
		auth = n.cl.c.Authority()
	}
	out := []transport.VolumeInfo{}
	for _, vc := range cfg.Volumes {
		if vc.FromAPI() {
			continue
		}
		vi := transport.VolumeInfo{Name: vc.Name, Protocol: vc.ProtocolOrDefault(), Replicas: slices.Sorted(maps.Keys(vc.Disks)), Source: transport.VolumeFromConfig}
		if vc.Size > 0 {
			vi.Size = uint64(vc.Size)
		}
		if va, ok := auth.Volume(vc.Name); ok {
			vi.Primary = va.Primary
		}
		out = append(out, vi)
	}
	for _, def := range auth.Creates {
		out = append(out, n.createdInfo(def, auth))
	}
	slices.SortFunc(out, func(a, b transport.VolumeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// createdInfo is def as the control API shows it, its primary as auth
// records it.
func (n *Node) createdInfo(def replication.CreatedVolume, auth replication.Authority) transport.VolumeInfo {
	vi := transport.VolumeInfo{Name: def.Name, Size: def.Size, Pool: def.Pool, Protocol: def.Protocol,
		Replicas: slices.Clone(def.Nodes), Source: transport.VolumeFromAPI}
	if va, ok := auth.Volume(def.Name); ok {
		vi.Primary = va.Primary
	}
	return vi
}

// kickCreated asks createdLoop to look at raft's records again; it never
// blocks.
func (n *Node) kickCreated() {
	select {
	case n.createdKick <- struct{}{}:
	default:
	}
}

// createdLoop runs the volumes raft records as created, each time the
// cluster loop saw a change, until stop.
func (n *Node) createdLoop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-n.createdKick:
		}
		n.reconcileCreated()
	}
}

// reconcileCreated makes the node run what raft records: it stops and
// frees the volumes created at run time that raft no longer has, and
// makes and starts the ones it has and this node does not run yet.
func (n *Node) reconcileCreated() {
	auth, applied := n.cl.c.AuthorityAt()
	n.volMu.Lock()
	defer n.volMu.Unlock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return
	}
	for _, vc := range n.config().Volumes {
		if _, ok := auth.Creates[vc.Name]; vc.FromAPI() && !ok {
			n.dropCreated(vc)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(auth.Creates)) {
		def := auth.Creates[name]
		if vc := n.config().Volume(name); vc != nil {
			if !vc.FromAPI() {
				n.createdProblem(name, fmt.Sprintf("raft records %s as a volume created at run time, and %s's cluster file lists a volume of that name: %s runs the file's; rename one of them", name, n.name, n.name))
			}
			continue
		}
		n.addCreated(def)
	}
	n.collectDeleted(auth, applied)
	n.volsChanged.notify() // a waiter looks again (awaitVolume)
}

// addCreated makes this node's backing file of def (when it holds one)
// and adds the volume as a SIGHUP adds one.
func (n *Node) addCreated(def replication.CreatedVolume) {
	cfg := n.config()
	vc := createdConfig(cfg, def)
	next := *cfg
	next.Volumes = append(slices.Clone(cfg.Volumes), vc)
	if slices.Contains(def.Nodes, n.name) {
		path := vc.Disks[n.name].Paths[0].Path
		if path == "" {
			n.createdProblem(def.Name, fmt.Sprintf("%s was placed on %s in pool %s, which %s's cluster file does not name as a directory pool: add it to nodes[%s].pools and reload", def.Name, n.name, def.Pool, n.name, n.name))
			return
		}
		if err := n.makeImage(&next, vc, def.Index, path); err != nil {
			n.createdProblem(def.Name, fmt.Sprintf("%s: cannot make its backing file: %v", def.Name, err))
			return
		}
	}
	if err := n.addVolume(&next, vc); err != nil {
		n.createdProblem(def.Name, fmt.Sprintf("%s: not started: %v", def.Name, err))
		return
	}
	n.createdProblem(def.Name, "")
}

// makeImage makes the sparse backing file of volume vc at path, of the
// size its metadata needs, with the marker of the create at index beside
// it (written and synced BEFORE the file, so that a file without a
// marker is never this node's to free). A file of the same create made
// before (a restart midway) is kept; one of an earlier volume of the
// name is freed first.
func (n *Node) makeImage(next *Config, vc VolumeConfig, index uint64, path string) error {
	marker := strings.TrimSuffix(path, imageSuffix) + markerSuffix
	if old, err := readMarker(marker); err == nil && old == index {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	} else if err == nil {
		if err := n.freeImage(vc.Name, path); err != nil {
			return err
		}
	}
	need, err := backing.RequiredSize(next, n.name, vc)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := writeSynced(marker, []byte(strconv.FormatUint(index, 10)+"\n")); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(need)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return err
	}
	n.event(vc.Name, "backing-made", fmt.Sprintf("made %s, a sparse file of %d bytes (%s): %s and its metadata", path, need, sizeText(need), vc.Name))
	return nil
}

// dropCreated stops a volume raft no longer records, as a removal from
// the file does, then frees its backing file.
func (n *Node) dropCreated(vc VolumeConfig) {
	dc, held := vc.Disks[n.name]
	if v, running := n.volumes()[vc.Name]; running && held {
		// Looked at first, without removeVolume's log and event: this
		// runs again at each change of the cluster until the clients
		// are gone.
		if err := v.clientsError("stopping it after its delete"); err != nil {
			n.createdProblem(vc.Name, fmt.Sprintf("%s was deleted, but %s keeps running it until its NBD clients are gone (disconnect them): %v", vc.Name, n.name, err))
			return
		}
	}
	if err := n.removeVolume(vc.Name, held); err != nil {
		n.createdProblem(vc.Name, fmt.Sprintf("%s was deleted, but %s keeps running it: %v", vc.Name, n.name, err))
		return
	}
	n.createdProblem(vc.Name, "")
	if !held || dc.Paths[0].Path == "" {
		return
	}
	if err := n.freeImage(vc.Name, dc.Paths[0].Path); err != nil {
		n.createdProblem(vc.Name, fmt.Sprintf("%s was deleted and stopped, but its backing file stays: %v", vc.Name, err))
	}
}

// freeImage removes a deleted volume's backing file and its marker, and
// forgets its state here, so that a volume of the name made later starts
// afresh.
func (n *Node) freeImage(volume, path string) error {
	marker := strings.TrimSuffix(path, imageSuffix) + markerSuffix
	for _, p := range []string{path, marker} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return err
	}
	if err := n.store.DeleteVolume(volume); err != nil {
		return err
	}
	n.log.Info("deleted volume's backing file removed", "volume", volume, "file", path)
	n.event(volume, "backing-freed", fmt.Sprintf("%s is deleted: %s removed %s", volume, n.name, path))
	return nil
}

// collectDeleted frees the backing files of this node's directory pools
// whose volume was deleted while the node did not run it: the state
// machine (auth, as of the entry applied) has applied the file's create,
// and records no volume of that create.
func (n *Node) collectDeleted(auth replication.Authority, applied uint64) {
	self, _ := n.config().Node(n.name)
	running := n.volumes()
	for _, p := range self.Pools {
		if p.Dir == "" {
			continue
		}
		entries, err := os.ReadDir(p.Dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name, ok := strings.CutSuffix(e.Name(), markerSuffix)
			if !ok {
				continue
			}
			index, err := readMarker(filepath.Join(p.Dir, e.Name()))
			if err != nil || index > applied {
				continue // a create this state machine has not applied yet
			}
			if def, ok := auth.Creates[name]; ok && def.Index == index {
				continue
			}
			if _, ok := running[name]; ok {
				continue
			}
			if vc := n.config().Volume(name); vc != nil && !vc.FromAPI() {
				continue
			}
			if err := n.freeImage(name, poolImage(p.Dir, name)); err != nil {
				n.createdProblem(name, fmt.Sprintf("%s was deleted, but its backing file in %s stays: %v", name, p.Dir, err))
			}
		}
	}
}

// createdProblem logs and records why a created volume is not as raft
// says, once per volume and words; "" says it is again.
func (n *Node) createdProblem(volume, words string) {
	n.mu.Lock()
	was := n.createdProblems[volume]
	if words == "" {
		delete(n.createdProblems, volume)
	} else {
		n.createdProblems[volume] = words
	}
	n.mu.Unlock()
	if words == "" || words == was {
		return
	}
	n.log.Error(words, "volume", volume)
	n.event(volume, "created-volume-problem", words)
}

// checkFile refuses a cluster file that lists a volume raft records as
// created at run time (a SIGHUP then keeps the config the node has).
func (n *Node) checkFile(next *Config) error {
	if n.cl == nil {
		return nil
	}
	auth := n.cl.c.Authority()
	var names []string
	for _, vc := range next.Volumes {
		if _, ok := auth.Created(vc.Name); ok {
			names = append(names, vc.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%w: volumes %s of the file were created with replctl volume create (raft records them): rename them in the file, or delete the created ones first (replctl volume delete NAME --yes)",
		errCreatedConflict, strings.Join(names, ", "))
}

// readMarker reads the raft index a marker holds.
func readMarker(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// writeSynced writes a new file and syncs it and its directory.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
