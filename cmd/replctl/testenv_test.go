package main

// Shared helpers for the end-to-end tests in e2e_test.go: building the
// binaries, running `replctl demo` as a child process, external tools,
// `replctl status --json`, file comparisons and a tiny raw NBD client for
// requests no well-behaved client library will send.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	demoSize     = 256 << 20
	demoSizeFlag = "256MiB"
	volName      = "vol0"
	syncTimeout  = 60 * time.Second
)

var (
	binDir     string // holds the replctl (and later replnode) test builds
	replctlBin string

	replnodeOnce sync.Once
	replnodeBin  string
	replnodeErr  error
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if runtime.GOOS != "linux" {
		return m.Run() // every e2e test skips itself
	}
	dir, err := os.MkdirTemp("", "replctl-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	replctlBin = filepath.Join(dir, "replctl")
	if err := isolateUserCache(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// The binary under test is built without -race: the e2e tests measure
	// behaviour through real clients and must stay fast on 2 cores.
	if out, err := goBuild(replctlBin, "."); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/replctl: %v\n%s\n", err, out)
		return 1
	}
	return m.Run()
}

// isolateUserCache points $XDG_CACHE_HOME, which replctl remembers
// clusters in, at a directory under dir, for this process and every
// replctl it starts, so tests never write to the user's cache. Go's build
// cache stays where it was.
func isolateUserCache(dir string) error {
	if os.Getenv("GOCACHE") == "" {
		out, err := exec.Command(goCommand(), "env", "GOCACHE").Output()
		if err != nil {
			return fmt.Errorf("go env GOCACHE: %v", err)
		}
		if err := os.Setenv("GOCACHE", strings.TrimSpace(string(out))); err != nil {
			return err
		}
	}
	cache := filepath.Join(dir, "cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	return os.Setenv("XDG_CACHE_HOME", cache)
}

func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

func goBuild(out, pkg string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// -buildvcs=auto: the binaries name their commit, as make builds
	// them, even where GOFLAGS turns stamping off.
	cmd := exec.CommandContext(ctx, goCommand(), "build", "-buildvcs=auto", "-o", out, pkg)
	return cmd.CombinedOutput()
}

// replnode builds ./cmd/replnode once, on first use.
func replnode(t *testing.T) string {
	t.Helper()
	replnodeOnce.Do(func() {
		replnodeBin = filepath.Join(binDir, "replnode")
		var out []byte
		if out, replnodeErr = goBuild(replnodeBin, "../replnode"); replnodeErr != nil {
			replnodeErr = fmt.Errorf("go build ./cmd/replnode: %v\n%s", replnodeErr, out)
		}
	})
	if replnodeErr != nil {
		t.Fatal(replnodeErr)
	}
	return replnodeBin
}

func e2e(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("end-to-end tests need linux")
	}
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
}

// e2eBeside is e2e for a test whose time goes into waiting for the
// cluster (leases, elections, failovers, restarts, a mount's claim to
// lapse) or for its clients and tools, and which asserts no time or rate
// of its own: it runs beside the other such tests, go test's -parallel at
// a time (GOMAXPROCS by default), after the package's other tests. Each
// cluster or demo has its own directories, ports (testport), network
// namespaces and mount tree (mounttree), so they do not meet. A test
// that bounds how long something takes, a rate or a process's wakeups
// stays with e2e: beside the others it would measure the machine.
//
// A subtest may call it too, but it then waits for every top-level test
// that waits already: only short subtests gain by it (a long one ends
// the package's run alone).
func e2eBeside(t *testing.T) {
	t.Helper()
	e2e(t)
	t.Parallel()
}

func inCI() bool { return os.Getenv("CI") == "true" }

// RequireTool returns the path of an external tool. A missing tool fails
// the test under CI=true (.ci/run installs them all) and skips it
// otherwise, naming the Debian package that provides it.
func RequireTool(t *testing.T, tool, debPkg string) string {
	t.Helper()
	if p, err := exec.LookPath(tool); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, tool)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	missing(t, "%s not found: install the Debian package %s (./deploy/install-test-deps.sh)", tool, debPkg)
	return ""
}

// RequirePythonNBD returns Debian's python3 with the libnbd bindings.
func RequirePythonNBD(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import nbd").Run(); err != nil {
		missing(t, "%s -c 'import nbd' failed (%v): install the Debian package python3-libnbd", py, err)
	}
	return py
}

