package node

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/pki"
)

// withTLS gives c's config a tls: section from a fresh replctl certs init
// of its nodes, and returns the directory of the files.
func withTLS(t testing.TB, c *testCluster) string {
	t.Helper()
	dir := t.TempDir()
	var hs []pki.Holder
	for _, n := range c.cfg.Nodes {
		hs = append(hs, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: n.Name}, Hosts: []string{"127.0.0.1"}})
	}
	if _, err := pki.Init(dir, hs, false); err != nil {
		t.Fatal(err)
	}
	c.cfg.TLS = &TLSConfig{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "{node}.crt"), Key: filepath.Join(dir, "{node}.key"),
		GossipKey: filepath.Join(dir, "gossip.key")}
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestANodeStartsOnlyWithItsOwnCertificate: a node whose certificate file
// names another node, or whose files are missing, does not start, and says
// which file and why.
func TestANodeStartsOnlyWithItsOwnCertificate(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	dir := withTLS(t, c)
	c.cfg.TLS.Cert, c.cfg.TLS.Key = filepath.Join(dir, "beta.crt"), filepath.Join(dir, "beta.key")
	if _, err := New(c.cfg, "alpha", Options{}); err == nil || !strings.Contains(err.Error(), "names node beta, not node alpha") {
		t.Fatalf("alpha started with beta's certificate: %v", err)
	}
	c.cfg.TLS.Cert, c.cfg.TLS.Key = filepath.Join(dir, "nope-{node}.crt"), filepath.Join(dir, "{node}.key")
	if _, err := New(c.cfg, "alpha", Options{}); err == nil || !strings.Contains(err.Error(), "nope-alpha.crt") {
		t.Fatalf("alpha started without its certificate file: %v", err)
	}
}

// TestTLSConfigProblemsAreNamed: the tls: section's mistakes each get a
// line naming the field.
func TestTLSConfigProblemsAreNamed(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.cfg.Nodes[0].Raft, c.cfg.Nodes[0].Gossip = "127.0.0.1:1", "127.0.0.1:2"
	c.cfg.TLS = &TLSConfig{CA: "/ca.crt", Cert: "/same.crt", NBD: "maybe"}
	err := c.cfg.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"tls.key: missing", "tls.cert: \"/same.crt\" names one file for every node", "tls.nbd: \"maybe\"", "tls.gossip_key: missing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in:\n%v", want, err)
		}
	}
}
