package node

import (
	"fmt"
	"net"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// With a tls: section, the node's data-plane links are mutual TLS 1.3 with
// the cluster's CA: the replication stream (here), raft and gossip
// (node/cluster). Without it they stay plaintext.

// A refusal is logged again once it has not recurred for refusalQuiet;
// at most maxRefusalsKept peers and causes are remembered (beyond, a new
// one is logged at DEBUG only: nobody fills the log by changing
// certificates).
const (
	refusalQuiet    = 10 * time.Minute
	maxRefusalsKept = 256
)

func nodeIdentity(name string) pki.Identity { return pki.Identity{Role: pki.RoleNode, Name: name} }

// replServerOptions: the replication server takes only nodes' certificates
// of the CA (which node sent a stream is checked against its Hello, in
// handleStream), and says once per peer and cause why it refused one.
func (n *Node) replServerOptions() []transport.ReplOption {
	if n.tls == nil {
		return nil
	}
	return []transport.ReplOption{
		transport.ReplTLS(pki.RequireCertificate(n.tls.ServerConfig(true, pki.Roles(pki.RoleNode)))),
		transport.ReplHandshakeFailed(func(remote net.Addr, err error) { n.refusedConnection("replication", remote, err) }),
	}
}

// replDialOptions: a stream to peer at addr goes only to the node whose
// certificate names peer.
func (n *Node) replDialOptions(peer, addr string) []transport.ReplOption {
	if n.tls == nil {
		return nil
	}
	return []transport.ReplOption{transport.ReplTLS(n.tls.ClientConfig(addr, pki.Exactly(nodeIdentity(peer))))}
}

// refusedConnection logs a connection to one of this node's servers whose
// TLS handshake was refused, and records it as an event: once per client
// host and cause (the certificate it presented), not at every retry. A
// handshake that merely failed (the client went away) is logged at DEBUG.
func (n *Node) refusedConnection(link string, remote net.Addr, err error) {
	host := remote.String()
	if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
		host = h
	}
	who := "a client at " + host
	words := pki.HandshakeWords(who, err)
	he := pki.ExplainHandshake(err)
	if he == nil {
		// No refusal: the client went away or stalled.
		n.log.Debug("a connection ended in its TLS handshake", "link", link, "reason", words)
		return
	}
	if !n.dataRefusals.First(link + " " + host + " " + he.Key()) {
		n.log.Debug("refused a connection again", "link", link, "reason", words)
		return
	}
	n.log.Warn("refused a connection", "link", link, "reason", words)
	n.emit(statefile.Event{Kind: "refused", Reason: string(he.Cause), Message: fmt.Sprintf("%s: refused a connection: %s", link, words)})
}

// raftRefused records a refusal of a raft connection (logged already, once
// per peer and cause, by node/cluster) as an event.
func (n *Node) raftRefused(words string) {
	n.emit(statefile.Event{Kind: "refused", Reason: string(CauseIdentity), Message: words})
}

// streamIdentity refuses a stream whose Hello claims a sender its TLS
// certificate does not name: a certificate of beta cannot stand in for
// alpha. It returns the refusal to send, or ok; without tls: every stream
// is ok.
func (n *Node) streamIdentity(s *transport.ReplStream, h replication.Hello) (replication.HelloReply, bool) {
	if n.tls == nil {
		return replication.HelloReply{}, true
	}
	want := nodeIdentity(h.From)
	got, ok := pki.PeerIdentity(s.TLS())
	if ok && got == want {
		return replication.HelloReply{}, true
	}
	presented := "no certificate"
	if ok {
		presented = "a certificate that names " + got.String()
	}
	words := fmt.Sprintf("a stream for %s claims to come from %s but presented %s: a node's certificate stands for that node only", h.Volume, h.From, presented)
	if n.dataRefusals.First("stream " + h.From + " " + got.String()) {
		n.log.Warn("refused replication stream", "from", h.From, "refusal", replication.RefusedIdentity, "reason", words)
		n.emit(statefile.Event{Volume: h.Volume, Kind: "refused", Peer: h.From, Reason: string(replication.RefusedIdentity), Message: words})
	} else {
		n.log.Debug("refused replication stream again", "from", h.From, "refusal", replication.RefusedIdentity)
	}
	return replication.HelloReply{Refused: replication.RefusedIdentity, Reason: words}, false
}

// streamSender refuses a stream from a node that holds no disk of the
// volume (a witness, a node of the CA outside the volume): only the
// volume's nodes stream it, and another one's Hello, whatever epoch it
// claims, neither makes this primary step down nor writes this
// secondary. Logged once per sender and volume.
func (v *Volume) streamSender(h replication.Hello) (replication.HelloReply, bool) {
	if _, ok := v.cfg.Disks[h.From]; ok {
		return replication.HelloReply{}, true
	}
	words := fmt.Sprintf("a stream for %s comes from %s, which holds no disk of %s in %s's cluster file: only the volume's nodes stream it", h.Volume, h.From, h.Volume, v.self)
	n := v.node
	if n.dataRefusals.First("sender " + h.From + " " + h.Volume) {
		n.log.Warn("refused replication stream", "from", h.From, "volume", h.Volume, "refusal", replication.RefusedIdentity, "reason", words)
		n.emit(statefile.Event{Volume: h.Volume, Kind: "refused", Peer: h.From, Reason: string(replication.RefusedIdentity), Message: words})
	} else {
		n.log.Debug("refused replication stream again", "from", h.From, "volume", h.Volume, "refusal", replication.RefusedIdentity)
	}
	return replication.HelloReply{Refused: replication.RefusedIdentity, Reason: words}, false
}

// tlsRefusal is a connection to peer whose TLS handshake failed, as the
// refusal the peer loop retries and status shows ("beta presented a
// certificate of another CA: ..."); nil when err is no TLS failure.
func tlsRefusal(peer string, err error) *refusal {
	he := pki.ExplainHandshake(err)
	if he == nil {
		return nil
	}
	return &refusal{cause: CauseIdentity, text: he.Words(peer)}
}
