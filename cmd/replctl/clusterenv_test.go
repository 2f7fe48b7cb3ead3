package main

// Clusters of N replnode processes for the cluster-membership tests
// (issue 9): data nodes alpha, beta, gamma, ..., an optional witness,
// raft and gossip addresses, failover mode, hooks, and optionally one
// network namespace per node (netns_test.go).

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/testport"
	"github.com/replvol/replvol/metadata"
)

// dataNodeNames are the data nodes of newProcClusterN, in order.
var dataNodeNames = []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}

// witnessName is the witness node of newProcClusterN.
const witnessName = "witness"

// clusterOpts shapes newProcClusterN's config. The zero value is today's
// two-node config on 127.0.0.1 with a 64 MiB volume.
type clusterOpts struct {
	// DataNodes is how many data nodes (default 2): alpha, beta, gamma, ...
	DataNodes int
	// Witness adds node "witness" (role: witness): no disks, no NBD,
	// only control, raft and gossip addresses. It needs Raft.
	Witness bool
	// Raft gives every node raft and gossip addresses.
	Raft bool
	// Failover is written as the top-level failover (auto|off); "" leaves
	// it out.
	Failover string
	// Size is the volume's size (default 64 MiB), ALExtents its al_extents
	// (default 61), DiskSize each backing file's size (0: exactly the
	// volume plus its internal metadata).
	Size, ALExtents, DiskSize int64
	// PeerTimeout is the volume's peer_timeout (0: left out).
	PeerTimeout time.Duration
	// OnPromote and OnDemote are the volume's hooks, shell commands.
	OnPromote, OnDemote string
	// RecordHooks makes both hooks append a line to hooks.log in the
	// cluster's directory (read by hookRuns); it replaces OnPromote and
	// OnDemote.
	RecordHooks bool
	// Netns runs each node in its own network namespace on a bridge
	// (10.77.X.N addresses); partition and heal then work.
	Netns bool
	// GossipNet (with Netns) gives gossip a network of its own, on each
	// node's eth1: a partition (eth0 down) leaves gossip up.
	GossipNet bool
	// Protocol is the volume's protocol (A, B or C; default C),
	// OnCongestion its on_congestion ("": left out, the protocol's
	// default), SendBuffer its send_buffer and MaxLag its max_lag, in
	// bytes (0: left out).
	Protocol, OnCongestion string
	SendBuffer, MaxLag     int64
	// TLS runs replctl certs init on the file (into DIR/tls) and gives it
	// the tls: section: every link is then mutual TLS, the harness's
	// replctl calls (ctl, ctlFrom, status) pass --tls-dir, and its
	// /api/... reads (localView, apiGet) go over HTTPS. NBDTLS is
	// tls.nbd (required, optional or off; "" leaves it out, which means
	// required).
	TLS    bool
	NBDTLS string
	// Pools gives each data node a storage pool "default", the directory
	// poolDir(name), for volumes made with replctl volume create.
	Pools bool
	// Volumes is how many volumes (default 1): vol0, then idle0001,
	// idle0002, ..., each of Size on a backing file of its own per data
	// node, alpha their first primary.
	Volumes int
}

// extraVolumeName is the name of newProcClusterN's volume i (1-based),
// past vol0.
func extraVolumeName(i int) string { return fmt.Sprintf("idle%04d", i) }

