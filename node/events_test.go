package node

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestEventsStreamHistoryThenLive: a client of the control API gets the
// node's recent history, then each new event as it happens, in order: a
// disconnect, then a connect.
func TestEventsStreamHistoryThenLive(t *testing.T) {
	c := newSyncedCluster(t, 4<<20)
	cl, err := transport.DialControl(c.nodes["beta"].ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(chan *transport.Event, 64)
	go cl.Events(ctx, &transport.EventsRequest{History: 5}, func(e *transport.Event) error {
		events <- e
		return nil
	})
	var history int
	first := <-events // the history starts with what beta logged at its start
	if first.Node != "beta" || first.Seq == 0 {
		t.Fatalf("first event %+v", first)
	}
	history++
	drain := time.After(500 * time.Millisecond)
loop:
	for {
		select {
		case <-events:
			history++
		case <-drain:
			break loop
		}
	}
	acl, err := transport.DialControl(c.nodes["alpha"].ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer acl.Close()
	alpha := c.nodes["alpha"]
	subscribers := func() int {
		alpha.events.mu.Lock()
		defer alpha.events.mu.Unlock()
		return len(alpha.events.subs)
	}
	before := subscribers()
	onAlpha := make(chan *transport.Event, 64)
	go acl.Events(ctx, &transport.EventsRequest{}, func(e *transport.Event) error {
		onAlpha <- e
		return nil
	})
	eventually(t, func() bool { return subscribers() > before }, "alpha's live stream is subscribed")
	c.vol("beta").setAdminDown(true)
	c.vol("beta").setAdminDown(false)
	// The primary's record of beta coming back names the peer and the
	// state it reached.
	for {
		var e *transport.Event
		select {
		case e = <-onAlpha:
		case <-ctx.Done():
			t.Fatal("alpha recorded no connected event for beta")
		}
		if e.Kind != "connected" {
			continue
		}
		if e.Peer != "beta" || e.New == "" || e.Node != "alpha" {
			t.Fatalf("alpha's connected event %+v: want peer beta and the state reached", e)
		}
		break
	}
	var kinds []string
	for len(kinds) < 2 {
		select {
		case e := <-events:
			if e.Kind == "disconnected" || e.Kind == "connected" {
				kinds = append(kinds, e.Kind)
			}
		case <-ctx.Done():
			t.Fatalf("events seen: %v", kinds)
		}
	}
	if kinds[0] != "disconnected" || kinds[1] != "connected" {
		t.Fatalf("events in order %v, want disconnected then connected", kinds)
	}
	t.Logf("%d events of history, then live", history)
}
