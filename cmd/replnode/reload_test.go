package main

import (
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
// volume's protocol, on_congestion and resync_rate are applied online (with the
// congestion policy a restart would give), on the nodes that hold it;
// everything else is named, by its path in the file, as needing a restart.
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
		}, "alpha", nil, []string{"volumes[vol1].disks[alpha].paths[p1]", "volumes[vol1].disks[alpha].paths[p2]", "volumes[vol2]"}},
		{"a volume this node does not hold changes protocol: nothing to do here", func(s string) string {
			return strings.Replace(s, "protocol: C\n    primary: alpha", "protocol: A\n    primary: alpha", 1)
		}, "gamma", nil, nil},
		{"nodes reordered: the metadata ids move", func(s string) string {
			lines := strings.Split(s, "\n")
			lines[1], lines[2] = lines[2], lines[1]
			return strings.Join(lines, "\n")
		}, "alpha", nil, []string{"nodes[beta] position (its metadata id)", "nodes[alpha] position (its metadata id)"}},
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
