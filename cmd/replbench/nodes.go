package main

// The production layout and the floor as fio targets (issue 31).
//
//   - replvol-nodes: two replnode processes, alpha (primary, serving NBD)
//     and beta, each with its own preallocated disk (--size of volume,
//     internal metadata), protocol C, on 127.0.0.1 with ports picked free,
//     no raft and no witness (failover is not measured here): the
//     failover phase's cluster (fvCluster) with its data nodes only.
//     Before every run both replicas are in sync (UpToDate, Connected,
//     nothing out of sync), as the demo is after its runs.
//   - replvol-nodes-nosums: the same with checksums at rest off.
//   - replvol-nodes3: the same as replvol-nodes with a third replnode
//     process, gamma: alpha replicates every write to beta and gamma
//     and, in protocol C, acknowledges it once both have written it.
//     Before every run all three replicas are in sync. Its 8K random
//     writes over replvol-nodes' in the same run are issue 31's "3
//     replicas >= 0.85x of 2".
//   - floor: cmd/replbench/floor's primary serving NBD and its replica, each
//     pwriting into its own preallocated file; the primary replies to a
//     write after the replica acknowledged it (protocol C).
//
// Each has a process per node, and the cost table shows each.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// nodesLayout is a target of replnode processes: its data nodes, alpha
// first (the cluster file and waitServing make alpha the primary), and
// whether checksums at rest are on.
type nodesLayout struct {
	label string // names its directory, processes and logs
	nodes []string
	sums  bool
}

// nodesLayouts are the targets startReplvolNodes starts.
var nodesLayouts = map[string]nodesLayout{
	tReplvolNodes:       {label: "nodes", nodes: fvDataNodes, sums: true},
	tReplvolNodesNoSums: {label: "nodes-nosums", nodes: fvDataNodes, sums: false},
	tReplvolNodes3:      {label: "nodes3", nodes: []string{"alpha", "beta", "gamma"}, sums: true},
}

// startReplvolNodes starts the target name of nodesLayouts and waits
// until it serves with every replica in sync.
func (b *bench) startReplvolNodes(ctx context.Context, name string) (*target, error) {
	l, ok := nodesLayouts[name]
	if !ok {
		return nil, fmt.Errorf("%s is not a target of replnode processes", name)
	}
	c := &fvCluster{b: b, label: l.label, size: b.cfg.size, primary: l.nodes[0], checksumsOff: !l.sums,
		dataNodes: l.nodes}
	c.dir = filepath.Join(b.tmp, l.label)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	devSize, err := c.setupDataNodes(ctx, l.sums)
	if err != nil {
		return nil, err
	}
	if err := c.dataDisks(devSize, true); err != nil {
		return nil, err
	}
	if err := c.writeConfig(); err != nil {
		return nil, err
	}
	if err := c.startAll(ctx); err != nil {
		return nil, c.failed(err)
	}
	v, err := c.waitServing(ctx, fvSyncTimeout)
	if err != nil {
		return nil, c.failed(err)
	}
	primary := l.nodes[0]
	if err := waitNBD(ctx, v.NBDURI, c.nodes[primary].proc, 30*time.Second); err != nil {
		return nil, err
	}
	t := &target{name: name, uri: v.NBDURI,
		version: fmt.Sprintf("replnode processes %s (%s), protocol C, internal metadata, checksums %s, primary %s",
			nodesRoles(l.nodes), runtime.Version(), onOff(l.sums), v.NBDURI),
		files: []string{c.dir}, control: c.nodes[primary].control, disk: c.disks[primary]}
	for i, n := range l.nodes {
		t.procs = append(t.procs, c.nodes[n].proc)
		role := n
		if i == 0 {
			role += " (primary)"
		}
		t.roles = append(t.roles, role)
	}
	t.settle = func(ctx context.Context) error {
		_, err := c.waitServing(ctx, protoSettleTimeout)
		return err
	}
	return t, nil
}

