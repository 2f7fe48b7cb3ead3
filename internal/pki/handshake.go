package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"
)

// HandshakeCause says why a TLS handshake with a peer failed, as a value:
// what logs, events and status put in words, and what tools may test.
type HandshakeCause string

// Handshake causes.
const (
	// CauseOtherCA: the peer's certificate was not signed by the
	// cluster's CA (a node of another cluster, or a stranger).
	CauseOtherCA HandshakeCause = "other-ca"
	// CauseExpired: the peer's certificate has expired, or is not valid
	// yet.
	CauseExpired HandshakeCause = "expired"
	// CauseWrongHost: the peer's certificate does not cover the host
	// dialled.
	CauseWrongHost HandshakeCause = "wrong-host"
	// CauseWrongIdentity: the certificate is the CA's but names another
	// holder: another node than the one dialled, or a role not allowed
	// here (an operator on a node's link).
	CauseWrongIdentity HandshakeCause = "wrong-identity"
	// CauseRefusedByPeer: the peer refused this side's certificate (it
	// answered with a TLS alert).
	CauseRefusedByPeer HandshakeCause = "refused-by-peer"
	// CauseNotTLS: the peer does not speak TLS (a node without tls: in
	// its config, or another program).
	CauseNotTLS HandshakeCause = "not-tls"
	// CauseNoCertificate: the client presented no certificate where one
	// is required.
	CauseNoCertificate HandshakeCause = "no-certificate"
	// CauseOther: any other failure (no certificate, a timeout, a
	// certificate of the CA that names nobody).
	CauseOther HandshakeCause = "other"
)

// HandshakeError is a failed TLS handshake, explained: why, and which
// certificate the peer presented. It wraps crypto/tls's error.
type HandshakeError struct {
	Cause HandshakeCause
	// Presented is whom the peer's certificate names, when it sent one
	// that names a replvol identity; zero otherwise.
	Presented Identity
	// cert is the peer's certificate, when the error carries it.
	cert *x509.Certificate
	// want: the identity or roles that were expected (CauseWrongIdentity).
	ident *IdentityError
	// host the certificate does not cover (CauseWrongHost); alert the
	// peer's TLS alert (CauseRefusedByPeer).
	host, alert string
	err         error
}

func (e *HandshakeError) Error() string { return e.Words("the peer") }

func (e *HandshakeError) Unwrap() error { return e.err }

// Words says what happened, naming the peer as who ("beta", "a client at
// 127.0.0.1"): "beta presented a certificate of another CA: node beta
// (serial 5A…), not signed by this cluster's CA".
func (e *HandshakeError) Words(who string) string {
	switch e.Cause {
	case CauseOtherCA:
		return fmt.Sprintf("%s presented a certificate of another CA: %s, not signed by this cluster's CA", who, e.certText())
	case CauseExpired:
		return fmt.Sprintf("%s presented a certificate that is not valid now: %s, valid from %s to %s", who, e.certText(),
			e.cert.NotBefore.UTC().Format(time.DateOnly), e.cert.NotAfter.UTC().Format(time.DateOnly))
	case CauseWrongHost:
		return fmt.Sprintf("%s presented a certificate for other hosts: %s covers %s, not %s", who, e.certText(), hostsText(e.cert), e.host)
	case CauseWrongIdentity:
		if e.ident.Want != (Identity{}) {
			return fmt.Sprintf("%s presented a certificate that names %s, not %s", who, e.ident.Got, e.ident.Want)
		}
		return fmt.Sprintf("%s presented a certificate of %s, which may not be used here (want %s)", who, e.ident.Got, rolesText(e.ident.Roles))
	case CauseRefusedByPeer:
		return fmt.Sprintf("%s refused this side's certificate (%s)", who, e.alert)
	case CauseNotTLS:
		return fmt.Sprintf("%s does not speak TLS: is tls: missing from its config?", who)
	case CauseNoCertificate:
		return fmt.Sprintf("%s presented no certificate: a certificate of the cluster's CA is required", who)
	}
	return fmt.Sprintf("TLS handshake with %s failed: %v", who, e.err)
}

// Key names the failure for "once per peer and cause": its cause, and the
// certificate presented (none of crypto/tls's text, which may carry a
// port that changes at every try).
func (e *HandshakeError) Key() string {
	k := string(e.Cause) + " " + e.Presented.String()
	if e.cert != nil {
		k += fmt.Sprintf(" %X", e.cert.SerialNumber)
	}
	if e.ident != nil {
		k += " want " + e.ident.Want.String()
	}
	return k
}

