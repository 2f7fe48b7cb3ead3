package main

// The failover phase (issue 9): how long a volume is unwritable when its
// primary dies (automatic failover) and when the primary is moved on
// purpose (switchover), measured on a real cluster of replnode processes:
// data nodes alpha and beta and a witness on 127.0.0.1, raft and gossip
// on, a 64 MiB volume on sparse files.
//
//   - Failover: one writer writes 4 KiB blocks at queue depth 1 through NBD
//     to whichever node serves, reconnecting after an error. The primary's
//     replnode gets SIGKILL; the time is from the kill to the first write
//     the other node acknowledges, and the nodes' events split it: raft
//     committing the new primary, that node serving, the client's first
//     write. The first kill waits until raft's leader is not the primary
//     (a settled cluster). The killed node is restarted and the
//     next run waits until it is an UpToDate Secondary that raft records
//     UpToDate, then kills the other node (the runs alternate).
//   - Switchover: no NBD client is connected (a switchover is refused while
//     the old primary has clients). The time is from the start of
//     `replctl primary vol0 --node OTHER --addr WITNESS` to the first write
//     the new primary acknowledges through a fresh NBD connection; the
//     command's own duration is reported beside it.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

const (
	fvVol       = "vol0"
	fvSize      = 64 << 20
	fvALExtents = 61
	fvBlock     = 4096
	fvWitness   = "witness"

	fvOpTimeout   = 3 * time.Second        // bounds each NBD write
	fvDialTimeout = 2 * time.Second        // bounds each connect + handshake
	fvBackoff     = 20 * time.Millisecond  // between two rounds of connection attempts
	fvPoll        = 100 * time.Millisecond // status polling

	fvGoalMedian = 2 * time.Second
	fvGoalWorst  = 5 * time.Second

	// A failover or switchover that takes longer than this is an error
	// (the cluster is stuck), not a figure.
	fvGiveUp = 60 * time.Second
	// How long a restarted node may take to be an UpToDate Secondary
	// again, and the cluster to be in sync at the start.
	fvSyncTimeout = 2 * time.Minute
)

// fvDataNodes are the failover phase's data nodes, and every cluster's
// that names none of its own (fvCluster.dataNodes): the failover runs
// alternate the primary between these two.
var fvDataNodes = []string{"alpha", "beta"}

// ---------------------------------------------------------------------------
// report

// failoverReport is the phase's result (JSON "failover").
type failoverReport struct {
	Setup      string       `json:"setup"`
	Runs       int          `json:"runs"`
	Failover   *phaseTiming `json:"failover,omitempty"`
	Switchover *phaseTiming `json:"switchover,omitempty"`
	// SwitchoverCommand is the duration of `replctl primary` alone.
	SwitchoverCommand *phaseTiming `json:"switchover_command,omitempty"`
	Goal              string       `json:"goal"`
	Status            string       `json:"status"` // PASS, MISS, or n/a when the failover runs did not all complete
	Error             string       `json:"error,omitempty"`
}

type phaseTiming struct {
	MedianS float64     `json:"median_s"`
	WorstS  float64     `json:"worst_s"`
	Runs    []runTiming `json:"runs"`
}

type runTiming struct {
	From    string  `json:"from"` // the primary before the run
	To      string  `json:"to"`   // the primary after it
	Seconds float64 `json:"seconds"`
	// Where a failover's time went, by the events the nodes recorded
	// (the same machine's clock): DecidedS from the kill to raft's
	// leader committing the new primary (the "failover" event: gossip
	// and raft saw the primary gone, its lease ran out), PromotedS to
	// the new primary serving (its "promoted" event). The rest, to
	// Seconds, is the client's: finding the new primary and writing.
	DecidedS  float64 `json:"decided_s,omitempty"`
	PromotedS float64 `json:"promoted_s,omitempty"`
}

func (p *phaseTiming) add(from, to string, d time.Duration) {
	p.Runs = append(p.Runs, runTiming{From: from, To: to, Seconds: d.Seconds()})
	var xs []float64
	for _, r := range p.Runs {
		xs = append(xs, r.Seconds)
	}
	p.MedianS = median(xs)
	p.WorstS = 0
	for _, x := range xs {
		p.WorstS = max(p.WorstS, x)
	}
}

func (r *failoverReport) setStatus() {
	r.Status = "n/a"
	f := r.Failover
	if f == nil || len(f.Runs) < r.Runs {
		return
	}
	r.Status = "MISS"
	if f.MedianS <= fvGoalMedian.Seconds() && f.WorstS <= fvGoalWorst.Seconds() {
		r.Status = "PASS"
	}
}

