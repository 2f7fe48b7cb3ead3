package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/node"
)

const baseConfig = `nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802", state_dir: /tmp/a}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805", state_dir: /tmp/b}
volumes:
  - name: vol0
    size: 64MiB
    protocol: C
    primary: alpha
    disks: {alpha: /tmp/a.img, beta: /tmp/b.img}
  - name: vol1
    size: 64MiB
    protocol: C
    primary: beta
    disks: {beta: /tmp/b1.img, alpha: {paths: [{name: p0, path: /tmp/a1.img}, {name: p1, path: /tmp/a1.img}]}}
`

func loadConfig(t *testing.T, text string) *node.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := node.LoadConfig(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return cfg
}

// TestPlanReload pins what a SIGHUP does with each kind of change: a
// volume added to or removed from the file is applied online on every
// node (whether it holds a disk of it or not); a volume's protocol,
// on_congestion and resync_rate are applied online (with the congestion
// policy a restart would give), on the nodes that hold it; everything
// else is named, by its path in the file, as needing a restart.
func TestPlanReload(t *testing.T) {
	for _, tc := range []struct {
		name        string
		edit        func(string) string
		self        string
		wantOnline  []onlineChange
		wantRestart []string
	}{
		{"nothing changed", func(s string) string { return s }, "alpha", nil, nil},
		{"protocol C to A takes A's congestion default", func(s string) string {
			return strings.Replace(s, "protocol: C\n    primary: alpha", "protocol: A\n    primary: alpha", 1)
		}, "alpha", []onlineChange{{volume: "vol0", protocol: "A", onCongestion: "pull-ahead", oldProtocol: "C", oldOnCongestion: "block", named: "default"}}, nil},
		{"on_congestion alone", func(s string) string {
			return strings.Replace(s, "protocol: C\n    primary: beta", "protocol: C\n    on_congestion: disconnect\n    primary: beta", 1)
		}, "beta", []onlineChange{{volume: "vol1", protocol: "C", onCongestion: "disconnect", oldProtocol: "C", oldOnCongestion: "block", named: "disconnect"}}, nil},
		{"a change online next to one that needs a restart", func(s string) string {
			s = strings.Replace(s, "protocol: C\n    primary: alpha", "protocol: B\n    primary: alpha\n    resync_rate: 100MiB", 1)
			return strings.Replace(s, `control: "127.0.0.1:7803"`, `control: "127.0.0.1:7903"`, 1)
		}, "alpha", []onlineChange{{volume: "vol0", protocol: "B", onCongestion: "block", oldProtocol: "C", oldOnCongestion: "block", named: "default",
			rateChanged: true, resyncRate: 100 << 20}},
			[]string{"nodes[beta].control"}},
		{"resync_rate alone: the protocol is left as it is", func(s string) string {
			return strings.Replace(s, "protocol: C\n    primary: beta", "protocol: C\n    resync_rate: 20MiB\n    primary: beta", 1)
		}, "alpha", []onlineChange{{volume: "vol1", rateChanged: true, resyncRate: 20 << 20}}, nil},
		{"a multipath path renamed, a volume added", func(s string) string {
			s = strings.Replace(s, "{name: p1, path: /tmp/a1.img}", "{name: p2, path: /tmp/a1.img}", 1)
			return s + "  - {name: vol2, size: 64MiB, protocol: C, primary: alpha, disks: {alpha: /tmp/a2.img, beta: /tmp/b2.img}}\n"
		}, "alpha", []onlineChange{{volume: "vol2", op: node.VolumeAdded}}, []string{"volumes[vol1].disks[alpha].paths[p1]", "volumes[vol1].disks[alpha].paths[p2]"}},
		{"a volume added is added on a node that holds no disk of it too", func(s string) string {
			return s + "  - {name: vol2, size: 64MiB, protocol: C, primary: alpha, disks: {alpha: /tmp/a2.img, beta: /tmp/b2.img}}\n"
		}, "gamma", []onlineChange{{volume: "vol2", op: node.VolumeAdded}}, nil},
		{"a volume removed", func(s string) string {
			return s[:strings.Index(s, "  - name: vol1")]
		}, "beta", []onlineChange{{volume: "vol1", op: node.VolumeRemoved}}, nil},
		{"a volume removed and another added with its disks", func(s string) string {
			return strings.Replace(s, "name: vol1", "name: vol9", 1)
		}, "alpha", []onlineChange{{volume: "vol1", op: node.VolumeRemoved}, {volume: "vol9", op: node.VolumeAdded}}, nil},
		{"a volume added next to a node added: the node needs a restart", func(s string) string {
			s = strings.Replace(s, "volumes:", `  - {name: gamma, control: "127.0.0.1:7806", replication: "127.0.0.1:7807", nbd: "127.0.0.1:7808", state_dir: /tmp/c}
volumes:`, 1)
			return s + "  - {name: vol2, size: 64MiB, protocol: C, primary: gamma, disks: {gamma: /tmp/c2.img, beta: /tmp/b2.img}}\n"
		}, "alpha", []onlineChange{{volume: "vol2", op: node.VolumeAdded}}, []string{"nodes[gamma]"}},
		{"a volume this node does not hold changes protocol: nothing to do here", func(s string) string {
			return strings.Replace(s, "protocol: C\n    primary: alpha", "protocol: A\n    primary: alpha", 1)
		}, "gamma", nil, nil},
		{"nodes reordered: the metadata ids move", func(s string) string {
			lines := strings.Split(s, "\n")
			lines[1], lines[2] = lines[2], lines[1]
			return strings.Join(lines, "\n")
		}, "alpha", nil, []string{"nodes[beta] position (its metadata id)", "nodes[alpha] position (its metadata id)"}},
		{"pools added and changed: applied online, no restart", func(s string) string {
			s = strings.Replace(s, "state_dir: /tmp/a}", "state_dir: /tmp/a, pools: [{name: default, dir: /srv/pool}, {name: fast, lvm_vg: vg0}]}", 1)
			return strings.Replace(s, "state_dir: /tmp/b}", "state_dir: /tmp/b, pools: [{name: default, dir: /srv/pool}]}", 1)
		}, "alpha", nil, nil},
		{"a plain disk becomes a one-path multipath disk", func(s string) string {
			return strings.Replace(s, "alpha: /tmp/a.img", "alpha: {paths: [{name: p0, path: /tmp/a.img}]}", 1)
		}, "alpha", nil, []string{"volumes[vol0].disks[alpha].multipath"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := baseConfig
			if tc.self == "gamma" {
				// A third node, which holds no disk of vol0.
				base = strings.Replace(base, "volumes:", `  - {name: gamma, control: "127.0.0.1:7806", replication: "127.0.0.1:7807", nbd: "127.0.0.1:7808", state_dir: /tmp/c}
volumes:`, 1)
			}
			online, restart := planReload(loadConfig(t, base), loadConfig(t, tc.edit(base)), tc.self)
			if !slices.Equal(online, tc.wantOnline) {
				t.Errorf("online changes %+v, want %+v", online, tc.wantOnline)
			}
			var fields []string
			for _, c := range restart {
				fields = append(fields, c.field)
			}
			if !slices.Equal(fields, tc.wantRestart) {
				t.Errorf("restart needed for %q, want %q (changes %+v)", fields, tc.wantRestart, restart)
			}
		})
	}
}

