package pki

import (
	"crypto/tls"
	"errors"
)

// ErrNoCertificate: a client presented no certificate.
var ErrNoCertificate = errors.New("no client certificate")

// AskingServerConfig is a TLS 1.3 server configuration presenting b's
// certificate that asks every client for its certificate but lets it in
// with none, or with one the CA did not sign: the server then refuses
// what it must per request, in words the client can read (a refusal in
// the handshake reaches a TLS 1.3 client only as an alert), and Caller
// says whom a connection names. Use it where some requests need no
// certificate (the control port's status page) and the others check it;
// use ServerConfig where every connection needs one.
func (b *Bundle) AskingServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Cert},
		ClientAuth:   tls.RequestClientCert,
	}
}

// Caller verifies the client certificate of a connection (one of
// AskingServerConfig's, or of ServerConfig's) and returns the identity it
// names: ErrNoCertificate when the client presented none, ErrNotTrusted
// when the CA did not sign it (or it expired), ErrNoIdentity when it names
// no replvol identity. Each error names the certificate.
func (b *Bundle) Caller(cs *tls.ConnectionState) (Identity, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, ErrNoCertificate
	}
	return b.Verify(cs.PeerCertificates)
}