func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// ---------------------------------------------------------------------------
// running commands

type result struct {
	out  string // stdout + stderr
	code int    // exit code, -1 when it did not run or was killed
	err  error
}

func (r result) ok() bool { return r.err == nil }

func (r result) String() string {
	return fmt.Sprintf("exit %d (%v): %s", r.code, r.err, strings.TrimSpace(r.out))
}

func runCmd(timeout time.Duration, env []string, name string, args ...string) result {
	return runCmdIn("", timeout, env, name, args...)
}

// runCmdIn is runCmd in directory dir ("" is the test's own directory,
// which is the source tree: give tools that leave files behind, such as
// fio's verify state, a temporary directory).
func runCmdIn(dir string, timeout time.Duration, env []string, name string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	r := result{out: buf.String(), code: -1, err: err}
	if cmd.ProcessState != nil {
		r.code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	return r
}

// mustRun runs a command and fails the test unless it exits 0.
func mustRun(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	r := runCmd(timeout, nil, name, args...)
	if !r.ok() {
		t.Fatalf("%s %s: %s", filepath.Base(name), strings.Join(args, " "), r)
	}
	return r.out
}

// qemuIO runs qemu-io commands against an NBD URI on one connection and
// fails the test on a non-zero exit or a failed pattern check.
func qemuIO(t *testing.T, uri string, cmds ...string) string {
	t.Helper()
	r, ok := tryQemuIOWithin(t, 2*time.Minute, uri, cmds...)
	if !ok {
		t.Fatalf("qemu-io %s %q: %s", uri, cmds, r)
	}
	return r.out
}

// tryQemuIOWithin runs qemu-io like qemuIO, killed after timeout, and says
// whether every command succeeded (exit 0, no failed pattern check, no
// error message).
func tryQemuIOWithin(t *testing.T, timeout time.Duration, uri string, cmds ...string) (result, bool) {
	t.Helper()
	qio := RequireTool(t, "qemu-io", "qemu-utils")
	args := []string{"-f", "raw", uri}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	r := runCmd(timeout, nil, qio, args...)
	low := strings.ToLower(r.out)
	ok := r.ok() && !strings.Contains(low, "fail") && !strings.Contains(low, "error") && !strings.Contains(low, "can't")
	return r, ok
}

// ---------------------------------------------------------------------------
// the demo cluster

type demoNode struct {
	Name, Control, Replication, NBD string
	// Raft, Gossip and Role are set by newProcClusterN (a witness has
	// no Replication or NBD address).
	Raft, Gossip, Role string
}

type demo struct {
	t     *testing.T
	dir   string
	uri   string // the primary's URI as the demo printed it
	nodes map[string]demoNode
	// tlsDir, on a cluster with a tls: section, is where replctl certs
	// init wrote its files: ctl passes it as --tls-dir, and apiGet
	// trusts its CA.
	tlsDir string
	cmd    *exec.Cmd
	out    *syncBuffer
	done   chan struct{}
	err    error
}

var nodeLine = regexp.MustCompile(`^node (\S+): control (\S+) replication (\S+) nbd (\S+)$`)

// startDemo runs `replctl demo` in a fresh directory, waits for "ready" and
// registers a cleanup that stops it with SIGTERM and checks that it exits 0
// within 10 s.
func startDemo(t *testing.T, extra ...string) *demo {
	t.Helper()
	dir := t.TempDir()
	d := &demo{t: t, dir: dir, nodes: map[string]demoNode{}, out: &syncBuffer{}, done: make(chan struct{})}
	cmd := exec.Command(replctlBin, append([]string{"demo", "--dir", dir, "--base-port", "0", "--size", demoSizeFlag}, extra...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = d.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start replctl demo: %v", err)
	}
	d.cmd = cmd
	lines := make(chan string, 256)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(d.out, sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		<-copied
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(d.stop)

	timeout := time.After(60 * time.Second)
	for ready := false; !ready; {
		select {
		case l, ok := <-lines:
			if !ok {
				<-d.done
				t.Fatalf("replctl demo exited before ready (%v):\n%s", d.err, d.out.tail(8000))
			}
			l = strings.TrimSpace(l)
			if m := nodeLine.FindStringSubmatch(l); m != nil {
				d.nodes[m[1]] = demoNode{Name: m[1], Control: m[2], Replication: m[3], NBD: m[4]}
			}
			switch {
			case (strings.HasPrefix(l, "nbd://") || strings.HasPrefix(l, "nbds://")) && d.uri == "":
				d.uri = strings.Fields(l)[0]
			case l == "ready":
				ready = true
			}
		case <-timeout:
			t.Fatalf("replctl demo not ready after 60s:\n%s", d.out.tail(8000))
		}
	}
	if d.uri == "" {
		t.Fatalf("replctl demo printed ready without an nbd:// line:\n%s", d.out.tail(8000))
	}
	for _, n := range []string{"alpha", "beta"} {
		if _, ok := d.nodes[n]; !ok {
			t.Fatalf("replctl demo printed no line %q for node %s:\n%s",
				"node "+n+": control HOST:PORT replication HOST:PORT nbd HOST:PORT", n, d.out.tail(8000))
		}
	}
	if u, err := url.Parse(d.uri); err != nil || u.Host != d.nodes["alpha"].NBD {
		t.Fatalf("primary URI %s is not on alpha's nbd address %s", d.uri, d.nodes["alpha"].NBD)
	}
	return d
}

func (d *demo) stop() {
	t := d.t
	if t.Failed() {
		t.Logf("replctl demo output (tail):\n%s", d.out.tail(12000))
	}
	select {
	case <-d.done:
		t.Errorf("replctl demo exited on its own before the end of the test (%v)", d.err)
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if d.err != nil {
			t.Errorf("replctl demo did not exit 0 after SIGTERM: %v\n%s", d.err, d.out.tail(4000))
		}
	case <-time.After(10 * time.Second):
		t.Errorf("replctl demo still running 10 s after SIGTERM; killing it")
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
}

// uriOf returns the volume's URI on a node (same export as the primary's).
func (d *demo) uriOf(node string) string {
	u, err := url.Parse(d.uri)
	if err != nil {
		d.t.Fatalf("parse %s: %v", d.uri, err)
	}
	u.Host = d.nodes[node].NBD
	return u.String()
}

func (d *demo) disk(node string) string {
	return filepath.Join(d.dir, node, volName+".img")
}

// ctl runs `replctl --addr <node's control> args...` (and --tls-dir on a
// cluster with TLS).
func (d *demo) ctl(node string, args ...string) result {
	return runCmd(30*time.Second, nil, replctlBin, d.ctlArgs(node, args)...)
}

// ctlArgs are args with --addr of node's control address, and --tls-dir
// on a cluster with TLS.
func (d *demo) ctlArgs(node string, args []string) []string {
	out := append(append([]string(nil), args...), "--addr", d.nodes[node].Control)
	if d.tlsDir != "" {
		out = append(out, "--tls-dir", d.tlsDir)
	}
	return out
}

// apiGet reads path (/api/node, /metrics, ...) from node's control
// address: over HTTPS on a cluster with TLS, trusting its CA and without
// a client certificate, as a browser does.
func (d *demo) apiGet(node, path string) (*http.Response, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	scheme := "http://"
	if d.tlsDir != "" {
		pem, err := os.ReadFile(filepath.Join(d.tlsDir, "ca.crt"))
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}
		scheme = "https://"
	}
	return hc.Get(scheme + d.nodes[node].Control + path)
}

func (d *demo) mustCtl(node string, args ...string) string {
	d.t.Helper()
	r := d.ctl(node, args...)
	if !r.ok() {
		d.t.Fatalf("replctl %s (via %s): %s", strings.Join(args, " "), node, r)
	}
	return r.out
}

// ---------------------------------------------------------------------------
// replctl status --json

type statusDoc struct {
	From    string        `json:"from"`
	Cluster clusterStatus `json:"cluster"`
	Nodes   []struct {
		Name       string `json:"name"`
		Control    string `json:"control"`
		NBD        string `json:"nbd"`
		Alive      bool   `json:"alive"`
		Role       string `json:"role"`
		Membership string `json:"membership"`
		Error      string `json:"error"`
		ErrorCode  string `json:"error_code"`
	} `json:"nodes"`
	Volumes []volumeStatus `json:"volumes"`
}

// clusterStatus is the raft and membership view (issue 9); empty from a
// node that does not report it yet.
type clusterStatus struct {
	Leader   string   `json:"leader"`
	Quorum   bool     `json:"quorum"`
	Voters   []string `json:"voters"`
	Failover string   `json:"failover"`
	Reason   string   `json:"reason"`
	// Standing: removed or joining when the node asked is not a voter.
	Standing string `json:"standing"`
}

type volumeStatus struct {
	Name     string          `json:"name"`
	Size     json.RawMessage `json:"size"`
	Protocol string          `json:"protocol"`
	// OnCongestion is the congestion policy in force.
	OnCongestion string          `json:"on_congestion"`
	Primary      string          `json:"primary"`
	Epoch        uint64          `json:"epoch"`
	NBDURI       string          `json:"nbd_uri"`
	Replicas     []replicaStatus `json:"replicas"`
	// ResyncRate is the primary's resync cap (bytes/s; 0: none).
	ResyncRate int64 `json:"resync_rate"`
	// Mount is the mount claim on the primary (replctl mount).
	Mount *struct {
		Holder struct {
			Host string `json:"host"`
			Dir  string `json:"dir"`
		} `json:"holder"`
		Connections int `json:"connections"`
	} `json:"mount"`
}

type replicaStatus struct {
	Node        string `json:"node"`
	Role        string `json:"role"`
	Disk        string `json:"disk"`
	Replication string `json:"replication"`
	Raft        string `json:"raft"`
	OutOfSync   int64  `json:"out_of_sync_bytes"`
	Resynced    int64  `json:"resynced_bytes"`
	// LagBytes and LagSeconds: protocols A and B (issue 10).
	LagBytes    int64   `json:"lag_bytes"`
	LagSeconds  float64 `json:"lag_seconds"`
	SyncRule    string  `json:"sync_rule"`
	Decision    string  `json:"sync_decision"`
	Reason      string  `json:"reason"`
	Reachable   bool    `json:"reachable"`
	Generation  string  `json:"generation"`
	UsableBytes int64   `json:"usable_bytes"`
	VerifyDone  int64   `json:"verify_done_bytes"`
	VerifyTotal int64   `json:"verify_total_bytes"`
	VerifyFound int64   `json:"verify_found_bytes"`
	// Integrity: issue 29 (nil from a node that did not answer).
	Integrity *struct {
		Checksums           bool  `json:"checksums"`
		RepairedBlocks      int64 `json:"repaired_blocks"`
		UnrecoverableBlocks int64 `json:"unrecoverable_blocks"`
		Scrub               struct {
			State string `json:"state"`
		} `json:"scrub"`
	} `json:"integrity"`
}

func (v *volumeStatus) replica(node string) *replicaStatus {
	for i := range v.Replicas {
		if v.Replicas[i].Node == node {
			return &v.Replicas[i]
		}
	}
	return nil
}

func (v *volumeStatus) inSync() bool {
	if len(v.Replicas) < 2 {
		return false
	}
	for _, r := range v.Replicas {
		if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSync != 0 {
			return false
		}
	}
	return true
}

// clusterStatus asks a node for the cluster status (replctl status --json).
func (d *demo) clusterStatus(node string) (*statusDoc, error) {
	r := d.ctl(node, "status", "--json")
	if !r.ok() {
		return nil, fmt.Errorf("replctl status --json: %s", r)
	}
	var s statusDoc
	js := r.out
	if i := strings.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		return nil, fmt.Errorf("replctl status --json: %v in %q", err, r.out)
	}
	return &s, nil
}

// status asks a node for the cluster status and returns vol0's entry.
func (d *demo) status(node string) (*statusDoc, *volumeStatus, error) {
	s, err := d.clusterStatus(node)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for i := range s.Volumes {
		if s.Volumes[i].Name == volName {
			return s, &s.Volumes[i], nil
		}
		names = append(names, s.Volumes[i].Name)
	}
	return s, nil, fmt.Errorf("no volume %s in status (volumes: %v)", volName, names)
}

func (d *demo) mustStatus(node string) *volumeStatus {
	d.t.Helper()
	_, v, err := d.status(node)
	if err != nil {
		d.t.Fatal(err)
	}
	return v
}

// waitFor polls vol0's status on a node until cond holds.
func (d *demo) waitFor(node, what string, timeout time.Duration, cond func(*volumeStatus) bool) *volumeStatus {
	d.t.Helper()
	return d.waitForEvery(200*time.Millisecond, node, what, timeout, cond)
}

// waitForEvery is waitFor polling every interval.
func (d *demo) waitForEvery(interval time.Duration, node, what string, timeout time.Duration, cond func(*volumeStatus) bool) *volumeStatus {
	d.t.Helper()
	var last string
	var got *volumeStatus
	if !within(timeout, interval, func() bool {
		_, v, err := d.status(node)
		if err == nil && cond(v) {
			got = v
			return true
		}
		if err != nil {
			last = err.Error()
		} else {
			b, _ := json.Marshal(v)
			last = string(b)
		}
		return false
	}) {
		d.t.Fatalf("%s: not reached after %s; last status: %s", what, timeout, last)
	}
	return got
}

func (d *demo) waitInSync(node string) *volumeStatus {
	d.t.Helper()
	return d.waitFor(node, "all replicas UpToDate and Connected", syncTimeout, (*volumeStatus).inSync)
}

// ---------------------------------------------------------------------------
// files

// compareFiles fails the test unless the first n bytes of a and b are equal.
func compareFiles(t *testing.T, a, b string, n int64) {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	const chunk = 1 << 20
	ba, bb := make([]byte, chunk), make([]byte, chunk)
	var diffBlocks int
	first := int64(-1)
	for off := int64(0); off < n; off += chunk {
		l := min(chunk, n-off)
		if _, err := io.ReadFull(io.NewSectionReader(fa, off, l), ba[:l]); err != nil {
			t.Fatalf("read %s at %d: %v", a, off, err)
		}
		if _, err := io.ReadFull(io.NewSectionReader(fb, off, l), bb[:l]); err != nil {
			t.Fatalf("read %s at %d: %v", b, off, err)
		}
		if bytes.Equal(ba[:l], bb[:l]) {
			continue
		}
		for o := int64(0); o < l; o += 4096 {
			e := min(o+4096, l)
			if !bytes.Equal(ba[o:e], bb[o:e]) {
				diffBlocks++
				if first < 0 {
					first = off + o
				}
			}
		}
	}
	if diffBlocks > 0 {
		t.Fatalf("backing files differ: %d 4KiB blocks within the first %d bytes, first at offset %d\n  %s\n  %s",
			diffBlocks, n, first, a, b)
	}
}

func hashRegion(t *testing.T, path string, off, n int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, off, n)); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// ---------------------------------------------------------------------------
// a minimal raw NBD client (fixed newstyle, OPT_GO, simple replies)

const (
	nbdCmdRead  = 0
	nbdCmdWrite = 1
	nbdCmdDisc  = 2
	nbdCmdFlush = 3
)

type rawNBD struct {
	conn   net.Conn
	size   uint64
	flags  uint16
	handle uint64
	// timeout bounds each request (default 15 s).
	timeout time.Duration
}

func dialRawNBD(uri string) (*rawNBD, error) {
	c, err := dialRawNBDWithin(uri, 10*time.Second)
	if err == nil {
		c.timeout = 15 * time.Second
	}
	return c, err
}

// dialRawNBDWithin connects and negotiates within timeout, which then
// bounds each request too.
func dialRawNBDWithin(uri string, timeout time.Duration) (*rawNBD, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", u.Host, min(timeout, 5*time.Second))
	if err != nil {
		return nil, err
	}
	c := &rawNBD{conn: conn, timeout: timeout}
	if err := c.handshake(strings.TrimPrefix(u.Path, "/")); err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake with %s: %w", uri, err)
	}
	return c, nil
}

