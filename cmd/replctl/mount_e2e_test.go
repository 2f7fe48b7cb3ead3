package main

// replctl mount and umount as root on the FUSE path (this kind of machine
// has no nbd module): replnode processes over TLS, the export nbds://,
// reached with the cluster's nbd-client certificate.

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/caps"
	"github.com/replvol/replvol/internal/mounttree"
	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/metadata"
)

// needMountTools skips (fails under CI=true) a test that mounts: it needs
// root, /dev/fuse and the tools replctl mount runs.
func needMountTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "replctl mount needs root (FUSE, a loop device, mount)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing(t, "replctl mount needs /dev/fuse: %v", err)
	}
	RequireTool(t, "mkfs.ext4", "e2fsprogs")
	RequireTool(t, "losetup", "util-linux")
	RequireTool(t, "blkid", "util-linux")
	RequireTool(t, "mount", "mount")
}

// mountRunDirs are the run directories of a test's replctl mounts (one per
// node: each node is a host of its own, its run directory base/run-NODE);
// cleanUp undoes whatever they record and checks nothing is left, even
// when the test failed.
type mountRunDirs struct {
	t    *testing.T
	base string
	dirs map[string]string // node -> run directory
	root string            // every mount point is under it
}

// newMountRunDirs names a run directory per node, and a root for mount
// points. Call cleanUpAtTheEnd once the nodes started: cleanups run last
// first, so the mounts are then undone while the nodes still serve.
func newMountRunDirs(t *testing.T, nodes ...string) *mountRunDirs {
	top := sharedMountTree(t)
	m := &mountRunDirs{t: t, base: filepath.Join(top, "runs"), dirs: map[string]string{}, root: filepath.Join(top, "mnt")}
	for _, d := range []string{m.base, m.root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		m.dirs[n] = filepath.Join(m.base, "run-"+n)
	}
	return m
}

// sharedMountTree is the test's tree to mount under (internal/mounttree):
// the unmounts of its mounts reach every copy another namespace took.
func sharedMountTree(t *testing.T) string { return mounttree.Shared(t) }

// cleanUpAtTheEnd registers cleanUp.
func (m *mountRunDirs) cleanUpAtTheEnd() { m.t.Cleanup(m.cleanUp) }

// mountPoint makes and returns a mount point named name.
func (m *mountRunDirs) mountPoint(name string) string {
	dir := filepath.Join(m.root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		m.t.Fatal(err)
	}
	return dir
}

// cleanUp undoes every recorded mount with replctl umount, forces what
// that leaves, and fails the test if anything is left then.
func (m *mountRunDirs) cleanUp() {
	t := m.t
	for _, run := range m.dirs {
		recs, _ := volmount.Registry{Dir: run}.List()
		for _, rec := range recs {
			if r := runCmd(time.Minute, nil, replctlBin, "umount", rec.Dir, "--run-dir", run); !r.ok() {
				t.Errorf("cleanup: replctl umount %s: %s; forcing", rec.Dir, r)
				_ = syscall.Unmount(rec.Dir, syscall.MNT_DETACH)
				if rec.Loop != "" {
					_ = exec.Command("losetup", "-d", rec.Loop).Run()
				}
				_ = rec.Helper.Signal(syscall.SIGKILL)
				_ = syscall.Unmount(rec.FUSEDir, syscall.MNT_DETACH)
			}
		}
	}
	if left := m.leftovers(); len(left) > 0 {
		t.Errorf("left behind after the test:\n  %s", strings.Join(left, "\n  "))
		m.force()
	}
}

