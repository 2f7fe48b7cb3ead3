package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodConfig = `
nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802"}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805"}
volumes:
  - name: vol0
    size: 1GiB
    protocol: C
    primary: alpha
    disks: {alpha: /dev/sdb, beta: /dev/sdc}
`

func TestLoadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte(goodConfig), 0o644)
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Volumes[0].Size != 1<<30 || c.Volumes[0].Disks["beta"].Paths[0].Path != "/dev/sdc" {
		t.Fatalf("parsed %+v", c.Volumes[0])
	}
}

// TestChecksumsOnUnlessOff: checksums is on when unset (the metadata this
// version creates gets a checksum area) and for on, off only for off;
// YAML's on and off read as the words, not as booleans.
func TestChecksumsOnUnlessOff(t *testing.T) {
	for _, c := range []struct {
		line string
		want bool
	}{{"", true}, {"\n    checksums: on", true}, {"\n    checksums: off", false}, {"\n    checksums: \"off\"", false}} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(strings.Replace(goodConfig, "protocol: C", "protocol: C"+c.line, 1)), 0o644)
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if got := cfg.Volumes[0].ChecksumsOn(); got != c.want {
			t.Fatalf("%q: checksums on %v, want %v", c.line, got, c.want)
		}
	}
}

// TestScrubIntervalTakesDays: scrub_interval is off unless set, and takes
// days (7d, 1d12h) as well as Go's durations.
func TestScrubIntervalTakesDays(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
	}{{"", 0}, {"\n    scrub_interval: 7d", 7 * 24 * time.Hour}, {"\n    scrub_interval: 1d12h", 36 * time.Hour}, {"\n    scrub_interval: 24h", 24 * time.Hour}} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(strings.Replace(goodConfig, "protocol: C", "protocol: C"+c.line, 1)), 0o644)
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if got := time.Duration(cfg.Volumes[0].ScrubInterval); got != c.want {
			t.Fatalf("%q: scrub interval %v, want %v", c.line, got, c.want)
		}
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, from, to, want string
	}{
		{"missing nbd address", `, nbd: "127.0.0.1:7805"}`, `}`, "nodes[1].nbd: missing"},
		{"missing volume size", "    size: 1GiB\n", "", "volumes[0].size: missing"},
		{"size not a multiple of 4096", "size: 1GiB", "size: 1000", "volumes[0].size: 1000 is not a multiple of 4096"},
		{"bad size text", "size: 1GiB", "size: lots", "want a number of bytes"},
		{"unknown protocol", "protocol: C", "protocol: Z", `volumes[0].protocol: "Z"`},
		{"primary not a node", "primary: alpha", "primary: gamma", `volumes[0].primary: "gamma" is not a node`},
		{"disk of an unknown node", "beta: /dev/sdc", "delta: /dev/sdc", `volumes[0].disks.delta: "delta" is not a node`},
		{"duplicate address", `"127.0.0.1:7803"`, `"127.0.0.1:7800"`, `nodes[1].control: "127.0.0.1:7800" is also used by nodes[0].control`},
		{"not host:port", `"127.0.0.1:7804"`, `"nowhere"`, `nodes[1].replication: "nowhere" is not HOST:PORT`},
		{"unknown field", "protocol: C", "protocol: C\n    colour: blue", "volumes[0].colour: unknown key"},
		{"checksums neither on nor off", "protocol: C", "protocol: C\n    checksums: crc64", `volumes[0].checksums: "crc64": want on or off`},
		{"a negative scrub interval", "protocol: C", "protocol: C\n    scrub_interval: -1h", `volumes[0].scrub_interval: -1h0m0s: want an hour or more (e.g. 7d or 24h), or leave it out`},
		{"a scrub interval of a minute", "protocol: C", "protocol: C\n    scrub_interval: 1m", `volumes[0].scrub_interval: 1m0s: want an hour or more`},
		{"a scrub interval that is no duration", "protocol: C", "protocol: C\n    scrub_interval: abc", `volumes[0].scrub_interval: "abc": want a duration such as 5s, 500ms or 7d`},
		{"a scrub interval of part of a day", "protocol: C", "protocol: C\n    scrub_interval: 1.5d", `volumes[0].scrub_interval: "1.5d": want a duration such as 5s, 500ms or 7d`},
		{"no nodes", goodConfig[:strings.Index(goodConfig, "volumes:")], "nodes: []\n", "nodes: missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text := strings.Replace(goodConfig, c.from, c.to, 1)
			if text == goodConfig {
				t.Fatalf("case does not change the config")
			}
			path := filepath.Join(t.TempDir(), "c.yaml")
			os.WriteFile(path, []byte(text), 0o644)
			_, err := LoadConfig(path)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to say %q", err, c.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"4096", 4096},
		{"64MiB", 64 << 20},
		{"1GiB", 1 << 30},
		{"2G", 2 << 30},
		{"1TiB", 1 << 40},
		{"1.5GiB", 3 << 29},
		{"1.5G", 3 << 29},
		{"1.5gib", 3 << 29},
		{"0.25GiB", 256 << 20},
		{"256 MiB", 256 << 20},
		{"512B", 512},
		{"1PiB", 1 << 50},
		// Decimal units count in powers of 1000, as disk vendors do.
		{"1GB", 1_000_000_000},
		{"1gb", 1_000_000_000},
		{"1.5GB", 1_500_000_000},
		{"512MB", 512_000_000},
		{"4KB", 4000},
		{"2TB", 2_000_000_000_000},
		{"1PB", 1_000_000_000_000_000},
		// A bare M is a MiB, as in dd and DRBD.
		{"512M", 512 << 20},
		{"512MiB", 512 << 20},
		{"4k", 4096},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "-1", "GiB", "1.5", "1.3B", "0.1K", "-1GiB", "1e3", "1XiB", "1GiBB", "1KBB", "0.0001KB", "1.5.5G", "99999999PiB", "99999999999TiB"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, got)
		}
	}
}

