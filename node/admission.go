package node

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/node/control"
)

// Each port admits its connections within limits (package connlimit):
// per address, in all, and handshakes in progress, with a share of each
// port kept for the cluster's own nodes. Which addresses are the nodes'
// is what the cluster file says: every address of every node in it.

// resolveTimeout bounds the lookup of the names in the cluster file's
// addresses.
const resolveTimeout = 5 * time.Second

// knownAddresses is the addresses of cfg's nodes, as the limits know the
// cluster's own connections by. A name that does not resolve is logged:
// its node's connections then count as a stranger's.
func knownAddresses(cfg *Config, log *slog.Logger) *connlimit.Known {
	k := connlimit.NewKnown()
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	seen := map[string]bool{}
	for _, nc := range cfg.Nodes {
		for _, addr := range []string{nc.Control, nc.Replication, nc.NBD, nc.Raft, nc.Gossip} {
			host, _, err := net.SplitHostPort(addr)
			if err != nil || seen[host] {
				continue
			}
			seen[host] = true
			if err := k.AddHost(ctx, host); err != nil {
				log.Warn("a node's address does not resolve: its connections count as a stranger's against the connection limits until the node restarts", "node", nc.Name, "address", addr, "err", err)
			}
		}
	}
	return k
}

// portAdmission is one port's connection limits' counts, as /metrics
// names the port.
type portAdmission struct {
	port  string
	stats connlimit.Stats
}

// admissions is the counts of every port's connection limits.
func (n *Node) admissions() []portAdmission {
	var out []portAdmission
	for _, p := range []struct {
		port string
		ln   net.Listener
	}{{"control", n.lnControl}, {"control-socket", n.lnUnix}} {
		if l, ok := p.ln.(*control.Listener); ok {
			out = append(out, portAdmission{p.port, l.Admission()})
		}
	}
	if !n.self.IsWitness() {
		if n.nbd != nil {
			out = append(out, portAdmission{"nbd", n.nbd.Stats().Admission})
		}
		if n.repl != nil {
			out = append(out, portAdmission{"replication", n.repl.Admission()})
		}
	}
	if n.cl != nil {
		if st, ok := n.cl.c.RaftAdmission(); ok {
			out = append(out, portAdmission{"raft", st})
		}
	}
	return out
}