// leftovers lists what replctl mount set up that is still there: mounts
// under the mount points' root or a run directory, loop devices over a file
// of a run directory, helper processes of a run directory, records.
func (m *mountRunDirs) leftovers() []string {
	var left []string
	under := func(p string) bool {
		if strings.HasPrefix(p, m.root+"/") {
			return true
		}
		for _, run := range m.dirs {
			if strings.HasPrefix(p, run+"/") || strings.HasPrefix(p, run+".") {
				return true
			}
		}
		return false
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && under(f[4]) {
				left = append(left, "a mount on "+f[4])
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range loops {
		if b, err := os.ReadFile(p); err == nil && under(strings.TrimSpace(string(b))) {
			left = append(left, fmt.Sprintf("%s over %s", filepath.Base(filepath.Dir(filepath.Dir(p))), strings.TrimSpace(string(b))))
		}
	}
	for _, pid := range m.helpers() {
		left = append(left, fmt.Sprintf("helper process %d", pid))
	}
	for node, run := range m.dirs {
		if recs, _ := (volmount.Registry{Dir: run}).List(); len(recs) > 0 {
			left = append(left, fmt.Sprintf("%d records in %s's run directory", len(recs), node))
		}
	}
	return left
}

// helpers are the processes whose command line names a run directory.
func (m *mountRunDirs) helpers() []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(mountHelperCommand)) {
			continue
		}
		for _, run := range m.dirs {
			if bytes.Contains(b, []byte(run)) {
				if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// force removes what is left, so that one failed test does not leave the
// machine to the next.
func (m *mountRunDirs) force() {
	for _, pid := range m.helpers() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], m.root+"/") {
				_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range loops {
		for _, run := range m.dirs {
			if b, err := os.ReadFile(p); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), run) {
				_ = exec.Command("losetup", "-d", "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p)))).Run()
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			for _, run := range m.dirs {
				if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], run) {
					_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
				}
			}
		}
	}
}

// writeFiles writes files of random content and sizes under dir, syncs
// them, and returns each one's sha256 by name.
func writeFiles(t *testing.T, dir string, seed uint64) map[string]string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 2))
	sums := map[string]string{}
	for i, n := range []int{1, 4096, 100000, 3 << 20} {
		name := filepath.Join(fmt.Sprintf("d%d", i%2), fmt.Sprintf("f%d.bin", i))
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		sums[name] = sha256File(t, filepath.Join(dir, name))
	}
	mustRun(t, time.Minute, RequireTool(t, "sync", "coreutils"))
	return sums
}

// checkFiles fails the test unless dir holds the files of sums.
func checkFiles(t *testing.T, dir string, sums map[string]string) {
	t.Helper()
	for name, sum := range sums {
		if got := sha256File(t, filepath.Join(dir, name)); got != sum {
			t.Errorf("%s: sha256 %s, want %s", filepath.Join(dir, name), got, sum)
		}
	}
}

