package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
)

// freePort returns a free 127.0.0.1 port, never one it returned before
// (the kernel may hand a closed port out again at once).
func freePort(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if _, loaded := givenPorts.LoadOrStore(addr, true); !loaded {
			return addr
		}
	}
}

var givenPorts sync.Map

// procCluster is alpha and beta as replnode processes, sharing one config.
type procCluster struct {
	*demo
	cfgPath string
	procs   map[string]*exec.Cmd
	bin     string
}

// newProcCluster writes a two-node config for a size-byte volume with
// internal metadata (al_extents extents) and starts nothing yet.
func newProcCluster(t *testing.T, size, alExtents int64) *procCluster {
	t.Helper()
	dir := t.TempDir()
	devSize, err := metadata.InternalDeviceSize(size, int(alExtents), 1)
	if err != nil {
		t.Fatal(err)
	}
	c := &procCluster{demo: &demo{t: t, dir: dir, nodes: map[string]demoNode{}}, procs: map[string]*exec.Cmd{}, bin: replnode(t)}
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

// start runs node name's replnode; the test's cleanup stops it.
func (c *procCluster) start(name string) {
	t := c.t
	log, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "--config", c.cfgPath, "--node", name, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
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
}

// stop ends node name's replnode cleanly (SIGTERM).
func (c *procCluster) stop(name string) { stopProc(c.procs[name]) }

func stopProc(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
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
	e2e(t)
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
	fioCmd := exec.Command(fio, "--name=w", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
		"--size=128M", "--iodepth=16", "--runtime=20", "--time_based", "--randrepeat=0")
	fioCmd.Dir = c.dir
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	c.procs["alpha"].Process.Kill() // SIGKILL in the middle of the writes
	c.procs["alpha"].Wait()
	fioCmd.Wait() // fio fails: its server is gone
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
	e2e(t)
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
