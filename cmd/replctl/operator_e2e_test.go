package main

// End-to-end tests of the operator's tools (issue 11): replctl events,
// errors in words, names checked everywhere, status on a terminal and in
// a pipe, --version, and replnode's SIGHUP and systemd notifications.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bgCmd is a replctl command running in the background (events,
// status --watch), its stdout and stderr kept apart.
type bgCmd struct {
	t              *testing.T
	name           string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

func startBG(t *testing.T, env []string, args ...string) *bgCmd {
	t.Helper()
	b := &bgCmd{t: t, name: strings.Join(args, " "), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	b.cmd = exec.Command(replctlBin, args...)
	b.cmd.Env = append(os.Environ(), env...)
	b.cmd.Stdout, b.cmd.Stderr = b.stdout, b.stderr
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("replctl %s: %v", b.name, err)
	}
	go func() {
		b.err = b.cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			b.cmd.Process.Kill()
			<-b.done
		}
		if t.Failed() {
			t.Logf("replctl %s\nstdout:\n%s\nstderr:\n%s", b.name, b.stdout.tail(8000), b.stderr.tail(4000))
		}
	})
	return b
}

func (b *bgCmd) out() string { return b.stdout.tail(1 << 24) }
func (b *bgCmd) errs() string {
	return b.stderr.tail(1 << 20)
}

// waitFor polls until cond holds, failing the test after timeout.
func (b *bgCmd) waitFor(what string, timeout time.Duration, cond func() bool) {
	b.t.Helper()
	exited := false
	if within(timeout, 50*time.Millisecond, func() bool {
		if cond() {
			return true
		}
		select {
		case <-b.done:
			exited = true
			return true
		default:
			return false
		}
	}) && !exited {
		return
	}
	if exited {
		if cond() {
			return
		}
		b.t.Fatalf("replctl %s exited (%v) before %s\nstdout:\n%s\nstderr:\n%s", b.name, b.err, what, b.out(), b.errs())
	}
	b.t.Fatalf("replctl %s: not %s after %s\nstdout:\n%s\nstderr:\n%s", b.name, what, timeout, b.out(), b.errs())
}

// interrupt sends Ctrl-C and returns the exit code.
func (b *bgCmd) interrupt() int {
	b.t.Helper()
	b.cmd.Process.Signal(syscall.SIGINT)
	return b.exitCode(10 * time.Second)
}

// exitCode waits for the command to end.
func (b *bgCmd) exitCode(timeout time.Duration) int {
	b.t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		b.t.Fatalf("replctl %s still running %s after it should have ended", b.name, timeout)
	}
	return b.cmd.ProcessState.ExitCode()
}

// eventLines parses --json output: one object per line, every key there.
func eventLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("events --json printed a line that is not a JSON object: %q (%v)", l, err)
		}
		for _, key := range []string{"time", "node", "seq", "volume", "kind", "peer", "old", "new", "reason", "message", "offset", "length"} {
			if _, ok := e[key]; !ok {
				t.Fatalf("event %s has no key %q", l, key)
			}
		}
		evs = append(evs, e)
	}
	return evs
}

func isDisconnect(e map[string]any) bool {
	return e["kind"] == "disconnected" || (e["new"] == "StandAlone" && e["volume"] == volName)
}

func isConnect(e map[string]any) bool {
	return e["kind"] == "connected" || (e["new"] == "Connected" && e["volume"] == volName)
}

// disconnectThenConnect returns the index of the first disconnect and of
// the first connect after it (-1 when missing).
func disconnectThenConnect(evs []map[string]any) (int, int) {
	d := -1
	for i, e := range evs {
		if d < 0 && isDisconnect(e) {
			d = i
		}
		if d >= 0 && i > d && isConnect(e) {
			return d, i
		}
	}
	return d, -1
}