// TestE2EMountSwitchOverAndMountOnTheNewPrimary: replctl mount --mkfs on
// alpha (TLS cluster: nbds:// with the nbd-client certificate; FUSE and a
// loop device), files written, replctl umount (everything it set up gone,
// a second umount nothing to do; a switchover before it is refused,
// saying to unmount), a switchover to beta, replctl mount on beta reads
// the files back. replctl mount on the secondary is refused,
// naming the primary, before and after the switchover, and sets nothing up.
func TestE2EMountSwitchOverAndMountOnTheNewPrimary(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	c := newProcClusterN(t, clusterOpts{TLS: true, Size: 64 << 20})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "alpha", "beta")
	runs.cleanUpAtTheEnd()
	mntA, mntB := runs.mountPoint("alpha"), runs.mountPoint("beta")
	mount := func(node string, args ...string) result {
		return runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs(node, append(append([]string{"mount", volName}, args...), "--run-dir", runs.dirs[node]))...)
	}
	umount := func(node, dir string) result {
		return runCmd(2*time.Minute, nil, replctlBin, "umount", dir, "--run-dir", runs.dirs[node])
	}

	// On the secondary: refused, naming the primary and the command that mounts there;
	// nothing set up.
	r := mount("beta", mntB, "--mkfs")
	retry := "run replctl mount on alpha: replctl --addr " + c.nodes["alpha"].Control + " mount vol0 " + mntB + " --mkfs"
	if r.code != exitFailed || !strings.Contains(r.out, "its primary is alpha") || !strings.Contains(r.out, retry) {
		t.Fatalf("replctl mount on the secondary beta: %s; want exit 1 naming alpha and saying %q", r, retry)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("a refused mount left %v", left)
	}

	r = mount("alpha", mntA, "--mkfs")
	if !r.ok() || !strings.Contains(r.out, "vol0 mounted on "+mntA) || !strings.Contains(r.out, "nbds://") {
		t.Fatalf("replctl mount --mkfs on alpha: %s", r)
	}
	t.Logf("%s", strings.TrimSpace(r.out))
	if list := runCmd(30*time.Second, nil, replctlBin, "mount", "--run-dir", runs.dirs["alpha"]); !list.ok() || !strings.Contains(list.out, mntA) || !strings.Contains(list.out, "ext4") {
		t.Fatalf("replctl mount (list): %s", list)
	}
	sums := writeFiles(t, mntA, 1)
	if r := mount("alpha", mntA); r.ok() || !strings.Contains(r.out, "already mounted") {
		t.Fatalf("a second replctl mount on %s: %s", mntA, r)
	}
	// A switchover is refused while the primary is mounted, naming the mount's host and
	// directory and how to unmount it.
	host, _ := os.Hostname()
	if r := c.ctl("alpha", "primary", volName, "--node", "beta"); r.ok() || !strings.Contains(r.out, "vol0 is mounted on host "+host+" at "+mntA) ||
		!strings.Contains(r.out, "replctl umount "+mntA+", on "+host) {
		t.Fatalf("a switchover while alpha has the volume mounted: %s; want it refused, naming the mount (%s, %s) and replctl umount", r, host, mntA)
	}
	if r := umount("alpha", mntA); !r.ok() || !strings.Contains(r.out, "unmounted") || !strings.Contains(r.out, "its claim on alpha given back") {
		t.Fatalf("replctl umount %s: %s", mntA, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
	if r := umount("alpha", mntA); !r.ok() || !strings.Contains(r.out, "nothing to do") {
		t.Fatalf("a second replctl umount %s: %s", mntA, r)
	}
	if v := c.mustStatus("alpha"); !v.inSync() {
		t.Fatalf("after the umount the replicas are not in sync: %+v", v.Replicas)
	}

	c.mustCtl("alpha", "primary", volName, "--node", "beta")
	c.waitFor("beta", "beta primary and serving", 30*time.Second, func(v *volumeStatus) bool { return v.Primary == "beta" && v.NBDURI != "" })
	if r := mount("alpha", mntA); r.code != exitFailed || !strings.Contains(r.out, "its primary is beta") {
		t.Fatalf("replctl mount on the old primary alpha: %s; want exit 1 naming beta", r)
	}
	r = mount("beta", mntB)
	if !r.ok() {
		t.Fatalf("replctl mount on beta: %s", r)
	}
	checkFiles(t, mntB, sums)
	if r := umount("beta", mntB); !r.ok() {
		t.Fatalf("replctl umount %s: %s", mntB, r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
}

// TestE2EHooksMountOnPromoteAndUnmountOnDemote: the volume's on_promote
// runs replctl mount (through the node's unix socket; the export over TLS
// with --tls-dir's nbd-client certificate) and on_demote replctl umount,
// as the README's hooks do; alpha, beta and a witness, raft and gossip.
//   - Failover: alpha, with the volume mounted, is killed (kill -9). beta
//     takes over and its on_promote mounts the volume, with every file
//     alpha synced. alpha comes back as a Secondary, and its on_demote
//     unmounts the file system whose export died under it, without
//     hanging, leaving nothing behind.
//   - Switchover: the operator unmounts on beta (a switchover is refused
//     while the primary has NBD clients) and switches to alpha: alpha's
//     on_promote mounts it with beta's files too, and beta's on_demote
//     finds nothing to do.
func TestE2EHooksMountOnPromoteAndUnmountOnDemote(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	runs := newMountRunDirs(t, "alpha", "beta")
	hook := filepath.Join(runs.base, "hook.sh")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, TLS: true, Size: 64 << 20, OnPromote: hook + " promote", OnDemote: hook + " demote"})
	script := fmt.Sprintf(`#!/bin/sh
exec >>%[1]s/hook-$REPLVOL_NODE.log 2>&1
echo "$1 on $REPLVOL_NODE at epoch $REPLVOL_EPOCH: $REPLVOL_EXPORT"
case "$1" in
promote) %[2]s --addr unix://%[3]s/$REPLVOL_NODE/control.sock --tls-dir %[4]s mount "$REPLVOL_VOLUME" %[5]s/$REPLVOL_NODE --run-dir %[1]s/run-$REPLVOL_NODE ;;
demote) %[2]s umount %[5]s/$REPLVOL_NODE --run-dir %[1]s/run-$REPLVOL_NODE ;;
esac
`, runs.base, replctlBin, c.dir, c.tlsDir, runs.root)
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	runs.cleanUpAtTheEnd()
	mnt := map[string]string{"alpha": runs.mountPoint("alpha"), "beta": runs.mountPoint("beta")}
	hookLogs := func() string {
		var b strings.Builder
		for _, n := range []string{"alpha", "beta"} {
			log, _ := os.ReadFile(filepath.Join(runs.base, "hook-"+n+".log"))
			fmt.Fprintf(&b, "%s's hooks:\n%s\n", n, log)
		}
		return b.String()
	}
	// mounted says, by node, whether its mount point holds a file system.
	mounted := func() map[string]bool {
		out := map[string]bool{}
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			for node, dir := range mnt {
				if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
					out[node] = true
				}
			}
		}
		return out
	}
	// waitMounted waits until exactly the nodes of want have the volume
	// mounted, and every other node has no record left.
	waitMounted := func(what string, want ...string) {
		t.Helper()
		var m map[string]bool
		if !within(90*time.Second, 200*time.Millisecond, func() bool {
			m = mounted()
			ok := len(m) == len(want)
			for _, n := range want {
				ok = ok && m[n]
			}
			for node, run := range runs.dirs {
				if recs, _ := (volmount.Registry{Dir: run}).List(); !m[node] && len(recs) > 0 {
					ok = false
				}
			}
			return ok
		}) {
			t.Fatalf("%s: after 90 s mounted on %v, want %v\n%s", what, m, want, hookLogs())
		}
	}

	start := time.Now()
	r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("alpha", []string{"mount", volName, mnt["alpha"], "--mkfs", "--run-dir", runs.dirs["alpha"]})...)
	if !r.ok() {
		t.Fatalf("replctl mount --mkfs on alpha: %s", r)
	}
	sums := writeFiles(t, mnt["alpha"], 1)

	// Failover.
	c.kill("alpha")
	waitMounted("alpha killed: beta's on_promote mounts", "alpha", "beta")
	checkFiles(t, mnt["beta"], sums)
	for name, sum := range writeFiles(t, filepath.Join(mnt["beta"], "from-beta"), 2) {
		sums[filepath.Join("from-beta", name)] = sum
	}
	c.start("alpha")
	waitMounted("alpha back: its on_demote unmounts", "beta")
	c.waitFor("beta", "alpha back in sync", syncTimeout, raftInSync)

	// Switchover: unmount first, as the switchover asks.
	if r := runCmd(2*time.Minute, nil, replctlBin, "umount", mnt["beta"], "--run-dir", runs.dirs["beta"]); !r.ok() {
		t.Fatalf("replctl umount on beta: %s", r)
	}
	c.mustCtl("beta", "primary", volName, "--node", "alpha")
	waitMounted("switched over to alpha: its on_promote mounts", "alpha")
	checkFiles(t, mnt["alpha"], sums)

	for _, n := range []string{"alpha", "beta"} {
		evs, err := c.eventsSince(n, "hook-failed", start)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			t.Errorf("%s: %s", n, e.Message)
		}
	}
	if log, _ := os.ReadFile(filepath.Join(runs.base, "hook-beta.log")); !strings.Contains(string(log), "nothing to do") {
		t.Errorf("beta's on_demote after the switchover did not find its mount point empty\n%s", hookLogs())
	}
	t.Log(hookLogs())
	if r := runCmd(2*time.Minute, nil, replctlBin, "umount", mnt["alpha"], "--run-dir", runs.dirs["alpha"]); !r.ok() {
		t.Fatalf("replctl umount on alpha: %s", r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("left %v", left)
	}
}

