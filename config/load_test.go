package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadText writes text to cluster.yaml in a temp dir and loads it; it
// returns the file's path too.
func loadText(t *testing.T, text string) (*Config, string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	return c, path, err
}

// TestConfigNamesEveryProblemOnItsOwnLine: a file with several problems
// of every kind (a slip in a key, a key that exists nowhere, values that
// do not parse, a field missing, a rule broken) is refused with one line
// per problem, in the file's order, each naming the file, the line and
// the field, and saying what would be right. A value that does not parse
// does not hide the problems after it.
func TestConfigNamesEveryProblemOnItsOwnLine(t *testing.T) {
	text := `nodes:
  - name: alpha
    control: "127.0.0.1:7800"
    replicaton: "127.0.0.1:7801"
    nbd: "127.0.0.1:7802"
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804"}
volumes:
  - name: vol0
    size: lots
    protocol: Z
    primary: alpha
    peer_timeout: forever
    al_extents: many
    disks: {alpha: /dev/sdb, beta: /dev/sdc}
colour: blue
`
	_, path, err := loadText(t, text)
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T), want a *ConfigError", err, err)
	}
	want := []string{
		path + `:4: nodes[0].replicaton: unknown key; did you mean "replication"?`,
		path + `:6: nodes[1].nbd: missing: give HOST:PORT`,
		path + `:9: volumes[0].size: size "lots": want a number of bytes with an optional unit`,
		path + `:10: volumes[0].protocol: "Z": want A, B or C`,
		path + `:12: volumes[0].peer_timeout: "forever": want a duration such as 5s, 500ms or 7d`,
		path + `:13: volumes[0].al_extents: "many": want a whole number`,
		path + `:15: colour: unknown key; valid keys here: failover, nodes, tls, volumes`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) || len(ce.Problems) != len(want) {
		t.Fatalf("%d lines, %d problems, want %d:\n%s", len(lines), len(ce.Problems), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d:\n got %s\nwant %s...", i+1, lines[i], w)
		}
	}
}

// TestConfigUnknownKeySuggestsTheNearest: an unknown key is named by its
// path with the valid key of that place nearest to it (a typo, a swap,
// a hyphen for an underscore, a capital), or, when none is near, with
// every valid key there. The key meant is not reported missing as well.
func TestConfigUnknownKeySuggestsTheNearest(t *testing.T) {
	for name, tc := range map[string]struct{ from, to, want string }{
		"a letter left out in a node": {`replication: "127.0.0.1:7801"`, `replicaton: "127.0.0.1:7801"`,
			`:2: nodes[0].replicaton: unknown key; did you mean "replication"?`},
		"two letters swapped": {"protocol: C", "protcool: C", `:7: volumes[0].protcool: unknown key; did you mean "protocol"?`},
		"a hyphen":            {"protocol: C", "protocol: C\n    on-congestion: block", `:8: volumes[0].on-congestion: unknown key; did you mean "on_congestion"?`},
		"a capital":           {"size: 1GiB", "Size: 1GiB", `:6: volumes[0].Size: unknown key; did you mean "size"?`},
		"in a multipath disk": {"beta: /dev/sdc", "beta: {pahts: [{path: /dev/sdc}]}", `:9: volumes[0].disks.beta.pahts: unknown key; did you mean "paths"?`},
		"in a path":           {"beta: /dev/sdc", "beta: {paths: [{path: /dev/sdc, grup: a}]}", `:9: volumes[0].disks.beta.paths[0].grup: unknown key; did you mean "group"?`},
		"nothing near":        {"protocol: C", "protocol: C\n    colour: blue", `:8: volumes[0].colour: unknown key; valid keys here: after_sb, al_extents, bad_blocks_max, checksums, csums, disks,`},
	} {
		t.Run(name, func(t *testing.T) {
			text := strings.Replace(goodConfig, tc.from, tc.to, 1)
			if text == goodConfig {
				t.Fatal("case does not change the config")
			}
			_, path, err := loadText(t, text[1:]) // goodConfig starts with a newline
			if err == nil {
				t.Fatal("loaded")
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], path+tc.want) {
				t.Fatalf("error\n%s\nwant one line starting %s%s", err, path, tc.want)
			}
		})
	}
}

