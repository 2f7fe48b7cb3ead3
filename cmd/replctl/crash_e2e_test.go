package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/testport"
	"github.com/replvol/replvol/metadata"
)

// freePort returns a free 127.0.0.1 port, never one it returned before
// (the kernel may hand a closed port out again at once).
func freePort(t *testing.T) string {
	t.Helper()
	return testport.Pick(t, false)
}

// procCluster is alpha and beta (or the nodes of newProcClusterN) as
// replnode processes, sharing one config.
type procCluster struct {
	*demo
	cfgPath string
	procs   map[string]*exec.Cmd
	bin     string
	// names lists the nodes in config order (nil: alpha and beta).
	names []string
	// lab, when set, runs each node in its own network namespace.
	lab *netLab
	// env adds variables to a node's environment (notifyOf's
	// NOTIFY_SOCKET) from its next start on.
	env map[string][]string
}

// newProcCluster writes a two-node config for a size-byte volume with
// internal metadata (al_extents extents) and starts nothing yet. Each
// backing file is exactly as large as the volume and its metadata.
func newProcCluster(t *testing.T, size, alExtents int64) *procCluster {
	t.Helper()
	return newProcClusterOnDisks(t, size, alExtents, 0)
}

// newProcClusterOnDisks is newProcCluster with sparse backing files of
// diskSize bytes (0: exactly the volume plus its internal metadata).
func newProcClusterOnDisks(t *testing.T, size, alExtents, diskSize int64) *procCluster {
	t.Helper()
	dir := t.TempDir()
	devSize, err := metadata.InternalDeviceSizeFor(size, int(alExtents), 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if diskSize != 0 {
		if diskSize < devSize {
			t.Fatalf("a %d-byte disk cannot hold a %d-byte volume and its metadata (%d bytes)", diskSize, size, devSize)
		}
		devSize = diskSize
	}
	c := &procCluster{demo: &demo{t: t, dir: dir, nodes: map[string]demoNode{}}, procs: map[string]*exec.Cmd{}, bin: replnode(t)}
	// Registered before any node starts, so it runs after they stopped.
	t.Cleanup(c.logTails)
	cfg := "nodes:\n"
	for _, name := range []string{"alpha", "beta"} {
		n := demoNode{Name: name, Control: freePort(t), Replication: freePort(t), NBD: freePort(t)}
		c.nodes[name] = n
		cfg += fmt.Sprintf("  - {name: %s, control: %q, replication: %q, nbd: %q, state_dir: %q}\n",
			name, n.Control, n.Replication, n.NBD, filepath.Join(dir, name))
		img := filepath.Join(dir, name+".img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, devSize); err != nil {
			t.Fatal(err)
		}
	}
	cfg += fmt.Sprintf("volumes:\n  - {name: vol0, size: %d, protocol: C, primary: alpha, al_extents: %d, disks: {alpha: %q, beta: %q}}\n",
		size, alExtents, filepath.Join(dir, "alpha.img"), filepath.Join(dir, "beta.img"))
	c.cfgPath = filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(c.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// start runs node name's replnode with extra flags; the test's cleanup
// stops it.
func (c *procCluster) start(name string, extra ...string) {
	t := c.t
	log, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.command(name, append([]string{"--config", c.cfgPath, "--node", name, "--log-level", "warn"}, extra...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if e := c.env[name]; len(e) > 0 {
		cmd.Env = append(os.Environ(), e...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.procs[name] = cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			stopProc(cmd)
		}
		log.Close()
	})
	// Runs before the stop above (cleanups run last-registered first): a
	// failed test has each node it leaves running write its goroutines'
	// stacks to its log (Go's SIGQUIT), for logTails to show where a node
	// that did not do what the test waited for stood.
	t.Cleanup(func() { dumpStacks(t, cmd) })
}

// dumpStacks has a replnode that still runs in a failed test print every
// goroutine's stack to its log and exit (SIGQUIT), and reaps it.
func dumpStacks(t *testing.T, cmd *exec.Cmd) {
	if !t.Failed() || cmd.ProcessState != nil || cmd.Process.Signal(syscall.SIGQUIT) != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// notifications hears what a replnode tells systemd (sd_notify):
// READY=1 once it serves, RELOADING=1 and READY=1 again around a SIGHUP.
type notifications struct {
	t    *testing.T
	name string
	conn *net.UnixConn
}

// notifyOf gives node name a notification socket of the test's (as
// systemd's Type=notify does) from its next start on.
func (c *procCluster) notifyOf(name string) *notifications {
	t := c.t
	t.Helper()
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if c.env == nil {
		c.env = map[string][]string{}
	}
	c.env[name] = append(c.env[name], "NOTIFY_SOCKET="+sock)
	return &notifications{t: t, name: name, conn: conn}
}

// reloaded waits until the node has handled a SIGHUP: RELOADING=1, then
// READY=1 (what it logs for the reload, it has logged by then).
func (n *notifications) reloaded() {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	reloading := false
	buf := make([]byte, 512)
	for {
		n.conn.SetReadDeadline(deadline)
		k, err := n.conn.Read(buf)
		if err != nil {
			n.t.Fatalf("%s did not tell systemd a SIGHUP was handled (RELOADING=1, then READY=1) in 30 s: %v", n.name, err)
		}
		msg := string(buf[:k])
		switch {
		case strings.HasPrefix(msg, "RELOADING=1"):
			reloading = true
		case reloading && strings.HasPrefix(msg, "READY=1"):
			return
		}
	}
}

// stop ends node name's replnode cleanly (SIGTERM).
func (c *procCluster) stop(name string) { stopProc(c.procs[name]) }

// kill ends node name's replnode with SIGKILL (a crash) and reaps it.
func (c *procCluster) kill(name string) {
	cmd := c.procs[name]
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// pause stops node name's replnode with SIGSTOP (a hung node: its sockets
// stay open and answer nothing); the test's cleanup continues it.
func (c *procCluster) pause(name string) {
	t := c.t
	t.Helper()
	cmd := c.procs[name]
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", name, err)
	}
	// Cleanups run last-registered first: this one before the stop.
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT) })
}

// resume continues a paused replnode (SIGCONT).
func (c *procCluster) resume(name string) {
	c.t.Helper()
	if err := c.procs[name].Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatalf("SIGCONT %s: %v", name, err)
	}
}

// uri is the volume's NBD URI on node name.
func (c *procCluster) uri(name string) string {
	return "nbd://" + c.nodes[name].NBD + "/" + volName
}

// waitListening waits until node name's control address accepts
// connections, and fails the test if its replnode exits first.
func (c *procCluster) waitListening(name string, timeout time.Duration) {
	t := c.t
	t.Helper()
	var err error
	if !within(timeout, 50*time.Millisecond, func() bool {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp", c.nodes[name].Control, time.Second)
		if err == nil {
			conn.Close()
			return true
		}
		if ps := c.procs[name].ProcessState; ps != nil {
			t.Fatalf("replnode %s exited (%s) before listening on %s", name, ps, c.nodes[name].Control)
		}
		return false
	}) {
		t.Fatalf("replnode %s: control address %s not answering after %s: %v", name, c.nodes[name].Control, timeout, err)
	}
}

// localView is the part of a node's own view (/api/node: the node alone,
// no peer is asked) the tests read.
type localView struct {
	Volumes []struct {
		Name       string `json:"name"`
		Role       string `json:"role"`
		Disk       string `json:"disk"`
		Reason     string `json:"reason"`
		Writes     uint64 `json:"writes"`
		WriteBytes uint64 `json:"write_bytes"`
	} `json:"volumes"`
	Events []nodeEvent `json:"events"`
}

type nodeEvent struct {
	Time    time.Time `json:"time"`
	Volume  string    `json:"volume"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

func (c *procCluster) localView(name string) (*localView, error) {
	resp, err := c.apiGet(name, "/api/node")
	if err != nil {
		return nil, err
	}
	return readLocalView(name, resp)
}

// fetchLocalView reads /api/node from the node name at control.
func fetchLocalView(name, control string) (*localView, error) {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + control + "/api/node")
	if err != nil {
		return nil, err
	}
	return readLocalView(name, resp)
}

func readLocalView(name string, resp *http.Response) (*localView, error) {
	defer resp.Body.Close()
	var lv localView
	if err := json.NewDecoder(resp.Body).Decode(&lv); err != nil {
		return nil, fmt.Errorf("/api/node on %s: %w", name, err)
	}
	return &lv, nil
}

// eventsOf returns the events of lv of the given kind at or after since,
// oldest first.
func (lv *localView) eventsOf(kind string, since time.Time) []nodeEvent {
	var evs []nodeEvent
	for _, e := range lv.Events {
		if e.Kind == kind && !e.Time.Before(since) {
			evs = append(evs, e)
		}
	}
	return evs
}

// writeBytes returns how many bytes node name's vol0 has written as
// primary since it started.
func (c *procCluster) writeBytes(name string) (uint64, error) {
	lv, err := c.localView(name)
	if err != nil {
		return 0, err
	}
	for _, v := range lv.Volumes {
		if v.Name == volName {
			return v.WriteBytes, nil
		}
	}
	return 0, fmt.Errorf("/api/node on %s: no volume %s", name, volName)
}

// waitWritten waits until node name's vol0 has written at least n bytes
// as primary (/api/node), while a client whose end fioDone reports keeps
// writing: the test fails if the client ends first, or after a minute.
// An end it reads from fioDone it puts back.
func (c *procCluster) waitWritten(name string, n uint64, fioDone chan error) {
	t := c.t
	t.Helper()
	var wrote uint64
	var err error
	if !within(time.Minute, 20*time.Millisecond, func() bool {
		select {
		case end := <-fioDone:
			fioDone <- end
			t.Fatalf("the client ended (%v) before %s wrote %d bytes (%d so far)", end, name, n, wrote)
		default:
		}
		wrote, err = c.writeBytes(name)
		return err == nil && wrote >= n
	}) {
		t.Fatalf("%s wrote %d bytes in a minute, want %d (last error: %v)", name, wrote, n, err)
	}
}

// eventsSince returns node name's recent events of the given kind at or
// after since, oldest first.
func (c *procCluster) eventsSince(name, kind string, since time.Time) ([]nodeEvent, error) {
	lv, err := c.localView(name)
	if err != nil {
		return nil, err
	}
	return lv.eventsOf(kind, since), nil
}

// logTails prints the end of every node's log when the test failed.
func (c *procCluster) logTails() {
	if !c.t.Failed() {
		return
	}
	for _, name := range c.nodeNames() {
		b, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
		if err != nil || len(b) == 0 {
			continue
		}
		logged, stacks := splitStacks(b)
		if len(logged) > 6000 {
			logged = logged[len(logged)-6000:]
		}
		c.t.Logf("replnode %s log (tail):\n%s", name, logged)
		if len(stacks) > 0 {
			c.t.Logf("replnode %s goroutines in replvol's packages at the failure (SIGQUIT):\n%s", name, stacks)
		}
	}
}

// splitStacks splits a replnode's log at the goroutine dump a SIGQUIT
// wrote (dumpStacks): the log before it, and the stacks of the goroutines
// whose calls pass through replvol's own code, without the frames'
// addresses (at most 64 KiB of them).
func splitStacks(b []byte) (logged, stacks []byte) {
	i := bytes.Index(b, []byte("\nSIGQUIT: quit"))
	if i < 0 {
		return b, nil
	}
	logged = b[:i+1]
	for _, g := range bytes.Split(b[i:], []byte("\n\n")) {
		if !bytes.HasPrefix(g, []byte("goroutine ")) || !bytes.Contains(g, []byte("github.com/replvol/replvol/")) {
			continue
		}
		g = frameAddrs.ReplaceAll(g, nil)
		if len(stacks)+len(g) > 64<<10 {
			stacks = append(stacks, "... (more goroutines left out)\n"...)
			break
		}
		stacks = append(append(stacks, g...), "\n\n"...)
	}
	return logged, stacks
}

// frameAddrs are a goroutine dump's frame and stack addresses.
var frameAddrs = regexp.MustCompile(` fp=0x[0-9a-f]+ sp=0x[0-9a-f]+ pc=0x[0-9a-f]+`)

// logSize is how many bytes node's log holds now (0 when it has none).
func (c *procCluster) logSize(name string) int64 {
	fi, err := os.Stat(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSummarySince counts the lines node logged after byte from, by
// level and message (a failure's diagnosis: what a node was busy with),
// most frequent first.
func (c *procCluster) logSummarySince(name string, from int64) string {
	b, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return err.Error()
	}
	if from > int64(len(b)) {
		from = 0
	}
	counts := map[string]int{}
	for line := range strings.Lines(string(b[from:])) {
		key := line
		if i := strings.Index(line, "level="); i >= 0 {
			key = line[i:]
			if j := strings.Index(key, " node="); j >= 0 {
				key = key[:j]
			}
		}
		counts[strings.TrimSpace(key)]++
	}
	if len(counts) == 0 {
		return "nothing"
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(counts[b]-counts[a], strings.Compare(a, b))
	})
	var out strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&out, "\n  %6d  %s", counts[k], k)
	}
	return out.String()
}

func stopProc(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Process.Signal(syscall.SIGCONT) // a paused node gets the SIGTERM too
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func (c *procCluster) disk(name string) string { return filepath.Join(c.dir, name+".img") }

// TestE2EKill9PrimaryResyncsOnlyTheActivityLog runs two replnode
// processes, kills the primary with SIGKILL in the middle of random writes
// and restarts it: the resync moves at most the activity log's extents
// (al_extents × 4 MiB), not the volume, and the replicas end identical.
func TestE2EKill9PrimaryResyncsOnlyTheActivityLog(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	const (
		size      = 128 << 20
		alExtents = 7
	)
	c := newProcCluster(t, size, alExtents)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	before := c.mustStatus("beta").replica("beta").Resynced

	uri := "nbd://" + c.nodes["alpha"].NBD + "/vol0"
	// fio writes until alpha is killed under it; its runtime only bounds
	// a test that went wrong (waitWritten gives up after a minute). With
	// 20 s, a loaded machine ended it before 16 MiB were written.
	fioCmd := exec.Command(fio, "--name=w", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
		"--size=128M", "--iodepth=16", "--runtime=120", "--time_based", "--randrepeat=0")
	fioCmd.Dir = c.dir
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fioCmd.Wait() }()
	// 16 MiB of random 4 KiB writes over 32 extents: more extents than
	// the activity log holds have been hot, and fio goes on writing.
	c.waitWritten("alpha", 16<<20, fioDone)
	c.procs["alpha"].Process.Kill() // SIGKILL in the middle of the writes
	c.procs["alpha"].Wait()
	<-fioDone // fio fails: its server is gone
	c.start("alpha")
	v := c.waitInSync("beta")
	moved := v.replica("beta").Resynced - before
	if moved <= 0 || moved > alExtents*(4<<20) {
		t.Fatalf("after kill -9 of the primary the resync moved %d bytes, want 0 < moved <= %d (al_extents × 4 MiB)", moved, alExtents*(4<<20))
	}
	t.Logf("kill -9 of the primary: resync moved %d bytes of a %d-byte volume", moved, size)
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2EReplacedPrimaryDiskCopiesFromItsPeer: the primary's disk is
// replaced (a blank one) and `replctl create-md --force --yes` initialises
// it. The node comes back primary and copies the volume from beta (status
// names rule just-created-self); the data reads back through its NBD export
// and the disks end identical.
func TestE2EReplacedPrimaryDiskCopiesFromItsPeer(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 64 << 20
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	uri := "nbd://" + c.nodes["alpha"].NBD + "/vol0"
	qemuIO(t, uri, "write -P 0x5a 0 1M", "write -P 0xa5 40M 64k", "write -P 0x11 63M 4k", "flush")

	c.stop("alpha")
	fi, err := os.Stat(c.disk("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(c.disk("alpha"), 0); err != nil { // a blank disk
		t.Fatal(err)
	}
	if err := os.Truncate(c.disk("alpha"), fi.Size()); err != nil {
		t.Fatal(err)
	}
	r := runCmd(30*time.Second, nil, replctlBin, "create-md", "vol0", "--config", c.cfgPath, "--node", "alpha", "--force", "--yes")
	if !r.ok() {
		t.Fatalf("replctl create-md: %s", r)
	}
	c.start("alpha")
	c.waitInSync("alpha")
	// The data is back, read through alpha's NBD export.
	qemuIO(t, uri, "read -P 0x5a 0 1M", "read -P 0xa5 40M 64k", "read -P 0x11 63M 4k")
	b := c.mustStatus("alpha").replica("beta")
	if b.SyncRule != "just-created-self" || b.Decision != "target-set-bitmap" {
		t.Fatalf("status says %q by rule %q, want target-set-bitmap by just-created-self", b.Decision, b.SyncRule)
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestSplitStacksKeepsReplvolsGoroutines: what a failed e2e test shows of
// a node's SIGQUIT dump (dumpStacks) is its log before the dump, and the
// goroutines that run replvol's code, their frames without addresses.
func TestSplitStacksKeepsReplvolsGoroutines(t *testing.T) {
	b := []byte("time=1 msg=a\ntime=2 msg=b\nSIGQUIT: quit\nPC=0x1 m=0\n\ngoroutine 1 [select]:\nruntime.gopark()\n\n" +
		"goroutine 7 [chan receive]:\ngithub.com/replvol/replvol/node.(*peer).run()\n\tnode/peer.go:1 +0x7fb fp=0x3759 sp=0x375a pc=0xd088\n\nrax 0x0\n")
	logged, stacks := splitStacks(b)
	if string(logged) != "time=1 msg=a\ntime=2 msg=b\n" {
		t.Errorf("the log before the dump: %q", logged)
	}
	if want := "goroutine 7 [chan receive]:\ngithub.com/replvol/replvol/node.(*peer).run()\n\tnode/peer.go:1 +0x7fb\n\n"; string(stacks) != want {
		t.Errorf("the stacks: %q, want %q", stacks, want)
	}
	if logged, stacks := splitStacks([]byte("time=1 msg=a\n")); string(logged) != "time=1 msg=a\n" || stacks != nil {
		t.Errorf("a log without a dump: %q %q", logged, stacks)
	}
}
