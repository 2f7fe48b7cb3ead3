package main

// End-to-end: what status, its JSON, --check and the events say of a
// reload that failed, of a volume added to one node's file only, of a
// disconnect, and of a resync under way (issue 27, items 6, 7 and 9).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
)

// TestE2EAFailedReloadShowsUntilAReloadLoads: the cluster file gets a
// typo (protocl: B) and beta gets a SIGHUP. beta runs on as it was, and
// says so everywhere an operator looks, through either node: status names
// beta, the file and its problem at its line; --json holds it
// (nodes[].failed_reload) with the warning reload-failed; --check exits 4
// with it; beta's events record it. The file fixed and beta reloaded
// again, all of it is gone and --check exits 0.
func TestE2EAFailedReloadShowsUntilAReloadLoads(t *testing.T) {
	e2eBeside(t)
	c := newProcCluster(t, 32<<20, 61)
	c.start("alpha")
	c.start("beta")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	c.waitInSync("alpha")

	orig, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(orig), "protocol: C,", "protocl: B,", 1)
	if broken == string(orig) {
		t.Fatalf("the harness's config changed shape:\n%s", orig)
	}
	line := 1 + strings.Count(broken[:strings.Index(broken, "protocl")], "\n")
	problem := fmt.Sprintf("%s:%d: volumes[0].protocl: unknown key", c.cfgPath, line)
	if err := os.WriteFile(c.cfgPath, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	hup := func() {
		t.Helper()
		if err := c.procs["beta"].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	hup()

	var st transport.ClusterStatus
	configWaitUntil(t, "status through alpha shows beta's failed reload", func() bool {
		st = clusterStatusOf(t, c, "alpha")
		n := nodeOf(&st, "beta")
		return n != nil && n.FailedReload != nil
	})
	fr := nodeOf(&st, "beta").FailedReload
	if fr.File != c.cfgPath || len(fr.Problems) != 1 || !strings.HasPrefix(fr.Problems[0], problem) || fr.At.Before(began.Add(-time.Second)) {
		t.Errorf("status --json: beta's failed_reload %+v, want %s and the problem %q", fr, c.cfgPath, problem)
	}
	if a := nodeOf(&st, "alpha"); a == nil || a.FailedReload != nil {
		t.Errorf("status --json: alpha %+v, whose file was not reloaded", a)
	}
	var found *transport.Warning
	for i, w := range st.Warnings {
		if w.Kind == transport.WarningReloadFailed {
			found = &st.Warnings[i]
		}
	}
	if found == nil || found.Node != "beta" || found.Severity != transport.SeverityWarning || !strings.Contains(found.Detail, problem) {
		t.Errorf("status --json: warnings %+v, want reload-failed on beta with the problem", st.Warnings)
	}
	if v := volumeOf(&st, volName); v == nil || v.Protocol != "C" {
		t.Errorf("status --json: vol0 %+v, want it running protocol C as before", v)
	}

	for _, via := range []string{"alpha", "beta"} {
		out := c.mustCtl(via, "status")
		for _, want := range []string{"alive, last reload failed", "! The last reload of beta failed", "its cluster file " + c.cfgPath + " does not load",
			problem, "fix: systemctl reload replnode (on beta, once " + c.cfgPath + " is fixed)"} {
			if !strings.Contains(out, want) {
				t.Errorf("replctl status via %s does not say %q:\n%s", via, want, out)
			}
		}
		r := c.ctl(via, "status", "--check")
		if r.code != exitWarning || !strings.Contains(r.out, "WARNING The last reload of beta failed") {
			t.Errorf("replctl status --check via %s: exit %d, want %d with the failed reload:\n%s", via, r.code, exitWarning, r.out)
		}
	}
	evs, err := c.eventsSince("beta", "reload-failed", began)
	if err != nil || len(evs) != 1 || !strings.Contains(evs[0].Message, c.cfgPath+" does not load") || !strings.Contains(evs[0].Message, problem) {
		t.Errorf("beta's reload-failed events %+v (%v): want one naming the file and the problem", evs, err)
	}

	// Fixed: the next reload loads, and clears it all.
	if err := os.WriteFile(c.cfgPath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	hup()
	configWaitUntil(t, "beta's failed reload cleared", func() bool {
		st = clusterStatusOf(t, c, "alpha")
		n := nodeOf(&st, "beta")
		return n != nil && n.FailedReload == nil
	})
	for _, w := range st.Warnings {
		if w.Kind == transport.WarningReloadFailed {
			t.Errorf("status --json still warns: %+v", w)
		}
	}
	if r := c.ctl("beta", "status", "--check"); r.code != 0 || !strings.Contains(r.out, "warnings: none") || strings.Contains(r.out, "reload failed") {
		t.Errorf("replctl status --check after a reload that loads: exit %d, want 0:\n%s", r.code, r.out)
	}
	configWaitUntil(t, "beta's reloaded event", func() bool {
		evs, err := c.eventsSince("beta", "reloaded", began)
		return err == nil && len(evs) == 1 && strings.Contains(evs[0].Message, "the failed reload of") && strings.Contains(evs[0].Message, "is over")
	})
}

// TestE2EAHalfAddedVolumeIsDiagnosedAsConfigDiffers: alpha, beta and a
// witness run vol0. vol1, whose primary is beta, is added to the file and
// only alpha is reloaded. beta is alive and serves vol0: status shows it
// as alive without vol1 in its file, not as unreachable, and the one thing
// to do is the reload of beta and the witness (config-differs): no
// no-primary, no "replctl connect vol1 --node alpha", which would not
// help. Once beta and the witness are reloaded, vol1 is in sync and
// nothing is left to warn about.
func TestE2EAHalfAddedVolumeIsDiagnosedAsConfigDiffers(t *testing.T) {
	e2eBeside(t)
	const size = 32 << 20
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: size})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)

	orig, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	devSize, err := metadata.InternalDeviceSizeFor(size, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	disks := map[string]string{}
	for _, n := range []string{"alpha", "beta"} {
		disks[n] = filepath.Join(c.dir, n+"-vol1.img")
		if err := os.Truncate(writeEmpty(t, disks[n]), devSize); err != nil {
			t.Fatal(err)
		}
	}
	withVol1 := string(orig) + fmt.Sprintf("  - {name: vol1, size: %d, protocol: C, primary: beta, al_extents: 61, disks: {alpha: %q, beta: %q}}\n",
		size, disks["alpha"], disks["beta"])
	if err := os.WriteFile(c.cfgPath, []byte(withVol1), 0o644); err != nil {
		t.Fatal(err)
	}
	hup := func(name string) {
		t.Helper()
		if err := c.procs[name].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	hup("alpha")

	var st transport.ClusterStatus
	configWaitUntil(t, "alpha runs vol1 and status sees the files differ", func() bool {
		st = clusterStatusOf(t, c, "alpha")
		v := volumeOf(&st, "vol1")
		return v != nil && v.Replica("alpha") != nil && v.Replica("alpha").Reachable && len(st.ConfigDiffers) == 1
	})
	v := volumeOf(&st, "vol1")
	if b := v.Replica("beta"); b == nil || !b.Reachable || b.ReasonCode != transport.ReasonNoSuchVolume || !strings.Contains(b.Reason, "beta is alive, but vol1 is not in its cluster file") {
		t.Errorf("status --json: beta's replica of vol1 %+v, want reachable with reason_code %s", b, transport.ReasonNoSuchVolume)
	}
	if len(st.Warnings) != 1 || st.Warnings[0].Kind != transport.WarningConfigDiffers || st.Warnings[0].Volume != "vol1" ||
		!strings.Contains(st.Warnings[0].Where, "to add it, on beta and witness") {
		t.Errorf("status --json: warnings %+v, want config-differs of vol1 alone, naming the reload on beta and witness", st.Warnings)
	}
	out := c.mustCtl("alpha", "status")
	for _, want := range []string{"alive, does not have vol1 in its cluster file", "Volume vol1 is in the cluster file of alpha but not in the files of beta and witness.",
		"! not served: its primary beta does not have it in its cluster file"} {
		if !strings.Contains(out, want) {
			t.Errorf("replctl status does not say %q:\n%s", want, out)
		}
	}
	for _, wrong := range []string{"unreachable", "DUnknown"} {
		if strings.Contains(out, wrong) {
			t.Errorf("replctl status says %q of a node that is alive:\n%s", wrong, out)
		}
	}
	r := c.ctl("alpha", "status", "--check")
	if r.code != exitWarning || !strings.Contains(r.out, "warnings: 1 warning") || strings.Contains(r.out, "CRITICAL") || strings.Contains(r.out, "replctl connect") {
		t.Errorf("replctl status --check: exit %d, want %d with the one warning to reload:\n%s", r.code, exitWarning, r.out)
	}

	hup("beta")
	hup(witnessName)
	configWaitUntil(t, "vol1 in sync on alpha and beta, nothing to warn about", func() bool {
		st = clusterStatusOf(t, c, "alpha")
		v := volumeOf(&st, "vol1")
		if v == nil || v.Primary != "beta" || len(st.Warnings) != 0 || st.ConfigDiffers != nil {
			return false
		}
		for _, r := range v.Replicas {
			if !r.Reachable || r.Disk != transport.DiskUpToDate || r.Replication != transport.ReplConnected {
				return false
			}
		}
		return true
	})
	if r := c.ctl("alpha", "status", "--check"); r.code != 0 {
		t.Errorf("replctl status --check once the files agree: exit %d, want 0:\n%s", r.code, r.out)
	}
}

// TestE2EDisconnectAndResyncSayTheVolumeRunsOnOneCopy: replctl disconnect
// without --node acts on the node at --addr; here that is alpha, the
// primary, and it says that vol0 now runs on alpha's copy alone, and how
// to connect it again. A secondary disconnected says the same from its
// side. While the connect's resync runs (throttled, so that it lasts),
// beta is an Inconsistent SyncTarget and status --check warns that vol0
// runs on one good copy; once beta is UpToDate, --check exits 0.
func TestE2EDisconnectAndResyncSayTheVolumeRunsOnOneCopy(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	d.waitInSync("alpha")

	out := d.mustCtl("alpha", "disconnect", volName)
	for _, want := range []string{"vol0 on alpha: StandAlone", "(no --node given: alpha is the node at --addr)",
		"alpha is the primary of vol0 and now replicates it to nobody: vol0 runs on one copy, alpha's. beta gets none of its writes until it is connected again",
		"reconnect: replctl connect vol0 --node alpha"} {
		if !strings.Contains(out, want) {
			t.Errorf("replctl disconnect vol0 (via alpha, the primary) does not say %q:\n%s", want, out)
		}
	}
	d.mustCtl("alpha", "connect", volName)
	d.waitInSync("alpha")

	out = d.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	for _, want := range []string{"vol0 on beta: StandAlone", "beta no longer replicates vol0 and misses its writes from now on", "vol0 runs on one copy, alpha's.",
		"reconnect: replctl connect vol0 --node beta"} {
		if !strings.Contains(out, want) {
			t.Errorf("replctl disconnect vol0 --node beta does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no --node given") {
		t.Errorf("replctl disconnect with --node says it was not given:\n%s", out)
	}

	// 64 MiB written while beta is away, resynced at 4 MiB/s: about 16 s.
	qemuIO(t, d.uri, "write -P 0x5a 0 64M", "flush")
	d.mustCtl("alpha", "adjust", volName, "--resync-rate", "4MiB")
	d.mustCtl("alpha", "connect", volName, "--node", "beta")
	// --check's view lies within beta's resync when the status before it
	// and the status after it both show beta Inconsistent: once its resync
	// started, beta stays Inconsistent until it is UpToDate.
	inconsistent := func() (syncing, done bool) {
		b := d.mustStatus("alpha").replica("beta")
		return b.Disk == transport.DiskInconsistent, b.Disk == transport.DiskUpToDate && b.Replication == transport.ReplConnected && b.OutOfSync == 0
	}
	checked := false
	if !within(syncTimeout, 100*time.Millisecond, func() bool {
		before, done := inconsistent()
		if done {
			t.Fatalf("beta was UpToDate before status --check saw its resync: the resync cap did not hold")
		}
		if !before {
			return false // not started yet
		}
		r := d.ctl("alpha", "status", "--check")
		if after, _ := inconsistent(); !after {
			return false // it ended meanwhile: look again
		}
		checked = true
		if r.code != exitWarning || !strings.Contains(r.out, "beta's copy of vol0 is Inconsistent until its resync ends") ||
			!strings.Contains(r.out, "until then vol0 runs on one good copy, alpha's") {
			t.Errorf("replctl status --check while beta resyncs: exit %d, want %d and the one-copy warning:\n%s", r.code, exitWarning, r.out)
		}
		return true
	}) || !checked {
		t.Fatalf("status --check never ran while beta resynced")
	}
	d.waitInSync("alpha")
	if r := d.ctl("alpha", "status", "--check"); r.code != 0 || !strings.Contains(r.out, "warnings: none") {
		t.Errorf("replctl status --check once beta is UpToDate: exit %d, want 0:\n%s", r.code, r.out)
	}
}

// nodeOf is what st says of the node name.
func nodeOf(st *transport.ClusterStatus, name string) *transport.NodeInfo {
	for i := range st.Nodes {
		if st.Nodes[i].Name == name {
			return &st.Nodes[i]
		}
	}
	return nil
}
