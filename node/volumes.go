package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/transport"
)

// Volumes at runtime. A SIGHUP hands the node its file's new config
// (ApplyVolumes): a volume the file added is opened and started, as at
// the node's start (a volume new here gets its metadata; the configured
// primary's disk is the truth and the others sync from it in full), and a
// volume the file dropped is stopped as at a clean shutdown (NBD requests
// in flight answered, bitmaps flushed, its state marked clean), its disk
// and metadata kept: added back, it resumes with a resync of what changed
// meanwhile. A primary with NBD clients is not stopped: the removal is
// refused, the volume keeps running, and the log, the event history and
// status say so until the clients are gone and the node is reloaded
// again (DRBD refuses to take down a device held open).
//
// A node whose file does not list a volume refuses its primary's stream
// with replication.RefusedNoVolume, and the primary tries again, so the
// order in which the nodes are reloaded does not matter. Status compares
// the nodes' files (ClusterStatus.ConfigDiffers) while they disagree.
//
// The node applies these itself, not through its control API: opening a
// disk that a caller names is no operation to offer on a port.

// VolumeOp is what ApplyVolumes did, or tried, with a volume.
type VolumeOp string

// The operations of ApplyVolumes.
const (
	VolumeAdded   VolumeOp = "added"
	VolumeRemoved VolumeOp = "removed"
)

// VolumeChange is what ApplyVolumes did, or would not do, with one volume.
type VolumeChange struct {
	Volume string
	Op     VolumeOp
	// Held: this node holds a disk of the volume; otherwise only its list
	// of the cluster's volumes changed (what status shows and the raft
	// leader fails over).
	Held bool
	// Err says why it was not done; the volume is then as it was.
	// errors.Is finds ErrHasClients (a removal of a primary with NBD
	// clients) and ErrVolumeConfig (the addition needs what only a
	// restart applies).
	Err error
}

// ErrVolumeConfig: a volume cannot be added online as the file gives it
// (it names nodes this node does not run with, or a disk a running volume
// uses).
var ErrVolumeConfig = errors.New("volume cannot be added online")

// configView is what the node's file lists as the node applied it
// (transport.NodeConfigStatus).
type configView struct {
	// kept: volumes the file dropped that the node runs on, and why.
	kept map[string]string
	// notAdded: volumes the file lists that the node could not add, and why.
	notAdded map[string]string
}

// ApplyVolumes adds the volumes of next that the node does not run and
// removes those it runs that next does not list. Every other difference
// between next and the running config is left alone (the caller says
// which need a restart). It returns what it did with each volume, sorted
// by volume. It must be called after Start and before Close; calls are
// serialised.
func (n *Node) ApplyVolumes(next *Config) []VolumeChange {
	n.volMu.Lock()
	defer n.volMu.Unlock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil
	}
	var changes []VolumeChange
	view := configView{kept: map[string]string{}, notAdded: map[string]string{}}
	n.applyPools(next)
	for _, vc := range n.config().Volumes {
		if next.Volume(vc.Name) != nil || vc.FromAPI() {
			continue // a volume created at run time is raft's, not the file's
		}
		_, held := vc.Disks[n.name]
		err := n.removeVolume(vc.Name, held)
		if err != nil {
			view.kept[vc.Name] = err.Error()
		}
		changes = append(changes, VolumeChange{Volume: vc.Name, Op: VolumeRemoved, Held: held, Err: err})
	}
	for _, vc := range next.Volumes {
		if n.config().Volume(vc.Name) != nil {
			continue
		}
		_, held := vc.Disks[n.name]
		err := n.addVolume(next, vc)
		if err != nil {
			view.notAdded[vc.Name] = err.Error()
		}
		changes = append(changes, VolumeChange{Volume: vc.Name, Op: VolumeAdded, Held: held, Err: err})
	}
	n.mu.Lock()
	n.view = view
	n.mu.Unlock()
	slices.SortFunc(changes, func(a, b VolumeChange) int { return strings.Compare(a.Volume, b.Volume) })
	return changes
}

// applyPools takes the storage pools of next's nodes into the running
// config, and makes the directories of this node's new ones.
func (n *Node) applyPools(next *Config) {
	cur := n.config()
	cfg := *cur
	cfg.Nodes = slices.Clone(cur.Nodes)
	changed := false
	for i, nc := range cfg.Nodes {
		if nn, ok := next.Node(nc.Name); ok && !slices.Equal(nn.Pools, nc.Pools) {
			cfg.Nodes[i].Pools = slices.Clone(nn.Pools)
			changed = true
		}
	}
	if !changed {
		return
	}
	n.cfg.Store(&cfg)
	n.makePoolDirs(&cfg)
	self, _ := cfg.Node(n.name)
	var names []string
	for _, p := range self.Pools {
		names = append(names, p.Name)
	}
	n.log.Info("storage pools reloaded", "pools", strings.Join(names, ","))
	n.event("", "pools-reloaded", fmt.Sprintf("%s's storage pools are now: %s", n.name, strings.Join(names, ", ")))
}