func FuzzLoadConfig(f *testing.F) {
	f.Add(goodConfig)
	f.Add("nodes: [{name: a}]\n")
	f.Add("nodes: [{name: a, replicaton: x, nbd: [1]}]\nvolumes: [{size: max, disks: {a: {pahts: []}}}]\n")
	f.Add("a: &x [*x, *x]\nnodes: *x\n")
	f.Fuzz(func(t *testing.T, text string) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(text), 0o644)
		c, err := LoadConfig(path)
		if err == nil && c.Validate() != nil {
			t.Fatal("LoadConfig returned an invalid config")
		}
	})
}

func TestExampleConfigIsValid(t *testing.T) {
	if _, err := LoadConfig("../deploy/cluster.example.yaml"); err != nil {
		t.Fatal(err)
	}
}

const clusterConfig = `
nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802", raft: "127.0.0.1:7806", gossip: "127.0.0.1:7807"}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805", raft: "127.0.0.1:7808", gossip: "127.0.0.1:7809"}
  - {name: wit, role: witness, control: "127.0.0.1:7810", raft: "127.0.0.1:7811", gossip: "127.0.0.1:7812"}
volumes:
  - name: vol0
    size: 1GiB
    primary: alpha
    on_promote: "logger promoted"
    disks: {alpha: /dev/sdb, beta: /dev/sdc}
`

// TestClusterConfig: raft and gossip addresses on every node and a
// witness with neither disks nor data addresses make a cluster whose
// failover is automatic; two voters, or no raft at all, leave it off and
// say why (the word quorum for two voters).
func TestClusterConfig(t *testing.T) {
	load := func(text string) (*Config, error) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(text), 0o644)
		return LoadConfig(path)
	}
	c, err := load(clusterConfig)
	if err != nil {
		t.Fatal(err)
	}
	if auto, why := c.FailoverMode(); !c.Clustered() || !auto {
		t.Fatalf("2 data nodes + witness: clustered %v, failover auto %v (%s)", c.Clustered(), auto, why)
	}
	w, _ := c.Node("wit")
	if !w.IsWitness() || c.Volumes[0].OnPromote != "logger promoted" {
		t.Fatalf("witness %+v, on_promote %q", w, c.Volumes[0].OnPromote)
	}
	two := strings.Replace(clusterConfig, `  - {name: wit, role: witness, control: "127.0.0.1:7810", raft: "127.0.0.1:7811", gossip: "127.0.0.1:7812"}`+"\n", "", 1)
	c, err = load(two)
	if err != nil {
		t.Fatal(err)
	}
	if auto, why := c.FailoverMode(); auto || !strings.Contains(why, "quorum") {
		t.Fatalf("two voters: failover auto %v, reason %q (want off, naming the quorum)", auto, why)
	}
	c, err = load(goodConfig)
	if err != nil {
		t.Fatal(err)
	}
	if auto, _ := c.FailoverMode(); auto || c.Clustered() {
		t.Fatal("a file without raft/gossip addresses runs a cluster")
	}
	for name, tc := range map[string]struct{ from, to, want string }{
		"a witness with a disk":       {"beta: /dev/sdc", "beta: /dev/sdc, wit: /dev/sdd", `volumes[0].disks.wit: "wit" is a witness`},
		"raft on some nodes only":     {`, raft: "127.0.0.1:7808", gossip: "127.0.0.1:7809"`, "", "2 of 3 nodes have raft and gossip"},
		"raft without gossip":         {`, gossip: "127.0.0.1:7807"`, "", "nodes[0].raft: give raft and gossip together"},
		"an unknown role":             {"role: witness", "role: judge", `nodes[2].role: "judge"`},
		"an unknown failover setting": {"volumes:", "failover: sometimes\nvolumes:", `failover: "sometimes"`},
	} {
		t.Run(name, func(t *testing.T) {
			text := strings.Replace(clusterConfig, tc.from, tc.to, 1)
			if text == clusterConfig {
				t.Fatal("case does not change the config")
			}
			if _, err := load(text); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
}
