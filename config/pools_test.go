package config

import (
	"errors"
	"strings"
	"testing"
)

// poolsConfig is a cluster of two data nodes and a witness whose data
// nodes offer storage pools and whose file lists no volume: every volume
// is created at run time.
const poolsConfig = `
nodes:
  - name: alpha
    control: "127.0.0.1:7800"
    replication: "127.0.0.1:7801"
    nbd: "127.0.0.1:7802"
    pools:
      - {name: default, dir: /var/lib/replvol/pool}
      - {name: fast, lvm_vg: vg0}
  - name: beta
    control: "127.0.0.1:7803"
    replication: "127.0.0.1:7804"
    nbd: "127.0.0.1:7805"
    pools: [{name: default, dir: /srv/pool}]
`

// TestPoolsAreParsedAndAVolumeListIsNotNeeded: a node's pools are read
// from its entry, and a file whose nodes have pools needs no volume.
func TestPoolsAreParsedAndAVolumeListIsNotNeeded(t *testing.T) {
	c, err := Parse("c.yaml", []byte(poolsConfig))
	if err != nil {
		t.Fatal(err)
	}
	alpha, _ := c.Node("alpha")
	if p, ok := alpha.Pool("default"); !ok || p.Dir != "/var/lib/replvol/pool" {
		t.Fatalf("alpha's default pool: %+v %v", p, ok)
	}
	if p, ok := alpha.Pool("fast"); !ok || p.LVMVG != "vg0" || p.Dir != "" {
		t.Fatalf("alpha's fast pool: %+v %v", p, ok)
	}
	if _, ok := alpha.Pool("slow"); ok {
		t.Fatal("alpha has no pool slow")
	}
}

func TestBadPoolsAreRefusedNamingTheField(t *testing.T) {
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"two pools of one name", "{name: fast, lvm_vg: vg0}", "{name: default, lvm_vg: vg0}", `nodes[0].pools[1].name: "default" is used by two pools of alpha`},
		{"a relative directory", "dir: /srv/pool", "dir: srv/pool", `nodes[1].pools[0].dir: "srv/pool" is a relative path`},
		{"both dir and lvm_vg", "{name: fast, lvm_vg: vg0}", "{name: fast, lvm_vg: vg0, dir: /fast}", "nodes[0].pools[1]: give either dir"},
		{"neither dir nor lvm_vg", "{name: fast, lvm_vg: vg0}", "{name: fast}", "nodes[0].pools[1]: missing: give dir"},
		{"one directory for two pools", "{name: fast, lvm_vg: vg0}", "{name: fast, dir: /var/lib/replvol/pool/}", `nodes[0].pools[1].dir: "/var/lib/replvol/pool/" is also the directory of pool default`},
		{"a pool without a name", "{name: fast, lvm_vg: vg0}", "{lvm_vg: vg0}", "nodes[0].pools[1].name: missing"},
		{"a bad volume group", "lvm_vg: vg0", "lvm_vg: vg/0", `nodes[0].pools[1].lvm_vg: "vg/0" is not a volume group name`},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := strings.Replace(poolsConfig, c.from, c.to, 1)
			if text == poolsConfig {
				t.Fatal("the case changes nothing")
			}
			_, err := Parse("c.yaml", []byte(text))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a ConfigError", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got\n%v\nwant it to say %q", err, c.want)
			}
		})
	}
}

func TestAWitnessHasNoPools(t *testing.T) {
	text := poolsConfig + `    raft: "127.0.0.1:7806"
    gossip: "127.0.0.1:7807"
  - name: judge
    role: witness
    control: "127.0.0.1:7808"
    raft: "127.0.0.1:7809"
    gossip: "127.0.0.1:7810"
    pools: [{name: default, dir: /srv/pool}]
`
	text = strings.Replace(text, `    nbd: "127.0.0.1:7802"`, `    nbd: "127.0.0.1:7802"
    raft: "127.0.0.1:7811"
    gossip: "127.0.0.1:7812"`, 1)
	_, err := Parse("c.yaml", []byte(text))
	if err == nil || !strings.Contains(err.Error(), "nodes[2].pools: a witness holds no disks") {
		t.Fatalf("got %v", err)
	}
}

// TestNoPoolsAndNoVolumesIsRefused: a file must give the cluster
// something to serve: volumes, or pools to create them from.
func TestNoPoolsAndNoVolumesIsRefused(t *testing.T) {
	text := goodConfig[:strings.Index(goodConfig, "volumes:")]
	_, err := Parse("c.yaml", []byte(text))
	if err == nil || !strings.Contains(err.Error(), "volumes: missing: list at least one volume, or give the data nodes storage pools") {
		t.Fatalf("got %v", err)
	}
}
