package main

// Network namespaces for partition tests: one namespace per node, each with
// an eth0 (one end of a veth pair) on a Linux bridge of the host, on a
// fresh 10.77.X.0/24 subnet per test. The host has address .254 on the
// bridge, so replctl and status calls from the test reach every node; a
// partition sets a node's eth0 down inside its namespace (its own address
// stays reachable from inside, so a client there still reaches it).
// Everything is removed by the test's cleanup, also when the test fails.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dialFunc opens a connection the way net.Dialer.DialContext does.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// netLab is one test's bridge and namespaces.
type netLab struct {
	t      *testing.T
	ipBin  string
	id     string // 6 hex digits, in every name the lab creates
	subnet int    // X of 10.77.X.0/24
	bridge string
	hostIP string
	// side is a second network (bridge sideBridge, 10.77.sideSubnet.0/24)
	// reached through each node's eth1, once addSideNetwork made it: a
	// partition (eth0 down) leaves it up.
	side       bool
	sideSubnet int
	sideBridge string

	mu    sync.Mutex
	nodes map[string]*labNode
	order []string
}

type labNode struct {
	name string
	ns   string // network namespace
	veth string // the host end of the veth pair, a bridge port
	ip   string // eth0's address inside ns
	// sideIP is eth1's address on the side network ("" without one).
	sideIP string
	index  int
}

// labSubnets keeps two labs of one test process off the same subnet
// (the host's addresses show those of other processes).
var (
	labSubnetsMu sync.Mutex
	labSubnets   = map[int]bool{}
)

// newNetLab creates the bridge with the host's address on it. It needs
// root and the ip tool (Debian iproute2): without them the test skips, or
// fails under CI=true.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("network namespaces need linux")
	}
	ipBin := RequireTool(t, "ip", "iproute2")
	if os.Geteuid() != 0 {
		missing(t, "network namespaces need root (CAP_NET_ADMIN); running as uid %d", os.Geteuid())
	}
	if _, err := os.Stat("/run/netns"); err != nil && !os.IsNotExist(err) {
		t.Fatalf("network namespace setup: /run/netns: %v", err)
	}
	var idb [3]byte
	if _, err := rand.Read(idb[:]); err != nil {
		t.Fatal(err)
	}
	l := &netLab{t: t, ipBin: ipBin, id: hex.EncodeToString(idb[:]), nodes: map[string]*labNode{}}
	l.bridge = "rvbr" + l.id
	l.subnet = l.pickSubnet()
	l.hostIP = fmt.Sprintf("10.77.%d.254", l.subnet)
	// Registered first, so it runs after every process cleanup registered
	// later (cleanups run last-registered first).
	t.Cleanup(l.remove)
	l.mustIP("create the bridge", "link", "add", l.bridge, "type", "bridge")
	l.mustIP("give the host an address on the bridge", "addr", "add", l.hostIP+"/24", "dev", l.bridge)
	l.mustIP("bring the bridge up", "link", "set", l.bridge, "up")
	return l
}

// addSideNetwork makes a second bridge, on a subnet of its own, that
// nodes added from now on reach through their eth1: a separate network
// for gossip, as a cluster with a dedicated heartbeat network has.
func (l *netLab) addSideNetwork() {
	l.t.Helper()
	l.sideSubnet = l.pickSubnet()
	l.sideBridge = "rvsb" + l.id
	l.side = true
	l.mustIP("create the side bridge", "link", "add", l.sideBridge, "type", "bridge")
	l.mustIP("bring the side bridge up", "link", "set", l.sideBridge, "up")
}

// sideIP is node name's address on the side network.
func (l *netLab) sideIP(name string) string { return l.node(name).sideIP }

