package buildinfo

import (
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestStringNamesReleaseAndGoVersion(t *testing.T) {
	got := String("1.2.3")
	if !strings.HasPrefix(got, "1.2.3 ("+runtime.Version()) || !strings.HasSuffix(got, ")") {
		t.Fatalf("String(1.2.3) = %q", got)
	}
}

// debianVersion is Debian policy's upstream version without an epoch or
// a revision: it starts with a digit, then letters, digits, . + ~.
var debianVersion = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)

// TestReleaseIsADebianVersionThatSortsAsTheModuleVersions: each module
// version go build stamps becomes a release a .deb takes as its version
// (the .deb said 0.0.0+git..., the binaries "dev"), with the commit in
// it, and dpkg orders them as the module versions are ordered.
func TestReleaseIsADebianVersionThatSortsAsTheModuleVersions(t *testing.T) {
	for _, tc := range []struct{ module, want string }{
		{"v1.4.0", "1.4.0"},
		{"v1.4.0+dirty", "1.4.0+dirty"},
		{"v1.4.0-rc.1", "1.4.0~rc.1"},
		{"v0.0.0-20261205134441-7d6bd45b7ac5", "0.0.0~git20261205134441.7d6bd45"},
		{"v0.0.0-20261205134441-7d6bd45b7ac5+dirty", "0.0.0~git20261205134441.7d6bd45+dirty"},
		{"v1.4.1-0.20261205134441-7d6bd45b7ac5", "1.4.1~git20261205134441.7d6bd45"},
		{"v1.4.0-rc.1.0.20261205134441-7d6bd45b7ac5", "1.4.0~rc.1.git20261205134441.7d6bd45"},
		{"(devel)", "dev"},
		{"", "dev"},
	} {
		got := Release(tc.module)
		if got != tc.want {
			t.Errorf("Release(%q) = %q, want %q", tc.module, got, tc.want)
		}
		if got != "dev" && !debianVersion.MatchString(got) {
			t.Errorf("Release(%q) = %q is no Debian version", tc.module, got)
		}
	}
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		t.Skip("no dpkg to compare versions with")
	}
	// Each before the next, as Go orders the module versions.
	order := []string{"v0.0.0-20261205134441-7d6bd45b7ac5", "v1.4.0-rc.1", "v1.4.0-rc.1.0.20261205134441-7d6bd45b7ac5", "v1.4.0", "v1.4.1-0.20261205134441-7d6bd45b7ac5", "v1.4.1"}
	for i := 1; i < len(order); i++ {
		a, b := Release(order[i-1]), Release(order[i])
		if out, err := exec.Command(dpkg, "--compare-versions", a, "lt", b).CombinedOutput(); err != nil {
			t.Errorf("dpkg does not sort %s (%s) before %s (%s): %v %s", a, order[i-1], b, order[i], err, out)
		}
	}
}
