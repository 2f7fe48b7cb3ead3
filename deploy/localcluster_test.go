package deploy

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/testport"
)

// localCluster drives one deploy/local-cluster.sh cluster in a test.
type localCluster struct {
	t      *testing.T
	script string
	dir    string
	env    map[string]string // lab.env, as the script's env command prints it
}

func (c *localCluster) sh(step string, timeout time.Duration, args ...string) string {
	c.t.Helper()
	return mustRun(c.t, step, "", timeout, nil, c.script, append(args, "--dir", c.dir)...)
}

// replctl runs replctl against node's control address.
func (c *localCluster) replctl(node string, args ...string) result {
	full := []string{"--addr", c.env["CONTROL_"+node], "--timeout", "5s"}
	if d := c.env["REPLCTL_TLS_DIR"]; d != "" {
		full = append(full, "--tls-dir", d)
	}
	return run("", 20*time.Second, nil, filepath.Join(c.dir, "bin", "replctl"), append(full, args...)...)
}

// volume is what status --json says of vol0, asked of node.
type volume struct {
	Primary string `json:"primary"`
	Epoch   uint64 `json:"epoch"`
	NBDURI  string `json:"nbd_uri"`
}

func (c *localCluster) vol0(node string) (volume, error) {
	r := c.replctl(node, "status", "--json")
	if !r.ok() {
		return volume{}, fmt.Errorf("replctl status at %s: %s", node, r)
	}
	var st struct {
		Volumes []struct {
			Name string `json:"name"`
			volume
		} `json:"volumes"`
	}
	if err := json.Unmarshal([]byte(r.out), &st); err != nil {
		return volume{}, fmt.Errorf("status JSON: %v", err)
	}
	for _, v := range st.Volumes {
		if v.Name == "vol0" {
			return v.volume, nil
		}
	}
	return volume{}, fmt.Errorf("no vol0 in status")
}

// uri is an export URI with the NBD client's certificates when TLS is on.
func (c *localCluster) uri(u string) string {
	if d := c.env["REPLCTL_TLS_DIR"]; d != "" && strings.HasPrefix(u, "nbds://") {
		return u + "?tls-certificates=" + filepath.Join(d, "nbd-client")
	}
	return u
}

// pythonNBD is Debian's python3, which has libnbd's bindings (the PATH
// may lead to another python3); nbdOpen connects h to the URI given.
const (
	pythonNBD = "/usr/bin/python3"
	nbdOpen   = "import nbd\nh = nbd.NBD()\nh.set_uri_allow_local_file(True)\nh.connect_uri(%q)\n"
)

// writeAt writes data at off through the NBD export uri and flushes.
func writeAt(t *testing.T, uri string, off int64, data []byte) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	py := fmt.Sprintf(nbdOpen+"data = open(%q, 'rb').read()\nfor i in range(0, len(data), 1 << 20):\n    h.pwrite(data[i:i + (1 << 20)], %d + i)\nh.flush()\n", uri, f, off)
	mustRun(t, fmt.Sprintf("write %d bytes at %d through %s", len(data), off, uri), "", 2*time.Minute, nil, pythonNBD, "-c", py)
}

// readAt reads n bytes at off through uri.
func readAt(t *testing.T, uri string, off int64, n int) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "read")
	py := fmt.Sprintf(nbdOpen+"with open(%q, 'wb') as out:\n    for i in range(0, %d, 1 << 20):\n        out.write(h.pread(min(1 << 20, %d - i), %d + i))\n", uri, f, n, n, off)
	mustRun(t, fmt.Sprintf("read %d bytes at %d through %s", n, off, uri), "", 2*time.Minute, nil, pythonNBD, "-c", py)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// freeBasePort returns a base port P such that P..P+24 are free on
// 127.0.0.1 (the script's loopback mode uses P+0..4, +10..14, +20..24)
// and reserved for t against the other test processes (internal/testport),
// below the kernel's ephemeral range, where no outgoing connection takes
// one meanwhile.
func freeBasePort(t *testing.T) int {
	return testport.PickRun(t, 25)
}

// deploy/local-cluster.sh starts three replnode processes (alpha, beta,
// witness; raft and gossip) that take writes through NBD; a kill -9 of
// the primary fails the volume over to beta with every acknowledged byte;
// the killed node rejoins with start-node and catches up; stop leaves no
// process, namespace, veth, bridge or file behind. As root each node is in
// a network namespace of its own and every link is TLS (--tls); the
// loopback mode runs too, in plaintext.
func TestLocalClusterSurvivesAKillOfThePrimary(t *testing.T) {
	if err := exec.Command(pythonNBD, "-c", "import nbd").Run(); err != nil {
		missing(t, "python3 -c 'import nbd': %v: install the Debian package python3-libnbd", err)
	}
	bin := t.TempDir()
	mustRun(t, "build replnode and replctl", repoRoot(t), 10*time.Minute, nil, "go", "build", "-o", bin+"/", "./cmd/replnode", "./cmd/replctl")

	modes := []struct {
		name string
		args func() []string
	}{
		{"loopback", func() []string { return []string{"--no-netns", "--base-port", strconv.Itoa(freeBasePort(t))} }},
	}
	if os.Geteuid() == 0 {
		requireTool(t, "ip", "iproute2")
		modes = append(modes, struct {
			name string
			args func() []string
		}{"netns-tls", func() []string { return []string{"--tls"} }})
	} else {
		missing(t, "the network namespace mode needs root; running as uid %d", os.Geteuid())
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			testLocalCluster(t, bin, mode.args())
		})
	}
}

