package main

// replctl mount --follow and replctl attach/detach (issue 30, item 2): a
// host that holds no replica mounts the volume through any node, and its
// helper follows the primary through a kill -9.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/volmount"
)

// TestE2EAFollowingMountRidesThroughAKill9OfThePrimary: a client host (a
// run directory of its own, --addr the witness, which holds no replica)
// mounts vol0 with --follow; fio writes with verify into a file there while
// the primary alpha is killed -9. beta takes over, the helper finds it,
// takes the claim there and sends what alpha did not answer again: fio
// finishes with no error and its verify passes, the listing shows beta as
// the primary followed, another host's mount is refused at beta (the claim
// was taken there under the same ID), and replctl umount gives the claim back
// to beta.
func TestE2EAFollowingMountRidesThroughAKill9OfThePrimary(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	fio := RequireTool(t, "fio", "fio")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, TLS: true, Size: 128 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	runs := newMountRunDirs(t, "client", "other")
	runs.cleanUpAtTheEnd()
	mnt := runs.mountPoint("client")
	list := func() string {
		r := runCmd(30*time.Second, nil, replctlBin, "mount", "--run-dir", runs.dirs["client"])
		if !r.ok() {
			t.Fatalf("replctl mount (list): %s", r)
		}
		return r.out
	}

	r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("witness", []string{"mount", volName, mnt, "--mkfs", "--follow", "--io-timeout", "3m", "--run-dir", runs.dirs["client"]})...)
	if !r.ok() || !strings.Contains(r.out, "following the primary") || !strings.Contains(r.out, "claimed on alpha") {
		t.Fatalf("replctl mount --follow through the witness: %s", r)
	}
	t.Logf("%s", strings.TrimSpace(r.out))
	if out := list(); !strings.Contains(out, "alpha (following)") {
		t.Fatalf("the listing does not show alpha followed:\n%s", out)
	}

	before, err := c.writeBytes("alpha")
	if err != nil {
		t.Fatal(err)
	}
	// alpha is killed in the middle of fio's writes, with requests in flight; fio's verify
	// then reads back every block through beta.
	fioDone, fioOut := startFioVerify(t, fio, filepath.Join(mnt, "fio.dat"), "32M")
	c.waitWritten("alpha", before+8<<20, fioDone)
	c.kill("alpha")
	killed := time.Now()
	c.waitPrimary("beta", 2*time.Minute, "alpha")

	var fioErr error
	select {
	case fioErr = <-fioDone:
	case <-time.After(5 * time.Minute):
		t.Fatalf("fio did not end 5 minutes after alpha was killed\n%s", fioOut.String())
	}
	if fioErr != nil {
		t.Fatalf("fio across the kill -9 of the primary: %v\n%s", fioErr, fioOut.String())
	}
	res, err := parseFio(fioOut.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != 0 || res.Write.IOBytes != 32<<20 || res.Read.IOBytes != 32<<20 {
		t.Fatalf("fio: error %d, wrote %d, verified %d bytes (want 32 MiB each)\n%s", res.Error, res.Write.IOBytes, res.Read.IOBytes, fioOut.String())
	}
	t.Logf("fio wrote and verified 32 MiB; it ended %s after alpha was killed", time.Since(killed).Round(time.Millisecond))
	if out := list(); !strings.Contains(out, "beta (following)") {
		t.Fatalf("the listing does not show beta followed:\n%s", out)
	}
	// The helper took the claim at beta under the mount's ID: another host's mount is
	// refused there, naming this mount.
	other := runs.mountPoint("other")
	r = runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("beta", []string{"mount", volName, other, "--run-dir", runs.dirs["other"]})...)
	if r.ok() || !strings.Contains(r.out, "mounted already") || !strings.Contains(r.out, mnt) {
		t.Fatalf("a mount from another host while the following mount holds vol0 on beta: %s; want it refused, naming %s", r, mnt)
	}
	helperLog, _ := os.ReadFile(volmount.Registry{Dir: runs.dirs["client"]}.LogPath(mnt))
	if !strings.Contains(string(helperLog), "following beta") {
		t.Errorf("the helper's log does not say it follows beta:\n%s", helperLog)
	}
	t.Logf("the helper's log:\n%s", helperLog)
	if r := runCmd(2*time.Minute, nil, replctlBin, "umount", mnt, "--run-dir", runs.dirs["client"]); !r.ok() || !strings.Contains(r.out, "its claim on beta given back") {
		t.Fatalf("replctl umount %s: %s", mnt, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
}

// TestE2EAFollowingMountRidesThroughASwitchover: a switchover (replctl
// primary vol0 --node beta) while a following mount writes is not refused
// for the mount's connections, as it is for any other mount: alpha drains
// them (its server answers NBD_ESHUTDOWN), the helper takes the claim at
// beta and sends what alpha did not answer again, and fio finishes with no
// error and its verify passes.
func TestE2EAFollowingMountRidesThroughASwitchover(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	fio := RequireTool(t, "fio", "fio")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 128 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	runs := newMountRunDirs(t, "client")
	runs.cleanUpAtTheEnd()
	mnt := runs.mountPoint("client")
	r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("witness", []string{"mount", volName, mnt, "--mkfs", "--follow", "--io-timeout", "3m", "--run-dir", runs.dirs["client"]})...)
	if !r.ok() || !strings.Contains(r.out, "claimed on alpha") {
		t.Fatalf("replctl mount --follow through the witness: %s", r)
	}
	before, err := c.writeBytes("alpha")
	if err != nil {
		t.Fatal(err)
	}
	fioDone, fioOut := startFioVerify(t, fio, filepath.Join(mnt, "fio.dat"), "32M")
	c.waitWritten("alpha", before+4<<20, fioDone)
	if r := c.ctl("witness", "primary", volName, "--node", "beta"); !r.ok() {
		t.Fatalf("a switchover to beta with a following mount writing: %s", r)
	}
	var fioErr error
	select {
	case fioErr = <-fioDone:
	case <-time.After(5 * time.Minute):
		t.Fatalf("fio did not end 5 minutes after the switchover\n%s", fioOut.String())
	}
	if fioErr != nil {
		t.Fatalf("fio across the switchover: %v\n%s", fioErr, fioOut.String())
	}
	res, err := parseFio(fioOut.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != 0 || res.Write.IOBytes != 32<<20 || res.Read.IOBytes != 32<<20 {
		t.Fatalf("fio: error %d, wrote %d, verified %d bytes (want 32 MiB each)\n%s", res.Error, res.Write.IOBytes, res.Read.IOBytes, fioOut.String())
	}
	out := runCmd(30*time.Second, nil, replctlBin, "mount", "--run-dir", runs.dirs["client"])
	if !out.ok() || !strings.Contains(out.out, "beta (following)") {
		t.Fatalf("the listing does not show beta followed: %s", out)
	}
	// replctl status says where and how it is mounted: following.
	if st := c.ctl("witness", "status"); !st.ok() || !strings.Contains(st.out, "by replctl mount --follow (it follows the primary)") {
		t.Fatalf("replctl status does not say the volume is mounted following the primary: %s", st)
	}
	if st := c.ctl("witness", "status", "--json"); !st.ok() || !strings.Contains(st.out, `"follows": true`) {
		t.Fatalf("replctl status --json does not say the mount follows: %s", st)
	}
	if r := runCmd(2*time.Minute, nil, replctlBin, "umount", mnt, "--run-dir", runs.dirs["client"]); !r.ok() || !strings.Contains(r.out, "its claim on beta given back") {
		t.Fatalf("replctl umount %s: %s", mnt, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
}

// startFioVerify starts fio writing size bytes of 4 KiB random writes to
// file with a crc32c verify after, and returns what its end sends (its
// exit) and its output; the test's end kills it if it still runs.
func startFioVerify(t *testing.T, fio, file, size string) (chan error, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(fio, "--name=follow", "--filename="+file, "--size="+size, "--rw=randwrite", "--bs=4k",
		"--ioengine=libaio", "--iodepth=16", "--direct=1", "--verify=crc32c", "--do_verify=1",
		"--verify_fatal=1", "--randrepeat=0", "--output-format=json")
	cmd.Dir = t.TempDir()
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return done, out
}
