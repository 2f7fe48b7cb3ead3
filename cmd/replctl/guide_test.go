package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The production guide (docs/production.md) names only replctl commands
// and flags that exist: every `replctl SUBCOMMAND ... --flag` it shows
// resolves in replctl's command tree with that flag.
func TestTheProductionGuideNamesRealCommands(t *testing.T) {
	raw, err := os.ReadFile("../../docs/production.md")
	if err != nil {
		t.Fatal(err)
	}
	// A replctl command line, up to the end of the code span or line.
	re := regexp.MustCompile("replctl((?: [^`\\n]+)+)")
	root := newRoot()
	checked := 0
	for _, m := range re.FindAllStringSubmatch(string(raw), -1) {
		words := strings.Fields(m[1])
		if len(words) == 0 || strings.HasPrefix(words[0], "-") && words[0] != "--addr" && words[0] != "--tls-dir" {
			continue
		}
		// Global flags with a value come first in some examples.
		for len(words) >= 2 && (words[0] == "--addr" || words[0] == "--tls-dir") {
			words = words[2:]
		}
		if len(words) == 0 || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(words[0]) {
			continue
		}
		cmd, rest, err := root.Find(words)
		if err != nil || cmd == root {
			t.Errorf("docs/production.md: %q is no replctl command", "replctl"+m[1])
			continue
		}
		if cmd.HasSubCommands() && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			t.Errorf("docs/production.md: %s has no subcommand %s (in %q)", cmd.CommandPath(), rest[0], "replctl"+m[1])
			continue
		}
		checked++
		for _, w := range rest {
			if !strings.HasPrefix(w, "--") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
			if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
				t.Errorf("docs/production.md: %s has no flag --%s (in %q)", cmd.CommandPath(), name, "replctl"+m[1])
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked only %d replctl commands in docs/production.md: the pattern misses them", checked)
	}
}
