package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func initDir(t *testing.T, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	var hs []Holder
	for _, n := range nodes {
		hs = append(hs, Holder{Identity: Identity{Role: RoleNode, Name: n}, Hosts: []string{"127.0.0.1", n + ".example"}})
	}
	if _, err := Init(dir, hs, false); err != nil {
		t.Fatal(err)
	}
	return dir
}

func load(t *testing.T, dir, name string) *Bundle {
	t.Helper()
	b, err := Load(filepath.Join(dir, CAFile), filepath.Join(dir, CertFile(name)), filepath.Join(dir, KeyFile(name)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInitWritesTheLayoutAndRefusesToOverwrite pins replctl certs init's
// files: the CA, every node's and the operator's certificate and key, the
// gossip key, and the NBD client's files in libnbd's layout; keys 0600;
// each certificate names its holder and its node's hosts. A second run
// without force changes nothing.
func TestInitWritesTheLayoutAndRefusesToOverwrite(t *testing.T) {
	dir := initDir(t, "alpha", "beta", "witness")
	for _, f := range []string{"ca.crt", "ca.key", "alpha.crt", "alpha.key", "beta.crt", "beta.key", "witness.crt", "witness.key",
		"operator.crt", "operator.key", "gossip.key", "nbd-client/ca-cert.pem", "nbd-client/client-cert.pem", "nbd-client/client-key.pem"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".key") || strings.HasSuffix(f, "-key.pem") {
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
			}
		}
	}
	if key, err := LoadGossipKey(filepath.Join(dir, GossipFile)); err != nil || len(key) != 32 {
		t.Fatalf("gossip key: %d bytes, %v", len(key), err)
	}
	a := load(t, dir, "alpha")
	if a.Self != (Identity{RoleNode, "alpha"}) {
		t.Fatalf("alpha's certificate names %s", a.Self)
	}
	if err := a.Cert.Leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	if err := a.Cert.Leaf.VerifyHostname("alpha.example"); err != nil {
		t.Error(err)
	}
	if op := load(t, dir, "operator"); op.Self != (Identity{RoleOperator, "operator"}) {
		t.Fatalf("operator's certificate names %s", op.Self)
	}
	nbdc, err := Load(filepath.Join(dir, "nbd-client/ca-cert.pem"), filepath.Join(dir, "nbd-client/client-cert.pem"), filepath.Join(dir, "nbd-client/client-key.pem"))
	if err != nil || nbdc.Self.Role != RoleNBDClient {
		t.Fatalf("nbd client bundle: %+v %v", nbdc, err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if _, err := Init(dir, nil, false); !errors.Is(err, ErrCAExists) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a second init without force: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if string(before) != string(after) {
		t.Fatal("the refused init changed the CA")
	}
	if _, err := Init(dir, []Holder{{Identity: Identity{RoleNode, "alpha"}}}, true); err != nil {
		t.Fatalf("init --force: %v", err)
	}
	if _, err := Load(filepath.Join(dir, CAFile), filepath.Join(t.TempDir(), "none.crt"), "none.key"); err == nil {
		t.Fatal("a missing certificate loaded")
	}
}

// TestMutualTLSAcceptsOnlyTheIdentityAsked: over a real TCP connection on
// 127.0.0.1, a node accepts beta's certificate where it expects beta, and
// refuses, in words, beta's certificate where alpha is expected, an
// operator where only nodes may come, a client of another CA, and a client
// without a certificate where one is required.
func TestMutualTLSAcceptsOnlyTheIdentityAsked(t *testing.T) {
	dir := initDir(t, "alpha", "beta")
	other := initDir(t, "beta")
	alpha, beta, op := load(t, dir, "alpha"), load(t, dir, "beta"), load(t, dir, "operator")
	strangerBeta := load(t, other, "beta")
	for _, tc := range []struct {
		name     string
		server   *tls.Config
		client   *tls.Config
		wantFail string
	}{
		{"beta where beta is expected", alpha.ServerConfig(true, Exactly(Identity{RoleNode, "beta"})), beta.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "alpha"})), ""},
		{"beta's certificate standing in for alpha", alpha.ServerConfig(true, Exactly(Identity{RoleNode, "alpha"})), beta.ClientConfig("127.0.0.1", nil), "not node alpha"},
		{"the server is not who the client dialed", alpha.ServerConfig(true, nil), beta.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "gamma"})), "not node gamma"},
		{"an operator where only nodes may come", alpha.ServerConfig(true, Roles(RoleNode)), op.ClientConfig("127.0.0.1", nil), "may not be used here"},
		{"a client of another CA", alpha.ServerConfig(true, nil), strangerBeta.ClientConfig("127.0.0.1", nil), "certificate"},
		{"no client certificate where one is required", alpha.ServerConfig(true, nil), &tls.Config{RootCAs: alpha.CA, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := tls.Listen("tcp", "127.0.0.1:0", tc.server)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			serverErr := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					serverErr <- err
					return
				}
				defer c.Close()
				err = c.(*tls.Conn).Handshake()
				if err == nil {
					_, err = c.Write([]byte("ok"))
				}
				serverErr <- err
			}()
			c, err := tls.Dial("tcp", ln.Addr().String(), tc.client)
			if err == nil {
				buf := make([]byte, 2)
				_, err = c.Read(buf) // TLS 1.3: the server's verdict arrives here
				c.Close()
			}
			serr := <-serverErr
			if tc.wantFail == "" {
				if err != nil || serr != nil {
					t.Fatalf("client %v, server %v", err, serr)
				}
				return
			}
			if err == nil && serr == nil {
				t.Fatal("the connection was accepted")
			}
			if got := errText(err) + " | " + errText(serr); !strings.Contains(got, tc.wantFail) {
				t.Fatalf("refused with %q, want it to say %q", got, tc.wantFail)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestIdentityOfReadsOneWellFormedURI: the certificate-to-identity rule.
func TestIdentityOfReadsOneWellFormedURI(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		uris []*url.URL
		want Identity
		ok   bool
	}{
		{"a node", []*url.URL{u("replvol://node/alpha")}, Identity{RoleNode, "alpha"}, true},
		{"the operator", []*url.URL{u("replvol://operator/operator")}, Identity{RoleOperator, "operator"}, true},
		{"other URIs are ignored", []*url.URL{u("spiffe://x/y"), u("replvol://nbd-client/c1")}, Identity{RoleNBDClient, "c1"}, true},
		{"none", nil, Identity{}, false},
		{"an unknown role", []*url.URL{u("replvol://admin/root")}, Identity{}, false},
		{"a name with a slash", []*url.URL{u("replvol://node/a/b")}, Identity{}, false},
		{"an empty name", []*url.URL{u("replvol://node/")}, Identity{}, false},
		{"two identities", []*url.URL{u("replvol://node/alpha"), u("replvol://node/beta")}, Identity{}, false},
		{"a query", []*url.URL{u("replvol://node/alpha?x=1")}, Identity{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := IdentityOf(&x509.Certificate{URIs: tc.uris})
			if tc.ok != (err == nil) || id != tc.want {
				t.Fatalf("IdentityOf = %v, %v; want %v (ok %v)", id, err, tc.want, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrNoIdentity) {
				t.Fatalf("error %v is not ErrNoIdentity", err)
			}
		})
	}
}

// FuzzIdentityOf: any certificate bytes, parsed or not, never crash the
// mapping; what it accepts round-trips through the URI it came from.
func FuzzIdentityOf(f *testing.F) {
	dir := f.TempDir()
	if _, err := Init(dir, []Holder{{Identity: Identity{RoleNode, "alpha"}, Hosts: []string{"127.0.0.1"}}}, false); err != nil {
		f.Fatal(err)
	}
	b, err := Load(filepath.Join(dir, CAFile), filepath.Join(dir, CertFile("alpha")), filepath.Join(dir, KeyFile("alpha")))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b.Cert.Certificate[0])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, der []byte) {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		id, err := IdentityOf(cert)
		if err != nil {
			return
		}
		if CheckName(id.Name) != nil || !id.Role.valid() {
			t.Fatalf("accepted %v", id)
		}
		back, err := IdentityOf(&x509.Certificate{URIs: []*url.URL{id.URI()}})
		if err != nil || back != id {
			t.Fatalf("%v does not round-trip: %v %v", id, back, err)
		}
		_, _ = b.Verify([]*x509.Certificate{cert})
	})
}
