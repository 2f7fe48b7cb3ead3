package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadBlocksMax: bad_blocks_max is 64 unless set, takes 0 (detach at
// the first block that cannot be rewritten) up to 256, and refuses the
// rest naming the field and the range.
func TestBadBlocksMax(t *testing.T) {
	for _, c := range []struct {
		line string
		want int
	}{{"", DefaultBadBlocksMax}, {"\n    bad_blocks_max: 0", 0}, {"\n    bad_blocks_max: 10", 10}, {"\n    bad_blocks_max: 256", 256}} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(goodConfig, "protocol: C", "protocol: C"+c.line, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if got := cfg.Volumes[0].BadBlocksMaxOrDefault(); got != c.want {
			t.Fatalf("%q: bad_blocks_max %d, want %d", c.line, got, c.want)
		}
	}
	for _, c := range []struct{ value, want string }{
		{"-1", "volumes[0].bad_blocks_max: -1: want 0..256"},
		{"257", "volumes[0].bad_blocks_max: 257: want 0..256"},
		{"many", `volumes[0].bad_blocks_max: "many"`},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(goodConfig, "protocol: C", "protocol: C\n    bad_blocks_max: "+c.value, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("bad_blocks_max %s: %v, want %q", c.value, err, c.want)
		}
	}
}
