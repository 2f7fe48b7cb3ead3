package node

import (
	"context"
	"sync"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/transport"
)

// Events: every event goes to the node's history (bbolt: it survives a
// restart) and to the live subscribers (replctl events, the web page). A
// subscriber that falls behind loses events, and learns so from the
// sequence numbers.

// eventHub fans events out to subscribers.
type eventHub struct {
	mu   sync.Mutex
	subs map[chan transport.Event]struct{}
}

// subscriberBuffer is how many events a subscriber may lag by.
const subscriberBuffer = 256

// emit records e and sends it to every subscriber.
func (n *Node) emit(e metadata.Event) {
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

func (n *Node) transportEvent(e metadata.Event) transport.Event {
	return transport.Event{Seq: e.Seq, Time: e.Time, Node: n.name, Volume: e.Volume, Kind: e.Kind, Message: e.Message,
		Peer: e.Peer, Old: e.Old, New: e.New, Reason: e.Reason}
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

// Events streams this node's events: the last r.History first (oldest
// first), then every new one as it happens, until ctx ends.
func (c *control) Events(ctx context.Context, r *transport.EventsRequest, send func(*transport.Event) error) error {
	n := c.n
	live, cancel := n.subscribe()
	defer cancel()
	var last uint64
	if r.History > 0 {
		past, err := n.store.Events(r.History)
		if err != nil {
			return grpcError(err)
		}
		for _, e := range past {
			if !r.Since.IsZero() && e.Time.Before(r.Since) {
				continue
			}
			te := n.transportEvent(e)
			if err := send(&te); err != nil {
				return err
			}
			last = e.Seq
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-live:
			if e.Seq != 0 && e.Seq <= last {
				continue // already sent from the history
			}
			if err := send(&e); err != nil {
				return err
			}
		}
	}
}
