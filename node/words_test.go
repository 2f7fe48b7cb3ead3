package node

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

func rawGRPC(s string) bool {
	return strings.Contains(s, "rpc error") || strings.Contains(s, "desc =") || strings.Contains(s, "Error while dialing")
}

// TestAStoppedNodeIsReportedInWords: with beta stopped, status says why in
// words that name it ("cannot reach beta at ADDR: connection refused"),
// with error_code refused; alpha's note on beta's replica and its
// peer-lost event say the same, with no gRPC text anywhere.
func TestAStoppedNodeIsReportedInWords(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	beta, _ := c.cfg.Node("beta")
	st := c.status()
	for _, n := range st.Nodes {
		if n.Name != "beta" {
			continue
		}
		want := "cannot reach beta at " + beta.Control + ": connection refused"
		if !strings.HasPrefix(n.Error, want) || n.ErrorCode != transport.ReachRefused {
			t.Errorf("stopped beta: error %q (%s), want %q... (refused)", n.Error, n.ErrorCode, want)
		}
	}
	eventually(t, func() bool {
		return strings.HasPrefix(replica(c.status(), "beta").Reason, "cannot reach beta at "+beta.Replication+": connection refused")
	}, "beta's replica noted unreachable in words: "+replica(c.status(), "beta").Reason)
	evs, err := c.nodes["alpha"].store.Events(100)
	if err != nil {
		t.Fatal(err)
	}
	lost := false
	for _, e := range evs {
		if rawGRPC(e.Message) {
			t.Errorf("an event in gRPC's words: %+v", e)
		}
		lost = lost || (e.Kind == "peer-lost" && strings.Contains(e.Message, "cannot reach beta at"))
	}
	if !lost {
		t.Errorf("no peer-lost event saying beta cannot be reached: %+v", evs)
	}
}

// TestProbeTellsAStoppedNodeFromAHungOne: a node gossip reports gone is
// not asked for its status; a look at its control port tells a stopped
// node (nothing listens) from a hung or paused one (the kernel still
// accepts its connections).
func TestProbeTellsAStoppedNodeFromAHungOne(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hung := l.Addr().String()
	defer l.Close()
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stopped := l2.Addr().String()
	l2.Close()
	if code, why := probeControl(context.Background(), hung); code != transport.ReachNoAnswer || !strings.Contains(why, "hung or paused") {
		t.Errorf("probe of a hung node: %s, %q", code, why)
	}
	if code, why := probeControl(context.Background(), stopped); code != transport.ReachRefused || !strings.Contains(why, "not running") {
		t.Errorf("probe of a stopped node: %s, %q", code, why)
	}
}

// TestEventsSayBytesInWordsAndTheStateBefore: the first sync's events
// read "4.0MiB out of sync on beta" and "finished: 4.0MiB in", not raw
// byte counts, the connect names the state it left, and says what it did
// and why in words ("resynced all of it, as its copy was new"), the
// generation rule's name being its reason, not its message.
func TestEventsSayBytesInWordsAndTheStateBefore(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	var connected, done bool
	eventually(t, func() bool {
		evs, err := c.nodes["alpha"].store.Events(100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			switch e.Kind {
			case "connected":
				// What the connection did, and why, in words; the rule's
				// name is the reason.
				connected = e.Peer == "beta" && strings.Contains(e.Message, "beta connected: resynced all of it, as its copy was new; 4.0MiB out of sync on beta, 0B on alpha") &&
					!strings.Contains(e.Message, "rule") && e.Reason == replication.RuleJustCreatedPeer && e.Old != "" && e.New == "SyncSource"
				if !connected {
					t.Logf("connected: %+v", e)
				}
			case "resync-done":
				done = strings.Contains(e.Message, "resync to beta finished: 4.0MiB in ")
			}
		}
		return connected && done
	}, "the first sync's events in words")
}
