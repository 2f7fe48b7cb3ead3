package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigDuplicatesAreNamed: a node name, a volume name or an address
// used twice (a port of one node's raft that another's gossip has too) is
// a line of its own naming both places; the file does not load.
func TestConfigDuplicatesAreNamed(t *testing.T) {
	edit := func(pairs ...string) string {
		text := goodConfig
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(text, pairs[i]) {
				t.Fatalf("no %q in the config", pairs[i])
			}
			text = strings.Replace(text, pairs[i], pairs[i+1], 1)
		}
		return text
	}
	for _, tc := range []struct{ name, text, want string }{
		{"a node name twice", edit("name: beta", "name: alpha"), `nodes[1].name: "alpha" is used by two nodes`},
		{"a volume name twice", edit("    disks: {alpha: /dev/sdb, beta: /dev/sdc}\n",
			"    disks: {alpha: /dev/sdb, beta: /dev/sdc}\n  - {name: vol0, size: 1GiB, primary: alpha, disks: {alpha: /dev/sdd, beta: /dev/sde}}\n"),
			`volumes[1].name: "vol0" is used by two volumes`},
		{"an NBD port that is another node's control port", edit(`nbd: "127.0.0.1:7805"`, `nbd: "127.0.0.1:7800"`),
			`nodes[1].nbd: "127.0.0.1:7800" is also used by nodes[0].control`},
		{"a gossip port that is another node's raft port", edit(
			`nbd: "127.0.0.1:7802"}`, `nbd: "127.0.0.1:7802", raft: "127.0.0.1:7806", gossip: "127.0.0.1:7807"}`,
			`nbd: "127.0.0.1:7805"}`, `nbd: "127.0.0.1:7805", raft: "127.0.0.1:7808", gossip: "127.0.0.1:7806"}`),
			`nodes[1].gossip: "127.0.0.1:7806" is also used by nodes[0].raft`},
	} {
		checkConfigError(t, tc.name, tc.text, tc.want)
	}
}

func checkConfigError(t *testing.T, name, text, want string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %v, want it to say %q", name, err, want)
	}
}