// nodesRoles names the data nodes, the first as the primary: "alpha
// (primary) and beta", "alpha (primary), beta and gamma".
func nodesRoles(nodes []string) string {
	names := append([]string{nodes[0] + " (primary)"}, nodes[1:]...)
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// startFloor builds cmd/replbench/floor and starts its replica, then its
// primary, each on a preallocated file of --size.
func (b *bench) startFloor(ctx context.Context) (*target, error) {
	bin, err := b.goBuild(ctx, "./cmd/replbench/floor")
	if err != nil {
		return nil, err
	}
	primaryImg, replicaImg := filepath.Join(b.tmp, "floor-primary.img"), filepath.Join(b.tmp, "floor-replica.img")
	for _, f := range []string{primaryImg, replicaImg} {
		if err := prealloc(f, b.cfg.size); err != nil {
			return nil, err
		}
	}
	replica, replicaAddr, err := b.startFloorProc(ctx, "floor-replica", bin, "replica", "-listen", "127.0.0.1:0", "-file", replicaImg)
	if err != nil {
		return nil, err
	}
	primary, addr, err := b.startFloorProc(ctx, "floor-primary", bin, "serve", "-listen", "127.0.0.1:0", "-file", primaryImg,
		"-size", strconv.FormatInt(b.cfg.size, 10), "-peer", replicaAddr)
	if err != nil {
		return nil, err
	}
	uri := "nbd://" + addr
	if err := waitNBD(ctx, uri, primary, 30*time.Second); err != nil {
		return nil, err
	}
	return &target{name: tFloor, uri: uri,
		version: fmt.Sprintf("%s: cmd/replbench/floor (%s), NBD primary + replica processes, protocol C over loopback TCP, pwrite", floorLabel, runtime.Version()),
		procs:   []*proc{primary, replica}, roles: []string{"primary", "replica"},
		files: []string{primaryImg, replicaImg}}, nil
}

// startFloorProc starts a floor process and waits for its "ready ADDR"
// line; it returns the address it listens on.
func (b *bench) startFloorProc(ctx context.Context, name, bin string, args ...string) (*proc, string, error) {
	lines := make(chan string, 8)
	p, err := b.start(name, lines, append([]string{bin}, args...)...)
	if err != nil {
		return nil, "", err
	}
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return nil, "", fmt.Errorf("%s exited before ready (%v); log: %s", name, p.exitErr(), p.log)
			}
			if addr, ok := strings.CutPrefix(strings.TrimSpace(l), "ready "); ok {
				return p, addr, nil
			}
		case <-deadline.C:
			return nil, "", fmt.Errorf("%s not ready after 30s; log: %s", name, p.log)
		case <-ctx.Done():
			return nil, "", ctx.Err()
		}
	}
}

// profileNodes takes, when --nodes-profile is set and t is a target of
// replnode processes running the 8K random writes at qd16, a CPU profile
// of its primary over the run's measured time; the channel gives its
// error once it is saved (at once nil when none is taken).
func (b *bench) profileNodes(ctx context.Context, t *target, w workload, round int) <-chan error {
	done := make(chan error, 1)
	if _, ok := nodesLayouts[t.name]; !ok || b.cfg.nodesProfile == "" || w.Name != "randwrite-8k" || t.control == "" {
		done <- nil
		return done
	}
	file := fmt.Sprintf("%s-%s-r%d.cpu.pprof", b.cfg.nodesProfile, t.name, round+1)
	go func() {
		// After fio's ramp, for the measured time (whole seconds).
		select {
		case <-time.After(b.cfg.ramp + time.Second):
		case <-ctx.Done():
			done <- ctx.Err()
			return
		}
		c := &fvCluster{nodes: map[string]*fvNode{"primary": {control: t.control}}}
		err := c.profile(ctx, "primary", "profile", max(b.cfg.runtime-time.Second, time.Second), file)
		if err == nil {
			logf("profile of %s's primary: %s", t.name, file)
		}
		done <- err
	}()
	return done
}
