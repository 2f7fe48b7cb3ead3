package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Role is what a certificate of the cluster's CA lets its holder be.
type Role string

// Roles.
const (
	// RoleNode: a node of the cluster (replication, raft, gossip, and the
	// control calls nodes make to each other).
	RoleNode Role = "node"
	// RoleOperator: replctl, for every control call.
	RoleOperator Role = "operator"
	// RoleNBDClient: a client of the volumes' NBD exports.
	RoleNBDClient Role = "nbd-client"
)

func (r Role) valid() bool {
	switch r {
	case RoleNode, RoleOperator, RoleNBDClient:
		return true
	}
	return false
}

// Identity is whom a certificate names: a role and a name (a node's name
// for RoleNode).
type Identity struct {
	Role Role
	Name string
}

// String renders id in words: "node alpha".
func (id Identity) String() string { return string(id.Role) + " " + id.Name }

// uriScheme is the scheme of the URI SAN that carries an identity:
// replvol://ROLE/NAME.
const uriScheme = "replvol"

// URI is the SAN that names id.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: uriScheme, Host: string(id.Role), Path: "/" + id.Name}
}

// ErrNoIdentity: a certificate names no replvol identity, or names one
// badly.
var ErrNoIdentity = errors.New("the certificate names no replvol identity")

// IdentityOf reads the identity cert names: exactly one URI SAN
// replvol://ROLE/NAME, of a known role and a valid name. It does not check
// who signed cert (Bundle.Verify does).
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u == nil || u.Scheme != uriScheme {
			continue
		}
		id := Identity{Role: Role(u.Host), Name: strings.TrimPrefix(u.Path, "/")}
		if !id.Role.valid() {
			return Identity{}, fmt.Errorf("%w: unknown role %q in %s", ErrNoIdentity, u.Host, u)
		}
		if err := CheckName(id.Name); err != nil || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
			return Identity{}, fmt.Errorf("%w: bad name in %s", ErrNoIdentity, u)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w (subject %q)", ErrNoIdentity, cert.Subject.CommonName)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("%w: it names %d identities (%s, %s)", ErrNoIdentity, len(found), found[0], found[1])
}

// CheckName refuses a name an identity cannot carry: empty, longer than 64
// bytes, or with anything but letters, digits, '-', '_' and '.'.
func CheckName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("name %q: want 1 to 64 characters", name)
	}
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("name %q: only letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}
