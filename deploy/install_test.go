package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// make install honours DESTDIR and PREFIX: everything lands under
// DESTDIR+PREFIX (the config and state directory under DESTDIR/etc and
// DESTDIR/var), and the installed unit starts the replnode installed with
// it, not the one the repository's unit names.
func TestMakeInstallHonoursDestdirAndPrefix(t *testing.T) {
	mk := requireTool(t, "make", "make")
	dest, build := t.TempDir(), t.TempDir()
	mustRun(t, "make install", repoRoot(t), 10*time.Minute, nil, mk, "install", "DESTDIR="+dest, "PREFIX=/opt/replvol", "BUILD="+build)
	for _, f := range []string{
		"opt/replvol/bin/replnode",
		"opt/replvol/bin/replctl",
		"opt/replvol/bin/replcsi",
		"opt/replvol/lib/systemd/system/replnode.service",
		"opt/replvol/lib/systemd/system/replvol-mount@.service",
		"opt/replvol/share/man/man1/replctl.1.gz",
		"opt/replvol/share/man/man1/replctl-primary.1.gz",
		"opt/replvol/share/man/man8/replnode.8.gz",
		"opt/replvol/share/bash-completion/completions/replctl",
		"opt/replvol/share/zsh/site-functions/_replctl",
		"opt/replvol/share/fish/vendor_completions.d/replctl.fish",
		"opt/replvol/share/doc/replvol/docs/production.md",
		"opt/replvol/share/doc/replvol/README.md",
		"etc/replvol/cluster.example.yaml",
		"var/lib/replvol",
	} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Errorf("make install: %v", err)
		}
	}
	// replcsi, the CSI driver, is installed beside the replctl it runs.
	if v := run("", 10*time.Second, nil, filepath.Join(dest, "opt/replvol/bin/replcsi"), "--version"); !v.ok() || !strings.HasPrefix(v.out, "replcsi ") {
		t.Errorf("the installed replcsi --version: %s", v)
	}
	unit, err := os.ReadFile(filepath.Join(dest, "opt/replvol/lib/systemd/system/replnode.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/opt/replvol/bin/replnode --config /etc/replvol/cluster.yaml") {
		t.Errorf("the installed unit does not start /opt/replvol/bin/replnode:\n%s", unit)
	}
	if strings.Contains(string(unit), "/usr/local/") {
		t.Errorf("the installed unit still names /usr/local/:\n%s", unit)
	}
	mount, err := os.ReadFile(filepath.Join(dest, "opt/replvol/lib/systemd/system/replvol-mount@.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mount), "ExecStart=/opt/replvol/bin/replctl --addr unix:///var/lib/replvol/control.sock") || strings.Contains(string(mount), "/usr/local/") {
		t.Errorf("the installed mount unit does not run /opt/replvol/bin/replctl:\n%s", mount)
	}
	// The completions are replctl's own, which ask the cluster for names.
	for _, f := range []string{"opt/replvol/share/bash-completion/completions/replctl", "opt/replvol/share/fish/vendor_completions.d/replctl.fish", "opt/replvol/share/zsh/site-functions/_replctl"} {
		b, err := os.ReadFile(filepath.Join(dest, f))
		if err == nil && !strings.Contains(string(b), "__complete") {
			t.Errorf("%s does not call replctl __complete (the cluster-aware completion)", f)
		}
	}
}
