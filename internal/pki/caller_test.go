package pki

import (
	"crypto/tls"
	"errors"
	"testing"
)

// TestAskingServerLetsEveryClientInAndCallerSaysWhoItIs: over a real TCP
// connection on 127.0.0.1, a server with AskingServerConfig completes the
// handshake with a client of the CA, one without a certificate and one of
// another CA; Caller then names the first, and refuses the others with
// ErrNoCertificate and ErrNotTrusted (naming the certificate).
func TestAskingServerLetsEveryClientInAndCallerSaysWhoItIs(t *testing.T) {
	dir := initDir(t, "alpha")
	other := initDir(t, "alpha")
	alpha, op := load(t, dir, "alpha"), load(t, dir, "operator")
	strangerOp := load(t, other, "operator")
	noCert := &tls.Config{RootCAs: alpha.CA, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	strangerWithOurCA := &tls.Config{Certificates: []tls.Certificate{strangerOp.Cert}, RootCAs: alpha.CA, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	for _, tc := range []struct {
		name    string
		client  *tls.Config
		want    Identity
		wantErr error
	}{
		{"the operator", op.ClientConfig("127.0.0.1", Exactly(alpha.Self)), Identity{RoleOperator, "operator"}, nil},
		{"a client without a certificate", noCert, Identity{}, ErrNoCertificate},
		{"the operator of another CA", strangerWithOurCA, Identity{}, ErrNotTrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := tls.Listen("tcp", "127.0.0.1:0", alpha.AskingServerConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			type verdict struct {
				id  Identity
				err error
			}
			got := make(chan verdict, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- verdict{err: err}
					return
				}
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					got <- verdict{err: err}
					return
				}
				cs := tc.ConnectionState()
				id, err := alpha.Caller(&cs)
				got <- verdict{id, err}
			}()
			c, err := tls.Dial("tcp", ln.Addr().String(), tc.client)
			if err != nil {
				t.Fatalf("the handshake failed: %v", err)
			}
			defer c.Close()
			v := <-got
			if v.id != tc.want || !errors.Is(v.err, tc.wantErr) || (tc.wantErr == nil) != (v.err == nil) {
				t.Fatalf("Caller = %v, %v; want %v, %v", v.id, v.err, tc.want, tc.wantErr)
			}
			if errors.Is(v.err, ErrNotTrusted) && v.err.Error() == ErrNotTrusted.Error() {
				t.Fatalf("the refusal does not name the certificate: %v", v.err)
			}
		})
	}
	if _, err := alpha.Caller(nil); !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("Caller(nil) = %v", err)
	}
}