// newProcClusterN writes the config opts describes and starts nothing
// yet. Volume vol0's first primary is alpha. On 127.0.0.1 every port is a
// free one (gossip's free for both TCP and UDP); in namespaces each node
// has its own address and the ports are fixed.
func newProcClusterN(t *testing.T, opts clusterOpts) *procCluster {
	t.Helper()
	if opts.DataNodes == 0 {
		opts.DataNodes = 2
	}
	if opts.DataNodes < 1 || opts.DataNodes > len(dataNodeNames) {
		t.Fatalf("newProcClusterN: %d data nodes: want 1..%d", opts.DataNodes, len(dataNodeNames))
	}
	if opts.Witness && !opts.Raft {
		t.Fatalf("newProcClusterN: a witness only votes in raft: set Raft too")
	}
	if opts.Size == 0 {
		opts.Size = 64 << 20
	}
	if opts.ALExtents == 0 {
		opts.ALExtents = 61
	}
	if opts.Protocol == "" {
		opts.Protocol = "C"
	}
	dir := t.TempDir()
	// The metadata holds a bitmap per peer.
	devSize, err := metadata.InternalDeviceSizeFor(opts.Size, int(opts.ALExtents), max(opts.DataNodes-1, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	if opts.DiskSize != 0 {
		if opts.DiskSize < devSize {
			t.Fatalf("a %d-byte disk cannot hold a %d-byte volume and its metadata (%d bytes)", opts.DiskSize, opts.Size, devSize)
		}
		devSize = opts.DiskSize
	}
	c := &procCluster{demo: &demo{t: t, dir: dir, nodes: map[string]demoNode{}}, procs: map[string]*exec.Cmd{}, bin: replnode(t)}
	c.names = append([]string(nil), dataNodeNames[:opts.DataNodes]...)
	if opts.Witness {
		c.names = append(c.names, witnessName)
	}
	if opts.Netns {
		c.lab = newNetLab(t)
		if opts.GossipNet {
			c.lab.addSideNetwork()
		}
	}
	// Registered before any node starts, so it runs after they stopped
	// (and before the lab's removal, registered earlier).
	t.Cleanup(c.logTails)

	var cfg strings.Builder
	if opts.Failover != "" {
		fmt.Fprintf(&cfg, "failover: %s\n", opts.Failover)
	}
	cfg.WriteString("nodes:\n")
	disks := map[string]string{}
	for _, name := range c.names {
		witness := name == witnessName
		n := demoNode{Name: name}
		if opts.Raft {
			n.Role = "data"
			if witness {
				n.Role = "witness"
			}
		}
		if c.lab != nil {
			ip := c.lab.addNode(name)
			at := func(port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
			n.Control = at(7800)
			if !witness {
				n.Replication, n.NBD = at(7801), at(7802)
			}
			if opts.Raft {
				n.Raft, n.Gossip = at(7803), at(7804)
				if opts.GossipNet {
					n.Gossip = net.JoinHostPort(c.lab.sideIP(name), "7804")
				}
			}
		} else {
			n.Control = freePort(t)
			if !witness {
				n.Replication, n.NBD = freePort(t), freePort(t)
			}
			if opts.Raft {
				n.Raft, n.Gossip = freePort(t), freeTCPUDPPort(t)
			}
		}
		c.nodes[name] = n
		fmt.Fprintf(&cfg, "  - {name: %s, control: %q", name, n.Control)
		if !witness {
			fmt.Fprintf(&cfg, ", replication: %q, nbd: %q", n.Replication, n.NBD)
		}
		if opts.Raft {
			fmt.Fprintf(&cfg, ", raft: %q, gossip: %q, role: %s", n.Raft, n.Gossip, n.Role)
		}
		if opts.Pools && !witness {
			fmt.Fprintf(&cfg, ", pools: [{name: default, dir: %q}]", c.poolDir(name))
		}
		fmt.Fprintf(&cfg, ", state_dir: %q}\n", filepath.Join(dir, name))
		if witness {
			continue
		}
		img := filepath.Join(dir, name+".img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, devSize); err != nil {
			t.Fatal(err)
		}
		disks[name] = img
		for i := 1; i < opts.Volumes; i++ {
			if err := os.Truncate(writeEmpty(t, filepath.Join(dir, name+"-"+extraVolumeName(i)+".img")), devSize); err != nil {
				t.Fatal(err)
			}
		}
	}
	fmt.Fprintf(&cfg, "volumes:\n  - name: %s\n    size: %d\n    protocol: %s\n    primary: alpha\n    al_extents: %d\n",
		volName, opts.Size, opts.Protocol, opts.ALExtents)
	if opts.OnCongestion != "" {
		fmt.Fprintf(&cfg, "    on_congestion: %s\n", opts.OnCongestion)
	}
	if opts.SendBuffer != 0 {
		fmt.Fprintf(&cfg, "    send_buffer: %d\n", opts.SendBuffer)
	}
	if opts.MaxLag != 0 {
		fmt.Fprintf(&cfg, "    max_lag: %d\n", opts.MaxLag)
	}
	if opts.PeerTimeout != 0 {
		fmt.Fprintf(&cfg, "    peer_timeout: %s\n", opts.PeerTimeout)
	}
	promote, demote := opts.OnPromote, opts.OnDemote
	if opts.RecordHooks {
		log := filepath.Join(dir, "hooks.log")
		line := func(what string) string {
			return fmt.Sprintf(`echo "%s|$REPLVOL_NODE|$REPLVOL_VOLUME|$REPLVOL_EPOCH|$REPLVOL_EXPORT" >> '%s'`, what, log)
		}
		promote, demote = line("promote"), line("demote")
	}
	if promote != "" {
		fmt.Fprintf(&cfg, "    on_promote: %q\n", promote)
	}
	if demote != "" {
		fmt.Fprintf(&cfg, "    on_demote: %q\n", demote)
	}
	cfg.WriteString("    disks:\n")
	for _, name := range c.names {
		if img, ok := disks[name]; ok {
			fmt.Fprintf(&cfg, "      %s: %q\n", name, img)
		}
	}
	for i := 1; i < opts.Volumes; i++ {
		vol := extraVolumeName(i)
		fmt.Fprintf(&cfg, "  - name: %s\n    size: %d\n    protocol: %s\n    primary: alpha\n    al_extents: %d\n    disks:\n", vol, opts.Size, opts.Protocol, opts.ALExtents)
		for _, name := range c.names {
			if _, ok := disks[name]; ok {
				fmt.Fprintf(&cfg, "      %s: %q\n", name, filepath.Join(dir, name+"-"+vol+".img"))
			}
		}
	}
	c.cfgPath = filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(c.cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if opts.TLS {
		c.initTLS(opts.Raft, opts.NBDTLS)
	}
	return c
}

// poolDir is the directory of data node name's storage pool "default"
// (clusterOpts.Pools).
func (c *procCluster) poolDir(name string) string { return filepath.Join(c.dir, name+"-pool") }

// writeEmpty creates the empty file path and returns path.
func writeEmpty(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// initTLS runs replctl certs init on the cluster file into DIR/tls, and
// gives the file the tls: section that names its files (gossip's key
// with gossip; nbd as given, "" leaving it out).
func (c *procCluster) initTLS(gossip bool, nbd string) {
	t := c.t
	t.Helper()
	dir := filepath.Join(c.dir, "tls")
	if r := runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", c.cfgPath, "--dir", dir); !r.ok() {
		t.Fatalf("replctl certs init: %s", r)
	}
	section := fmt.Sprintf("tls:\n  ca: %q\n  cert: %q\n  key: %q\n",
		filepath.Join(dir, "ca.crt"), filepath.Join(dir, "{node}.crt"), filepath.Join(dir, "{node}.key"))
	if gossip {
		section += fmt.Sprintf("  gossip_key: %q\n", filepath.Join(dir, "gossip.key"))
	}
	if nbd != "" {
		section += fmt.Sprintf("  nbd: %s\n", nbd)
	}
	f, err := os.OpenFile(c.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(section); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	c.tlsDir = dir
}

// otherCA runs replctl certs init on the cluster file into a new
// directory: a second CA, with certificates of the same names that this
// cluster's nodes must refuse. It returns the directory (for --tls-dir,
// or configUsingTLSDir).
func (c *procCluster) otherCA() string {
	t := c.t
	t.Helper()
	dir := filepath.Join(t.TempDir(), "other-ca")
	if r := runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", c.cfgPath, "--dir", dir); !r.ok() {
		t.Fatalf("replctl certs init of a second CA: %s", r)
	}
	return dir
}

// nodeAsOperator is a --tls-dir whose operator certificate is node
// name's: replctl then presents a node's certificate.
func (c *procCluster) nodeAsOperator(name string) string {
	t := c.t
	t.Helper()
	dir := t.TempDir()
	for from, to := range map[string]string{"ca.crt": "ca.crt", name + ".crt": "operator.crt", name + ".key": "operator.key"} {
		b, err := os.ReadFile(filepath.Join(c.tlsDir, from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// configUsingTLSDir writes a copy of the cluster file whose tls: section
// names dir's files (otherCA's, say) and returns its path: start a node
// with it by c.start(name, "--config", path).
func (c *procCluster) configUsingTLSDir(dir string) string {
	t := c.t
	t.Helper()
	if c.tlsDir == "" {
		t.Fatal("configUsingTLSDir: the cluster has no tls: section (clusterOpts.TLS)")
	}
	b, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), c.tlsDir+"/", dir+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// socket is node name's unix socket address (STATE_DIR/control.sock):
// replctl needs no certificate there.
func (c *procCluster) socket(name string) string {
	return "unix://" + filepath.Join(c.dir, name, "control.sock")
}

// freeTCPUDPPort returns a 127.0.0.1 address whose port is free for TCP
// and for UDP (memberlist listens on both), never one given out before.
func freeTCPUDPPort(t *testing.T) string {
	t.Helper()
	return testport.Pick(t, true)
}

// command returns the command that runs node name's replnode: in its
// namespace when the cluster has a lab.
func (c *procCluster) command(name string, args ...string) *exec.Cmd {
	if c.lab != nil {
		return c.lab.command(name, c.bin, args...)
	}
	return exec.Command(c.bin, args...)
}

// nodeNames lists the cluster's nodes in config order.
func (c *procCluster) nodeNames() []string {
	if c.names == nil {
		return []string{"alpha", "beta"}
	}
	return c.names
}

// dataNodes lists the nodes with a disk (all but the witness).
func (c *procCluster) dataNodes() []string {
	var d []string
	for _, n := range c.nodeNames() {
		if c.nodes[n].Role != "witness" {
			d = append(d, n)
		}
	}
	return d
}

// startAll starts every node and waits until each control address answers.
func (c *procCluster) startAll() {
	c.t.Helper()
	c.startAllWithin(30 * time.Second)
}

// startAllWithin is startAll waiting up to timeout for each control
// address: for a test whose own bound covers the start.
func (c *procCluster) startAllWithin(timeout time.Duration) {
	c.t.Helper()
	for _, n := range c.nodeNames() {
		c.start(n)
	}
	for _, n := range c.nodeNames() {
		c.waitListening(n, timeout)
	}
}

// partition cuts node name off the network (Netns clusters only).
func (c *procCluster) partition(name string) {
	c.t.Helper()
	c.needLab("partition")
	c.lab.partition(name)
}

// heal reconnects a partitioned node.
func (c *procCluster) heal(name string) {
	c.t.Helper()
	c.needLab("heal")
	c.lab.heal(name)
}

func (c *procCluster) needLab(what string) {
	c.t.Helper()
	if c.lab == nil {
		c.t.Fatalf("%s needs a cluster in network namespaces (clusterOpts.Netns)", what)
	}
}

// ctlFrom runs `replctl args... --addr <node's control>` inside the
// namespace of node from (on the host without a lab).
func (c *procCluster) ctlFrom(from, node string, args ...string) result {
	args = c.ctlArgs(node, args)
	if c.lab == nil {
		return runCmd(30*time.Second, nil, replctlBin, args...)
	}
	return c.lab.run(from, 30*time.Second, replctlBin, args...)
}

// anyStatus asks the nodes in turn (skipping those in skip) for the
// cluster status and returns the first answer: the view of whichever node
// is up.
func (c *procCluster) anyStatus(skip ...string) (*statusDoc, *volumeStatus, error) {
	var errs []string
	for _, n := range c.nodeNames() {
		if slices.Contains(skip, n) {
			continue
		}
		s, v, err := c.status(n)
		if err == nil {
			return s, v, nil
		}
		errs = append(errs, n+": "+err.Error())
	}
	return nil, nil, fmt.Errorf("no node answered status: %s", strings.Join(errs, "; "))
}

// waitPrimary polls the status of any node not in skip until it names
// want as vol0's primary ("" : any primary) and returns the primary.
func (c *procCluster) waitPrimary(want string, timeout time.Duration, skip ...string) string {
	c.t.Helper()
	var last, primary string
	if !within(timeout, 100*time.Millisecond, func() bool {
		_, v, err := c.anyStatus(skip...)
		if err == nil && v.Primary != "" && (want == "" || v.Primary == want) {
			primary = v.Primary
			return true
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("primary %q epoch %d", v.Primary, v.Epoch)
		}
		return false
	}) {
		c.t.Fatalf("vol0's primary is not %q after %s; last: %s", want, timeout, last)
	}
	return primary
}

// hookRun is one line of hooks.log (clusterOpts.RecordHooks).
type hookRun struct {
	Kind, Node, Volume, Epoch, Export string
}

// hookRuns reads hooks.log: the hooks run so far, in order.
func (c *procCluster) hookRuns() []hookRun {
	c.t.Helper()
	f, err := os.Open(filepath.Join(c.dir, "hooks.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	var runs []hookRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		for len(f) < 5 {
			f = append(f, "")
		}
		runs = append(runs, hookRun{Kind: f[0], Node: f[1], Volume: f[2], Epoch: f[3], Export: f[4]})
	}
	return runs
}

// nodeAlive reports whether a status document says node name answered,
// and whether it lists the node at all.
func (s *statusDoc) nodeAlive(name string) (alive, listed bool) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n.Alive, true
		}
	}
	return false, false
}