// TestE2EEventsJSONShowsDisconnectThenConnect runs replctl events --json
// in the background against the demo while beta is disconnected and
// connected again: the node's own stream and the merged stream of every
// node show the disconnect and then the connect, as JSON lines with
// every key, in time order; a stream without --since shows nothing older
// than its start; Ctrl-C ends each with exit 0.
func TestE2EEventsJSONShowsDisconnectThenConnect(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	d.waitInSync("alpha")

	since := time.Now().Add(-50 * time.Millisecond)
	sinceFlag := since.Format(time.RFC3339Nano)
	// --since makes the test independent of when the stream subscribes.
	onBeta := startBG(t, nil, "events", "--json", "--since", sinceFlag, "--addr", d.nodes["beta"].Control)
	all := startBG(t, nil, "events", "--json", "--all", "--since", sinceFlag, "--addr", d.nodes["alpha"].Control)
	liveStart := time.Now()
	live := startBG(t, nil, "events", "--json", "--addr", d.nodes["alpha"].Control)
	live.waitFor("following alpha", 10*time.Second, func() bool { return strings.Contains(live.errs(), "following node alpha") })
	all.waitFor("following both nodes", 10*time.Second, func() bool { return strings.Contains(all.errs(), "following 2 nodes (alpha, beta)") })

	d.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	d.waitFor("alpha", "beta StandAlone", 10*time.Second, func(v *volumeStatus) bool {
		b := v.replica("beta")
		return b != nil && b.Replication == "StandAlone"
	})
	d.mustCtl("alpha", "connect", volName, "--node", "beta")
	d.waitInSync("alpha")

	onBeta.waitFor("showing a disconnect then a connect", 15*time.Second, func() bool {
		_, c := disconnectThenConnect(eventLines(t, onBeta.out()))
		return c >= 0
	})
	all.waitFor("showing a disconnect then a connect, and events of both nodes", 15*time.Second, func() bool {
		evs := eventLines(t, all.out())
		_, c := disconnectThenConnect(evs)
		nodes := map[any]bool{}
		for _, e := range evs {
			nodes[e["node"]] = true
		}
		return c >= 0 && nodes["alpha"] && nodes["beta"]
	})
	evs := eventLines(t, all.out())
	di, ci := disconnectThenConnect(evs)
	t.Logf("merged stream: disconnect %v, then connect %v", evs[di], evs[ci])
	var last time.Time
	for _, e := range evs {
		tm, err := time.Parse(time.RFC3339Nano, e["time"].(string))
		if err != nil {
			t.Fatalf("event time %v: %v", e["time"], err)
		}
		if tm.Before(last) {
			t.Errorf("the merged stream is not in time order: %v after %v", e, last)
		}
		if tm.Before(since) {
			t.Errorf("--since %s showed an older event: %v", sinceFlag, e)
		}
		if m, _ := e["message"].(string); strings.Contains(m, "rpc error") || strings.Contains(m, "desc =") {
			t.Errorf("an event's message is in gRPC's words, not ours: %v", e)
		}
		last = tm
	}
	for _, e := range eventLines(t, onBeta.out()) {
		if e["node"] != "beta" {
			t.Errorf("the stream of beta shows an event of %v", e["node"])
		}
	}
	for _, e := range eventLines(t, live.out()) {
		if tm, _ := time.Parse(time.RFC3339Nano, e["time"].(string)); tm.Before(liveStart) {
			t.Errorf("events without --since showed history: %v", e)
		}
	}
	for _, b := range []*bgCmd{onBeta, all, live} {
		if code := b.interrupt(); code != 0 {
			t.Errorf("replctl %s: exit %d after Ctrl-C, want 0; stderr: %s", b.name, code, b.errs())
		}
	}
}

