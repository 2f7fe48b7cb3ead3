package node

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/transport"
)

// TestOneNodeReloadsAnotherProtocol: a SIGHUP on beta alone switches it
// to protocol B (through its own control API, as replnode's reloader
// does) while alpha, the primary, stays on C. beta finds the difference
// and records an event naming both values and the command that ends it;
// status, from any node, names the setting and each node's value. When
// beta is switched back, it records that they agree and status is clear.
func TestOneNodeReloadsAnotherProtocol(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	beta := c.start("beta")
	c.waitInSync()
	if st := c.status(); st.Volumes[0].SettingMismatches != nil {
		t.Fatalf("mismatches before any change: %+v", st.Volumes[0].SettingMismatches)
	}
	ctx := context.Background()
	if _, err := beta.api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Node: "beta", Protocol: "B"}); err != nil {
		t.Fatal(err)
	}
	e := waitForEvent(t, beta, "settings-mismatch", nil)
	for _, part := range []string{"protocol is B on beta but C on alpha", "replctl adjust vol0 --protocol C"} {
		if !strings.Contains(e.Message, part) {
			t.Errorf("event %q does not say %q", e.Message, part)
		}
	}
	if e.Peer != "alpha" || e.Reason != "protocol" {
		t.Errorf("event peer %q reason %q, want alpha and protocol", e.Peer, e.Reason)
	}
	for _, from := range []string{"alpha", "beta"} {
		st, err := c.nodes[from].clusterStatus(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []transport.SettingMismatch{{Setting: "protocol", Values: map[string]string{"alpha": "C", "beta": "B"}, Primary: "C"}}
		if got := st.Volumes[0].SettingMismatches; !reflect.DeepEqual(got, want) {
			t.Fatalf("status from %s: mismatches %+v, want %+v", from, got, want)
		}
	}

	if _, err := beta.api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Node: "beta", Protocol: "C"}); err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, beta, "settings-agree", func(e statefile.Event) bool { return e.Peer == "alpha" })
	if got := c.status().Volumes[0].SettingMismatches; got != nil {
		t.Fatalf("mismatches after beta is back on C: %+v", got)
	}
	// Once: a difference is recorded when it appears, not at every check.
	evs, _ := beta.store.Events(500)
	if n := countKind(evs, "settings-mismatch"); n != 1 {
		t.Fatalf("%d settings-mismatch events, want 1", n)
	}
}

// TestAnAdjustOfEveryNodeIsNoMismatch: replctl adjust without --node
// changes every node one after the other; the moment between is not
// reported as a difference.
func TestAnAdjustOfEveryNodeIsNoMismatch(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	alpha := c.start("alpha")
	beta := c.start("beta")
	c.waitInSync()
	if _, err := alpha.api.Adjust(context.Background(), &transport.AdjustRequest{Volume: "vol0", Protocol: "B"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Node{alpha, beta} {
		v := n.volumes()["vol0"]
		eventually(t, func() bool { return v.settingsChecks.Load() > 0 }, n.name+" compares its settings after the change")
	}
	for _, n := range []*Node{alpha, beta} {
		evs, _ := n.store.Events(500)
		if countKind(evs, "settings-mismatch") != 0 {
			t.Fatalf("%s reported a mismatch during an adjust of every node", n.name)
		}
	}
}

// TestHandshakeComparesSettings: beta restarts with a config whose
// after_sb differs from alpha's. Both sides of the handshake find it and
// record it, and status names each node's value; the volume still
// replicates.
func TestHandshakeComparesSettings(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	alpha := c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")

	other := *c.cfg
	other.Volumes = slices.Clone(c.cfg.Volumes)
	other.Volumes[0].AfterSB = "discard-zero-changes"
	opts := c.opts["beta"]
	opts.wrapStore = func(s stateStore) stateStore { return &faultyStore{stateStore: s} }
	beta, err := New(&other, "beta", opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := beta.Start(); err != nil {
		t.Fatal(err)
	}
	c.nodes["beta"] = beta
	c.waitInSync()
	for _, side := range []struct {
		n    *Node
		text string
	}{
		{alpha, "after_sb is disconnect on alpha but discard-zero-changes on beta"},
		{beta, "after_sb is discard-zero-changes on beta but disconnect on alpha"},
	} {
		e := waitForEvent(t, side.n, "settings-mismatch", nil)
		if !strings.Contains(e.Message, side.text) || !strings.Contains(e.Message, "restart replnode") {
			t.Errorf("%s: event %q, want it to say %q and how to end it", side.n.name, e.Message, side.text)
		}
	}
	want := []transport.SettingMismatch{{Setting: "after_sb", Values: map[string]string{"alpha": "disconnect", "beta": "discard-zero-changes"}, Primary: "disconnect"}}
	if got := c.status().Volumes[0].SettingMismatches; !reflect.DeepEqual(got, want) {
		t.Fatalf("mismatches %+v, want %+v", got, want)
	}
}

func countKind(evs []statefile.Event, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}