func (c *rawNBD) handshake(export string) error {
	_ = c.conn.SetDeadline(time.Now().Add(c.timeout))
	defer c.conn.SetDeadline(time.Time{})
	var hello [18]byte
	if _, err := io.ReadFull(c.conn, hello[:]); err != nil {
		return err
	}
	if string(hello[:8]) != "NBDMAGIC" || string(hello[8:16]) != "IHAVEOPT" {
		return fmt.Errorf("not a fixed-newstyle NBD server: %q", hello[:16])
	}
	hflags := binary.BigEndian.Uint16(hello[16:])
	cflags := uint32(1) // NBD_FLAG_C_FIXED_NEWSTYLE
	noZeroes := hflags&2 != 0
	if noZeroes {
		cflags |= 2 // NBD_FLAG_C_NO_ZEROES
	}
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = binary.BigEndian.AppendUint16(data, 0) // no info requests
	opt := binary.BigEndian.AppendUint32(nil, cflags)
	opt = binary.BigEndian.AppendUint64(opt, 0x49484156454F5054) // IHAVEOPT
	opt = binary.BigEndian.AppendUint32(opt, 7)                  // NBD_OPT_GO
	opt = binary.BigEndian.AppendUint32(opt, uint32(len(data)))
	opt = append(opt, data...)
	if _, err := c.conn.Write(opt); err != nil {
		return err
	}
	for {
		var h [20]byte
		if _, err := io.ReadFull(c.conn, h[:]); err != nil {
			return err
		}
		typ := binary.BigEndian.Uint32(h[12:])
		payload := make([]byte, binary.BigEndian.Uint32(h[16:]))
		if _, err := io.ReadFull(c.conn, payload); err != nil {
			return err
		}
		switch {
		case typ == 1: // NBD_REP_ACK
			if c.flags == 0 {
				return errors.New("no NBD_INFO_EXPORT before ACK")
			}
			return nil
		case typ == 3 && len(payload) >= 12 && binary.BigEndian.Uint16(payload) == 0: // NBD_INFO_EXPORT
			c.size = binary.BigEndian.Uint64(payload[2:])
			c.flags = binary.BigEndian.Uint16(payload[10:])
		case typ&(1<<31) != 0:
			return fmt.Errorf("option error 0x%x: %s", typ, payload)
		}
	}
}