// TestPlanReloadSizeMax: size: max is a size like any other for a
// SIGHUP: unchanged, nothing to do; changed, planReload names it, saying
// max, not a number (takeSizes then tells what a size in the file means:
// TestTakeSizes).
func TestPlanReloadSizeMax(t *testing.T) {
	withMax := strings.Replace(baseConfig, "size: 64MiB\n    protocol: C\n    primary: alpha", "size: max\n    protocol: C\n    primary: alpha", 1)
	if withMax == baseConfig {
		t.Fatal("case does not change the config")
	}
	if online, restart := planReload(loadConfig(t, withMax), loadConfig(t, withMax), "alpha"); online != nil || restart != nil {
		t.Fatalf("size: max unchanged: online %+v, restart %+v", online, restart)
	}
	_, restart := planReload(loadConfig(t, withMax), loadConfig(t, baseConfig), "alpha")
	if want := []change{{field: "volumes[vol0].size", old: "max", new: "67108864"}}; !slices.Equal(restart, want) {
		t.Fatalf("size: max to 64MiB: restart %+v, want %+v", restart, want)
	}
}

func TestSdNotify(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	for _, msg := range []string{"READY=1", reloading(), "STOPPING=1"} {
		if err := sdNotify(msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:n]) != msg {
			t.Fatalf("received %q, want %q", buf[:n], msg)
		}
	}
	if r := reloading(); !strings.HasPrefix(r, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Fatalf("reloading() = %q", r)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v", err)
	}
}

