package main

// The end-to-end tests' harness: replnode, replctl and replcsi built once; a cluster of
// separate replnode processes on 127.0.0.1 (data nodes alpha and beta, witness "witness",
// raft and gossip; volume vol0 of the cluster file, alpha its first primary); replcsi
// processes on unix sockets, each with a run directory of its own (a "host"); real CSI
// clients over those sockets. It is the minimum of cmd/replctl's cluster harness
// (clusterenv_test.go) that these tests need, copied: that one lives in package main of
// replctl, which a test of this package cannot import.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/mounttree"
	"github.com/replvol/replvol/internal/poll"
	"github.com/replvol/replvol/internal/testport"
	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const volName = "vol0"

// binDir holds the test builds of replnode, replctl and replcsi.
var binDir string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if runtime.GOOS != "linux" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "replcsi-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	// Built without -race: the e2e tests go through real clients and must stay fast on 2 cores.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "../replnode", "../replctl", ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build: %v\n%s\n", err, out)
		return 1
	}
	return m.Run()
}

func bin(name string) string { return filepath.Join(binDir, name) }

// e2e skips a test where it cannot run: not linux, -short, not root (it mounts).
func e2e(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("end-to-end tests need linux")
	}
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		missing(t, "replcsi's node service attaches and mounts volumes: run the test as root")
	}
}

// requireTool is the path of an external tool; missing, it fails the test under CI=true and
// skips it otherwise, naming where it comes from.
func requireTool(t *testing.T, tool, from string) string {
	t.Helper()
	if p, err := exec.LookPath(tool); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if p := filepath.Join(d, tool); fileExists(p) {
			return p
		}
	}
	missing(t, "%s not found: install %s (./deploy/install-test-deps.sh)", tool, from)
	return ""
}

// needNodeTools checks what NodeStageVolume runs: FUSE, blkid, mkfs.ext4, losetup.
func needNodeTools(t *testing.T) {
	t.Helper()
	if !fileExists("/dev/fuse") {
		missing(t, "/dev/fuse is missing: load the fuse module (modprobe fuse)")
	}
	requireTool(t, "blkid", "the Debian package util-linux")
	requireTool(t, "losetup", "the Debian package mount")
	requireTool(t, "mkfs.ext4", "the Debian package e2fsprogs")
	requireTool(t, "resize2fs", "the Debian package e2fsprogs")
	requireTool(t, "dumpe2fs", "the Debian package e2fsprogs")
	requireTool(t, "e2fsck", "the Debian package e2fsprogs")
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// cluster is replnode processes of one cluster file.
type cluster struct {
	t        *testing.T
	dir, cfg string
	control  map[string]string // node -> control address
	// exited is closed when node's replnode exits.
	exited map[string]chan struct{}
	procs  map[string]*exec.Cmd
}

// startCluster writes a cluster file of alpha, beta (data, a 64 MiB vol0 on a file each) and
// a witness, starts a replnode per node and waits until vol0's primary serves it. With pools
// each data node has a pool "default" in a directory of its own, for volumes made through
// the control API (CreateVolume).
func startCluster(t *testing.T, pools bool) *cluster {
	t.Helper()
	return startClusterWith(t, pools, map[string]int64{volName: 64 << 20})
}

// startClusterWith is startCluster with the volumes of the cluster file and their sizes
// (each on a sparse file per data node, alpha its primary).
func startClusterWith(t *testing.T, pools bool, volumes map[string]int64) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), control: map[string]string{}, exited: map[string]chan struct{}{}, procs: map[string]*exec.Cmd{}}
	var cfg strings.Builder
	cfg.WriteString("nodes:\n")
	for _, n := range []string{"alpha", "beta", "witness"} {
		c.control[n] = testport.Pick(t, false)
		fmt.Fprintf(&cfg, "  - {name: %s, control: %q", n, c.control[n])
		role := "witness"
		if n != "witness" {
			role = "data"
			fmt.Fprintf(&cfg, ", replication: %q, nbd: %q", testport.Pick(t, false), testport.Pick(t, false))
		}
		fmt.Fprintf(&cfg, ", raft: %q, gossip: %q, role: %s, state_dir: %q", testport.Pick(t, false), testport.Pick(t, true), role, filepath.Join(c.dir, n))
		if pools && n != "witness" {
			pool := filepath.Join(c.dir, n+"-pool")
			if err := os.Mkdir(pool, 0o755); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&cfg, ", pools: [{name: default, dir: %q}]", pool)
		}
		cfg.WriteString("}\n")
	}
	cfg.WriteString("volumes:\n")
	names := slices.Sorted(maps.Keys(volumes))
	for _, name := range names {
		size := volumes[name]
		devSize, err := metadata.InternalDeviceSizeFor(size, 61, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&cfg, "  - name: %s\n    size: %d\n    protocol: C\n    primary: alpha\n    al_extents: 61\n    disks:\n", name, size)
		for _, n := range []string{"alpha", "beta"} {
			img := c.disk(name, n)
			if err := os.WriteFile(img, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(img, devSize); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&cfg, "      %s: %q\n", n, img)
		}
	}
	c.cfg = filepath.Join(c.dir, "cluster.yaml")
	if err := os.WriteFile(c.cfg, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alpha", "beta", "witness"} {
		c.start(n)
	}
	for _, name := range names {
		c.waitServing(name, 90*time.Second)
		c.waitInSync(name, 90*time.Second)
	}
	if pools {
		c.waitPools(90 * time.Second)
	}
	return c
}

