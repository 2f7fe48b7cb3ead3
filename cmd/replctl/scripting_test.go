package main

// Unit tests of what replctl shows scripts and operators (issue 15).

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestStatusTellsAStoppedNodeFromAHungOne: the node table says a node
// whose port refuses connections is not running, and one that accepts
// them but answers nothing (SIGSTOPped, hung) is not answering.
func TestStatusTellsAStoppedNodeFromAHungOne(t *testing.T) {
	st := sampleStatus()
	st.Cluster.Voters = []string{"alpha", "beta", "witness"}
	st.Nodes = append(st.Nodes, transport.NodeInfo{Name: "witness", Role: "witness"})
	st.Nodes[1].Alive, st.Nodes[1].Membership, st.Nodes[1].ErrorCode = false, "dead", transport.ReachNoAnswer
	st.Nodes[1].Error = "not asked while gossip reports beta dead: 127.0.0.1:7803 accepts connections but the node answers nothing: is replnode hung or paused?"
	st.Nodes[2].Alive, st.Nodes[2].Membership, st.Nodes[2].ErrorCode = false, "dead", transport.ReachRefused
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{"unreachable (not answering: hung or paused?), gossip: dead", "unreachable (not running: nothing listens), gossip: dead"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	err := unreachablePeer(st, "beta")
	if err == nil || !strings.Contains(err.Error(), "hung or paused") || strings.Contains(err.Error(), "is replnode running") {
		t.Errorf("a command for the hung beta: %v", err)
	}
}