// pickSubnet returns a random X such that no address or route of the
// host is in 10.77.X.0/24 and no other lab of this process has it.
func (l *netLab) pickSubnet() int {
	t := l.t
	t.Helper()
	addrs := runCmd(10*time.Second, nil, l.ipBin, "-o", "-4", "addr", "show")
	routes := runCmd(10*time.Second, nil, l.ipBin, "-4", "route", "show", "table", "all")
	if !addrs.ok() || !routes.ok() {
		t.Fatalf("network namespace setup: ip addr/route show: %s / %s", addrs, routes)
	}
	used := addrs.out + "\n" + routes.out
	labSubnetsMu.Lock()
	defer labSubnetsMu.Unlock()
	for range 200 {
		x := mrand.IntN(256)
		if labSubnets[x] || strings.Contains(used, fmt.Sprintf("10.77.%d.", x)) {
			continue
		}
		labSubnets[x] = true
		return x
	}
	t.Fatalf("network namespace setup: no free 10.77.X.0/24 subnet on this host (ip addr:\n%s)", addrs.out)
	return 0
}

// mustIP runs `ip args...` and fails the test naming the step.
func (l *netLab) mustIP(step string, args ...string) {
	l.t.Helper()
	r := runCmd(10*time.Second, nil, l.ipBin, args...)
	if !r.ok() {
		hint := ""
		if strings.Contains(r.out, "Operation not permitted") {
			hint = " (network namespaces need root with CAP_NET_ADMIN and CAP_SYS_ADMIN: in a container, --privileged or --cap-add NET_ADMIN,SYS_ADMIN)"
		}
		l.t.Fatalf("network namespace setup: %s: ip %s: %s%s", step, strings.Join(args, " "), r, hint)
	}
}

// addNode creates node name's namespace, with eth0 on the bridge at the
// next address (10.77.X.1, .2, ...), and returns that address.
func (l *netLab) addNode(name string) string {
	t := l.t
	t.Helper()
	l.mu.Lock()
	if _, dup := l.nodes[name]; dup {
		l.mu.Unlock()
		t.Fatalf("network namespace setup: node %s added twice", name)
	}
	n := &labNode{name: name, index: len(l.order)}
	n.ns = fmt.Sprintf("rv%s-%s", l.id, name)
	n.veth = fmt.Sprintf("rv%sh%d", l.id, n.index)
	n.ip = fmt.Sprintf("10.77.%d.%d", l.subnet, n.index+1)
	l.nodes[name] = n
	l.order = append(l.order, name)
	l.mu.Unlock()
	if n.index+1 >= 254 {
		t.Fatalf("network namespace setup: too many nodes")
	}
	peer := fmt.Sprintf("rv%sp%d", l.id, n.index)
	l.mustIP("create namespace "+n.ns, "netns", "add", n.ns)
	l.mustIP("create the veth pair of "+name, "link", "add", n.veth, "type", "veth", "peer", "name", peer)
	l.mustIP("move "+peer+" into "+n.ns, "link", "set", peer, "netns", n.ns)
	l.mustIP("attach "+n.veth+" to the bridge", "link", "set", n.veth, "master", l.bridge)
	l.mustIP("bring "+n.veth+" up", "link", "set", n.veth, "up")
	l.mustIP("rename "+peer+" to eth0 in "+n.ns, "-n", n.ns, "link", "set", peer, "name", "eth0")
	l.mustIP("address eth0 in "+n.ns, "-n", n.ns, "addr", "add", n.ip+"/24", "dev", "eth0")
	l.mustIP("bring eth0 up in "+n.ns, "-n", n.ns, "link", "set", "eth0", "up")
	l.mustIP("bring lo up in "+n.ns, "-n", n.ns, "link", "set", "lo", "up")
	if l.side {
		host, peer := l.sideVeth(n), fmt.Sprintf("rv%sq%d", l.id, n.index)
		n.sideIP = fmt.Sprintf("10.77.%d.%d", l.sideSubnet, n.index+1)
		l.mustIP("create the side veth pair of "+name, "link", "add", host, "type", "veth", "peer", "name", peer)
		l.mustIP("move "+peer+" into "+n.ns, "link", "set", peer, "netns", n.ns)
		l.mustIP("attach "+host+" to the side bridge", "link", "set", host, "master", l.sideBridge)
		l.mustIP("bring "+host+" up", "link", "set", host, "up")
		l.mustIP("rename "+peer+" to eth1 in "+n.ns, "-n", n.ns, "link", "set", peer, "name", "eth1")
		l.mustIP("address eth1 in "+n.ns, "-n", n.ns, "addr", "add", n.sideIP+"/24", "dev", "eth1")
		l.mustIP("bring eth1 up in "+n.ns, "-n", n.ns, "link", "set", "eth1", "up")
	}
	return n.ip
}