// disk is the backing file of volume on node (alpha or beta).
func (c *cluster) disk(volume, node string) string {
	if volume == volName {
		return filepath.Join(c.dir, node+".img")
	}
	return filepath.Join(c.dir, volume+"-"+node+".img")
}

// waitInSync waits until both replicas of volume are UpToDate and connected, and raft
// records both UpToDate (either may then be promoted).
func (c *cluster) waitInSync(volume string, within time.Duration) {
	c.t.Helper()
	var last string
	if !poll.Within(within, 200*time.Millisecond, func() bool {
		v, err := c.volumeStatus("alpha", volume)
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%+v", v.Replicas)
		if len(v.Replicas) < 2 {
			return false
		}
		for _, r := range v.Replicas {
			if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSyncBytes != 0 || r.Raft != "UpToDate" {
				return false
			}
		}
		return true
	}) {
		c.t.Fatalf("%s is not in sync within %s: %s", volume, within, last)
	}
}

// volumeStatus is volume's status in the cluster status of node from.
func (c *cluster) volumeStatus(from, volume string) (*transport.VolumeStatus, error) {
	client, err := transport.DialControl(c.control[from])
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := client.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return nil, err
	}
	for i := range st.Volumes {
		if st.Volumes[i].Name == volume {
			return &st.Volumes[i], nil
		}
	}
	return nil, fmt.Errorf("%s lists no volume %s", from, volume)
}

// waitPools waits until the control API lists both data nodes' pools: raft has a leader,
// and CreateVolume can place volumes.
func (c *cluster) waitPools(within time.Duration) {
	c.t.Helper()
	client, err := transport.DialControl(c.control["alpha"])
	if err != nil {
		c.t.Fatal(err)
	}
	defer client.Close()
	var last string
	if !poll.Within(within, 200*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := client.VolumeList(ctx, &transport.VolumeListRequest{}); err != nil {
			last = err.Error()
			return false
		}
		r, err := client.Pools(ctx, &transport.PoolsRequest{})
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("pools %+v", r.Pools)
		return len(r.Pools) >= 2
	}) {
		c.t.Fatalf("the control API does not list both nodes' pools within %s: %s", within, last)
	}
}

// start starts node name's replnode, stopped (and its log shown on failure) at the test's end.
func (c *cluster) start(name string) {
	t := c.t
	logPath := filepath.Join(c.dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin("replnode"), "--config", c.cfg, "--node", name, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c.exited[name], c.procs[name] = exited, cmd
	t.Cleanup(func() {
		stop(cmd, exited)
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s's log:\n%s", name, tail(string(b), 40))
		}
	})
}

// kill kills node name's replnode with SIGKILL and waits until it is gone.
func (c *cluster) kill(name string) {
	_ = c.procs[name].Process.Kill()
	<-c.exited[name]
	delete(c.exited, name)
}

// stopProcess ends cmd with SIGTERM, SIGKILL after 30 s, and waits for it.
func stopProcess(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop(cmd, done)
}

