package node

import (
	"context"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestEventsStartWithTheCurrentState: a subscriber that asks for the state
// (replctl events without --since) first gets a line for the node, one
// per volume with its role and one per peer with its replication state,
// then exists-end, then what happens from then on, as drbdsetup events2.
func TestEventsStartWithTheCurrentState(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan transport.Event, 64)
	go c.nodes["alpha"].api.Events(ctx, &transport.EventsRequest{State: true}, func(e *transport.Event) error {
		got <- *e
		return nil
	})
	next := func() transport.Event {
		t.Helper()
		select {
		case e := <-got:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10s")
		}
		return transport.Event{}
	}
	for _, want := range []transport.Event{
		{Kind: transport.EventExists, Node: "alpha"},
		{Kind: transport.EventExists, Node: "alpha", Volume: "vol0", New: "Primary"},
		{Kind: transport.EventExists, Node: "alpha", Volume: "vol0", Peer: "beta", New: "Connected"},
		{Kind: transport.EventExistsEnd, Node: "alpha"},
	} {
		e := next()
		if e.Kind != want.Kind || e.Node != want.Node || e.Volume != want.Volume || e.Peer != want.Peer || e.New != want.New || e.Message == "" || e.Time.IsZero() {
			t.Fatalf("state line %+v, want %+v with a message", e, want)
		}
	}
	c.vol("alpha").setAdminDown(true)
	for {
		if e := next(); e.Kind != transport.EventExists && e.Seq != 0 {
			return // a live event, recorded
		}
	}
}