// sideVeth is the host end of node n's side veth pair.
func (l *netLab) sideVeth(n *labNode) string { return fmt.Sprintf("rv%sg%d", l.id, n.index) }

func (l *netLab) node(name string) *labNode {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.nodes[name]
	if !ok {
		l.t.Fatalf("network lab: no node %s", name)
	}
	return n
}

// ip is node name's address.
func (l *netLab) ip(name string) string { return l.node(name).ip }

// namespace is node name's network namespace.
func (l *netLab) namespace(name string) string { return l.node(name).ns }

// command returns a command that runs bin inside node name's namespace.
// ip netns exec execs bin in place: the process's pid is bin's, so
// signals (SIGKILL, SIGSTOP) reach it directly.
func (l *netLab) command(name, bin string, args ...string) *exec.Cmd {
	return exec.Command(l.ipBin, append([]string{"netns", "exec", l.namespace(name), bin}, args...)...)
}

// run runs a client command inside node name's namespace, like runCmd.
func (l *netLab) run(name string, timeout time.Duration, bin string, args ...string) result {
	return runCmd(timeout, nil, l.ipBin, append([]string{"netns", "exec", l.namespace(name), bin}, args...)...)
}

// partition cuts node name off the bridge: its eth0 goes down inside its
// namespace. Its own address stays reachable from inside the namespace.
func (l *netLab) partition(name string) {
	l.t.Helper()
	n := l.node(name)
	if r := runCmd(10*time.Second, nil, l.ipBin, "netns", "exec", n.ns, l.ipBin, "link", "set", "eth0", "down"); !r.ok() {
		l.t.Fatalf("partition %s: %s", name, r)
	}
}

// heal puts node name back on the bridge (eth0 up; the kernel restores
// the subnet's route).
func (l *netLab) heal(name string) {
	l.t.Helper()
	n := l.node(name)
	if r := runCmd(10*time.Second, nil, l.ipBin, "netns", "exec", n.ns, l.ipBin, "link", "set", "eth0", "up"); !r.ok() {
		l.t.Fatalf("heal %s: %s", name, r)
	}
}

// dialer returns a dialFunc whose sockets live in node name's namespace:
// each dial runs on an OS thread that enters the namespace, makes the
// socket and comes back. The thread must come back: a thread that ends
// (a goroutine that exits locked) SIGKILLs the children it forked, whose
// Pdeathsig is set (every replnode). If it cannot come back, the thread
// stays locked and blocked until the test binary exits.
func (l *netLab) dialer(name string) dialFunc {
	nsPath := "/run/netns/" + l.namespace(name)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			conn net.Conn
			err  error
		}
		ch := make(chan dialed, 1)
		go func() {
			runtime.LockOSThread()
			home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- dialed{nil, fmt.Errorf("open this thread's network namespace: %w", err)}
				return
			}
			defer unix.Close(home)
			target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- dialed{nil, fmt.Errorf("open %s: %w", nsPath, err)}
				return
			}
			err = unix.Setns(target, unix.CLONE_NEWNET)
			unix.Close(target)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- dialed{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
				return
			}
			// One literal address: the socket is made on this thread.
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if berr := unix.Setns(home, unix.CLONE_NEWNET); berr != nil {
				if c != nil {
					c.Close()
				}
				ch <- dialed{nil, fmt.Errorf("back to the host's network namespace: %w", berr)}
				select {} // never unlock, never exit: see above
			}
			runtime.UnlockOSThread()
			ch <- dialed{c, err}
		}()
		r := <-ch
		return r.conn, r.err
	}
}