// TestE2EEventsWhenANodeGoesAway: with --all, a node that stops is
// reported in words and the others are followed on; when it is back, what
// it recorded meanwhile is shown. Following that node alone, the command
// ends with an error saying so.
func TestE2EEventsWhenANodeGoesAway(t *testing.T) {
	e2eBeside(t)
	c := newProcCluster(t, 64<<20, 61)
	c.start("alpha")
	c.start("beta")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	c.waitInSync("alpha")

	all := startBG(t, nil, "events", "--all", "--json", "--addr", c.nodes["alpha"].Control)
	one := startBG(t, nil, "events", "--addr", c.nodes["beta"].Control)
	// Each follows beta live once beta's state came (exists-end): a
	// stream to beta that was not up yet when beta stopped is a node
	// never reached, not one that went away.
	all.waitFor("following both nodes live", 20*time.Second, func() bool {
		for _, e := range eventLines(t, all.out()) {
			if e["node"] == "beta" && e["kind"] == "exists-end" {
				return true
			}
		}
		return false
	})
	one.waitFor("following beta live", 20*time.Second, func() bool { return strings.Contains(one.out(), "exists-end") })

	c.stop("beta")
	gone := "node beta at " + c.nodes["beta"].Control + " went away"
	all.waitFor("saying beta went away", 15*time.Second, func() bool { return strings.Contains(all.errs(), gone) })
	if code := one.exitCode(15 * time.Second); code == 0 || !strings.Contains(one.errs(), gone) || !strings.Contains(one.errs(), "no more events") {
		t.Errorf("following beta alone: exit %d, stderr %q; want non-zero and %q", code, one.errs(), gone)
	}
	for _, s := range []string{all.errs(), one.errs()} {
		if strings.Contains(s, "rpc error") || strings.Contains(s, "desc =") {
			t.Errorf("raw gRPC in the words: %s", s)
		}
	}

	// alpha is followed on.
	c.mustCtl("alpha", "disconnect", volName, "--node", "alpha")
	all.waitFor("showing alpha's disconnect", 15*time.Second, func() bool {
		for _, e := range eventLines(t, all.out()) {
			if e["node"] == "alpha" && isDisconnect(e) {
				return true
			}
		}
		return false
	})
	c.mustCtl("alpha", "connect", volName, "--node", "alpha")

	c.start("beta")
	all.waitFor("saying beta is back", 20*time.Second, func() bool {
		return strings.Contains(all.errs(), "node beta at "+c.nodes["beta"].Control+" is back")
	})
	all.waitFor("showing what beta recorded while away", 10*time.Second, func() bool {
		kinds := map[any]bool{}
		for _, e := range eventLines(t, all.out()) {
			if e["node"] == "beta" {
				kinds[e["kind"]] = true
			}
		}
		return kinds["stopped"] && kinds["started"]
	})
	if code := all.interrupt(); code != 0 {
		t.Errorf("events --all: exit %d after Ctrl-C, want 0", code)
	}
}

// TestE2EUnknownVolumeOrNodeListsTheValidOnes: every command given a
// volume or node the cluster does not have exits non-zero and lists the
// valid names, in words.
func TestE2EUnknownVolumeOrNodeListsTheValidOnes(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	d.waitInSync("alpha")
	const volumes, nodes = "the volumes are vol0", "the nodes are alpha, beta"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "vol9"}, volumes},
		{[]string{"status", "--watch", "vol9"}, volumes},
		{[]string{"primary", "vol9", "--node", "beta"}, volumes},
		{[]string{"primary", volName, "--node", "gamma"}, nodes},
		{[]string{"connect", "vol9"}, volumes},
		{[]string{"connect", volName, "--node", "gamma"}, nodes},
		{[]string{"disconnect", "vol9", "--node", "beta"}, volumes},
		{[]string{"disconnect", volName, "--node", "gamma"}, nodes},
		{[]string{"resync", "vol9"}, volumes},
		{[]string{"resync", "vol9", "--pause"}, volumes},
		{[]string{"resync", volName, "--from", "gamma"}, nodes},
		{[]string{"verify", "vol9"}, volumes},
		{[]string{"path", "list", "vol9"}, volumes},
		{[]string{"path", "list", "--node", "gamma"}, nodes},
		{[]string{"path", "fail", "vol9", "p0"}, volumes},
		{[]string{"adjust", "vol9", "--protocol", "B"}, volumes},
		{[]string{"adjust", volName, "--protocol", "B", "--node", "gamma"}, nodes},
		{[]string{"events", "--node", "gamma"}, nodes},
	} {
		r := d.ctl("alpha", tc.args...)
		t.Logf("replctl %s: %s", strings.Join(tc.args, " "), r)
		if r.code != 1 || !strings.Contains(r.out, tc.want) {
			t.Errorf("replctl %s: %s; want exit 1 and %q", strings.Join(tc.args, " "), r, tc.want)
		}
		if strings.Contains(r.out, "rpc error") || strings.Contains(r.out, "code =") {
			t.Errorf("replctl %s shows raw gRPC: %s", strings.Join(tc.args, " "), r.out)
		}
	}
	// Nothing changed on the way.
	if v := d.mustStatus("alpha"); !v.inSync() || v.Protocol != "C" {
		t.Fatalf("after the refused commands: %+v", v)
	}
}

