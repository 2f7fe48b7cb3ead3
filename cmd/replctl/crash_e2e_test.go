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

// TestE2EKill9PrimaryResyncsOnlyTheActivityLog runs two replnode
// processes, kills the primary with SIGKILL in the middle of random writes
// and restarts it: the resync moves at most the activity log's extents
// (al_extents × 4 MiB), not the volume, and the replicas end identical.
func TestE2EKill9PrimaryResyncsOnlyTheActivityLog(t *testing.T) {
	e2e(t)
	fio := RequireTool(t, "fio", "fio")
	bin := replnode(t)
	const (
		size      = 128 << 20
		alExtents = 7
	)
	dir := t.TempDir()
	devSize, err := metadata.InternalDeviceSize(size, alExtents, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{t: t, dir: dir, nodes: map[string]demoNode{}}
	cfg := "nodes:\n"
	for _, name := range []string{"alpha", "beta"} {
		n := demoNode{Name: name, Control: freePort(t), Replication: freePort(t), NBD: freePort(t)}
		d.nodes[name] = n
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
	cfgPath := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	procs := map[string]*exec.Cmd{}
	start := func(name string) {
		log, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--config", cfgPath, "--node", name, "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[name] = cmd
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Signal(syscall.SIGTERM)
				done := make(chan struct{})
				go func() { cmd.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					cmd.Process.Kill()
				}
			}
			log.Close()
		})
	}
	start("alpha")
	start("beta")
	d.waitInSync("alpha")
	before := d.mustStatus("beta").replica("beta").Resynced

	uri := "nbd://" + d.nodes["alpha"].NBD + "/vol0"
	fioCmd := exec.Command(fio, "--name=w", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
		"--size=128M", "--iodepth=16", "--runtime=20", "--time_based", "--randrepeat=0")
	fioCmd.Dir = dir
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	procs["alpha"].Process.Kill() // SIGKILL in the middle of the writes
	procs["alpha"].Wait()
	fioCmd.Wait() // fio fails: its server is gone
	start("alpha")
	v := d.waitInSync("beta")
	moved := v.replica("beta").Resynced - before
	if moved <= 0 || moved > alExtents*(4<<20) {
		t.Fatalf("after kill -9 of the primary the resync moved %d bytes, want 0 < moved <= %d (al_extents × 4 MiB)", moved, alExtents*(4<<20))
	}
	t.Logf("kill -9 of the primary: resync moved %d bytes of a %d-byte volume", moved, size)
	compareFiles(t, filepath.Join(dir, "alpha.img"), filepath.Join(dir, "beta.img"), size)
}