// TestE2EAVolumeIsMountedOnceOnAnyHost (issue 27): vol0 mounted on alpha's
// host at a, a second replctl mount of it is refused, naming the host and a
// and how to unmount it: on the same host at b, and from a second run
// directory standing for another host at c, with --mkfs --force too (the
// files on a are intact). After replctl umount a, the other host mounts it.
// Its helper killed (a client host that crashed), the same mount is made
// again from its record at once; killed again, the claim lasts while its
// connections are gone for --io-timeout, then the first host mounts it.
func TestE2EAVolumeIsMountedOnceOnAnyHost(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	c := newProcClusterN(t, clusterOpts{TLS: true, Size: 64 << 20})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "alpha", "other")
	runs.cleanUpAtTheEnd()
	mntA, mntB, mntC := runs.mountPoint("a"), runs.mountPoint("b"), runs.mountPoint("c")
	mount := func(run, dir string, args ...string) result {
		return runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("alpha", append([]string{"mount", volName, dir, "--run-dir", runs.dirs[run]}, args...))...)
	}
	umount := func(run, dir string) result {
		return runCmd(2*time.Minute, nil, replctlBin, "umount", dir, "--run-dir", runs.dirs[run])
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	mountedOn := func(dir string) bool {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
				return true
			}
		}
		return false
	}
	refusedNaming := func(what string, r result, dir string) {
		t.Helper()
		for _, words := range []string{"vol0 is mounted already, on host " + host + " at " + dir, "--force does not change that", "replctl umount " + dir + ", on " + host} {
			if r.ok() || !strings.Contains(r.out, words) {
				t.Fatalf("%s: %s; want it refused, saying %q", what, r, words)
			}
		}
	}

	if r := mount("alpha", mntA, "--mkfs"); !r.ok() || !strings.Contains(r.out, "claimed on alpha for "+host) {
		t.Fatalf("replctl mount --mkfs at a: %s", r)
	}
	sums := writeFiles(t, mntA, 1)
	refusedNaming("a second mount on the same host", mount("alpha", mntB), mntA)
	refusedNaming("a mount with --mkfs --force from another host", mount("other", mntC, "--mkfs", "--force"), mntA)
	for _, dir := range []string{mntB, mntC} {
		if mountedOn(dir) {
			t.Fatalf("a refused mount mounted %s", dir)
		}
	}
	if recs, _ := (volmount.Registry{Dir: runs.dirs["other"]}).List(); len(recs) != 0 {
		t.Fatalf("a refused mount left records: %+v", recs)
	}
	checkFiles(t, mntA, sums)
	// Status names the mount, from any node: in the JSON and in words.
	for _, node := range []string{"alpha", "beta"} {
		_, v, err := c.status(node)
		if err != nil {
			t.Fatal(err)
		}
		if m := v.Mount; m == nil || m.Holder.Host != host || m.Holder.Dir != mntA || m.Connections == 0 {
			t.Fatalf("status via %s: mount %+v, want host %s, directory %s and its connections", node, m, host, mntA)
		}
	}
	if r := c.ctl("beta", "status"); !r.ok() || !strings.Contains(r.out, "mounted on host "+host+" at "+mntA+" by replctl mount") {
		t.Fatalf("replctl status via beta does not name the mount on %s at %s: %s", host, mntA, r)
	}

	if r := umount("alpha", mntA); !r.ok() || !strings.Contains(r.out, "its claim on alpha given back") {
		t.Fatalf("replctl umount a: %s", r)
	}
	if r := mount("other", mntC, "--io-timeout", "10s"); !r.ok() {
		t.Fatalf("the other host's mount after replctl umount a: %s", r)
	}
	checkFiles(t, mntC, sums)
	if _, v, err := c.status("alpha"); err != nil || v.Mount == nil || v.Mount.Holder.Dir != mntC {
		t.Fatalf("status after the other host mounted at %s: %+v (%v)", mntC, v.Mount, err)
	}

	// Its helper dies: the same mount is made again from its record, under the same claim.
	rec, err := volmount.Registry{Dir: runs.dirs["other"]}.Load(mntC)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Helper.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := mount("other", mntC, "--io-timeout", "10s"); !r.ok() {
		t.Fatalf("replctl mount of c again, its helper killed: %s", r)
	}
	again, err := volmount.Registry{Dir: runs.dirs["other"]}.Load(mntC)
	if err != nil || again.Claim == nil || again.Claim.ID != rec.Claim.ID || again.Helper == rec.Helper {
		t.Fatalf("the record of the mount made again: %+v, %v; want a new helper under claim %s", again, err, rec.Claim.ID)
	}
	checkFiles(t, mntC, sums)

	// Killed again, and not mounted again: its claim lasts 10 s past its connections.
	killed := time.Now()
	if err := again.Helper.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var last result
	if !within(90*time.Second, 500*time.Millisecond, func() bool {
		last = mount("alpha", mntB)
		if !last.ok() {
			refusedNaming("a mount while the crashed host's claim lasts", last, mntC)
		}
		return last.ok()
	}) {
		t.Fatalf("the crashed host's claim did not lapse: %s", last)
	}
	if took := time.Since(killed); took < 10*time.Second {
		t.Fatalf("mounted %s after the other host's helper was killed: its claim lasted less than its --io-timeout (10s)", took)
	}
	checkFiles(t, mntB, sums)
	if r := umount("other", mntC); !r.ok() {
		t.Fatalf("replctl umount of the crashed mount c: %s", r)
	}
	if r := umount("alpha", mntB); !r.ok() {
		t.Fatalf("replctl umount b: %s", r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("left %v", left)
	}
}

