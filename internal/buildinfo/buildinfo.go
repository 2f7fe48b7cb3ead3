package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// Info is what a binary knows of the build it came from.
type Info struct {
	// Release is the version, valid as a Debian package's version (the
	// .deb takes this one): the tag (1.4.0), a commit past a tag or with
	// none (0.0.0~git20261205134441.7d6bd45, sorting before the next
	// tag), "+dirty" for a checkout with uncommitted changes; "dev" when
	// the build recorded nothing.
	Release string
	// Revision is the commit (12 hex digits, "+modified" for uncommitted
	// changes), Time its time (RFC 3339); empty when unknown.
	Revision, Time string
	// Go is the Go version it was built with.
	Go string
}

// Read is the running binary's build. release, when set (go build
// -ldflags "-X main.version=1.4.0", for a build outside a checkout),
// is the release; otherwise the release comes from the module's version,
// which go build takes from the checkout's tags and commit (with
// -buildvcs=auto or true).
func Read(release string) Info {
	info := Info{Go: runtime.Version(), Release: release}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Release == "" {
			info.Release = "dev"
		}
		return info
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if len(info.Revision) > 12 {
		info.Revision = info.Revision[:12]
	}
	if info.Revision != "" && modified {
		info.Revision += "+modified"
	}
	if info.Release == "" {
		info.Release = Release(bi.Main.Version)
	}
	return info
}

// String is the release followed by the Go version and, when known, the
// commit and its time: "1.4.0 (go1.27.3, revision 7d6bd45b7ac5 of
// 2026-12-05T13:44:41Z)".
func (i Info) String() string {
	parts := []string{i.Go}
	if i.Revision != "" {
		rev := "revision " + i.Revision
		if i.Time != "" {
			rev += " of " + i.Time
		}
		parts = append(parts, rev)
	}
	return fmt.Sprintf("%s (%s)", i.Release, strings.Join(parts, ", "))
}

// String is Read(release).String(), for --version.
func String(release string) string { return Read(release).String() }

// pseudo is a Go pseudo-version: its base (vX.0.0 before "-", or
// vX.Y.Z-pre.0 or vX.Y.(Z+1)-0 before "."), the commit's time and hash.
var pseudo = regexp.MustCompile(`^(.*?)([.-])(\d{14})-([0-9a-f]{12})$`)

// Release turns a Go module version into a release that is a valid
// Debian version and sorts as the module's versions do: v1.4.0 is 1.4.0;
// a pre-release v1.4.0-rc.1 is 1.4.0~rc.1 (before 1.4.0). A pseudo-version
// (a commit with no tag, or past one) names the commit's time and short
// hash: with no tag (v0.0.0-20261205134441-7d6bd45b7ac5) or past a
// release (v1.4.1-0.20261205134441-7d6bd45b7ac5), before the version it
// leads to (0.0.0~git20261205134441.7d6bd45, 1.4.1~git...); past a
// pre-release (v1.4.0-rc.1.0.2026...), after it (1.4.0~rc.1.git...).
// "+dirty" stays. No version, or "(devel)", is "dev".
func Release(module string) string {
	v, dirty := strings.CutSuffix(module, "+dirty")
	if v == "" || v == "(devel)" || !strings.HasPrefix(v, "v") {
		return "dev"
	}
	v = strings.TrimPrefix(v, "v")
	out := debianBase(v)
	if m := pseudo.FindStringSubmatch(v); m != nil {
		commit := "git" + m[3] + "." + m[4][:7]
		switch base := m[1]; {
		case m[2] == "-": // vX.0.0-TIME-HASH: no tag before
			out = debianBase(base) + "~" + commit
		case strings.HasSuffix(base, "-0"): // past vX.Y.Z
			out = debianBase(strings.TrimSuffix(base, "-0")) + "~" + commit
		default: // vX.Y.Z-pre.0: past that pre-release
			out = debianBase(strings.TrimSuffix(base, ".0")) + "." + commit
		}
	}
	if dirty {
		out += "+dirty"
	}
	return out
}

// debianBase is a semantic version as Debian writes it: the pre-release
// after ~ (sorting before the release), the build metadata after +.
func debianBase(v string) string {
	v, build, hasBuild := strings.Cut(v, "+")
	v = strings.Replace(v, "-", "~", 1)
	v = strings.ReplaceAll(v, "-", ".")
	if hasBuild {
		v += "+" + strings.ReplaceAll(build, "-", ".")
	}
	return v
}