// certText names a certificate: whom it names (or its subject) and its
// serial number.
func (e *HandshakeError) certText() string {
	if e.cert == nil {
		return "a certificate"
	}
	holder := fmt.Sprintf("subject %q", e.cert.Subject.CommonName)
	if e.Presented != (Identity{}) {
		holder = e.Presented.String()
	}
	return fmt.Sprintf("%s (serial %X)", holder, e.cert.SerialNumber)
}

func hostsText(c *x509.Certificate) string {
	var hosts []string
	for _, ip := range c.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	hosts = append(hosts, c.DNSNames...)
	if len(hosts) == 0 {
		return "no host"
	}
	return strings.Join(hosts, ", ")
}

// ExplainHandshake explains err, the error of a TLS handshake, or of the
// first read after a client's handshake (TLS 1.3 delivers a server's
// refusal of the client's certificate there). It returns nil for an error
// that is no refusal: a connection refused, closed or reset, a handshake
// that timed out (the peer went away, or stalled).
func ExplainHandshake(err error) *HandshakeError {
	if err == nil {
		return nil
	}
	if he, ok := errors.AsType[*HandshakeError](err); ok {
		return he
	}
	e := &HandshakeError{Cause: CauseOther, err: err}
	if ie, ok := errors.AsType[*IdentityError](err); ok {
		e.Cause, e.Presented, e.ident = CauseWrongIdentity, ie.Got, ie
		return e
	}
	if ve, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		if len(ve.UnverifiedCertificates) > 0 {
			e.cert = ve.UnverifiedCertificates[0]
			if id, err := IdentityOf(e.cert); err == nil {
				e.Presented = id
			}
		}
		if e.cert == nil {
			return e
		}
		var invalid x509.CertificateInvalidError
		var host x509.HostnameError
		switch {
		case errors.As(ve.Err, new(x509.UnknownAuthorityError)):
			e.Cause = CauseOtherCA
		case errors.As(ve.Err, &invalid) && invalid.Reason == x509.Expired:
			e.Cause = CauseExpired
		case errors.As(ve.Err, &host):
			e.Cause, e.host = CauseWrongHost, host.Host
		}
		return e
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		e.Cause = CauseNotTLS
		return e
	}
	if alert, ok := remoteAlert(err); ok {
		e.Cause, e.alert = CauseRefusedByPeer, alert
		return e
	}
	if errors.Is(err, ErrNoCertificate) {
		e.Cause = CauseNoCertificate
		return e
	}
	if errors.Is(err, ErrNotTrusted) || errors.Is(err, ErrNoIdentity) {
		return e // words already: CauseOther
	}
	return nil
}

// RequireCertificate changes conf, a ServerConfig(true, ...), so that a
// client without a certificate is refused with ErrNoCertificate (a
// value ExplainHandshake knows) rather than crypto/tls's text; any
// certificate given is verified as before. It returns conf.
func RequireCertificate(conf *tls.Config) *tls.Config {
	verify := conf.VerifyConnection
	conf.ClientAuth = tls.VerifyClientCertIfGiven
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return ErrNoCertificate
		}
		if verify != nil {
			return verify(cs)
		}
		return nil
	}
	return conf
}

// remoteAlert reports whether err is a TLS alert the peer sent: crypto/tls
// reports one as a *net.OpError whose Op is "remote error" (its alert type
// is not exported).
func remoteAlert(err error) (alert string, ok bool) {
	op, ok := errors.AsType[*net.OpError](err)
	if !ok || op.Op != "remote error" || op.Err == nil {
		return "", false
	}
	return op.Err.Error(), true
}

// HandshakeWords says in words why a TLS handshake with who failed: what
// ExplainHandshake finds, or the error itself.
func HandshakeWords(who string, err error) string {
	if he := ExplainHandshake(err); he != nil {
		return he.Words(who)
	}
	return fmt.Sprintf("TLS handshake with %s failed: %v", who, err)
}

// WatchRefusal wraps a client's TLS connection whose handshake completed:
// with TLS 1.3 the server checks the client's certificate after the
// client's handshake returned, and a refusal arrives as the first read's
// error. refused is called with it (a *HandshakeError of
// CauseRefusedByPeer), once; reads after the first answer cost one atomic
// load.
func WatchRefusal(c net.Conn, refused func(*HandshakeError)) net.Conn {
	return &watchConn{Conn: c, refused: refused}
}

type watchConn struct {
	net.Conn
	refused  func(*HandshakeError)
	answered atomic.Bool
}

func (c *watchConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.answered.Load() {
		return n, err
	}
	if n > 0 {
		c.answered.Store(true)
	} else if alert, ok := remoteAlert(err); ok && c.answered.CompareAndSwap(false, true) {
		c.refused(&HandshakeError{Cause: CauseRefusedByPeer, alert: alert, err: err})
	}
	return n, err
}