// TestE2EUmountAfterARefusedMkfsWaitsForAProbeOfTheLoopDevice (issue 27,
// item 8): after a refused replctl mount --mkfs, replctl umount of the
// volume's mount stopped half way, the loop device still holding its file
// 10 s after it was detached: something held the device open (udev's blkid
// probes a loop device when it changes), so the detach only marked it to
// let go at its last close. Here a probe holds the loop device open for 12
// s from before the umount: the umount waits for it with the helper serving
// its reads, detaches the device once nothing uses it, and leaves nothing.
func TestE2EUmountAfterARefusedMkfsWaitsForAProbeOfTheLoopDevice(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	c := newProcClusterN(t, clusterOpts{TLS: true, Size: 64 << 20})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "alpha", "other")
	runs.cleanUpAtTheEnd()
	mntA, mntB := runs.mountPoint("a"), runs.mountPoint("b")
	mount := func(run, dir string, args ...string) result {
		return runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("alpha", append([]string{"mount", volName, dir, "--run-dir", runs.dirs[run]}, args...))...)
	}
	if r := mount("alpha", mntA, "--mkfs"); !r.ok() {
		t.Fatalf("replctl mount --mkfs at a: %s", r)
	}
	sums := writeFiles(t, mntA, 1)
	if r := mount("other", mntB, "--mkfs"); r.ok() {
		t.Fatalf("replctl mount --mkfs of the mounted volume: %s; want it refused", r)
	}
	rec, err := volmount.Registry{Dir: runs.dirs["alpha"]}.Load(mntA)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := os.Open(rec.Loop)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.ReadAt(make([]byte, 4096), 1024); err != nil {
		t.Fatalf("the probe reads %s: %v", rec.Loop, err)
	}
	probed := time.AfterFunc(12*time.Second, func() { probe.Close() })
	defer func() {
		if probed.Stop() {
			probe.Close()
		}
	}()
	r := runCmd(2*time.Minute, nil, replctlBin, "umount", mntA, "--run-dir", runs.dirs["alpha"])
	if !r.ok() || !strings.Contains(r.out, "unmounted") {
		t.Fatalf("replctl umount a while a probe held its loop device: %s", r)
	}
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
	if r := mount("other", mntB); !r.ok() {
		t.Fatalf("the mount at b after the umount: %s", r)
	}
	checkFiles(t, mntB, sums)
}