func testLocalCluster(t *testing.T, bin string, args []string) {
	c := &localCluster{t: t, script: filepath.Join(repoRoot(t), "deploy", "local-cluster.sh"), dir: filepath.Join(t.TempDir(), "cluster")}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if r := run("", 2*time.Minute, nil, c.script, "stop", "--dir", c.dir); !r.ok() {
				t.Errorf("cleanup: local-cluster.sh stop: %s", r)
			}
		}
	})
	out := c.sh("start", 3*time.Minute, append([]string{"start", "--bin", bin, "--size", "256MiB"}, args...)...)
	t.Logf("local-cluster.sh start:\n%s", out)
	c.env = map[string]string{}
	for _, line := range strings.Split(c.sh("env", 10*time.Second, "env"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			c.env[k] = v
		}
	}
	var export string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "export:" {
			export = f[1]
		}
	}
	if export == "" {
		t.Fatalf("start printed no export line:\n%s", out)
	}
	before, err := c.vol0("beta")
	if err != nil {
		t.Fatal(err)
	}
	if before.Primary != "alpha" || c.uri(before.NBDURI) != export {
		t.Fatalf("after start: primary %q at %q; start printed %q", before.Primary, before.NBDURI, export)
	}

	// Writes through NBD, acknowledged (flushed) before the kill.
	first, second := randomBytes(t, 8<<20), randomBytes(t, 4<<20)
	writeAt(t, export, 0, first)
	writeAt(t, export, 100<<20, second)

	pids := map[string]int{}
	for _, n := range []string{"alpha", "beta", "witness"} {
		b, err := os.ReadFile(filepath.Join(c.dir, "pids", n))
		if err != nil {
			t.Fatal(err)
		}
		pids[n], _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	t.Logf("%s", c.sh("kill -9 the primary", 10*time.Second, "kill", "alpha"))
	killed := time.Now()

	var after volume
	deadline := time.Now().Add(60 * time.Second)
	for {
		after, err = c.vol0("beta")
		if err == nil && after.Primary == "beta" && after.NBDURI != "" {
			break
		}
		if time.Now().After(deadline) {
			r := c.replctl("beta", "status")
			t.Fatalf("no failover to beta 60 s after the kill: %+v, %v\n%s", after, err, r.out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("failed over to beta (epoch %d) %.1f s after the kill", after.Epoch, time.Since(killed).Seconds())
	newExport := c.uri(after.NBDURI)
	if !bytes.Equal(readAt(t, newExport, 0, len(first)), first) || !bytes.Equal(readAt(t, newExport, 100<<20, len(second)), second) {
		t.Fatal("the new primary does not hold what was written before the kill")
	}
	third := randomBytes(t, 4<<20)
	writeAt(t, newExport, 200<<20, third)

	// The killed node rejoins and catches up; the cluster is whole again.
	t.Logf("%s", c.sh("start alpha again", 30*time.Second, "start-node", "alpha"))
	c.sh("wait until healthy", 3*time.Minute, "wait")
	for off, want := range map[int64][]byte{0: first, 100 << 20: second, 200 << 20: third} {
		if !bytes.Equal(readAt(t, newExport, off, len(want)), want) {
			t.Fatalf("after alpha rejoined: the data at %d differ", off)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "pids", "alpha")); err == nil {
		pids["alpha-again"], _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}

	t.Logf("%s", c.sh("stop", 2*time.Minute, "stop"))
	stopped = true
	for n, pid := range pids {
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			t.Errorf("after stop: %s (pid %d) still runs", n, pid)
		}
	}
	if _, err := os.Stat(c.dir); err == nil {
		t.Errorf("after stop: %s is still there", c.dir)
	}
	if prefix := c.env["NS_PREFIX"]; prefix != "" {
		if ns, _ := filepath.Glob("/run/netns/" + prefix + "*"); len(ns) > 0 {
			t.Errorf("after stop: namespaces %v are still there", ns)
		}
		links := run("", 10*time.Second, nil, "ip", "-o", "link", "show")
		if strings.Contains(links.out, c.env["LINK_PREFIX"]) {
			t.Errorf("after stop: links of the cluster are still there:\n%s", links.out)
		}
	}
}
