package node

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
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
// names another node, whose files are missing or unreadable, whose key is
// not its certificate's, or whose CA file holds no certificate, does not
// start, and says which file and why.
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
	c.cfg.TLS.Cert, c.cfg.TLS.Key = filepath.Join(dir, "alpha.crt"), filepath.Join(dir, "beta.key")
	if _, err := New(c.cfg, "alpha", Options{}); err == nil || !strings.Contains(err.Error(), "alpha.crt with key") || !strings.Contains(err.Error(), "beta.key") {
		t.Fatalf("alpha started with beta's key: %v", err)
	}
	c.cfg.TLS.Key = filepath.Join(dir, "{node}.key")
	if err := os.WriteFile(filepath.Join(dir, "empty-ca.crt"), []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.cfg.TLS.CA = filepath.Join(dir, "empty-ca.crt")
	if _, err := New(c.cfg, "alpha", Options{}); err == nil || !strings.Contains(err.Error(), "empty-ca.crt: no PEM certificate in it") {
		t.Fatalf("alpha started with a CA file that holds no certificate: %v", err)
	}
	c.cfg.TLS.CA = filepath.Join(dir, "ca.crt")
	// A key that cannot be read (a directory in its place: root reads any
	// file whatever its mode).
	if err := os.Mkdir(filepath.Join(dir, "dir.key"), 0o700); err != nil {
		t.Fatal(err)
	}
	c.cfg.TLS.Key = filepath.Join(dir, "dir.key")
	if _, err := New(c.cfg, "alpha", Options{}); err == nil || !strings.Contains(err.Error(), "dir.key") {
		t.Fatalf("alpha started with an unreadable key: %v", err)
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

// TestATLSClusterServesNBDOverTLSOnly: with tls: (nbd defaults to required) the primary serves
// its export to a client with the cluster's NBD client certificate (or the operator's) after
// NBD_OPT_STARTTLS, and refuses a plaintext client with NBD_REP_ERR_TLS_REQD saying how to
// connect, and a node's certificate; status, and a secondary's refusal, name the export
// nbds://. With nbd: optional plaintext is served too, and the URI stays nbd://.
func TestATLSClusterServesNBDOverTLSOnly(t *testing.T) {
	for _, policy := range []string{"", NBDTLSOptional} {
		t.Run("nbd: "+cmp.Or(policy, "(default)"), func(t *testing.T) {
			c := newTestCluster(t, 4<<20)
			dir := withTLS(t, c)
			c.cfg.TLS.NBD = policy
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			addr := c.nodes["alpha"].NBDAddr()
			scheme := "nbds"
			if policy == NBDTLSOptional {
				scheme = "nbd"
			}
			if got, want := c.status().Volumes[0].NBDURI, scheme+"://"+addr+"/vol0"; got != want {
				t.Errorf("status names the export %q, want %q", got, want)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			nbdClient := nbdClientTLS(t, filepath.Join(dir, pki.NBDClientDir, "ca-cert.pem"),
				filepath.Join(dir, pki.NBDClientDir, "client-cert.pem"), filepath.Join(dir, pki.NBDClientDir, "client-key.pem"))
			cl, err := nbdtest.DialTLS(ctx, addr, "vol0", nbdClient)
			if err != nil {
				t.Fatalf("NBD over TLS with the nbd-client certificate: %v", err)
			}
			defer cl.Close()
			if err := cl.Write(4096, bytes.Repeat([]byte{0x5a}, 4096), nbdtest.CmdFlagFUA); err != nil {
				t.Fatal(err)
			}
			if got, err := cl.Read(4096, 4096); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 4096)) {
				t.Fatalf("read back over TLS: %v", err)
			}
			operator := nbdClientTLS(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "operator.crt"), filepath.Join(dir, "operator.key"))
			if cl, err := nbdtest.DialTLS(ctx, addr, "vol0", operator); err != nil {
				t.Errorf("NBD over TLS with the operator's certificate: %v", err)
			} else {
				cl.Close()
			}
			node := nbdClientTLS(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "beta.crt"), filepath.Join(dir, "beta.key"))
			if cl, err := nbdtest.DialTLS(ctx, addr, "vol0", node); err == nil {
				cl.Close()
				t.Error("a node's certificate was let in as an NBD client")
			}

			// A secondary points at the primary's export, with the same scheme.
			_, err = nbdtest.DialTLS(ctx, c.nodes["beta"].NBDAddr(), "vol0", nbdClient)
			var oe *nbdtest.OptionError
			if !errors.As(err, &oe) || oe.Type != nbdtest.RepErrUnknown || !strings.Contains(oe.Message, "the primary is alpha at "+scheme+"://"+addr+"/vol0") {
				t.Errorf("GO on the secondary: %v", err)
			}

			plain, err := nbdtest.Dial(ctx, addr, "vol0")
			if policy == NBDTLSOptional {
				if err != nil {
					t.Fatalf("plaintext client with nbd: optional: %v", err)
				}
				plain.Close()
				return
			}
			if err == nil {
				plain.Close()
				t.Fatal("a plaintext client was served with nbd: required")
			}
			want := "connect with TLS, e.g. nbds://" + addr + "/vol0?tls-certificates=DIR/nbd-client"
			if !errors.As(err, &oe) || oe.Type != nbdtest.RepErrTLSReqd || !strings.Contains(oe.Message, want) {
				t.Fatalf("plaintext client: %v, want NBD_REP_ERR_TLS_REQD saying %q", err, want)
			}
			// The server counts a failed handshake once its side of it
			// returned, which may be after the client saw the alert.
			counted := func() bool {
				st := c.nodes["alpha"].nbd.Stats()
				return st.TLSRequiredRefusals == 1 && st.TLSHandshakeFailures == 1
			}
			if !within(5*time.Second, 10*time.Millisecond, counted) {
				st := c.nodes["alpha"].nbd.Stats()
				t.Errorf("%d TLS-required refusals, %d TLS handshake failures; want 1 and 1", st.TLSRequiredRefusals, st.TLSHandshakeFailures)
			}
		})
	}
}

// nbdClientTLS is what an NBD client holding these files presents, trusting nodes of the CA.
func nbdClientTLS(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(ca)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA %s: %v", ca, err)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}}
}
