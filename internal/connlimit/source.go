package connlimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/replvol/replvol/internal/lockorder"
)

// Source is what the limits count connections by: an IPv4 address, an
// IPv6 /64 (what one host or one site is given), or Local for a
// connection with no IP address (a unix socket). The zero Source is Local.
type Source struct{ prefix netip.Prefix }

// Local is the source of connections with no IP address.
var Local = Source{}

// SourceOf returns the source of a connection from a, and a's IP address
// (invalid for Local).
func SourceOf(a net.Addr) (Source, netip.Addr) {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	if !ip.IsValid() {
		return Local, ip
	}
	ip = ip.WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return Source{p}, ip
}

// IsLocal reports whether s is Local.
func (s Source) IsLocal() bool { return !s.prefix.IsValid() }

func (s Source) String() string {
	switch {
	case s.IsLocal():
		return "local"
	case s.prefix.Addr().Is4():
		return s.prefix.Addr().String()
	}
	return s.prefix.String()
}

// Known is the addresses of the cluster's own nodes: a connection from
// one may take the slots kept for them, is held to no limit per source,
// and may close a stranger's unfinished handshake to get in. Local
// connections are always known. A nil *Known knows no address. Its
// methods may be called concurrently.
type Known struct {
	mu    lockorder.RWMutex
	addrs map[netip.Addr]struct{}
}

// NewKnown returns a set of addrs.
func NewKnown(addrs ...netip.Addr) *Known {
	k := &Known{addrs: map[netip.Addr]struct{}{}}
	for _, a := range addrs {
		k.Add(a)
	}
	return k
}

// Add makes a known.
func (k *Known) Add(a netip.Addr) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.addrs[a.Unmap().WithZone("")] = struct{}{}
}

// AddHost makes known the addresses of hostport's host ("10.0.0.1:7800",
// "alpha.example:7800" or a host alone): an IP address as it is, a name
// as it resolves now.
func (k *Known) AddHost(ctx context.Context, hostport string) error {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(host); err == nil {
		k.Add(a)
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("the connection limits cannot tell %s's connections from a stranger's: %w", host, err)
	}
	for _, a := range addrs {
		k.Add(a)
	}
	return nil
}

// Contains reports whether a is known.
func (k *Known) Contains(a netip.Addr) bool {
	if k == nil || !a.IsValid() {
		return false
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	_, ok := k.addrs[a.Unmap().WithZone("")]
	return ok
}