// TestConfigShapeProblems: values of the wrong shape, keys given twice
// and a disk with both path and paths are each one line, and do not stop
// the rest of the file from being checked.
func TestConfigShapeProblems(t *testing.T) {
	text := `nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802"}
  - just-a-name
volumes:
  - name: vol0
    name: vol1
    size: [1GiB]
    primary: alpha
    csums: maybe
    disks: {alpha: {path: /dev/sdb, paths: [{path: /dev/sdc}]}, beta: [1, 2]}
`
	_, path, err := loadText(t, text)
	if err == nil {
		t.Fatal("loaded")
	}
	want := []string{
		path + `:3: nodes[1]: want a mapping (key: value lines), not "just-a-name"`,
		path + `:6: volumes[0].name: given twice (first at line 5): keep one`,
		path + `:7: volumes[0].size: want a size such as 1GiB, not a list`,
		path + `:9: volumes[0].csums: "maybe": want true or false`,
		path + `:10: volumes[0].disks.alpha: give either path (one device) or paths (several paths to one LUN), not both`,
		path + `:10: volumes[0].disks.beta: want a device path, or a mapping with path or paths`,
	}
	if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("error:\n%s\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}

// TestConfigSyntaxError: text that is not YAML is one line naming the
// file, with yaml's own words and line.
func TestConfigSyntaxError(t *testing.T) {
	_, path, err := loadText(t, "nodes: [\n  a: b\n")
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.HasPrefix(err.Error(), path+": yaml: line 2:") {
		t.Fatalf("error %q, want one line naming %s and line 2", err, path)
	}
}

// TestVolumeSizeUnits: a volume's size takes decimal units (1GB is 10^9
// bytes, rounded up to a whole 4 KiB block) and binary ones (1GiB, and a
// bare G, as in dd and DRBD), with fractions, and max; a byte count must
// be whole 4 KiB blocks already.
func TestVolumeSizeUnits(t *testing.T) {
	for _, tc := range []struct {
		size string
		want VolumeSize
	}{
		{"1GB", 1_000_001_536}, // 10^9 = 244140.625 blocks: rounded up
		{"1TB", 1_000_000_000_000},
		{"500MB", 500_002_816},
		{"1GiB", 1 << 30},
		{"1G", 1 << 30},
		{"512M", 512 << 20},
		{"512MiB", 512 << 20},
		{"1.5GiB", 3 << 29},
		{"1073741824", 1 << 30},
		{"max", SizeMax},
		{"MAX", SizeMax},
	} {
		c, _, err := loadText(t, strings.Replace(goodConfig, "size: 1GiB", "size: "+tc.size, 1))
		if err != nil {
			t.Errorf("size: %s: %v", tc.size, err)
			continue
		}
		if got := c.Volumes[0].Size; got != tc.want {
			t.Errorf("size: %s = %d bytes, want %d", tc.size, got, tc.want)
		}
	}
	for size, want := range map[string]string{
		"1000":   "volumes[0].size: 1000 is not a multiple of 4096",
		"3K":     "volumes[0].size: 3072 is not a multiple of 4096",
		"1.1MiB": `volumes[0].size: size "1.1MiB" is not a whole number of bytes`,
		"1GBB":   `volumes[0].size: size "1GBB": want a number of bytes with an optional unit, such as 1GB, 1.5GiB, 512MiB or 4096`,
		// max is a volume's size only.
		"1GiB\n    send_buffer: max": `volumes[0].send_buffer: size "max": want a number of bytes`,
	} {
		if _, _, err := loadText(t, strings.Replace(goodConfig, "size: 1GiB", "size: "+size, 1)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("size: %s: error %v, want it to say %q", size, err, want)
		}
	}
}

// TestConfigLoadsTheTLSSection: a file with a tls: section loads, its
// fields read, and a slip in one of its keys is named like any other.
func TestConfigLoadsTheTLSSection(t *testing.T) {
	text := `tls:
  ca: /etc/replvol/tls/ca.crt
  cert: /etc/replvol/tls/{node}.crt
  key: /etc/replvol/tls/{node}.key
  nbd: optional
nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802"}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805"}
volumes:
  - {name: vol0, size: 1GiB, primary: alpha, disks: {alpha: /dev/sdb, beta: /dev/sdc}}
`
	c, _, err := loadText(t, text)
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS == nil || c.TLS.CertFor("beta") != "/etc/replvol/tls/beta.crt" || c.TLS.NBDPolicy() != NBDTLSOptional {
		t.Fatalf("tls: %+v", c.TLS)
	}
	_, path, err := loadText(t, strings.Replace(text, "  nbd: optional", "  gossip_kye: /k", 1))
	if err == nil || !strings.Contains(err.Error(), path+`:5: tls.gossip_kye: unknown key; did you mean "gossip_key"?`) {
		t.Fatalf("a slip in tls: %v", err)
	}
}