// CheckFile refuses a cluster file that lists the name of a volume
// created at run time (replnode's SIGHUP keeps the config it has).
func (n *Node) CheckFile(next *Config) error { return n.checkFile(next) }

// addVolume opens, registers and starts volume vc of the file next.
// Callers hold n.volMu.
func (n *Node) addVolume(next *Config, vc VolumeConfig) error {
	cur := n.config()
	if err := n.addable(cur, next, vc); err != nil {
		return err
	}
	_, held := vc.Disks[n.name]
	cfg := *cur
	cfg.Volumes = append(slices.Clone(cur.Volumes), vc)
	if !held {
		n.cfg.Store(&cfg)
		n.log.Info("volume added to the cluster's volumes; this node holds no disk of it", "volume", vc.Name)
		n.event(vc.Name, "volume-added", fmt.Sprintf("%s was added to the cluster file; %s holds no disk of it", vc.Name, n.name))
		return nil
	}
	sizeMax := vc.Size == SizeMax
	if sizeMax {
		// As at a start: the size this node recorded, or what its disk
		// holds for a volume it never ran.
		st, known, err := n.store.Volume(vc.Name)
		if err != nil {
			return fmt.Errorf("volume %s: %w", vc.Name, err)
		}
		if known {
			vc.Size = VolumeSize(st.Size)
		}
	}
	// The volumes running keep their path preference; the new one takes
	// its place in the balance of the whole file.
	v, err := n.openVolume(vc, sizeMax, balanceByGroup(&cfg, n.name)[vc.Name], n.cl != nil && n.cl.auto)
	if err != nil {
		return err
	}
	cfg.Volumes[len(cfg.Volumes)-1] = v.cfg
	v.start()
	vols := maps.Clone(n.volumes())
	vols[vc.Name] = v
	n.cfg.Store(&cfg)
	n.vols.Store(&vols)
	n.volsChanged.notify()
	s := v.state()
	role, disk := s.role(), s.st.Disk
	v.log.Info("volume added and started", "role", role, "disk", disk)
	n.event(vc.Name, "volume-added", fmt.Sprintf("%s was added to the cluster file: %s started it as %s (%s)", vc.Name, n.name, role, disk))
	return nil
}

// addable says why volume vc of next cannot be added to the running
// config cur, or nil: its nodes must be nodes this one runs with, with
// the same metadata ids, and its disk here must be no running volume's.
func (n *Node) addable(cur, next *Config, vc VolumeConfig) error {
	nodes := slices.Sorted(maps.Keys(vc.Disks))
	if !slices.Contains(nodes, vc.Primary) {
		nodes = append(nodes, vc.Primary)
	}
	for _, name := range nodes {
		if _, ok := cur.Node(name); !ok {
			return fmt.Errorf("%w: %s names node %s, which %s does not run with: the nodes changed, restart replnode to apply that", ErrVolumeConfig, vc.Name, name, n.name)
		}
		if cur.NodeID(name) != next.NodeID(name) {
			return fmt.Errorf("%w: %s names node %s, whose metadata id the file changed (%d, %d before): restart replnode to apply that", ErrVolumeConfig, vc.Name, name, next.NodeID(name), cur.NodeID(name))
		}
	}
	dc, held := vc.Disks[n.name]
	if !held {
		return nil
	}
	if n.self.IsWitness() {
		return fmt.Errorf("%w: %s gives the witness %s a disk", ErrVolumeConfig, vc.Name, n.name)
	}
	mine := diskFiles(dc)
	for name, v := range n.volumes() {
		for _, f := range diskFiles(v.cfg.Disks[n.name]) {
			if slices.Contains(mine, f) {
				return fmt.Errorf("%w: %s's disk %s on %s is the disk of %s, which runs: give it a disk of its own", ErrVolumeConfig, vc.Name, f, n.name, name)
			}
		}
	}
	return nil
}

// diskFiles are the files and devices a disk config opens.
func diskFiles(dc DiskConfig) []string {
	var out []string
	for _, p := range dc.Paths {
		out = append(out, p.Path)
	}
	if dc.Meta != "" {
		out = append(out, dc.Meta)
	}
	return out
}