// request sends one command and reads its simple reply. data is the write
// payload (sent whatever length says); readLen is how many bytes of read
// data follow a successful reply.
func (c *rawNBD) request(typ, flags uint16, off uint64, length uint32, data []byte, readLen int) (errno uint32, reply []byte, err error) {
	timeout := c.timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	_ = c.conn.SetDeadline(time.Now().Add(timeout))
	defer c.conn.SetDeadline(time.Time{})
	c.handle++
	req := append(reqHeader(typ, flags, c.handle, off, length), data...)
	if _, err := c.conn.Write(req); err != nil {
		return 0, nil, err
	}
	var h [16]byte
	if _, err := io.ReadFull(c.conn, h[:]); err != nil {
		return 0, nil, fmt.Errorf("reading reply: %w", err)
	}
	if m := binary.BigEndian.Uint32(h[:]); m != 0x67446698 {
		return 0, nil, fmt.Errorf("bad reply magic 0x%x", m)
	}
	if hd := binary.BigEndian.Uint64(h[8:]); hd != c.handle {
		return 0, nil, fmt.Errorf("reply handle %d, want %d", hd, c.handle)
	}
	errno = binary.BigEndian.Uint32(h[4:])
	if errno == 0 && readLen > 0 {
		reply = make([]byte, readLen)
		if _, err := io.ReadFull(c.conn, reply); err != nil {
			return 0, nil, fmt.Errorf("reading data: %w", err)
		}
	}
	return errno, reply, nil
}

func (c *rawNBD) read(off uint64, n int) ([]byte, error) {
	errno, b, err := c.request(nbdCmdRead, 0, off, uint32(n), nil, n)
	if err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, fmt.Errorf("read %d@%d: errno %d", n, off, errno)
	}
	return b, nil
}

// write writes data at off and returns the server's errno (0: acknowledged).
func (c *rawNBD) write(off uint64, data []byte) (uint32, error) {
	errno, _, err := c.request(nbdCmdWrite, 0, off, uint32(len(data)), data, 0)
	return errno, err
}

func (c *rawNBD) close() {
	_ = c.conn.SetDeadline(time.Now().Add(2 * time.Second))
	c.handle++
	_, _ = c.conn.Write(reqHeader(nbdCmdDisc, 0, c.handle, 0, 0))
	c.conn.Close()
}

func reqHeader(typ, flags uint16, handle, off uint64, length uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0x25609513)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, handle)
	b = binary.BigEndian.AppendUint64(b, off)
	return binary.BigEndian.AppendUint32(b, length)
}

// ---------------------------------------------------------------------------
// misc

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