// stop ends cmd, whose Wait closes done, with SIGTERM, SIGKILL after 30 s.
func stop(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// waitServing waits until volume has a primary that serves its export, as alpha sees it.
func (c *cluster) waitServing(volume string, within time.Duration) {
	c.t.Helper()
	client, err := transport.DialControl(c.control["alpha"])
	if err != nil {
		c.t.Fatal(err)
	}
	defer client.Close()
	var last string
	if !poll.Within(within, 200*time.Millisecond, func() bool {
		for n, exited := range c.exited {
			select {
			case <-exited:
				c.t.Fatalf("replnode %s exited", n)
			default:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := client.ClusterStatus(ctx, &transport.StatusRequest{})
		if err != nil {
			last = err.Error()
			return false
		}
		for _, v := range st.Volumes {
			if v.Name == volume {
				last = fmt.Sprintf("primary %q, export %q", v.Primary, v.NBDURI)
				return v.Primary != "" && v.NBDURI != ""
			}
		}
		last = "no volume " + volume
		return false
	}) {
		c.t.Fatalf("%s is not served within %s: %s", volume, within, last)
	}
}

// csiHost is a replcsi process and what it set up: a host of the Kubernetes cluster.
type csiHost struct {
	t        *testing.T
	name     string
	endpoint string // unix:///...
	runDir   string
	conn     *grpc.ClientConn
	node     csi.NodeClient
	ctrl     csi.ControllerClient
	ident    csi.IdentityClient
}

// startCSI starts replcsi as host name, asking the node at addr, with a run directory under
// the test's shared mount tree top; at the test's end whatever it left attached is detached
// (the test has failed then: the tests undo what they did).
func startCSI(t *testing.T, name, addr, top string) *csiHost {
	t.Helper()
	h := &csiHost{t: t, name: name, runDir: filepath.Join(top, "run-"+name)}
	// A socket's path must fit in 108 bytes: not under t.TempDir(), named after the test.
	sockDir, err := os.MkdirTemp("", "replcsi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "csi.sock")
	h.endpoint = "unix://" + sock
	logPath := filepath.Join(t.TempDir(), "replcsi.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin("replcsi"), "--endpoint", h.endpoint, "--node-id", name, "--addr", addr,
		"--run-dir", h.runDir, "--replctl", bin("replctl"), "--io-timeout", "2m")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopProcess(cmd)
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("replcsi %s's log:\n%s", name, tail(string(b), 60))
		}
	})
	t.Cleanup(func() { h.detachLeftovers(top) })
	// The socket's file exists from its bind, a moment before its listen:
	// a connection in that moment is refused (a loaded machine met it, and
	// the first call failed Unavailable). So the test waits for a
	// connection the driver accepts, as kubelet waits for its plugin.
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}) {
		t.Fatalf("replcsi %s does not listen on %s", name, sock)
	}
	h.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	h.node, h.ctrl, h.ident = csi.NewNodeClient(h.conn), csi.NewControllerClient(h.conn), csi.NewIdentityClient(h.conn)
	return h
}

// attached lists the attachments replctl recorded in the host's run directory.
func (h *csiHost) attached() []*volmount.Record {
	recs, err := volmount.Registry{Dir: h.runDir}.List()
	if err != nil {
		h.t.Fatal(err)
	}
	return recs
}

// detachLeftovers detaches what the host left attached, failing the test if anything was:
// after it unmounted what is mounted under top (replctl detach refuses a mounted device).
func (h *csiHost) detachLeftovers(top string) {
	recs := h.attached()
	if len(recs) > 0 {
		unmountLeftovers(h.t, top)
	}
	for _, rec := range recs {
		h.t.Errorf("replcsi %s left %s attached as %s: detaching it", h.name, rec.Volume, rec.Device)
		out, err := exec.Command(bin("replctl"), "detach", rec.Volume, "--run-dir", h.runDir).CombinedOutput()
		if err != nil {
			h.t.Errorf("replctl detach %s: %v: %s", rec.Volume, err, out)
		}
	}
}

// sharedTop is the test's directory to mount under (internal/mounttree); at the end, what
// is still mounted under it is unmounted, failing the test.
func sharedTop(t *testing.T) string {
	top := mounttree.Shared(t)
	t.Cleanup(func() { unmountLeftovers(t, top) })
	return top
}

// unmountLeftovers unmounts, failing the test, what is mounted under top but the FUSE
// helpers' own mounts (replctl detach undoes those), innermost first.
func unmountLeftovers(t *testing.T, top string) {
	m := mountsUnder(t, top)
	for i := len(m) - 1; i >= 0; i-- {
		if strings.HasSuffix(m[i], ".fuse") {
			continue
		}
		t.Errorf("left mounted: %s", m[i])
		_ = syscall.Unmount(m[i], syscall.MNT_DETACH)
	}
}

// mountsUnder lists the mount points strictly under top.
func mountsUnder(t *testing.T, top string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var under []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], top+"/") {
			under = append(under, f[4])
		}
	}
	return under
}
