package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEachManPageIsTitledByItsCommand: `man replctl-mount` showed the
// header REPLCTL(1). Every page replctl man writes is titled by its own
// command (REPLCTL-MOUNT for replctl mount), in section 1.
func TestEachManPageIsTitledByItsCommand(t *testing.T) {
	dir := t.TempDir()
	if code, _, errOut := runReplctl(t, "man", "--dir", dir); code != 0 {
		t.Fatalf("replctl man: exit %d: %s", code, errOut)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	if len(pages) < 10 {
		t.Fatalf("replctl man wrote %d pages: %v", len(pages), pages)
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		var th string
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, ".TH ") {
				th = line
				break
			}
		}
		fields := strings.Fields(strings.ReplaceAll(th, `"`, " "))
		want := strings.ToUpper(strings.TrimSuffix(filepath.Base(page), ".1"))
		if len(fields) < 3 || strings.ReplaceAll(fields[1], `\-`, "-") != want || fields[2] != "1" {
			t.Errorf("%s: header %q, want it titled %s(1)", filepath.Base(page), th, want)
		}
	}
}