// TestE2EVersionFlags: both binaries, built in a checkout, say the
// release the module's version gives (a built binary said "replctl dev"),
// the Go version, and the commit they were built from with its time;
// replctl version --release says the release alone, a valid Debian
// version (make deb takes it); -ldflags sets the release instead.
func TestE2EVersionFlags(t *testing.T) {
	e2eBeside(t)
	head := gitHead(t)
	want := regexp.MustCompile(`^(replctl|replnode) ([0-9][A-Za-z0-9.+~]*) \(` + regexp.QuoteMeta(runtime.Version()) + `, revision ([0-9a-f]{12})(\+modified)? of [0-9TZ:-]+\)\n$`)
	for _, bin := range []string{replctlBin, replnode(t)} {
		r := runCmd(10*time.Second, nil, bin, "--version")
		m := want.FindStringSubmatch(r.out)
		if !r.ok() || m == nil || m[1] != filepath.Base(bin) {
			t.Errorf("%s --version: %s; want %s", filepath.Base(bin), r, want)
			continue
		}
		if head != "" && m[3] != head[:12] {
			t.Errorf("%s --version names revision %s; the checkout is at %s", filepath.Base(bin), m[3], head)
		}
		if head != "" && !strings.Contains(m[2], head[:7]) && !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(\+dirty)?$`).MatchString(m[2]) {
			t.Errorf("%s --version: release %s names neither a tag nor the commit %s", filepath.Base(bin), m[2], head[:7])
		}
		if bin == replctlBin {
			rel := runCmd(10*time.Second, nil, bin, "version", "--release")
			if !rel.ok() || strings.TrimSpace(rel.out) != m[2] {
				t.Errorf("replctl version --release: %s; want %s", rel, m[2])
			}
		}
	}
	// -ldflags sets the release (replnode's version.go is the same).
	out := filepath.Join(t.TempDir(), "replctl")
	if b, err := exec.Command(goCommand(), "build", "-ldflags", "-X main.version=1.2.3-test", "-o", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	r := runCmd(10*time.Second, nil, out, "--version")
	if !r.ok() || !strings.HasPrefix(r.out, "replctl 1.2.3-test ("+runtime.Version()) {
		t.Errorf("replctl built with -X main.version=1.2.3-test: %s", r)
	}
}

// gitHead is the commit the checkout is at; "" (the test skips what
// needs it) outside a git checkout, which fails the test under CI=true.
func gitHead(t *testing.T) string {
	t.Helper()
	r := runCmd(10*time.Second, nil, "git", "rev-parse", "HEAD")
	if !r.ok() || len(strings.TrimSpace(r.out)) != 40 {
		if inCI() {
			t.Fatalf("CI=true: git rev-parse HEAD: %s", r)
		}
		t.Logf("not a git checkout (%s): the commit is not checked", r)
		return ""
	}
	return strings.TrimSpace(r.out)
}

// TestE2EResyncPauseWithNothingToPause: pausing when no resync runs says
// so, exits non-zero and changes nothing.
func TestE2EResyncPauseWithNothingToPause(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	d.waitInSync("alpha")
	r := d.ctl("alpha", "resync", volName, "--pause")
	if r.code != 1 || !strings.Contains(r.out, "no resync of vol0 is running: nothing to pause") {
		t.Fatalf("resync --pause with nothing to pause: %s", r)
	}
	// A usage error (issue 15: exit code 2).
	if r := d.ctl("alpha", "resync", volName, "--pause", "--resume"); r.code != 2 || !strings.Contains(r.out, "exclude each other") {
		t.Fatalf("resync --pause --resume: %s", r)
	}
	// A resync started now is not held by a pause left behind.
	out := d.mustCtl("alpha", "resync", volName, "--wait")
	if !strings.Contains(out, "vol0: in sync") {
		t.Fatalf("resync --wait after the refused pause: %s", out)
	}
}

// TestE2EUnreachableNodeInWords: a refused connection names the address
// (and the node, once a status has shown it) and asks whether replnode
// runs there; a hung node's timeout says the command may or may not have
// happened. No raw gRPC text reaches the operator. Each exits 3: a node
// could not be reached (issue 15).
func TestE2EUnreachableNodeInWords(t *testing.T) {
	e2eBeside(t)
	cache := []string{"XDG_CACHE_HOME=" + t.TempDir()}
	rawGRPC := func(out string) bool {
		return strings.Contains(out, "rpc error") || strings.Contains(out, "code =") || strings.Contains(out, "desc =")
	}

	closed := freePort(t)
	for _, args := range [][]string{{"status"}, {"primary", volName, "--node", "beta"}, {"events"}} {
		r := runCmd(30*time.Second, cache, replctlBin, append(args, "--addr", closed)...)
		want := "cannot reach a node at " + closed + ": is replnode running there? (connection refused"
		if r.code != 3 || !strings.Contains(r.out, want) || rawGRPC(r.out) {
			t.Errorf("replctl %s --addr %s (closed): %s; want exit 3 (unreachable) and %q", strings.Join(args, " "), closed, r, want)
		}
	}

	c := newProcCluster(t, 64<<20, 61)
	c.start("alpha")
	c.start("beta")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	c.waitInSync("alpha")
	ctl := func(node string, args ...string) result {
		return runCmd(30*time.Second, cache, replctlBin, append(args, "--addr", c.nodes[node].Control)...)
	}
	if r := ctl("alpha", "status"); !r.ok() {
		t.Fatal(r)
	}
	c.stop("beta")
	r := ctl("beta", "status")
	want := "cannot reach node beta at " + c.nodes["beta"].Control + ": is replnode running there? (connection refused"
	if r.code != 3 || !strings.Contains(r.out, want) || !strings.Contains(r.out, "alpha ("+c.nodes["alpha"].Control+")") || rawGRPC(r.out) {
		t.Errorf("status via a stopped beta: %s; want %q and alpha's address to try", r, want)
	}
	r = ctl("alpha", "status")
	if !r.ok() || !strings.Contains(r.out, "unreachable") || !strings.Contains(r.out, "! beta unreachable") || rawGRPC(r.out) {
		t.Errorf("status via alpha with beta stopped: %s", r)
	}
	r = ctl("alpha", "disconnect", volName, "--node", "beta")
	if r.code != 3 || rawGRPC(r.out) || !strings.Contains(r.out, "node beta is unreachable from alpha") {
		t.Errorf("disconnect of the stopped beta via alpha: %s", r)
	}

	// A hung node: it accepts connections and answers nothing.
	c.pause("alpha")
	r = ctl("alpha", "primary", volName, "--node", "beta", "--timeout", "1s")
	want = "the request timed out after 1s (--timeout): the switchover may or may not have happened; check replctl status"
	if r.code != 3 || !strings.Contains(r.out, want) {
		t.Errorf("switchover via a hung alpha: %s; want exit 3 and %q", r, want)
	}
	r = ctl("alpha", "status", "--timeout", "5s")
	if r.code != 3 || !strings.Contains(r.out, "node alpha at "+c.nodes["alpha"].Control) || !strings.Contains(r.out, "hung") || rawGRPC(r.out) {
		t.Errorf("status via a hung alpha: %s", r)
	}
	c.resume("alpha")
}

// TestE2EReplnodeSIGHUP: SIGHUP applies a changed protocol and resync
// rate online (status shows them) and logs every change that needs a
// restart; a broken file is
// logged and the node runs on; systemd hears READY=1, RELOADING=1 with
// the monotonic time, READY=1 again and STOPPING=1.
func TestE2EReplnodeSIGHUP(t *testing.T) {
	e2e(t)
	c := newProcCluster(t, 64<<20, 61)
	sock := filepath.Join(t.TempDir(), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	c.start("beta")
	t.Setenv("NOTIFY_SOCKET", sock) // alpha only: beta is running already
	c.start("alpha")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	expectNotify := func(prefix string) {
		t.Helper()
		buf := make([]byte, 512)
		notify.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := notify.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), prefix) {
			t.Fatalf("systemd notification %q (%v), want %q...", buf[:n], err, prefix)
		}
	}
	expectNotify("READY=1")
	c.waitInSync("alpha")

	orig, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), "protocol: C,", "protocol: B, resync_rate: 100MiB, csums: true,", 1)
	if edited == string(orig) {
		t.Fatalf("the harness's config changed shape:\n%s", orig)
	}
	if err := os.WriteFile(c.cfgPath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alpha", "beta"} {
		if err := c.procs[n].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	expectNotify("RELOADING=1\nMONOTONIC_USEC=")
	expectNotify("READY=1")
	c.waitFor("alpha", "protocol B, resync capped at 100 MiB/s", 15*time.Second, func(v *volumeStatus) bool {
		return v.Protocol == "B" && v.ResyncRate == 100<<20
	})
	alphaLog := filepath.Join(c.dir, "alpha.log")
	waitLog := func(what string) {
		t.Helper()
		var b []byte
		if !within(15*time.Second, 50*time.Millisecond, func() bool {
			b, _ = os.ReadFile(alphaLog)
			return bytes.Contains(b, []byte(what))
		}) {
			t.Fatalf("alpha's log has no %q after 15s:\n%s", what, b)
		}
	}
	waitLog("field volumes[vol0].csums changed: restart to apply")
	for _, n := range []string{"alpha", "beta"} {
		// Each node's own view: the protocol it runs.
		if p := nodeProtocol(t, c.nodes[n].Control); p != "B" {
			t.Fatalf("after SIGHUP %s runs protocol %q, want B", n, p)
		}
	}

	// A broken file: logged, ignored, the node serves on.
	if err := os.WriteFile(c.cfgPath, []byte("nodes: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.procs["alpha"].Process.Signal(syscall.SIGHUP)
	expectNotify("RELOADING=1")
	expectNotify("READY=1")
	waitLog("the config file does not load; nothing changed, the node runs on")
	if ps := c.procs["alpha"].ProcessState; ps != nil {
		t.Fatalf("alpha exited after a SIGHUP with a broken file: %s", ps)
	}
	if v := c.mustStatus("alpha"); v.Protocol != "B" || !v.inSync() {
		t.Fatalf("after a SIGHUP with a broken file: %+v", v)
	}
	c.stop("alpha")
	expectNotify("STOPPING=1")
	if code := c.procs["alpha"].ProcessState.ExitCode(); code != 0 {
		t.Fatalf("alpha exited %d after SIGTERM", code)
	}
}

// nodeProtocol is the protocol vol0 runs with on the node at control,
// from the node's own view (/api/node).
func nodeProtocol(t *testing.T, control string) string {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + control + "/api/node")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var view struct {
		Volumes []struct {
			Name     string `json:"name"`
			Protocol string `json:"protocol"`
		} `json:"volumes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
		t.Fatalf("/api/node on %s: %v", control, err)
	}
	for _, v := range view.Volumes {
		if v.Name == volName {
			return v.Protocol
		}
	}
	t.Fatalf("/api/node on %s: no %s", control, volName)
	return ""
}

