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
//   - floor: cmd/replbench/floor's primary serving NBD and its replica, each
//     pwriting into its own preallocated file; the primary replies to a
//     write after the replica acknowledged it (protocol C).
//
// Both have a process per node, and the cost table shows each.
//
// Three replicas are not a target yet: fvCluster knows data nodes alpha
// and beta only (fvDataNodes), and a third would need its status checks
// and the failover runs' alternation to count the nodes they are given.

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

// startReplvolNodes starts replvol-nodes (sums: checksums at rest on) or
// replvol-nodes-nosums and waits until it serves with both replicas in
// sync.
func (b *bench) startReplvolNodes(ctx context.Context, sums bool) (*target, error) {
	name, label := tReplvolNodes, "nodes"
	if !sums {
		name, label = tReplvolNodesNoSums, "nodes-nosums"
	}
	c := &fvCluster{b: b, label: label, size: b.cfg.size, primary: "alpha", checksumsOff: !sums}
	c.dir = filepath.Join(b.tmp, label)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	devSize, err := c.setupDataNodes(ctx, sums)
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
	if err := waitNBD(ctx, v.NBDURI, c.nodes["alpha"].proc, 30*time.Second); err != nil {
		return nil, err
	}
	t := &target{name: name, uri: v.NBDURI,
		version: fmt.Sprintf("replnode processes alpha (primary) and beta (%s), protocol C, internal metadata, checksums %s, primary %s", runtime.Version(), onOff(sums), v.NBDURI),
		files:   []string{c.dir}, control: c.nodes["alpha"].control, disk: c.disks["alpha"]}
	for _, name := range fvDataNodes {
		t.procs = append(t.procs, c.nodes[name].proc)
	}
	t.roles = []string{"alpha (primary)", "beta"}
	t.settle = func(ctx context.Context) error {
		_, err := c.waitServing(ctx, protoSettleTimeout)
		return err
	}
	return t, nil
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