// remove kills what still runs in the namespaces (only processes this
// test started live there), then deletes namespaces, veths and bridge.
func (l *netLab) remove() {
	t := l.t
	l.mu.Lock()
	nodes := make([]*labNode, 0, len(l.order))
	for _, name := range l.order {
		nodes = append(nodes, l.nodes[name])
	}
	l.mu.Unlock()
	for _, n := range nodes {
		if r := runCmd(10*time.Second, nil, l.ipBin, "netns", "pids", n.ns); r.ok() {
			for _, f := range strings.Fields(r.out) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
					t.Logf("network lab cleanup: process %d still in %s: SIGKILL", pid, n.ns)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if r := runCmd(10*time.Second, nil, l.ipBin, "netns", "del", n.ns); !r.ok() && !strings.Contains(r.out, "No such file") {
			t.Errorf("network lab cleanup: ip netns del %s: %s", n.ns, r)
		}
	}
	for _, n := range nodes {
		// The host end goes with the namespace's end, which the kernel
		// destroys asynchronously; unless setup stopped before the move.
		within(5*time.Second, 20*time.Millisecond, func() bool { return !linkExists(l.ipBin, n.veth) })
		if linkExists(l.ipBin, n.veth) {
			r := runCmd(10*time.Second, nil, l.ipBin, "link", "del", n.veth)
			if !r.ok() && linkExists(l.ipBin, n.veth) {
				t.Errorf("network lab cleanup: ip link del %s: %s", n.veth, r)
			}
		}
	}
	bridges := []string{l.bridge}
	if l.side {
		bridges = append(bridges, l.sideBridge)
		for _, n := range nodes {
			// Gone with the namespace, like eth0's pair.
			within(5*time.Second, 20*time.Millisecond, func() bool { return !linkExists(l.ipBin, l.sideVeth(n)) })
			if linkExists(l.ipBin, l.sideVeth(n)) {
				if r := runCmd(10*time.Second, nil, l.ipBin, "link", "del", l.sideVeth(n)); !r.ok() && linkExists(l.ipBin, l.sideVeth(n)) {
					t.Errorf("network lab cleanup: ip link del %s: %s", l.sideVeth(n), r)
				}
			}
		}
	}
	for _, br := range bridges {
		if linkExists(l.ipBin, br) {
			if r := runCmd(10*time.Second, nil, l.ipBin, "link", "del", br); !r.ok() {
				t.Errorf("network lab cleanup: ip link del %s: %s", br, r)
			}
		}
	}
	labSubnetsMu.Lock()
	delete(labSubnets, l.subnet)
	if l.side {
		delete(labSubnets, l.sideSubnet)
	}
	labSubnetsMu.Unlock()
}

// leftovers lists what of the lab still exists on the host (nothing after
// its cleanup ran).
func (l *netLab) leftovers() []string {
	var left []string
	if linkExists(l.ipBin, l.bridge) {
		left = append(left, "bridge "+l.bridge)
	}
	if l.side && linkExists(l.ipBin, l.sideBridge) {
		left = append(left, "bridge "+l.sideBridge)
	}
	for _, name := range l.order {
		n := l.nodes[name]
		if linkExists(l.ipBin, n.veth) {
			left = append(left, "veth "+n.veth)
		}
		if l.side && linkExists(l.ipBin, l.sideVeth(n)) {
			left = append(left, "veth "+l.sideVeth(n))
		}
		if _, err := os.Stat("/run/netns/" + n.ns); err == nil {
			left = append(left, "namespace "+n.ns)
		}
	}
	return left
}

func linkExists(ipBin, name string) bool {
	return runCmd(10*time.Second, nil, ipBin, "link", "show", "dev", name).ok()
}

// waitTCP polls until addr accepts a TCP connection dialed by dial (nil:
// the host's network), or fails the test after timeout.
func waitTCP(t *testing.T, dial dialFunc, addr string, timeout time.Duration) {
	t.Helper()
	if err := pollTCP(dial, addr, timeout, true); err != nil {
		t.Fatal(err)
	}
}

// waitNoTCP polls until a TCP connection to addr fails.
func waitNoTCP(t *testing.T, dial dialFunc, addr string, timeout time.Duration) {
	t.Helper()
	if err := pollTCP(dial, addr, timeout, false); err != nil {
		t.Fatal(err)
	}
}

func pollTCP(dial dialFunc, addr string, timeout time.Duration, want bool) error {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	var err error
	if within(timeout, 50*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		var c net.Conn
		c, err = dial(ctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
		}
		return (err == nil) == want
	}) {
		return nil
	}
	if want {
		return fmt.Errorf("%s: no TCP connection after %s: %v", addr, timeout, err)
	}
	return fmt.Errorf("%s: still accepts TCP connections after %s", addr, timeout)
}