// TestAnUnmountUnderTheSharedTreeReachesAnotherNamespacesCopy: a mount
// made under sharedMountTree, then copied into a mount namespace made as
// ip netns exec makes one (unshare, then everything a slave), is gone
// from that namespace too once it is unmounted here. Without the shared
// tree the copy stays, and replctl umount of a mount test finds its loop
// device mounted elsewhere whenever another test started a namespaced
// replnode meanwhile.
func TestAnUnmountUnderTheSharedTreeReachesAnotherNamespacesCopy(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "mounting needs root")
	}
	unshare := RequireTool(t, "unshare", "util-linux")
	top := sharedMountTree(t)
	dir := filepath.Join(top, "tmp")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	}()
	other := exec.Command(unshare, "--mount", "--propagation", "slave", "sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	inOther := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", other.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), " "+dir+" ")
	}
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	unshared := func() bool {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", other.Process.Pid))
		return err == nil && ns != ours
	}
	if !within(5*time.Second, 10*time.Millisecond, func() bool { return unshared() && inOther() }) {
		t.Fatalf("process %d has no mount namespace of its own with a copy of %s", other.Process.Pid, dir)
	}
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if inOther() {
		t.Fatalf("%s is unmounted here but still mounted in the namespace of process %d", dir, other.Process.Pid)
	}
}