func printFailover(w io.Writer, r *failoverReport) {
	fmt.Fprintf(w, "failover and switchover: %s, %d runs each\n", r.Setup, r.Runs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  \tmedian\tworst\truns (s)\n")
	line := func(label string, p *phaseTiming) {
		if p == nil || len(p.Runs) == 0 {
			fmt.Fprintf(tw, "  %s\t-\t-\t-\n", label)
			return
		}
		var runs []string
		for _, x := range p.Runs {
			runs = append(runs, strconv.FormatFloat(x.Seconds, 'f', 2, 64))
		}
		fmt.Fprintf(tw, "  %s\t%.3fs\t%.3fs\t%s\n", label, p.MedianS, p.WorstS, strings.Join(runs, " "))
	}
	line("failover (kill -9 primary -> first write on the other)", r.Failover)
	if f := r.Failover; f != nil && len(f.Runs) > 0 {
		part := func(label string, of func(runTiming) float64) {
			var xs []string
			for _, x := range f.Runs {
				xs = append(xs, strconv.FormatFloat(of(x), 'f', 2, 64))
			}
			fmt.Fprintf(tw, "    %s\t\t\t%s\n", label, strings.Join(xs, " "))
		}
		part("kill -> raft commits the new primary", func(x runTiming) float64 { return x.DecidedS })
		part("  -> the new primary serves", func(x runTiming) float64 { return x.PromotedS - x.DecidedS })
		part("  -> the client's first write on it", func(x runTiming) float64 { return x.Seconds - x.PromotedS })
	}
	line("switchover (replctl primary start -> first write on the new)", r.Switchover)
	line("  replctl primary alone", r.SwitchoverCommand)
	tw.Flush()
	got := ""
	if f := r.Failover; f != nil && len(f.Runs) > 0 {
		got = fmt.Sprintf(" (median %.3fs, worst %.3fs over %d runs)", f.MedianS, f.WorstS, len(f.Runs))
	}
	fmt.Fprintf(w, "  goal: %s%s: %s\n", r.Goal, got, r.Status)
	if r.Error != "" {
		fmt.Fprintf(w, "  phase failed: %s\n", r.Error)
	}
}

// failoverPhase runs the failover and then the switchover runs. It returns
// what it measured also on error (rep.Error says what went wrong).
func (b *bench) failoverPhase(ctx context.Context) (rep *failoverReport, err error) {
	runs := b.cfg.failoverRuns
	rep = &failoverReport{
		Setup: fmt.Sprintf("data nodes alpha+beta and a witness (replnode processes, raft+gossip on 127.0.0.1), %s volume, protocol C, 4 KiB writes at qd1 through NBD; the first kill once raft's leader is not the primary",
			fmtSize(fvSize)),
		Runs: runs,
		Goal: fmt.Sprintf("failover median <= %s, never over %s", fvGoalMedian, fvGoalWorst),
	}
	c := &fvCluster{b: b, nodes: map[string]*fvNode{}, used: map[int]bool{}}
	defer func() {
		if err != nil {
			err = c.failed(err)
			rep.Error = err.Error()
		}
		c.stopAll()
		rep.setStatus()
	}()
	if err := c.setup(ctx); err != nil {
		return rep, err
	}
	logf("failover: starting alpha, beta and the witness")
	if err := c.startAll(ctx); err != nil {
		return rep, err
	}
	if _, err := c.waitServing(ctx, fvSyncTimeout); err != nil {
		return rep, err
	}
	// In a settled cluster raft's leader is not a primary (a leader that
	// is one hands its leadership off, once it has led for
	// cluster.LeadershipSettle): the runs measure that, not the moment
	// after the first election, when killing the primary can also kill
	// the leader (an election, then a new leader's wait of a lease).
	if err := c.waitLeaderNotPrimary(ctx, "alpha"); err != nil {
		return rep, err
	}
	rep.Failover = &phaseTiming{}
	if err := c.failovers(ctx, runs, rep.Failover); err != nil {
		return rep, fmt.Errorf("failover: %w", err)
	}
	rep.Switchover, rep.SwitchoverCommand = &phaseTiming{}, &phaseTiming{}
	if err := c.switchovers(ctx, runs, rep.Switchover, rep.SwitchoverCommand); err != nil {
		return rep, fmt.Errorf("switchover: %w", err)
	}
	return rep, nil
}

// ---------------------------------------------------------------------------
// the cluster

type fvNode struct {
	name                                    string
	witness                                 bool
	control, replication, nbd, raft, gossip string
	proc                                    *proc
	starts                                  int
	killed                                  bool // by kill, and not restarted since
}

type fvCluster struct {
	b                 *bench
	label             string // names the processes and their logs
	dir, cfgPath      string
	replnode, replctl string
	nodes             map[string]*fvNode
	// dataNodes are the nodes that hold a replica, alpha (the primary)
	// first; nil: fvDataNodes. replvol-nodes3 has three.
	dataNodes []string
	order     []string // the data nodes[, witness]
	primary   string   // the primary, as the runs left it
	used      map[int]bool

	// What the config says.
	raft          bool  // raft, gossip and a witness; failover: auto
	size          int64 // the volume's
	alExtents     int   // 0: the default
	readBalancing string
	checksumsOff  bool              // checksums: off (the volume's metadata is laid out without them)
	disks         map[string]string // data node -> backing file or device (of vol0)
	// volumes, when set, are the volumes instead of vol0 alone, each
	// node's disk of each at volumeDisk (the idle phase).
	volumes []string
	// startTimeout bounds a start until the control address answers
	// (0: 30 s); a node opens every volume before it listens.
	startTimeout time.Duration
}

// data is the cluster's data nodes, alpha (the primary) first.
func (c *fvCluster) data() []string {
	if len(c.dataNodes) == 0 {
		return fvDataNodes
	}
	return c.dataNodes
}

// disk is node's backing file of vol.
func (c *fvCluster) disk(vol, node string) string {
	if len(c.volumes) == 0 {
		return c.disks[node]
	}
	return c.volumeDisk(vol, node)
}

// volumeDisk is where node's disk of vol is when c.volumes is set.
func (c *fvCluster) volumeDisk(vol, node string) string {
	return filepath.Join(c.dir, "disks-"+node, vol+".img")
}

// setup builds the binaries and writes the config and the backing files.
func (c *fvCluster) setup(ctx context.Context) error {
	b := c.b
	c.label, c.raft, c.size, c.alExtents = "failover", true, fvSize, fvALExtents
	c.dir = filepath.Join(b.tmp, "failover")
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	if err := c.build(ctx); err != nil {
		return err
	}
	devSize, err := metadata.InternalDeviceSizeFor(fvSize, fvALExtents, len(fvDataNodes)-1, true)
	if err != nil {
		return err
	}
	c.order = append(append([]string(nil), fvDataNodes...), fvWitness)
	if err := c.allocate(); err != nil {
		return err
	}
	if err := c.dataDisks(devSize, false); err != nil {
		return err
	}
	c.primary = "alpha"
	return c.writeConfig()
}

// dataDisks creates each data node's backing file of vol0 in c.dir,
// devSize bytes, its blocks allocated (preallocate) or sparse.
func (c *fvCluster) dataDisks(devSize int64, preallocate bool) error {
	c.disks = map[string]string{}
	for _, name := range c.order {
		if c.nodes[name].witness {
			continue
		}
		img := filepath.Join(c.dir, name+".img")
		if preallocate {
			if err := prealloc(img, devSize); err != nil {
				return err
			}
			c.disks[name] = img
			continue
		}
		f, err := os.Create(img)
		if err != nil {
			return err
		}
		err = f.Truncate(devSize) // sparse
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		c.disks[name] = img
	}
	return nil
}

// startAll starts the replnode of every node of c.order.
func (c *fvCluster) startAll(ctx context.Context) error {
	for _, n := range c.order {
		if err := c.start(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// waitServing waits until alpha is vol0's primary and serves NBD, every
// replica in sync (inSync), and returns alpha's status of vol0.
func (c *fvCluster) waitServing(ctx context.Context, timeout time.Duration) (*transport.VolumeStatus, error) {
	what := fmt.Sprintf("alpha primary, all %d replicas (%s) in sync", len(c.data()), strings.Join(c.data(), ", "))
	if c.raft {
		what += " and UpToDate in raft"
	}
	return c.waitStatus(ctx, "alpha", what, timeout, func(v *transport.VolumeStatus) bool {
		return v.Primary == "alpha" && v.NBDURI != "" && c.inSync(v)
	})
}

// build builds replnode and, unless there is one, replctl.
func (c *fvCluster) build(ctx context.Context) error {
	b := c.b
	var err error
	if c.replnode, err = b.goBuild(ctx, "./cmd/replnode"); err != nil {
		return err
	}
	switch {
	case b.cfg.replctl != "":
		c.replctl = b.cfg.replctl
	case b.replctlBin != "":
		c.replctl = b.replctlBin
	default:
		if c.replctl, err = b.goBuild(ctx, "./cmd/replctl"); err != nil {
			return err
		}
		b.replctlBin = c.replctl
	}
	return nil
}

// allocate gives every node of c.order its addresses (the witness, named
// fvWitness, holds no data; raft and gossip only with c.raft).
func (c *fvCluster) allocate() error {
	if c.nodes == nil {
		c.nodes = map[string]*fvNode{}
	}
	if c.used == nil {
		c.used = map[int]bool{}
	}
	var err error
	for _, name := range c.order {
		n := &fvNode{name: name, witness: name == fvWitness}
		for _, a := range []struct {
			dst *string
			udp bool
			use bool
		}{{&n.control, false, true}, {&n.replication, false, !n.witness}, {&n.nbd, false, !n.witness}, {&n.raft, false, c.raft}, {&n.gossip, true, c.raft}} {
			if !a.use {
				continue
			}
			if *a.dst, err = c.port(a.udp); err != nil {
				return err
			}
		}
		c.nodes[name] = n
	}
	return nil
}

// writeConfig writes the cluster's config file (again: a restart picks up
// a changed readBalancing).
func (c *fvCluster) writeConfig() error {
	var cfg strings.Builder
	if c.raft {
		cfg.WriteString("failover: auto\n")
	}
	cfg.WriteString("nodes:\n")
	for _, name := range c.order {
		n := c.nodes[name]
		fmt.Fprintf(&cfg, "  - {name: %s, control: %q", name, n.control)
		if !n.witness {
			fmt.Fprintf(&cfg, ", replication: %q, nbd: %q", n.replication, n.nbd)
		}
		if c.raft {
			role := "data"
			if n.witness {
				role = "witness"
			}
			fmt.Fprintf(&cfg, ", raft: %q, gossip: %q, role: %s", n.raft, n.gossip, role)
		}
		fmt.Fprintf(&cfg, ", state_dir: %q}\n", filepath.Join(c.dir, name))
	}
	cfg.WriteString("volumes:\n")
	volumes := c.volumes
	if len(volumes) == 0 {
		volumes = []string{fvVol}
	}
	for _, vol := range volumes {
		fmt.Fprintf(&cfg, "  - name: %s\n    size: %d\n    protocol: C\n    primary: alpha\n", vol, c.size)
		if c.alExtents > 0 {
			fmt.Fprintf(&cfg, "    al_extents: %d\n", c.alExtents)
		}
		if c.readBalancing != "" {
			fmt.Fprintf(&cfg, "    read_balancing: %s\n", c.readBalancing)
		}
		if c.checksumsOff {
			cfg.WriteString("    checksums: off\n")
		}
		cfg.WriteString("    disks:\n")
		for _, name := range c.order {
			if !c.nodes[name].witness {
				fmt.Fprintf(&cfg, "      %s: %q\n", name, c.disk(vol, name))
			}
		}
	}
	c.cfgPath = filepath.Join(c.dir, "cluster.yaml")
	return os.WriteFile(c.cfgPath, []byte(cfg.String()), 0o644)
}

// goBuild builds pkg (relative to the module root) into the bench's bin
// directory and returns the binary's path.
func (b *bench) goBuild(ctx context.Context, pkg string) (string, error) {
	bin := filepath.Join(b.tmp, "bin", filepath.Base(pkg))
	if b.built[pkg] {
		return bin, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	logf("building %s", pkg)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	if b.built == nil {
		b.built = map[string]bool{}
	}
	b.built[pkg] = true
	return bin, nil
}

// port returns a 127.0.0.1 address whose port is free (for TCP, and for
// UDP too when udp: memberlist listens on both) and was not given out
// before. It picks below the kernel's ephemeral range when it can, so
// that no outgoing connection takes the port of a node that is down
// while it restarts.
func (c *fvCluster) port(udp bool) (string, error) {
	lo, hi := 10000, 0
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	for range 2000 {
		p := 0
		if hi-lo >= 1000 {
			p = lo + rand.IntN(hi-lo)
			if c.used[p] {
				continue
			}
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		addr := l.Addr().(*net.TCPAddr)
		if udp {
			u, err := net.ListenPacket("udp", addr.String())
			if err != nil {
				l.Close()
				continue
			}
			u.Close()
		}
		l.Close()
		if c.used[addr.Port] {
			continue
		}
		c.used[addr.Port] = true
		return addr.String(), nil
	}
	return "", errors.New("no free port found")
}

// start (re)starts node name's replnode and waits until its control
// address answers.
func (c *fvCluster) start(ctx context.Context, name string) error {
	n := c.nodes[name]
	n.starts++
	n.killed = false
	p, err := c.b.start(fmt.Sprintf("%s-%s-%d", c.label, name, n.starts), nil,
		c.replnode, "--config", c.cfgPath, "--node", name, "--log-level", "warn")
	if err != nil {
		return err
	}
	n.proc = p
	timeout := 30 * time.Second
	if c.startTimeout > 0 {
		timeout = c.startTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", n.control, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("replnode %s exited (%v) before listening on %s; log %s", name, p.exitErr(), n.control, p.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replnode %s: %s not answering after %s: %v; log %s", name, n.control, timeout, err, p.log)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// kill ends node name's replnode with SIGKILL and reaps it.
func (c *fvCluster) kill(name string) {
	p := c.nodes[name].proc
	c.nodes[name].killed = true
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stopAll stops the replnode processes (SIGTERM, then SIGKILL).
func (c *fvCluster) stopAll() {
	for i := len(c.order) - 1; i >= 0; i-- {
		if n := c.nodes[c.order[i]]; n != nil && n.proc != nil {
			n.proc.stop()
		}
	}
}

// failed is err with the replnode processes that died by themselves named
// (call it before stopping them).
func (c *fvCluster) failed(err error) error {
	if d := c.diagnose(); d != "" {
		return fmt.Errorf("%w [%s]", err, d)
	}
	return err
}

// setupDataNodes builds the binaries and gives the data nodes (c.data()),
// no witness, their addresses; it returns the size of a backing file of
// a c.size volume with internal metadata (a bitmap per peer: every other
// data node).
func (c *fvCluster) setupDataNodes(ctx context.Context, sums bool) (int64, error) {
	if err := c.build(ctx); err != nil {
		return 0, err
	}
	c.order = append([]string(nil), c.data()...)
	if err := c.allocate(); err != nil {
		return 0, err
	}
	return metadata.InternalDeviceSizeFor(c.size, 0, len(c.order)-1, sums)
}

// diagnose names the replnode processes that exited by themselves.
func (c *fvCluster) diagnose() string {
	var msgs []string
	for _, name := range c.order {
		if n := c.nodes[name]; n != nil && n.proc != nil && !n.killed && n.proc.exited() {
			p := n.proc
			msgs = append(msgs, fmt.Sprintf("replnode %s (pid %d) exited: %v; log %s", name, p.cmd.Process.Pid, p.exitErr(), p.log))
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	s := strings.Join(msgs, "; ")
	if !c.b.cfg.keepLogs {
		s += " (rerun with -keep-logs to keep the logs)"
	}
	return s
}

// ---------------------------------------------------------------------------
// status

// inSync: every data node's replica is in the status, and every replica
// is UpToDate, Connected, nothing out of sync, and, with raft, raft
// records it UpToDate (a replica raft does not record UpToDate cannot be
// promoted).
func (c *fvCluster) inSync(v *transport.VolumeStatus) bool {
	for _, name := range c.data() {
		if v.Replica(name) == nil {
			return false
		}
	}
	for _, r := range v.Replicas {
		if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSyncBytes != 0 || c.raft && r.Raft != "UpToDate" {
			return false
		}
	}
	return true
}

// ctl runs replctl ARGS --addr <node's control>.
func (c *fvCluster) ctl(ctx context.Context, node string, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	args = append(args, "--addr", c.nodes[node].control)
	return exec.CommandContext(cctx, c.replctl, args...).CombinedOutput()
}

// statusAll is `replctl status --json` asked of node.
func (c *fvCluster) statusAll(ctx context.Context, node string) (*transport.ClusterStatus, error) {
	out, err := c.ctl(ctx, node, "status", "--json", "--timeout", "5s")
	if err != nil {
		return nil, fmt.Errorf("replctl status --json --addr %s: %v: %s", c.nodes[node].control, err, strings.TrimSpace(string(out)))
	}
	return parseStatus(out)
}

// status is vol0's entry in `replctl status --json` asked of node.
func (c *fvCluster) status(ctx context.Context, node string) (*transport.VolumeStatus, error) {
	st, err := c.statusAll(ctx, node)
	if err != nil {
		return nil, err
	}
	for i := range st.Volumes {
		if st.Volumes[i].Name == fvVol {
			return &st.Volumes[i], nil
		}
	}
	return nil, fmt.Errorf("no volume %s in the status", fvVol)
}

// peerView is what node itself says of its peers (its /api/node), for
// diagnostics.
func (c *fvCluster) peerView(ctx context.Context, node string) string {
	var lv struct {
		Volumes []struct {
			Name  string            `json:"name"`
			Peers []json.RawMessage `json:"peers"`
		} `json:"volumes"`
	}
	if err := c.apiNode(ctx, node, &lv); err != nil {
		return "/api/node: " + err.Error()
	}
	for _, v := range lv.Volumes {
		if v.Name == fvVol {
			var ps []string
			for _, p := range v.Peers {
				var buf bytes.Buffer
				if json.Compact(&buf, p) == nil {
					p = buf.Bytes()
				}
				ps = append(ps, string(p))
			}
			return strings.Join(ps, ", ")
		}
	}
	return "no " + fvVol + " in /api/node"
}

// waitStatus polls node's status until cond holds.
func (c *fvCluster) waitStatus(ctx context.Context, node, what string, timeout time.Duration, cond func(*transport.VolumeStatus) bool) (*transport.VolumeStatus, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		v, err := c.status(ctx, node)
		if err == nil && cond(v) {
			return v, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			last = err.Error()
		} else {
			js, _ := json.Marshal(v)
			last = string(js)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: not reached after %s; last status from %s: %s", what, timeout, node, last)
		}
		if err := sleepCtx(ctx, fvPoll); err != nil {
			return nil, err
		}
	}
}

// ---------------------------------------------------------------------------
// NBD

// fvBlockData is a block to write: a pattern with seq in its first bytes.
func fvBlockData(seq uint64) []byte {
	b := make([]byte, fvBlock)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	binary.LittleEndian.PutUint64(b, seq)
	return b
}

// dial connects to vol0's export on node within fvDialTimeout; a node that
// is not primary refuses the export in the handshake.
func (c *fvCluster) dial(ctx context.Context, node string) (*nbdtest.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, fvDialTimeout)
	defer cancel()
	return nbdtest.Dial(dctx, c.nodes[node].nbd, fvVol)
}

// fvWrite writes one block (write number seq) at off within fvOpTimeout.
func fvWrite(cl *nbdtest.Client, off uint64, seq uint64) error {
	_ = cl.Conn.SetDeadline(time.Now().Add(fvOpTimeout))
	return cl.Write(off, fvBlockData(seq), 0)
}

// fvDisconnect ends an NBD session cleanly (NBD_CMD_DISC, then the server
// closes), so the server no longer counts the client.
func fvDisconnect(cl *nbdtest.Client) {
	_ = cl.Conn.SetDeadline(time.Now().Add(2 * time.Second))
	_, _ = cl.Disconnect()
	_ = cl.Close()
}

// fvWriter writes 4 KiB blocks at queue depth 1 to whichever data node
// serves, reconnecting after every error, and tells a waiter about the
// first write a given node acknowledges after a given time.
type fvWriter struct {
	c      *fvCluster
	cancel context.CancelFunc
	done   chan struct{}

	mu      lockorder.Mutex
	watch   *fvWatch
	acks    map[string]int64
	failed  int64
	lastErr string
}

type fvWatch struct {
	node  string
	since time.Time
	ch    chan time.Time
}

func (c *fvCluster) startWriter(ctx context.Context) *fvWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &fvWriter{c: c, cancel: cancel, done: make(chan struct{}), acks: map[string]int64{}}
	go w.run(ctx)
	return w
}

// stop ends the writer; its connection is closed cleanly.
func (w *fvWriter) stop() {
	w.cancel()
	<-w.done
}

func (w *fvWriter) run(ctx context.Context) {
	defer close(w.done)
	var cl *nbdtest.Client
	node, next := "", 0
	defer func() {
		if cl != nil {
			fvDisconnect(cl)
		}
	}()
	blocks := uint64(fvSize / fvBlock)
	for seq := uint64(0); ctx.Err() == nil; {
		if cl == nil {
			// Try each data node, starting with the last one that served.
			for cl == nil && ctx.Err() == nil {
				for i := range fvDataNodes {
					k := (next + i) % len(fvDataNodes)
					c, err := w.c.dial(ctx, fvDataNodes[k])
					if err == nil {
						cl, node, next = c, fvDataNodes[k], k
						break
					}
					w.fail(fvDataNodes[k], "connect", err)
				}
				if cl == nil {
					_ = sleepCtx(ctx, fvBackoff)
				}
			}
			if cl == nil {
				return
			}
		}
		err := fvWrite(cl, (seq%blocks)*fvBlock, seq)
		at := time.Now()
		if err != nil {
			w.fail(node, "write", err)
			cl.Close()
			cl = nil
			_ = sleepCtx(ctx, fvBackoff)
			continue
		}
		seq++
		w.mu.Lock()
		w.acks[node]++
		if wt := w.watch; wt != nil && wt.node == node && at.After(wt.since) {
			wt.ch <- at
			w.watch = nil
		}
		w.mu.Unlock()
	}
}

func (w *fvWriter) fail(node, what string, err error) {
	w.mu.Lock()
	if what == "write" {
		w.failed++
	}
	w.lastErr = fmt.Sprintf("%s on %s: %v", what, node, err)
	w.mu.Unlock()
}

// expect returns a channel that receives the time of the first write node
// acknowledges after since.
func (w *fvWriter) expect(node string, since time.Time) <-chan time.Time {
	ch := make(chan time.Time, 1)
	w.mu.Lock()
	w.watch = &fvWatch{node: node, since: since, ch: ch}
	w.mu.Unlock()
	return ch
}

// wait waits for ch (from expect) at most timeout.
func (w *fvWriter) wait(ctx context.Context, ch <-chan time.Time, timeout time.Duration, what string) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case at := <-ch:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-t.C:
		w.mu.Lock()
		defer w.mu.Unlock()
		w.watch = nil
		return time.Time{}, fmt.Errorf("%s: none after %s (acknowledged so far: %v; %d writes failed; last error: %s)",
			what, timeout, w.acks, w.failed, w.lastErr)
	}
}

// ---------------------------------------------------------------------------
// the runs

func otherNode(node string) string {
	if node == fvDataNodes[0] {
		return fvDataNodes[1]
	}
	return fvDataNodes[0]
}

// failovers kills the primary runs times, alternating nodes, while the
// writer writes.
func (c *fvCluster) failovers(ctx context.Context, runs int, res *phaseTiming) error {
	w := c.startWriter(ctx)
	defer w.stop()
	for i := 1; i <= runs; i++ {
		from := c.primary
		to := otherNode(from)
		// The writer is writing through the primary.
		if _, err := w.wait(ctx, w.expect(from, time.Now()), 30*time.Second,
			fmt.Sprintf("run %d: a write acknowledged by %s", i, from)); err != nil {
			return err
		}
		ch := w.expect(to, time.Now())
		killed := time.Now()
		c.kill(from)
		at, err := w.wait(ctx, ch, fvGiveUp, fmt.Sprintf("run %d: after kill -9 %s, a write acknowledged by %s", i, from, to))
		if err != nil {
			return err
		}
		took := at.Sub(killed)
		res.add(from, to, took)
		run := &res.Runs[len(res.Runs)-1]
		decided, promoted := c.failoverEvents(ctx, to, killed)
		if !decided.IsZero() && !promoted.IsZero() {
			run.DecidedS, run.PromotedS = decided.Sub(killed).Seconds(), promoted.Sub(killed).Seconds()
		}
		c.primary = to
		logf("failover %d/%d: kill -9 %s -> first write acknowledged by %s after %s (raft committed it after %.2fs, %s served after %.2fs)",
			i, runs, from, to, took.Round(time.Millisecond), run.DecidedS, to, run.PromotedS)

		if err := c.start(ctx, from); err != nil {
			return err
		}
		if _, err := c.waitStatus(ctx, to, fmt.Sprintf("run %d: %s back as an UpToDate Secondary, both UpToDate in raft", i, from), fvSyncTimeout,
			func(v *transport.VolumeStatus) bool {
				r := v.Replica(from)
				return v.Primary == to && v.NBDURI != "" && r != nil && r.Role == "Secondary" && c.inSync(v)
			}); err != nil {
			return err
		}
	}
	return nil
}

// waitLeaderNotPrimary waits until raft's leader, as node's status says, is
// a node other than vol0's primary.
func (c *fvCluster) waitLeaderNotPrimary(ctx context.Context, node string) error {
	deadline := time.Now().Add(fvSyncTimeout)
	for {
		st, err := c.statusAll(ctx, node)
		if err == nil {
			if v, ok := st.Volume(fvVol); ok && st.Cluster.Leader != "" && st.Cluster.Leader != v.Primary {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("raft's leader is still vol0's primary %s after it, or no status (%v)", fvSyncTimeout, err)
		}
		if err := sleepCtx(ctx, fvPoll); err != nil {
			return err
		}
	}
}

// failoverEvents are when, after since, raft's leader recorded vol0's
// failover (its "failover" event: the leader is to or the witness) and
// when to was promoted (its "promoted" event), as the nodes' /api/node
// lists them; zero when not found.
func (c *fvCluster) failoverEvents(ctx context.Context, to string, since time.Time) (decided, promoted time.Time) {
	for _, node := range []string{to, fvWitness} {
		for _, e := range c.events(ctx, node) {
			if e.Volume != fvVol || e.Time.Before(since) {
				continue
			}
			switch {
			case e.Kind == "failover" && (decided.IsZero() || e.Time.Before(decided)):
				decided = e.Time
			case e.Kind == "promoted" && node == to && (promoted.IsZero() || e.Time.Before(promoted)):
				promoted = e.Time
			}
		}
	}
	return decided, promoted
}

// events are node's recent events (its /api/node); none on an error.
func (c *fvCluster) events(ctx context.Context, node string) []transport.Event {
	var st transport.NodeStatus
	if c.apiNode(ctx, node, &st) != nil {
		return nil
	}
	return st.Events
}

// apiNode decodes node's own view (its /api/node) into v.
func (c *fvCluster) apiNode(ctx context.Context, node string, v any) error {
	return getNodeView(ctx, c.nodes[node].control, 5*time.Second, v)
}

// getNodeView decodes the own view (/api/node) of the node whose control
// port is control into v, waiting for it no longer than timeout.
func getNodeView(ctx context.Context, control string, timeout time.Duration, v any) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+control+"/api/node", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// switchovers moves the primary runs times with `replctl primary`,
// alternating, with no NBD client connected.
func (c *fvCluster) switchovers(ctx context.Context, runs int, total, command *phaseTiming) error {
	for i := 1; i <= runs; i++ {
		from := c.primary
		to := otherNode(from)
		if _, err := c.waitStatus(ctx, from, fmt.Sprintf("run %d: %s primary, both replicas in sync and UpToDate in raft", i, from), fvSyncTimeout,
			func(v *transport.VolumeStatus) bool { return v.Primary == from && v.NBDURI != "" && c.inSync(v) }); err != nil {
			return err
		}
		var start, cmdDone time.Time
		for attempt := 1; ; attempt++ {
			start = time.Now()
			out, err := c.ctl(ctx, fvWitness, "primary", fvVol, "--node", to)
			cmdDone = time.Now()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A client that just disconnected may still be counted for a
			// moment: the switchover is refused and nothing changes.
			if strings.Contains(string(out), "NBD client") && attempt < 10 {
				logf("switchover %d/%d: refused (%s); again", i, runs, strings.TrimSpace(string(out)))
				if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("run %d: replctl primary %s --node %s failed after %s: %v: %s (%s's own view of its peers: %s)",
				i, fvVol, to, cmdDone.Sub(start).Round(time.Millisecond), err, strings.TrimSpace(string(out)), from, c.peerView(ctx, from))
		}
		// A fresh connection to the new primary, one write.
		var ackAt time.Time
		var last error
		for ackAt.IsZero() {
			if time.Since(start) > fvGiveUp {
				return fmt.Errorf("run %d: %s does not acknowledge a write %s after the switchover started: %v", i, to, fvGiveUp, last)
			}
			cl, err := c.dial(ctx, to)
			if err == nil {
				if err = fvWrite(cl, uint64(i)*fvBlock, uint64(i)); err == nil {
					ackAt = time.Now()
				}
				fvDisconnect(cl)
			}
			if err != nil {
				last = err
				if err := sleepCtx(ctx, fvBackoff); err != nil {
					return err
				}
			}
		}
		total.add(from, to, ackAt.Sub(start))
		command.add(from, to, cmdDone.Sub(start))
		c.primary = to
		logf("switchover %d/%d: %s -> %s: first write after %s (replctl primary took %s)", i, runs, from, to,
			ackAt.Sub(start).Round(time.Millisecond), cmdDone.Sub(start).Round(time.Millisecond))
	}
	return nil
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
