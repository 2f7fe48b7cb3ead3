package nbdclient

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// DefaultPort is NBD's registered port, the port of a URI that names none.
const DefaultPort = "10809"

// URI is an export's address as replvol writes it: nbd://HOST:PORT/EXPORT, or
// nbds://HOST:PORT/EXPORT for NBD over TLS (libnbd's URI forms).
type URI struct {
	// TLS: the client must STARTTLS (nbds).
	TLS bool
	// Addr is HOST:PORT.
	Addr string
	// Export is the export's name (the URI's path without its leading slash).
	Export string
}

// ErrBadURI is a URI this client cannot use.
var ErrBadURI = errors.New("not an NBD URI")

// ParseURI parses nbd:// and nbds:// URIs; a query (libnbd's tls-certificates=...) is
// ignored. Unix sockets (nbd+unix://) are not supported.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		return URI{}, fmt.Errorf("%w: %q: %v", ErrBadURI, s, err)
	}
	var out URI
	switch u.Scheme {
	case "nbd":
	case "nbds":
		out.TLS = true
	default:
		return URI{}, fmt.Errorf("%w: %q: the scheme must be nbd or nbds", ErrBadURI, s)
	}
	if u.Host == "" {
		return URI{}, fmt.Errorf("%w: %q names no host", ErrBadURI, s)
	}
	out.Addr = u.Host
	if u.Port() == "" {
		out.Addr = net.JoinHostPort(strings.Trim(u.Host, "[]"), DefaultPort)
	}
	out.Export = strings.TrimPrefix(u.Path, "/")
	return out, nil
}

// String is the URI in nbd:// or nbds:// form.
func (u URI) String() string {
	scheme := "nbd"
	if u.TLS {
		scheme = "nbds"
	}
	return scheme + "://" + u.Addr + "/" + url.PathEscape(u.Export)
}

// Local replaces a host that names every address of its machine (0.0.0.0, ::, or none, as a
// server's listening address may) by the loopback address: what a client on that machine
// dials, and the host its TLS certificate covers.
func (u URI) Local() URI {
	host, port, err := net.SplitHostPort(u.Addr)
	if err != nil {
		return u
	}
	switch ip := net.ParseIP(host); {
	case host == "" || (ip != nil && ip.To4() != nil && ip.IsUnspecified()):
		u.Addr = net.JoinHostPort("127.0.0.1", port)
	case ip != nil && ip.IsUnspecified():
		u.Addr = net.JoinHostPort("::1", port)
	}
	return u
}
