package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Events: every event goes to the node's history (bbolt: it survives a
// restart) and to the live subscribers (replctl events, the web page). A
// subscriber that falls behind loses events, and learns so from the
// sequence numbers.

// eventHub fans events out to subscribers.
type eventHub struct {
	mu   mutex
	subs map[chan transport.Event]struct{}
}

// subscriberBuffer is how many events a subscriber may lag by.
const subscriberBuffer = 256

// emit records e and sends it to every subscriber.
func (n *Node) emit(e statefile.Event) {
	stored, err := n.store.AddEvent(e)
	if err != nil {
		n.log.Warn("record event", "err", err)
		stored = e
	}
	te := n.transportEvent(stored)
	n.events.mu.Lock()
	defer n.events.mu.Unlock()
	for ch := range n.events.subs {
		select {
		case ch <- te:
		default: // a slow subscriber misses it (the Seq shows the gap)
		}
	}
}

func (n *Node) transportEvent(e statefile.Event) transport.Event {
	return transport.Event{Seq: e.Seq, Time: e.Time, Node: n.name, Volume: e.Volume, Kind: e.Kind, Message: e.Message,
		Peer: e.Peer, Old: e.Old, New: e.New, Reason: e.Reason, Offset: e.Offset, Length: e.Length}
}

// subscribe returns a channel of the events from now on; cancel ends it.
func (n *Node) subscribe() (<-chan transport.Event, func()) {
	ch := make(chan transport.Event, subscriberBuffer)
	n.events.mu.Lock()
	if n.events.subs == nil {
		n.events.subs = map[chan transport.Event]struct{}{}
	}
	n.events.subs[ch] = struct{}{}
	n.events.mu.Unlock()
	return ch, func() {
		n.events.mu.Lock()
		delete(n.events.subs, ch)
		n.events.mu.Unlock()
	}
}

// stateEvents is the node's current state as events, at now: a line for
// the node (its role and the cluster as it sees it), one per volume (role,
// disk, epoch, whether it serves IO), one per peer of each volume
// (replication state, the peer's disk, what it misses), and the end
// marker. They are not recorded.
func (n *Node) stateEvents(now time.Time) []transport.Event {
	ns := n.nodeStatus(0)
	ev := func(volume, peer, state, msg string) transport.Event {
		return transport.Event{Time: now, Node: n.name, Volume: volume, Kind: transport.EventExists, Peer: peer, New: state, Message: msg}
	}
	cl, _ := n.clusterInfo()
	what := fmt.Sprintf("node %s (%s): failover %s", n.name, ns.Node.Role, cl.Failover)
	if len(cl.Voters) > 0 {
		leader, quorum := cl.Leader, "quorum"
		if leader == "" {
			leader = "none"
		}
		if !cl.Quorum {
			quorum = "no quorum"
		}
		what += fmt.Sprintf(", raft leader %s, %s, voters %s", leader, quorum, strings.Join(cl.Voters, " "))
	}
	out := []transport.Event{ev("", "", "", what)}
	for _, lv := range ns.Volumes {
		msg := fmt.Sprintf("disk %s, epoch %d", lv.Disk, lv.Epoch)
		switch {
		case lv.Role == string(replication.Primary) && lv.Serving:
			msg += ", serving IO"
		case lv.Role == string(replication.Primary):
			msg += ", not serving IO"
		case lv.Primary != "":
			msg += ", primary " + lv.Primary
		}
		if lv.Reason != "" {
			msg += " (" + lv.Reason + ")"
		}
		out = append(out, ev(lv.Name, "", lv.Role, msg))
		for _, p := range lv.Peers {
			msg := fmt.Sprintf("peer disk %s, %s out of sync", p.PeerDisk, human.Bytes(p.OutOfSyncBytes))
			if p.ResyncTotalBytes > 0 && p.ResyncDoneBytes < p.ResyncTotalBytes {
				msg += fmt.Sprintf(", resync %s of %s done", human.Bytes(p.ResyncDoneBytes), human.Bytes(p.ResyncTotalBytes))
			}
			if p.Reason != "" {
				msg += " (" + p.Reason + ")"
			}
			out = append(out, ev(lv.Name, p.Node, p.Replication, msg))
		}
		if lv.Role != string(replication.Primary) && lv.Primary != "" && lv.Primary != n.name {
			out = append(out, ev(lv.Name, lv.Primary, lv.Replication, "the primary, replicating from it"))
		}
	}
	end := ev("", "", "", fmt.Sprintf("the state of %s above is current; live events follow", n.name))
	end.Kind = transport.EventExistsEnd
	return append(out, end)
}
