package main

// Unit tests of what replctl shows scripts and operators (issue 15).

import (
	"bytes"
	"container/heap"
	"os"
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

// TestEventLinesNeverShowAnEmptyState: a state change reads "A -> B", the
// first state seen "-> B" (never " -> B" after an empty old state), an
// unchanged one "B".
func TestEventLinesNeverShowAnEmptyState(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 4, 5, 0, time.Local)
	for _, tc := range []struct {
		name     string
		old, new string
		want     string
	}{
		{"a change", "Connecting", "SyncSource", "peer beta: Connecting -> SyncSource: beta connected"},
		{"the first state seen", "", "SyncSource", "peer beta: -> SyncSource: beta connected"},
		{"no change", "Connecting", "Connecting", "peer beta: Connecting: beta connected"},
		{"no state", "", "", "peer beta: beta connected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := formatEvent(&transport.Event{Time: at, Node: "alpha", Volume: "vol0", Kind: "connected", Peer: "beta", Old: tc.old, New: tc.new, Message: "beta connected"}, palette{})
			if !strings.HasSuffix(line, tc.want) || strings.Contains(line, ":  ->") {
				t.Errorf("formatEvent = %q, want it to end in %q", line, tc.want)
			}
		})
	}
}

// TestStateLinesKeepTheirOrderWhenMerged: a node's state lines share one
// time; merged with other nodes' (--all) they keep the order the node sent
// them in, its exists-end last.
func TestStateLinesKeepTheirOrderWhenMerged(t *testing.T) {
	var out, errOut bytes.Buffer
	f := &eventFollower{out: &out, errOut: &errOut}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var h eventHeap
	var want []string
	for _, node := range []string{"alpha", "beta"} {
		for _, line := range []struct{ kind, volume, peer, msg string }{
			{transport.EventExists, "", "", "node " + node},
			{transport.EventExists, "vol0", "", "the volume on " + node},
			{transport.EventExists, "vol0", "gamma", "a peer of " + node},
			{transport.EventExistsEnd, "", "", "the end of " + node},
		} {
			heap.Push(&h, f.pending(&transport.Event{Time: at, Node: node, Kind: line.kind, Volume: line.volume, Peer: line.peer, Message: line.msg}))
			want = append(want, line.msg)
		}
	}
	f.drain(make(chan *transport.Event), &h)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		for _, w := range want {
			if strings.HasSuffix(l, w) {
				got = append(got, w)
			}
		}
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("merged state lines:\n%s\nwant in the order %q", out.String(), want)
	}
}

// TestReadmeStatusSampleMatchesTheOutput: the README's `replctl status`
// sample is what replctl prints for the demo's cluster (two nodes in sync,
// failover off), so a change of the format must update it.
func TestReadmeStatusSampleMatchesTheOutput(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The whole sample; excerpts (starting "...") elsewhere are skipped.
	const head = "```\n$ replctl status\n"
	sample := ""
	for rest := string(readme); sample == ""; {
		i := strings.Index(rest, head)
		if i < 0 {
			t.Fatal("the README has no whole replctl status sample")
		}
		rest = rest[i+len(head):]
		if !strings.HasPrefix(rest, "...\n") {
			sample = rest[:strings.Index(rest, "```\n")]
		}
	}

	now := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	st := &transport.ClusterStatus{
		From:    "alpha",
		Cluster: transport.ClusterInfo{Failover: "off", Reason: "no raft/gossip addresses in the config: primaries change by replctl primary (switchover or --force)"},
		Nodes: []transport.NodeInfo{
			{Name: "alpha", Control: "127.0.0.1:7800", NBD: "127.0.0.1:7802", Alive: true, Role: "data"},
			{Name: "beta", Control: "127.0.0.1:7803", NBD: "127.0.0.1:7805", Alive: true, Role: "data"},
		},
		Volumes: []transport.VolumeStatus{{
			Name: "vol0", Size: 1 << 30, Protocol: "C", Primary: "alpha", Epoch: 1, NBDURI: "nbd://127.0.0.1:7802/vol0",
			Replicas: []transport.ReplicaStatus{
				{Node: "alpha", Role: "Primary", Disk: "UpToDate", Replication: "Connected", Reachable: true, SyncProgress: 100},
				{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "Connected", Reachable: true, SyncProgress: 100,
					LastResyncBytes: 1 << 30, LastResyncSeconds: 0.4, LastResyncEnded: now.Add(-23 * time.Second),
					SyncRule: "just-created-peer", SyncDecision: "source-set-bitmap"},
			},
		}},
	}
	var out bytes.Buffer
	printStatus(&out, st, palette{}, now)
	if out.String() != sample {
		t.Fatalf("the README's status sample:\n%s\nreplctl prints:\n%s", sample, out.String())
	}
}