// fakeVolumes stands for the node's ApplyVolumes: it records the files it
// was given and refuses to remove the volumes named in refuse.
type fakeVolumes struct {
	running map[string]bool
	refuse  map[string]bool
	calls   int
}

func (f *fakeVolumes) ApplyVolumes(next *node.Config) []node.VolumeChange {
	f.calls++
	var out []node.VolumeChange
	for name := range f.running {
		if volumeNamed(next, name) != nil {
			continue
		}
		c := node.VolumeChange{Volume: name, Op: node.VolumeRemoved, Held: true}
		if f.refuse[name] {
			c.Err = fmt.Errorf("%w: 1 NBD client", node.ErrHasClients)
		} else {
			delete(f.running, name)
		}
		out = append(out, c)
	}
	for _, vc := range next.Volumes {
		if !f.running[vc.Name] {
			f.running[vc.Name] = true
			out = append(out, node.VolumeChange{Volume: vc.Name, Op: node.VolumeAdded, Held: true})
		}
	}
	return out
}

// TestReloadKeepsWhatTheNodeRuns: the reloader's idea of the running
// config follows what the node did: a volume added is in it (its settings
// are compared at the next SIGHUP), a removal the node refused leaves the
// volume in it, so the next SIGHUP asks again, and a removal done takes it
// out. Every SIGHUP hands the node the file, changed or not.
func TestReloadKeepsWhatTheNodeRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(baseConfig)
	running, err := node.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeVolumes{running: map[string]bool{"vol0": true, "vol1": true}, refuse: map[string]bool{"vol1": true}}
	r := &reloader{path: path, name: "alpha", log: slog.New(slog.NewTextHandler(io.Discard, nil)), running: running, volumes: fake}
	names := func() []string {
		var out []string
		for _, v := range r.running.Volumes {
			out = append(out, v.Name)
		}
		slices.Sort(out)
		return out
	}

	write(baseConfig[:strings.Index(baseConfig, "  - name: vol1")] + "  - {name: vol2, size: 64MiB, protocol: C, primary: alpha, disks: {alpha: /tmp/a2.img, beta: /tmp/b2.img}}\n")
	r.reload(context.Background())
	if got, want := names(), []string{"vol0", "vol1", "vol2"}; !slices.Equal(got, want) {
		t.Fatalf("after adding vol2 and a refused removal of vol1: running %q, want %q", got, want)
	}
	if online, _ := planReload(r.running, loadConfig(t, readFile(t, path)), "alpha"); !slices.Equal(online, []onlineChange{{volume: "vol1", op: node.VolumeRemoved}}) {
		t.Fatalf("the refused removal is not planned again: %+v", online)
	}
	delete(fake.refuse, "vol1")
	r.reload(context.Background())
	if got, want := names(), []string{"vol0", "vol2"}; !slices.Equal(got, want) {
		t.Fatalf("after the removal: running %q, want %q", got, want)
	}
	r.reload(context.Background())
	if fake.calls != 3 {
		t.Fatalf("ApplyVolumes called %d times for 3 SIGHUPs, want every time", fake.calls)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// createdVolumes is a node whose raft records volumes created at run
// time: it refuses a file that names one (node.Node.CheckFile).
type createdVolumes struct {
	fakeVolumes
	created string
}

func (c *createdVolumes) CheckFile(next *node.Config) error {
	if volumeNamed(next, c.created) != nil {
		return fmt.Errorf("volumes %s of the file were created with replctl volume create", c.created)
	}
	return nil
}

// TestAFileNamingACreatedVolumeIsRefused: a SIGHUP whose file lists the
// name of a volume created at run time changes nothing, not even the
// other volumes: the node runs on with the config it had, and says why.
func TestAFileNamingACreatedVolumeIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(baseConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	running, err := node.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	fake := &createdVolumes{fakeVolumes: fakeVolumes{running: map[string]bool{"vol0": true, "vol1": true}}, created: "pvc1"}
	reports := &fakeReports{}
	r := &reloader{path: path, name: "alpha", log: slog.New(slog.NewTextHandler(io.Discard, nil)), running: running, volumes: fake, report: reports}
	next := strings.Replace(baseConfig, "name: vol1", "name: pvc1", 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	r.reload(context.Background())
	if fake.calls != 0 || len(reports.failed) != 1 || reports.reloaded != 0 || !strings.Contains(reports.failed[0].Error(), "pvc1 of the file were created with replctl volume create") {
		t.Fatalf("ApplyVolumes called %d times; failed %v, reloaded %d: want the reload refused, naming pvc1", fake.calls, reports.failed, reports.reloaded)
	}
	if volumeNamed(r.running, "vol1") == nil {
		t.Fatal("the refused file changed what the reloader runs")
	}
}

// fakeReports records what the reloader tells the node of each reload.
type fakeReports struct {
	failed   []error
	reloaded int
}

func (f *fakeReports) ReloadFailed(_ string, err error, _ time.Time) {
	f.failed = append(f.failed, err)
}
func (f *fakeReports) Reloaded(string) { f.reloaded++ }

// TestAFailedReloadIsToldToTheNode: a file that does not load, or that
// no longer names this node, is told to the node (which shows it in
// status until a reload loads) with the loader's problems, file:line
// first; a file that loads is told too, and changes nothing else.
func TestAFailedReloadIsToldToTheNode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(baseConfig)
	running, err := node.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	reports := &fakeReports{}
	r := &reloader{path: path, name: "alpha", log: slog.New(slog.NewTextHandler(io.Discard, nil)), running: running, report: reports}

	broken := strings.Replace(baseConfig, "protocol:", "protocl:", 1)
	write(broken)
	r.reload(context.Background())
	line := 1 + strings.Count(broken[:strings.Index(broken, "protocl")], "\n")
	if want := fmt.Sprintf("%s:%d: volumes[0].protocl: unknown key", path, line); len(reports.failed) != 1 || !strings.HasPrefix(reports.failed[0].Error(), want) || reports.reloaded != 0 {
		t.Fatalf("after a broken file: failed %v, reloaded %d; want one failure saying %q", reports.failed, reports.reloaded, want)
	}
	write(strings.ReplaceAll(baseConfig, "alpha", "gamma"))
	r.reload(context.Background())
	if len(reports.failed) != 2 || !strings.Contains(reports.failed[1].Error(), "there is no node alpha") {
		t.Fatalf("after a file without this node: failed %v", reports.failed)
	}
	write(baseConfig)
	r.reload(context.Background())
	if len(reports.failed) != 2 || reports.reloaded != 1 {
		t.Fatalf("after the file loads again: failed %v, reloaded %d; want it told once", reports.failed, reports.reloaded)
	}
}
