package nbdtest

import (
	"os"
	"os/exec"
	"testing"
)

// debianPackages names the Debian package that provides each external client used in tests.
var debianPackages = map[string]string{
	"nbdinfo":  "libnbd-bin",
	"nbdcopy":  "libnbd-bin",
	"nbdfuse":  "libnbd-bin",
	"nbdsh":    "python3-libnbd",
	"qemu-io":  "qemu-utils",
	"qemu-img": "qemu-utils",
	"qemu-nbd": "qemu-utils",
	"fio":      "fio",
	"nbdkit":   "nbdkit",
}

// RequireTool skips the test unless every named program is on PATH (or in /usr/bin). Under CI
// (env CI=true) a missing program fails the test instead, so CI cannot silently skip interop tests.
func RequireTool(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := LookTool(name); err == nil {
			continue
		}
		pkg := debianPackages[name]
		if pkg == "" {
			pkg = "the package providing " + name
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found and CI=true: apt-get install %s", name, pkg)
		}
		t.Skipf("%s not found: install the Debian package %s (apt-get install %s) to run this test", name, pkg, pkg)
	}
}

// LookTool finds a program on PATH, then in /usr/bin (Debian's tools when a pyenv or similar
// shadows part of PATH).
func LookTool(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if path, err2 := exec.LookPath("/usr/bin/" + name); err2 == nil {
		return path, nil
	}
	return "", err
}
