package replication

import (
	"errors"
	"fmt"
)

// WireVersion is the version of the replication protocol this build
// speaks: the frames, the Hello and HelloReply (which carry it, as
// "wire"). It grows by one in a release that changes what a peer must
// understand. Nodes at most one version apart interoperate, so a cluster
// is upgraded one node at a time, one release at a time; a peer further
// apart is refused at the handshake, in words, before any data moves.
const WireVersion = 2

// unversionedWire is the version of a peer whose Hello or HelloReply has
// no "wire" field: a node of the releases before the field existed,
// which speaks what version 1 names.
const unversionedWire = 1

// ErrWireVersion: a peer speaks a replication wire version more than one
// apart from this node's.
var ErrWireVersion = errors.New("replication wire versions more than one apart")

// RefusedWireVersion: the peer speaks a replication wire version more than
// one apart. Not final: the primary keeps trying, and connects once one of
// the two nodes was upgraded (or downgraded) to within one version.
const RefusedWireVersion Refusal = "wire-version"

// PeerWireVersion is the version a peer's Hello or HelloReply field says
// (0: absent, a node from before the field).
func PeerWireVersion(field int) int {
	if field == 0 {
		return unversionedWire
	}
	return field
}

// CheckWireVersion reports whether this node (self, at WireVersion) may
// replicate with peer, whose Hello or HelloReply carried field as its
// wire version: an error wrapping ErrWireVersion when the two are more
// than one version apart, saying what to do.
func CheckWireVersion(self, peer string, field int) error {
	return checkWireVersion(self, WireVersion, peer, PeerWireVersion(field))
}

func checkWireVersion(self string, mine int, peer string, theirs int) error {
	if theirs >= mine-1 && theirs <= mine+1 {
		return nil
	}
	older := peer
	if theirs > mine {
		older = self
	}
	return fmt.Errorf("%w: %s speaks replication wire version %d and %s version %d: "+
		"a node replicates only with peers at most one version apart; upgrade %s through the releases in between, "+
		"one node at a time and one release at a time",
		ErrWireVersion, self, mine, peer, theirs, older)
}
