package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestE2EMultipathPathFlapsUnderFioVerify runs the demo with two paths per
// node, fails and restores alpha's paths with replctl while fio writes and
// verifies through NBD: no error reaches fio, and the replicas end equal.
func TestE2EMultipathPathFlapsUnderFioVerify(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	d := startDemo(t, "--paths", "2")

	var paths []map[string]any
	if err := json.Unmarshal([]byte(d.mustCtl("alpha", "path", "list", "--json")), &paths); err != nil {
		t.Fatal(err)
	}
	if len(paths) != 4 {
		t.Fatalf("path list: %d paths, want 2 per node: %v", len(paths), paths)
	}
	for _, p := range paths {
		for _, k := range []string{"node", "volume", "path", "state", "group", "ios", "errors"} {
			if _, ok := p[k]; !ok {
				t.Fatalf("path entry lacks %q: %v", k, p)
			}
		}
	}

	stop := make(chan struct{})
	flapped := make(chan int)
	go func() {
		n := 0
		defer func() { flapped <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				d.ctl("alpha", "path", "restore", "vol0", "p0", "--node", "alpha")
				d.ctl("alpha", "path", "restore", "vol0", "p1", "--node", "alpha")
				return
			case <-time.After(100 * time.Millisecond):
			}
			victim, other := "p0", "p1"
			if i%2 == 1 {
				victim, other = other, victim
			}
			d.ctl("alpha", "path", "restore", "vol0", other, "--node", "alpha")
			if r := d.ctl("alpha", "path", "fail", "vol0", victim, "--node", "alpha"); r.ok() {
				n++
			}
		}
	}()
	// fio writes its verify state into its directory: not the source tree.
	r := runCmdIn(t.TempDir(), 3*time.Minute, nil, fio, "--name=verify", "--ioengine=nbd", "--uri="+d.uri,
		"--rw=randwrite", "--bs=4k", "--size=32M", "--iodepth=16",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	close(stop)
	n := <-flapped
	if !r.ok() {
		t.Fatalf("fio verify while paths flapped (%d path failures): %s", n, r)
	}
	if n < 2 {
		t.Fatalf("only %d path failures happened during fio", n)
	}
	d.waitInSync("alpha")
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
	out := d.mustCtl("alpha", "path", "list", "vol0")
	if !strings.Contains(out, "ACTIVE") {
		t.Fatalf("path list after the flapping: %s", out)
	}
}

// TestE2EAllPathsFailedDetachesAndServesFromThePeer fails every path of
// the primary with replctl: after the no-path queue time the disk is
// detached and NBD clients go on reading and writing through beta; when a
// path is restored the disk re-attaches and catches up.
func TestE2EAllPathsFailedDetachesAndServesFromThePeer(t *testing.T) {
	e2eBeside(t)
	d := startDemo(t, "--paths", "2")
	qemuIO(t, d.uri, "write -P 0x31 0 1M")
	d.mustCtl("alpha", "path", "fail", "vol0", "p0", "--node", "alpha")
	d.mustCtl("alpha", "path", "fail", "vol0", "p1", "--node", "alpha")
	// The first IO queues for the no-path time, then the disk is detached
	// and the IO served by beta: no error reaches the client.
	qemuIO(t, d.uri, "write -P 0x32 2M 1M", "read -P 0x32 2M 1M", "read -P 0x31 0 1M", "flush")
	v := d.waitFor("alpha", "alpha detached", 30*time.Second, func(v *volumeStatus) bool {
		r := v.replica("alpha")
		return r != nil && r.Disk == "Diskless"
	})
	if r := v.replica("alpha"); r.OutOfSync != 1<<20 {
		t.Fatalf("alpha misses %d bytes, want the 1 MiB written while detached", r.OutOfSync)
	}
	d.mustCtl("alpha", "path", "restore", "vol0", "p1", "--node", "alpha")
	d.waitFor("alpha", "alpha re-attached and caught up", 30*time.Second, func(v *volumeStatus) bool {
		r := v.replica("alpha")
		return r != nil && r.Disk == "UpToDate" && r.OutOfSync == 0
	})
	d.waitInSync("alpha")
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
}

// TestE2EResyncAndVerifyCommands runs the operator's resync and verify
// commands against the demo and waits with them.
func TestE2EResyncAndVerifyCommands(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	qemuIO(t, d.uri, "write -P 0x44 0 4M")
	out := d.mustCtl("alpha", "verify", "vol0", "--wait")
	if !strings.Contains(out, "verify 100.0%, 0B out of sync") {
		t.Fatalf("verify --wait: %s", out)
	}
	before := d.mustStatus("alpha").replica("beta").Resynced
	out = d.mustCtl("beta", "resync", "vol0", "--wait")
	if !strings.Contains(out, "full resync started on alpha for beta") || !strings.Contains(out, "vol0: in sync") {
		t.Fatalf("resync --wait: %s", out)
	}
	if moved := d.mustStatus("alpha").replica("beta").Resynced - before; moved != demoSize {
		t.Fatalf("full resync moved %d bytes, want the volume's %d", moved, demoSize)
	}
	if r := d.ctl("alpha", "resync", "vol0", "--from", "beta"); r.ok() || !strings.Contains(r.out, "runs from the primary") {
		t.Fatalf("resync --from a secondary: %s", r)
	}
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
}
