package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// String is release followed by the Go version and, when the binary was
// built from a checkout, the commit it was built from:
// "1.4.0 (go1.26.8, revision abc123456789)".
func String(release string) string {
	parts := []string{runtime.Version()}
	if rev := revision(); rev != "" {
		parts = append(parts, "revision "+rev)
	}
	return fmt.Sprintf("%s (%s)", release, strings.Join(parts, ", "))
}

// revision is the short commit the binary was built from, marked
// "+modified" when the checkout had uncommitted changes; empty when the
// build recorded none (go build -buildvcs=false, or not from a checkout).
func revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "+modified"
	}
	return rev
}
