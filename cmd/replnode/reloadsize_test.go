package main

import (
	"slices"
	"strings"
	"testing"
)

// TestTakeSizes: a SIGHUP never restarts for a volume's size, which a
// restart would not apply either (a node runs at the size it recorded):
// the file's size of a volume this node holds is either the size it runs
// at (grown online: taken as it is) or not (the operator is told to run
// replctl resize); other changes stay.
func TestTakeSizes(t *testing.T) {
	grown := strings.Replace(baseConfig, "size: 64MiB\n    protocol: C\n    primary: alpha", "size: 256MiB\n    protocol: C\n    primary: alpha", 1)
	grown = strings.Replace(grown, `control: "127.0.0.1:7803"`, `control: "127.0.0.1:7903"`, 1)
	_, restart := planReload(loadConfig(t, baseConfig), loadConfig(t, grown), "alpha")
	for _, tc := range []struct {
		name      string
		runs      map[string]int64
		wantNotes []sizeNote
		matches   bool
	}{
		{"the node runs vol0 at the file's new size (grown online)", map[string]int64{"vol0": 256 << 20, "vol1": 64 << 20}, []sizeNote{{"vol0", 256 << 20, 256 << 20}}, true},
		{"the node runs vol0 at the old size", map[string]int64{"vol0": 64 << 20}, []sizeNote{{"vol0", 256 << 20, 64 << 20}}, false},
		{"the node holds no vol0", map[string]int64{"vol1": 64 << 20}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept, notes := takeSizes(restart, loadConfig(t, grown), tc.runs)
			var fields []string
			for _, c := range kept {
				fields = append(fields, c.field)
			}
			if want := []string{"nodes[beta].control"}; !slices.Equal(fields, want) {
				t.Errorf("kept %q, want %q", fields, want)
			}
			if !slices.Equal(notes, tc.wantNotes) {
				t.Fatalf("notes %+v, want %+v", notes, tc.wantNotes)
			}
			if len(notes) > 0 && notes[0].matches() != tc.matches {
				t.Fatalf("%+v matches: %v, want %v", notes[0], notes[0].matches(), tc.matches)
			}
		})
	}
}
