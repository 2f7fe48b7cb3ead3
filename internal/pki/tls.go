package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// Bundle is one holder's view of the cluster's PKI: the CA to trust, its
// own certificate and key, and the identity that certificate names.
type Bundle struct {
	CA   *x509.CertPool
	Cert tls.Certificate
	Self Identity
}

// Load reads a bundle: the CA certificate, and a certificate the CA signed
// with its key. Every problem is an error that names the file and what to
// do.
func Load(caFile, certFile, keyFile string) (*Bundle, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("CA certificate %s: no PEM certificate in it", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certFile, err)
	}
	pair.Leaf = leaf
	b := &Bundle{CA: pool, Cert: pair}
	if b.Self, err = b.Verify([]*x509.Certificate{leaf}); err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certFile, err)
	}
	return b, nil
}

// ErrNotTrusted: a certificate the cluster's CA did not sign (or that
// expired).
var ErrNotTrusted = errors.New("not signed by the cluster's CA")

// Verify checks that chain's leaf was signed by the CA and is valid now,
// and returns the identity it names.
func (b *Bundle) Verify(chain []*x509.Certificate) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrNotTrusted)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	leaf := chain[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.CA, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return Identity{}, fmt.Errorf("%w: certificate %q (serial %s): %v", ErrNotTrusted, leaf.Subject.CommonName, leaf.SerialNumber, err)
	}
	return IdentityOf(leaf)
}

// Accept decides whether a verified peer may go on: nil to accept, or an
// error in words to refuse it.
type Accept func(Identity) error

// Roles accepts any identity of the given roles.
func Roles(roles ...Role) Accept {
	return func(id Identity) error {
		for _, r := range roles {
			if id.Role == r {
				return nil
			}
		}
		return &IdentityError{Got: id, Roles: roles}
	}
}

// Exactly accepts only want.
func Exactly(want Identity) Accept {
	return func(id Identity) error {
		if id != want {
			return &IdentityError{Got: id, Want: want}
		}
		return nil
	}
}

// IdentityError is a certificate of the CA that names a holder who may
// not be accepted here: another node than the one expected (Exactly), or
// a role not allowed (Roles).
type IdentityError struct {
	// Got is whom the certificate names.
	Got Identity
	// Want is the identity Exactly expected; zero for Roles.
	Want Identity
	// Roles are the roles Roles allows.
	Roles []Role
}

func (e *IdentityError) Error() string {
	if e.Want != (Identity{}) {
		return fmt.Sprintf("the certificate names %s, not %s", e.Got, e.Want)
	}
	return fmt.Sprintf("a certificate of %s may not be used here (want %s)", e.Got, rolesText(e.Roles))
}

func rolesText(roles []Role) string {
	s := ""
	for i, r := range roles {
		if i > 0 {
			s += " or "
		}
		s += string(r)
	}
	return s
}

// ServerConfig is a TLS 1.3 server configuration presenting b's
// certificate. With required, a client must present a certificate of the
// CA that accept takes; otherwise a client without one is let in (the
// caller decides what it may do: PeerIdentity says whom a connection
// names), and one with a certificate must still pass.
func (b *Bundle) ServerConfig(required bool, accept Accept) *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if required {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Cert},
		ClientCAs:    b.CA,
		ClientAuth:   auth,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil // required: the handshake refused it already
			}
			id, err := b.Verify(cs.PeerCertificates)
			if err != nil {
				return err
			}
			if accept != nil {
				return accept(id)
			}
			return nil
		},
	}
}

// ClientConfig is a TLS 1.3 client configuration presenting b's
// certificate to a server at addr (HOST:PORT or HOST: its certificate must
// name the host, as every certificate Init writes names its node's hosts)
// whose certificate accept takes.
func (b *Bundle) ClientConfig(addr string, accept Accept) *tls.Config {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Cert},
		RootCAs:      b.CA,
		ServerName:   host,
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := b.Verify(cs.PeerCertificates)
			if err != nil {
				return err
			}
			if accept != nil {
				return accept(id)
			}
			return nil
		},
	}
}

// PeerIdentity is whom the verified client certificate of a connection
// names; false when the client presented none.
func PeerIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(cs.VerifiedChains[0][0])
	return id, err == nil
}