// TestE2EAPlainMountGrowsWithTheVolume: a mount without --follow (on the
// primary, through FUSE and a loop device, over TLS) sees its volume grow:
// NBD tells no client that an export grew, so its helper asks every
// --refresh-every, connects again, and grows the FUSE file and the loop
// device. The file system is then grown on the mounted device (resize2fs
// for ext4 where the process holds CAP_SYS_RESOURCE, as the kernel asks
// for an online ext4 resize; xfs_growfs otherwise) and takes a file that
// only the gained range has room for (the old free space is filled first,
// with fallocate); mounted again, the volume holds it.
func TestE2EAPlainMountGrowsWithTheVolume(t *testing.T) {
	e2eBeside(t)
	needMountTools(t)
	fstype, from, to := "ext4", int64(64<<20), int64(96<<20)
	grow := func(dev, dir string) (string, []string) {
		return RequireTool(t, "resize2fs", "e2fsprogs"), []string{dev}
	}
	if !hasCapability(t, caps.SysResource) {
		// xfs needs 300 MiB at least.
		fstype, from, to = "xfs", 304<<20, 336<<20
		RequireTool(t, "mkfs.xfs", "xfsprogs")
		grow = func(dev, dir string) (string, []string) {
			return RequireTool(t, "xfs_growfs", "xfsprogs"), []string{dir}
		}
	}
	t.Logf("%s, %d MiB grown to %d MiB", fstype, from>>20, to>>20)
	disk, err := metadata.InternalDeviceSizeFor(to, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	c := newProcClusterN(t, clusterOpts{TLS: true, Size: from, DiskSize: disk})
	c.startAll()
	c.waitInSync("alpha")
	runs := newMountRunDirs(t, "alpha")
	runs.cleanUpAtTheEnd()
	run, mnt := runs.dirs["alpha"], runs.mountPoint("alpha")
	reg := volmount.Registry{Dir: run}
	mount := func(args ...string) {
		t.Helper()
		r := runCmd(2*time.Minute, nil, replctlBin, c.ctlArgs("alpha", append(append([]string{"mount", volName, mnt}, args...), "--refresh-every", "1s", "--run-dir", run))...)
		if !r.ok() || strings.Contains(r.out, "following") {
			t.Fatalf("replctl mount %v (without --follow): %s", args, r)
		}
	}
	umount := func() {
		t.Helper()
		if r := runCmd(2*time.Minute, nil, replctlBin, "umount", mnt, "--run-dir", run); !r.ok() {
			t.Fatalf("replctl umount %s: %s", mnt, r)
		}
	}
	mount("--mkfs", "--fstype", fstype)
	rec, err := reg.Load(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Follow || rec.Loop == "" || rec.File == "" {
		t.Fatalf("the mount's record: %+v; want a loop device over a FUSE file, not following", rec)
	}
	sizeOf := func(path string) int64 {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := sizeOf(rec.Loop); got != from {
		t.Fatalf("%s is %d bytes, want %d", rec.Loop, got, from)
	}

	// The old free space is taken (fallocate writes no data), so that a
	// file written after the growth lands in the gained range.
	free := func() int64 {
		t.Helper()
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	const gained = 8 << 20
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(filler.Fd()), 0, 0, free()-(1<<20)); err != nil {
		t.Fatalf("fallocate the old free space: %v", err)
	}
	filler.Close()
	if f := free(); f >= gained {
		t.Fatalf("%d bytes free after the filler, want less than %d", f, gained)
	}

	if r := c.ctl("alpha", "resize", volName, itoa(to)); !r.ok() {
		t.Fatalf("replctl resize: %s", r)
	}
	if !within(2*time.Minute, 100*time.Millisecond, func() bool { return sizeOf(rec.File) == to && sizeOf(rec.Loop) == to }) {
		log, _ := os.ReadFile(reg.LogPath(mnt))
		t.Fatalf("2 minutes after the resize the FUSE file is %d bytes and %s %d, want %d; the helper's log:\n%s", sizeOf(rec.File), rec.Loop, sizeOf(rec.Loop), to, log)
	}
	tool, args := grow(rec.Loop, mnt)
	mustRun(t, time.Minute, tool, args...)
	if f := free(); f < gained+(1<<20) {
		t.Fatalf("after %s %d bytes are free, want more than %d", filepath.Base(tool), f, gained+(1<<20))
	}
	data := make([]byte, gained)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	path := filepath.Join(mnt, "gained.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatalf("a file in the gained range: %v", err)
	}
	mustRun(t, time.Minute, RequireTool(t, "sync", "coreutils"))
	sum := sha256File(t, path)

	umount()
	mount()
	if got := sha256File(t, path); got != sum {
		t.Fatalf("mounted again, %s has sha256 %s, want %s", path, got, sum)
	}
	umount()
	if left := runs.leftovers(); len(left) > 0 {
		t.Fatalf("replctl umount left %v", left)
	}
}

// hasCapability says whether this process holds capability bit.
func hasCapability(t *testing.T, bit uint) bool {
	t.Helper()
	has, err := caps.Has(bit)
	if err != nil {
		t.Fatal(err)
	}
	return has
}
