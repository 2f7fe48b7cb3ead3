package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// The man page of replnode is written by hand (replnode has no cobra to
// generate it from): it must describe every flag, and no flag that is gone.
func TestTheManPageDescribesEveryFlag(t *testing.T) {
	page, err := os.ReadFile("../../deploy/man/replnode.8")
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	fs, _ := newFlags()
	flags := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		flags[f.Name] = true
		if !strings.Contains(text, ".BI \\-\\-"+strings.ReplaceAll(f.Name, "-", "\\-")) && !strings.Contains(text, ".B \\-\\-"+strings.ReplaceAll(f.Name, "-", "\\-")+"\n") {
			t.Errorf("deploy/man/replnode.8 has no entry (.B or .BI) for --%s", f.Name)
		}
	})
	// Every option entry under OPTIONS names a flag replnode has.
	options := text[strings.Index(text, ".SH OPTIONS"):strings.Index(text, ".SH SIGNALS")]
	lines := strings.Split(options, "\n")
	for i, line := range lines {
		if line != ".TP" || i+1 >= len(lines) {
			continue
		}
		entry := strings.Fields(strings.ReplaceAll(lines[i+1], "\\-", "-"))
		if len(entry) < 2 || !strings.HasPrefix(entry[1], "--") {
			t.Errorf("option entry %q names no flag", lines[i+1])
			continue
		}
		if name := strings.TrimPrefix(entry[1], "--"); !flags[name] {
			t.Errorf("deploy/man/replnode.8 describes --%s, which replnode does not have", name)
		}
	}
}
