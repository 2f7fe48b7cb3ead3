package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// expiredBundle is a certificate of the CA in dir for node name that
// expired yesterday.
func expiredBundle(t *testing.T, dir, name string) *Bundle {
	t.Helper()
	b := load(t, dir, name)
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	caKey, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, CAFile))
	block, _ = pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs: []*url.URL{Identity{RoleNode, name}.URI()}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	b.Cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	return b
}

// TestHandshakeFailuresAreExplained: over real TCP connections on
// 127.0.0.1, each way a handshake between nodes fails is classified, and
// put in words that name the peer, the certificate and why: on the side
// that refused, and, for a refusal of the client's certificate, on the
// client at its first read (WatchRefusal).
func TestHandshakeFailuresAreExplained(t *testing.T) {
	dir := initDir(t, "alpha", "beta")
	other := initDir(t, "beta")
	alpha, beta, op := load(t, dir, "alpha"), load(t, dir, "beta"), load(t, dir, "operator")
	stranger, expired := load(t, other, "beta"), expiredBundle(t, dir, "beta")
	nodes := Roles(RoleNode)
	anyServer := func(b *Bundle) *tls.Config {
		c := b.ClientConfig("127.0.0.1", nil)
		c.InsecureSkipVerify = true // a stranger does not check whom it reaches
		c.VerifyConnection = nil
		return c
	}
	for _, tc := range []struct {
		name           string
		server, client *tls.Config
		plaintext      bool
		// refused is the side whose error is explained ("client" or
		// "server"), cause and words what it says.
		refused string
		cause   HandshakeCause
		words   []string
	}{
		{"the node dialled presents another CA's certificate", stranger.ServerConfig(true, nodes), alpha.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "beta"})),
			false, "client", CauseOtherCA, []string{"beta presented a certificate of another CA: node beta (serial ", "not signed by this cluster's CA"}},
		{"a client of another CA", alpha.ServerConfig(true, nodes), anyServer(stranger),
			false, "server", CauseOtherCA, []string{"beta presented a certificate of another CA: node beta"}},
		{"the node dialled is another node", alpha.ServerConfig(true, nodes), beta.ClientConfig("127.0.0.1", Exactly(Identity{RoleNode, "gamma"})),
			false, "client", CauseWrongIdentity, []string{"beta presented a certificate that names node alpha, not node gamma"}},
		{"an operator on a node's link", alpha.ServerConfig(true, nodes), op.ClientConfig("127.0.0.1", nil),
			false, "server", CauseWrongIdentity, []string{"beta presented a certificate of operator operator, which may not be used here (want node)"}},
		{"the server refuses the client's certificate", alpha.ServerConfig(true, nodes), op.ClientConfig("127.0.0.1", nil),
			false, "client", CauseRefusedByPeer, []string{"beta refused this side's certificate (tls: bad certificate)"}},
		{"an expired certificate", alpha.ServerConfig(true, nodes), anyServer(expired),
			false, "server", CauseExpired, []string{"beta presented a certificate that is not valid now: node beta (serial ", "valid from"}},
		{"a certificate for other hosts", alpha.ServerConfig(true, nodes), beta.ClientConfig("alpha.invalid:7000", nil),
			false, "client", CauseWrongHost, []string{"beta presented a certificate for other hosts: node alpha (serial ", "covers 127.0.0.1, alpha.example, not alpha.invalid"}},
		{"a client without TLS", alpha.ServerConfig(true, nodes), nil,
			true, "server", CauseNotTLS, []string{"beta does not speak TLS"}},
		{"a client without a certificate", RequireCertificate(alpha.ServerConfig(true, nodes)), &tls.Config{RootCAs: alpha.CA, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13},
			false, "server", CauseNoCertificate, []string{"beta presented no certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
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
				tc := tls.Server(c, tc.server)
				err = tc.Handshake()
				if err == nil {
					_, err = tc.Write([]byte("ok"))
				}
				serverErr <- err
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			var clientErr error
			var watched *HandshakeError
			if tc.plaintext {
				raw.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
			} else {
				c := tls.Client(raw, tc.client)
				if clientErr = c.Handshake(); clientErr == nil {
					w := WatchRefusal(c, func(e *HandshakeError) { watched = e })
					_, clientErr = w.Read(make([]byte, 2))
				}
			}
			err = <-serverErr
			if tc.refused == "client" {
				err = clientErr
				if tc.cause == CauseRefusedByPeer && watched == nil {
					t.Fatalf("WatchRefusal did not report the refusal (%v)", clientErr)
				}
			}
			he := ExplainHandshake(err)
			if he == nil {
				t.Fatalf("%s's error %v is not explained", tc.refused, err)
			}
			if he.Cause != tc.cause {
				t.Fatalf("%s's error %v: cause %s, want %s", tc.refused, err, he.Cause, tc.cause)
			}
			got := he.Words("beta")
			for _, w := range tc.words {
				if !strings.Contains(got, w) {
					t.Fatalf("words %q do not say %q", got, w)
				}
			}
		})
	}
	if he := ExplainHandshake(&net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}); he != nil {
		t.Fatalf("a failed dial explained as a TLS failure: %v", he)
	}
}
