package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// debFiles are paths the .deb must install (and a purge remove).
var debFiles = []string{
	"/usr/bin/replnode",
	"/usr/bin/replctl",
	"/usr/bin/replcsi",
	"/lib/systemd/system/replnode.service",
	"/lib/systemd/system/replvol-mount@.service",
	"/etc/replvol/cluster.example.yaml",
	"/usr/share/man/man1/replctl.1.gz",
	"/usr/share/man/man1/replctl-status.1.gz",
	"/usr/share/man/man1/replctl-mount.1.gz",
	"/usr/share/man/man8/replnode.8.gz",
	"/usr/share/bash-completion/completions/replctl",
	"/usr/share/zsh/vendor-completions/_replctl",
	"/usr/share/fish/vendor_completions.d/replctl.fish",
	"/usr/share/doc/replvol/docs/production.md",
	"/usr/share/doc/replvol/README.md",
	"/var/lib/replvol",
}

// The .deb that make deb builds installs into the real system with dpkg
// -i: the binaries run, the unit passes systemd-analyze verify where it
// is installed, the example config is a conffile, the man pages and
// completions are where man and the shells look, the state directory is
// private. A purge removes every file again. It runs as root (CI does);
// it refuses to touch a system that has replvol installed already.
func TestTheDebInstallsAndItsUnitVerifies(t *testing.T) {
	requireRoot(t, "installing the .deb into the system")
	dpkg := requireTool(t, "dpkg", "dpkg")
	analyze := requireTool(t, "systemd-analyze", "systemd")
	mk := requireTool(t, "make", "make")
	if r := run("", 10*time.Second, nil, "dpkg-query", "-W", "-f=${Status}", "replvol"); r.ok() && strings.Contains(r.out, "installed") {
		t.Fatalf("the package replvol is installed on this system already (%s): this test installs and purges it, so it does not run here; dpkg --purge replvol first", strings.TrimSpace(r.out))
	}
	for _, f := range debFiles {
		if _, err := os.Stat(f); err == nil {
			t.Fatalf("%s exists though no replvol package is installed: the test would overwrite it and its purge remove it; move it away first", f)
		}
	}

	root := repoRoot(t)
	build := t.TempDir()
	out := mustRun(t, "make deb", root, 10*time.Minute, []string{"BUILD=" + build}, mk, "deb")
	t.Logf("make deb:\n%s", lastLines(out, 3))
	debs, _ := filepath.Glob(filepath.Join(build, "replvol_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %v in %s, want one replvol_*.deb", debs, build)
	}
	deb := debs[0]

	purged := false
	t.Cleanup(func() {
		if purged {
			return
		}
		if r := run("", time.Minute, nil, dpkg, "--purge", "replvol"); !r.ok() {
			t.Errorf("cleanup: dpkg --purge replvol: %s", r)
		}
	})
	t.Logf("dpkg -i:\n%s", mustRun(t, "install the .deb", "", 2*time.Minute, []string{"DEBIAN_FRONTEND=noninteractive"}, dpkg, "-i", deb))

	for _, f := range debFiles {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after dpkg -i: %v", err)
		}
	}
	if fi, err := os.Stat("/var/lib/replvol"); err == nil && fi.Mode().Perm() != 0o700 {
		t.Errorf("/var/lib/replvol has mode %v, want 0700", fi.Mode().Perm())
	}
	conffiles := mustRun(t, "the conffiles", "", 10*time.Second, nil, "dpkg-query", "-W", "-f=${Conffiles}", "replvol")
	if !strings.Contains(conffiles, "/etc/replvol/cluster.example.yaml") {
		t.Errorf("conffiles %q do not list /etc/replvol/cluster.example.yaml", conffiles)
	}

	// systemd-analyze verify checks the unit's syntax, that ExecStart's
	// binary exists and is executable, and the settings' values; it
	// exits non-zero on an error. A warning is printed but passes: none
	// is allowed either.
	// The mount unit is a template: verify checks it as an instance.
	for _, u := range []string{"replnode.service", "replvol-mount@.service"} {
		path := "/lib/systemd/system/" + u
		r := run("", time.Minute, nil, analyze, "verify", path)
		t.Logf("systemd-analyze verify %s: %s", path, r)
		if !r.ok() {
			t.Errorf("systemd-analyze verify %s failed: %s", path, r)
		}
		stem := strings.TrimSuffix(strings.TrimSuffix(u, ".service"), "@")
		for _, line := range strings.Split(strings.TrimSpace(r.out), "\n") {
			if strings.Contains(line, stem) {
				t.Errorf("systemd-analyze verify warns about %s: %s", u, line)
			}
		}
	}
	mount, err := os.ReadFile("/lib/systemd/system/replvol-mount@.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mount), "ExecStart=/usr/bin/replctl ") || strings.Contains(string(mount), "/usr/local/") {
		t.Errorf("the installed mount unit does not run /usr/bin/replctl:\n%s", mount)
	}
	unit, err := os.ReadFile("/lib/systemd/system/replnode.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/bin/replnode ") {
		t.Errorf("the installed unit does not start /usr/bin/replnode:\n%s", unit)
	}

	// The package's version is the binaries' release, which names the
	// commit they were built from (or its tag): it said 0.0.0+git...,
	// and the binaries "dev".
	debVersion := strings.TrimSpace(mustRun(t, "the package's version", "", 10*time.Second, nil, "dpkg-query", "-W", "-f=${Version}", "replvol"))
	head := strings.TrimSpace(mustRun(t, "git rev-parse HEAD", root, 10*time.Second, nil, "git", "rev-parse", "HEAD"))
	t.Logf("the package's version: %s (HEAD %s)", debVersion, head)
	if !strings.Contains(debVersion, head[:7]) && !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+`).MatchString(debVersion) || strings.HasPrefix(debVersion, "0.0.0+") {
		t.Errorf("the package's version %s names neither a tag nor the commit %s", debVersion, head[:7])
	}
	for _, bin := range []string{"replctl", "replnode", "replcsi"} {
		v := mustRun(t, bin+" --version", "", 10*time.Second, nil, "/usr/bin/"+bin, "--version")
		t.Logf("%s --version: %s", bin, strings.TrimSpace(v))
		if !strings.HasPrefix(v, bin+" "+debVersion+" (") || !strings.Contains(v, "revision "+head[:12]) {
			t.Errorf("%s --version: %q, want the package's version %s and the revision %s", bin, v, debVersion, head[:12])
		}
	}
	if man, err := requireToolQuiet("man"); err == nil {
		for _, page := range []string{"replctl", "replctl-status", "replctl-mount", "replnode"} {
			if r := run("", 10*time.Second, nil, man, "-w", page); !r.ok() || !strings.HasPrefix(strings.TrimSpace(r.out), "/usr/share/man/") {
				t.Errorf("man -w %s: %s", page, r)
			}
		}
		// Each page is headed by its own command: man replctl-mount
		// showed REPLCTL(1).
		r := run("", 10*time.Second, []string{"MANWIDTH=80"}, man, "-P", "cat", "replctl-mount")
		if first, _, _ := strings.Cut(strings.TrimSpace(r.out), "\n"); !r.ok() || !strings.HasPrefix(first, "REPLCTL-MOUNT(1)") {
			t.Errorf("man replctl-mount begins %q, want REPLCTL-MOUNT(1): %s", first, r)
		}
	}
	// bash: the completion file registers replctl's completion function.
	if r := run("", 10*time.Second, nil, "bash", "-c", "source /usr/share/bash-completion/completions/replctl && complete -p replctl"); !r.ok() || !strings.Contains(r.out, "replctl") {
		t.Errorf("bash completion: %s", r)
	}

	t.Logf("dpkg --purge:\n%s", mustRun(t, "purge the package", "", 2*time.Minute, nil, dpkg, "--purge", "replvol"))
	purged = true
	for _, f := range append(debFiles, "/etc/replvol", "/usr/share/doc/replvol") {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("after dpkg --purge: %s is still there", f)
		}
	}
}

// requireToolQuiet finds a tool on the PATH without skipping.
func requireToolQuiet(tool string) (string, error) {
	return exec.LookPath(tool)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