// TestE2EStatusFilterColoursAndWatch: status VOLUME shows that volume; a
// pipe or NO_COLOR gets no escape codes, a terminal gets colours;
// --watch in a pipe prints a frame a second after a separator and ends on
// Ctrl-C; a failed path is warned about on the volume's line, and path
// list --node shows that node's paths. The demo runs with a fractional
// --size and two paths per node.
func TestE2EStatusFilterColoursAndWatch(t *testing.T) {
	e2e(t)
	script := RequireTool(t, "script", "bsdutils")
	d := startDemo(t, "--size", "0.25GiB", "--paths", "2") // the last --size wins: 256 MiB, as startDemo expects
	d.waitInSync("alpha")
	addr := d.nodes["alpha"].Control

	out := d.mustCtl("alpha", "status", volName)
	if !strings.Contains(out, "vol0  size 256.0MiB  protocol C  primary alpha") || !strings.Contains(out, "in sync") {
		t.Errorf("status vol0:\n%s", out)
	}
	if strings.Contains(out, "\033[") {
		t.Errorf("status in a pipe has escape codes: %q", out)
	}
	js := d.mustCtl("alpha", "status", volName, "--json")
	s, err := parseStatus(js)
	if err != nil || len(s.Volumes) != 1 || s.Volumes[0].Name != volName {
		t.Errorf("status vol0 --json: %v %s", err, js)
	}
	if out := d.mustCtl("alpha", "status", "--color", "always"); !strings.Contains(out, "\033[32min sync\033[0m") {
		t.Errorf("status --color always has no green: %q", out)
	}

	// On a terminal (script gives it a pty): colours, unless NO_COLOR.
	onTTY := func(env ...string) string {
		t.Helper()
		r := runCmd(30*time.Second, env, script, "-qec", fmt.Sprintf("%s status --addr %s", replctlBin, addr), "/dev/null")
		if !r.ok() {
			t.Fatalf("status on a terminal: %s", r)
		}
		return r.out
	}
	if out := onTTY(); !strings.Contains(out, "\033[32m") {
		t.Errorf("status on a terminal has no colour: %q", out)
	}
	if out := onTTY("NO_COLOR=1"); strings.Contains(out, "\033[") {
		t.Errorf("status on a terminal with NO_COLOR has escape codes: %q", out)
	}

	// path list --node: that node's paths only.
	out = d.mustCtl("alpha", "path", "list", volName, "--node", "beta")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NODE") {
		t.Errorf("path list --node beta: want a header and beta's two paths:\n%s", out)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "beta ") {
			t.Errorf("path list --node beta shows %q", l)
		}
	}
	// A failed path is a warning on the volume's line.
	d.mustCtl("alpha", "path", "fail", volName, "p0", "--node", "alpha")
	out = d.mustCtl("alpha", "status", volName)
	if !strings.Contains(firstLineWith(out, "vol0  size"), "! alpha path p0 failed") {
		t.Errorf("status with alpha's p0 failed:\n%s", out)
	}
	d.mustCtl("alpha", "path", "restore", volName, "p0", "--node", "alpha")
	if line := firstLineWith(d.mustCtl("alpha", "status", volName), "vol0  size"); strings.Contains(line, "!") {
		t.Errorf("status with every path restored still warns: %s", line)
	}

	w := startBG(t, []string{"NO_COLOR="}, "status", "--watch", "--addr", addr)
	w.waitFor("three frames", 15*time.Second, func() bool { return strings.Count(w.out(), "\n--- ") >= 2 })
	if code := w.interrupt(); code != 0 {
		t.Errorf("status --watch: exit %d after Ctrl-C", code)
	}
	frames := w.out()
	if !strings.HasPrefix(frames, "--- ") || strings.Contains(frames, "\033[") || strings.Count(frames, "vol0  size") < 3 {
		t.Errorf("status --watch in a pipe:\n%s", frames)
	}
}

func firstLineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