// removeVolume stops volume name here (held: this node runs it) and takes
// it out of the running config; its disk and metadata stay. A primary
// with NBD clients is refused (ErrHasClients) and keeps running. Callers
// hold n.volMu.
func (n *Node) removeVolume(name string, held bool) error {
	cur := n.config()
	cfg := *cur
	cfg.Volumes = slices.DeleteFunc(slices.Clone(cur.Volumes), func(vc VolumeConfig) bool { return vc.Name == name })
	v, running := n.volumes()[name]
	if !held || !running {
		n.cfg.Store(&cfg)
		n.log.Info("volume removed from the cluster's volumes; this node held no disk of it", "volume", name)
		n.event(name, "volume-removed", fmt.Sprintf("%s was removed from the cluster file; %s held no disk of it", name, n.name))
		return nil
	}
	if err := v.clientsError("removing it from the cluster file"); err != nil {
		err = fmt.Errorf("%w. %s keeps running on %s: disconnect the clients, then reload replnode again (systemctl reload replnode)", err, name, n.name)
		v.log.Warn("not removed: the primary has NBD clients", "err", err)
		n.event(name, "remove-refused", err.Error())
		return err
	}
	// Out of every list first: no NBD client, replication stream, control
	// command or cluster step finds it from here on.
	vols := maps.Clone(n.volumes())
	delete(vols, name)
	n.cfg.Store(&cfg)
	n.vols.Store(&vols)
	n.volsChanged.notify()
	clean := v.stop()
	paths := strings.Join(diskFiles(v.cfg.Disks[n.name]), ", ")
	if !clean {
		v.log.Error("volume removed, but it did not stop cleanly (see above): its state is not marked clean", "disk", paths)
		n.event(name, "volume-removed", fmt.Sprintf("%s was removed from the cluster file: %s stopped it, but not cleanly (a flush or a state write failed); its disk %s and metadata are kept", name, n.name, paths))
		return nil
	}
	v.log.Info("volume removed: stopped cleanly, its disk and metadata are kept", "disk", paths)
	n.event(name, "volume-removed", fmt.Sprintf("%s was removed from the cluster file: %s stopped it cleanly and keeps its disk %s and metadata; added back, it resumes with a resync of what changed meanwhile", name, n.name, paths))
	return nil
}

// stop stops a volume taken out of the node while the node runs on, as a
// node's clean shutdown stops it: its export's requests in flight are
// answered (then the clients are told it shut down), everything is
// flushed, and its state is marked clean. It reports whether all of that
// worked.
func (v *Volume) stop() bool {
	// The volume's rules stop its IO now; the lease is stopped by
	// shutdown, which steps Stop again, once the clients are gone.
	if err := v.drive(volstate.Stop{Removed: true}, driveOptions{texts: func(volstate.Cause) reason {
		return because(CauseRemoved, "%s was removed from the cluster file", v.name)
	}}); err != nil {
		v.log.Error("stop the volume's IO", "err", err)
	}
	if nbd := v.node.nbd; nbd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := nbd.CloseExportContext(ctx, v.name); err != nil {
			v.log.Warn("NBD clients did not close in time; their connections were closed", "err", err)
		}
		cancel()
	}
	return v.shutdown()
}

// configStatus is what the node's file lists, as the node applied it.
func (n *Node) configStatus() *transport.NodeConfigStatus {
	n.mu.Lock()
	view := n.view
	n.mu.Unlock()
	names := map[string]bool{}
	for _, vc := range n.config().Volumes {
		if vc.FromAPI() {
			continue // raft's, not the file's
		}
		if _, kept := view.kept[vc.Name]; !kept {
			names[vc.Name] = true
		}
	}
	for name := range view.notAdded {
		names[name] = true
	}
	cs := &transport.NodeConfigStatus{Volumes: slices.Sorted(maps.Keys(names))}
	if cs.Volumes == nil {
		cs.Volumes = []string{}
	}
	if len(view.kept) > 0 {
		cs.Kept = maps.Clone(view.kept)
	}
	if len(view.notAdded) > 0 {
		cs.NotAdded = maps.Clone(view.notAdded)
	}
	return cs
}

// configDifferences compares the nodes' files (files: each reachable
// node's, nil from an older node, which is left out): every volume some
// file lists and another does not, and every volume a node does not run
// as its file says. Sorted by volume.
func configDifferences(files map[string]*transport.NodeConfigStatus) []transport.ConfigDifference {
	byVolume := map[string]*transport.ConfigDifference{}
	diff := func(volume string) *transport.ConfigDifference {
		d, ok := byVolume[volume]
		if !ok {
			d = &transport.ConfigDifference{Volume: volume}
			byVolume[volume] = d
		}
		return d
	}
	nodes := slices.Sorted(maps.Keys(files))
	for _, node := range nodes {
		f := files[node]
		if f == nil {
			continue
		}
		for _, volume := range f.Volumes {
			diff(volume)
		}
		for volume, why := range f.Kept {
			d := diff(volume)
			if d.NotApplied == nil {
				d.NotApplied = map[string]string{}
			}
			d.NotApplied[node] = "keeps running it: " + why
		}
		for volume, why := range f.NotAdded {
			d := diff(volume)
			if d.NotApplied == nil {
				d.NotApplied = map[string]string{}
			}
			d.NotApplied[node] = "could not add it: " + why
		}
	}
	var out []transport.ConfigDifference
	for _, volume := range slices.Sorted(maps.Keys(byVolume)) {
		d := byVolume[volume]
		for _, node := range nodes {
			if f := files[node]; f != nil {
				if slices.Contains(f.Volumes, volume) {
					d.In = append(d.In, node)
				} else {
					d.NotIn = append(d.NotIn, node)
				}
			}
		}
		if len(d.In) == 0 || len(d.NotIn) == 0 {
			d.In, d.NotIn = nil, nil // the files agree
		}
		if d.In != nil || d.NotApplied != nil {
			out = append(out, *d)
		}
	}
	return out
}
