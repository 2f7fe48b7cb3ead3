package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/pki"
)

// What a node checks on its own host joins the file's problems in one
// report, each with its line and what to do; and a witness, which listens
// on no NBD or replication address, is refused one.

// tlsCluster is a cluster file of two data nodes and a witness with a
// tls: section whose files are in DIR; it has one problem of its own (a
// protocol that does not exist), on line 11.
const tlsCluster = `nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802", raft: "127.0.0.1:7806", gossip: "127.0.0.1:7807"}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805", raft: "127.0.0.1:7808", gossip: "127.0.0.1:7809"}
  - {name: wit, role: witness, control: "127.0.0.1:7810", raft: "127.0.0.1:7811", gossip: "127.0.0.1:7812"}
tls:
  ca: DIR/ca.crt
  cert: DIR/{node}.crt
  key: DIR/{node}.key
  gossip_key: DIR/gossip.key
volumes:
  - {name: vol0, size: 1GiB, primary: alpha, protocol: Z, disks: {alpha: /dev/sdb, beta: /dev/sdc}}
`

// writeCluster writes text, DIR replaced by dir, as cluster.yaml in a
// temporary directory, and returns its path.
func writeCluster(t *testing.T, text, dir string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, "DIR", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// problemLines is err's lines: a *ConfigError's problems.
func problemLines(t *testing.T, err error) []string {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T), want a *ConfigError", err, err)
	}
	return strings.Split(err.Error(), "\n")
}

// requireLines fails unless got holds, in order, a line starting with
// each of want, and nothing else.
func requireLines(t *testing.T, got []string, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Fatalf("problem %d:\n%s\nwant it to start with\n%s\nall:\n%s", i+1, got[i], want[i], strings.Join(got, "\n"))
		}
	}
}

// TestLoadNodeConfigNamesMissingTLSFilesWithTheFilesOwnProblems: the CA
// certificate, the node's certificate and key and the gossip key missing
// are named in the same report as the file's own problem, each with its
// line, and say which command writes them (replnode said only "node
// alpha: tls: CA certificate: open ...", once every other problem was
// fixed). LoadConfig, which any host runs (replctl certs init writes the
// files), does not look at them.
func TestLoadNodeConfigNamesMissingTLSFilesWithTheFilesOwnProblems(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	path := writeCluster(t, tlsCluster, dir)
	_, err := LoadNodeConfig(path, "alpha")
	init := "run replctl certs init --config " + path + " --dir " + dir + " on one host"
	requireLines(t, problemLines(t, err), []string{
		path + ":6: tls.ca: the CA certificate " + dir + "/ca.crt: no such file: " + init,
		path + ":7: tls.cert: alpha's certificate " + dir + "/alpha.crt: no such file: " + init,
		path + ":8: tls.key: alpha's key " + dir + "/alpha.key: no such file: " + init,
		path + ":9: tls.gossip_key: the gossip key " + dir + "/gossip.key: no such file: " + init,
		path + `:11: volumes[0].protocol: "Z": want A, B or C`,
	})
	_, err = LoadConfig(path)
	requireLines(t, problemLines(t, err), []string{path + `:11: volumes[0].protocol: "Z": want A, B or C`})

	// With the files written, the file's own problem is all there is.
	holders := []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}, {Identity: pki.Identity{Role: pki.RoleNode, Name: "beta"}, Hosts: []string{"127.0.0.1"}}}
	if _, err := pki.Init(dir, holders, false); err != nil {
		t.Fatal(err)
	}
	_, err = LoadNodeConfig(path, "alpha")
	requireLines(t, problemLines(t, err), []string{path + `:11: volumes[0].protocol: "Z": want A, B or C`})
	good := writeCluster(t, strings.Replace(tlsCluster, "protocol: Z", "protocol: C", 1), dir)
	if _, err := LoadNodeConfig(good, "alpha"); err != nil {
		t.Fatalf("a good file with every file in place: %v", err)
	}
	_, err = LoadNodeConfig(good, "gamma")
	requireLines(t, problemLines(t, err), []string{good + `:1: nodes: no node "gamma" (--node): the nodes are alpha, beta, wit`})
}

// TestLoadNodeConfigRefusesTLSFilesThatHoldTheWrongThing: a CA file that
// is no certificate, a certificate of another node, and a gossip key of
// the wrong length are each named at their line.
func TestLoadNodeConfigRefusesTLSFilesThatHoldTheWrongThing(t *testing.T) {
	dir := t.TempDir()
	holders := []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}, {Identity: pki.Identity{Role: pki.RoleNode, Name: "beta"}, Hosts: []string{"127.0.0.1"}}}
	if _, err := pki.Init(dir, holders, false); err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(tlsCluster, "protocol: Z", "protocol: C", 1)
	// alpha's certificate and key are beta's.
	for _, ext := range []string{".crt", ".key"} {
		b, err := os.ReadFile(filepath.Join(dir, "beta"+ext))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "alpha"+ext), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.key"), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeCluster(t, text, dir)
	_, err := LoadNodeConfig(path, "alpha")
	requireLines(t, problemLines(t, err), []string{
		path + ":7: tls.cert: " + dir + "/alpha.crt names node beta, not node alpha: give this node its own certificate",
		path + ":9: tls.gossip_key: gossip key " + dir + "/gossip.key: 5 bytes; want 32",
	})

	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadNodeConfig(path, "alpha")
	requireLines(t, problemLines(t, err), []string{
		path + ":6: tls.ca: the CA certificate " + dir + "/ca.crt holds no PEM certificate",
		path + ":9: tls.gossip_key: gossip key",
	})
}

// TestAWitnessListensOnNoNBDOrReplicationAddress: a witness holds no disk,
// so an nbd: or replication: address on it would look served and is not:
// each is refused at its line, saying what to do (it was accepted
// without comment).
func TestAWitnessListensOnNoNBDOrReplicationAddress(t *testing.T) {
	text := strings.Replace(clusterConfig, `{name: wit, role: witness, control: "127.0.0.1:7810",`, `{name: wit, role: witness, control: "127.0.0.1:7810", nbd: "127.0.0.1:7813", replication: "127.0.0.1:7814",`, 1)
	if text == clusterConfig {
		t.Fatal("the case does not change the config")
	}
	path := writeCluster(t, text, "")
	_, err := LoadConfig(path)
	requireLines(t, problemLines(t, err), []string{
		path + `:5: nodes[2].replication: "127.0.0.1:7814": a witness holds no disk and replicates nothing, so it listens on no replication address: remove this line, or make wit a data node`,
		path + `:5: nodes[2].nbd: "127.0.0.1:7813": a witness holds no disk and serves no NBD, so it listens on no nbd address: remove this line, or make wit a data node`,
	})
}
