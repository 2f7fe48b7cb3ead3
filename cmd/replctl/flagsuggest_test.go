package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestAMistypedFlagGetsTheFlagMeant: `replctl status --wtach` said only
// "unknown flag: --wtach". Every flag of every command, typed with two
// letters swapped, is a usage error that names it ("did you mean
// --watch?"); a flag nothing resembles gets no suggestion.
func TestAMistypedFlagGetsTheFlagMeant(t *testing.T) {
	code, _, errOut := runReplctl(t, "status", "--wtach")
	if code != exitUsage || !strings.Contains(errOut, "unknown flag: --wtach (did you mean --watch?)") {
		t.Fatalf("replctl status --wtach: exit %d, %q", code, errOut)
	}
	code, _, errOut = runReplctl(t, "status", "--bogus")
	if code != exitUsage || strings.Contains(errOut, "did you mean") {
		t.Fatalf("replctl status --bogus: exit %d, %q: want no suggestion", code, errOut)
	}

	var walk func(path []string, c *cobra.Command)
	checked := 0
	walk = func(path []string, c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(append(append([]string(nil), path...), sub.Name()), sub)
		}
		if c.DisableFlagParsing || c.Hidden {
			return
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			typo := swapped(f.Name)
			if f.Hidden || typo == "" {
				return
			}
			args := append(append([]string(nil), path...), "--"+typo)
			code, _, errOut := runReplctl(t, args...)
			if code != exitUsage || !strings.Contains(errOut, "did you mean") || !strings.Contains(errOut, "--"+f.Name) {
				t.Errorf("replctl %s: exit %d, %q; want a usage error suggesting --%s", strings.Join(args, " "), code, errOut, f.Name)
			}
			checked++
		})
	}
	root := newRoot()
	root.InitDefaultHelpFlag()
	walk(nil, root)
	t.Logf("%d flags of every command, each mistyped, got the flag meant", checked)
	if checked < 50 {
		t.Fatalf("checked %d flags: the walk missed the commands", checked)
	}
}

// swapped is name with two neighbouring letters that differ swapped
// ("" when it has none).
func swapped(name string) string {
	b := []byte(name)
	for i := len(b) / 2; i+1 < len(b); i++ {
		if b[i] != b[i+1] && b[i] != '-' && b[i+1] != '-' {
			b[i], b[i+1] = b[i+1], b[i]
			return string(b)
		}
	}
	return ""
}
