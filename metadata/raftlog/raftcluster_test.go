package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestRaftClusterOnRaftStore runs three raft nodes in one process, each
// with a RaftStore for its log and stable state and a file snapshot store:
// they bootstrap and elect a leader, commands are applied, one follower
// snapshots (compacting its log through DeleteRange), is stopped while more
// commands commit, and restarts from its files alone: it must find its
// state, catch up, and hold the same state machine as the others.
func TestRaftClusterOnRaftStore(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b", "node-c")
	for _, n := range c.nodes {
		c.start(t, n, true)
	}
	for i := range 20 {
		c.apply(t, fmt.Sprintf("cmd-%d", i))
	}

	var follower *testRaftNode
	for _, n := range c.nodes {
		if n != c.waitLeader(t) {
			follower = n
			break
		}
	}
	c.waitFor(t, "the follower applies the first 20 commands", func() bool { return len(follower.fsm.items()) == 20 })
	if err := follower.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	first, err := follower.store.FirstIndex()
	if err != nil || first <= 1 {
		t.Fatalf("after a snapshot with 5 trailing logs, the follower's log starts at %d (%v): not compacted", first, err)
	}
	termBefore := follower.raft.CurrentTerm()
	lastBefore, err := follower.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	c.stop(t, follower)
	// What the follower's files hold, as its next start finds them.
	s, err := OpenRaftStore(filepath.Join(follower.dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	last, _ := s.LastIndex()
	term, err := s.GetUint64([]byte("CurrentTerm"))
	if last != lastBefore || term != termBefore || err != nil {
		t.Fatalf("stored after stop: last index %d, term %d (%v); raft had %d and %d", last, term, err, lastBefore, termBefore)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for i := 20; i < 30; i++ {
		c.apply(t, fmt.Sprintf("cmd-%d", i))
	}
	c.start(t, follower, false)
	var want []string
	for i := range 30 {
		want = append(want, fmt.Sprintf("cmd-%d", i))
	}
	c.waitFor(t, "the restarted follower catches up", func() bool { return slices.Equal(follower.fsm.items(), want) })
	if follower.raft.CurrentTerm() < termBefore {
		t.Fatalf("the restarted follower's term went back from %d to %d", termBefore, follower.raft.CurrentTerm())
	}
	for _, n := range c.nodes {
		c.waitFor(t, string(n.id)+" holds every command", func() bool { return slices.Equal(n.fsm.items(), want) })
	}
}

// testCluster is a set of raft nodes on in-memory transports. events
// wakes waitFor: raft observations (state and leader changes) and applies
// to any node's state machine.
type testCluster struct {
	nodes  []*testRaftNode
	events chan raft.Observation
	config raft.Configuration
}

type testRaftNode struct {
	id    raft.ServerID
	dir   string
	store *RaftStore
	trans *raft.InmemTransport
	fsm   *listFSM
	raft  *raft.Raft
}

func newTestCluster(t *testing.T, ids ...string) *testCluster {
	c := &testCluster{events: make(chan raft.Observation, 256)}
	for _, id := range ids {
		n := &testRaftNode{id: raft.ServerID(id), dir: filepath.Join(t.TempDir(), id)}
		c.nodes = append(c.nodes, n)
		c.config.Servers = append(c.config.Servers, raft.Server{Suffrage: raft.Voter, ID: n.id, Address: raft.ServerAddress(id)})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.raft != nil {
				c.stop(t, n)
			}
		}
	})
	return c
}

// start opens n's stores and starts its raft, bootstrapping a new node
// with the cluster's configuration; a restarted node must find its state.
func (c *testCluster) start(t *testing.T, n *testRaftNode, bootstrap bool) {
	t.Helper()
	var err error
	if n.store, err = OpenRaftStore(filepath.Join(n.dir, "raft.db")); err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(n.dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, n.trans = raft.NewInmemTransport(raft.ServerAddress(n.id))
	for _, m := range c.nodes {
		if m != n && m.raft != nil {
			n.trans.Connect(m.trans.LocalAddr(), m.trans)
			m.trans.Connect(n.trans.LocalAddr(), n.trans)
		}
	}
	conf := raft.DefaultConfig()
	conf.LocalID = n.id
	conf.HeartbeatTimeout = 300 * time.Millisecond
	conf.ElectionTimeout = 300 * time.Millisecond
	conf.LeaderLeaseTimeout = 150 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.TrailingLogs = 5
	conf.SnapshotThreshold = 1 << 20 // only the test's own snapshot
	conf.LogOutput, conf.LogLevel = io.Discard, "ERROR"

	existing, err := raft.HasExistingState(n.store, n.store, snaps)
	if err != nil {
		t.Fatal(err)
	}
	if existing == bootstrap {
		t.Fatalf("%s: existing state %v, bootstrapping %v", n.id, existing, bootstrap)
	}
	if bootstrap {
		if err := raft.BootstrapCluster(conf, n.store, n.store, snaps, n.trans, c.config); err != nil {
			t.Fatal(err)
		}
	}
	n.fsm = &listFSM{events: c.events}
	if n.raft, err = raft.NewRaft(conf, n.fsm, n.store, n.store, snaps, n.trans); err != nil {
		t.Fatal(err)
	}
	n.raft.RegisterObserver(raft.NewObserver(c.events, false, nil))
}

// stop shuts n's raft down and closes its store, as a node process exit;
// the others lose their connection to it.
func (c *testCluster) stop(t *testing.T, n *testRaftNode) {
	t.Helper()
	if err := n.raft.Shutdown().Error(); err != nil {
		t.Error(err)
	}
	n.raft = nil
	for _, m := range c.nodes {
		if m != n && m.trans != nil {
			m.trans.Disconnect(n.trans.LocalAddr())
		}
	}
	if err := n.store.Close(); err != nil {
		t.Error(err)
	}
}

// waitFor waits until cond holds, re-checking it at each raft observation
// or state machine apply, for at most 10 s.
func (c *testCluster) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-c.events:
		case <-deadline.C:
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// waitLeader waits until one node leads and every running node knows it.
func (c *testCluster) waitLeader(t *testing.T) *testRaftNode {
	t.Helper()
	var leader *testRaftNode
	c.waitFor(t, "a leader is elected", func() bool {
		leader = nil
		for _, n := range c.nodes {
			if n.raft != nil && n.raft.State() == raft.Leader {
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range c.nodes {
			if n.raft == nil {
				continue
			}
			if _, id := n.raft.LeaderWithID(); id != leader.id {
				return false
			}
		}
		return true
	})
	return leader
}

// apply applies cmd through the leader, again through the next one if
// leadership moves meanwhile (a loaded machine can starve heartbeats):
// the state machine ignores a command it holds already, since a lost
// leadership leaves the outcome unknown.
func (c *testCluster) apply(t *testing.T, cmd string) {
	t.Helper()
	for range 5 {
		err := c.waitLeader(t).raft.Apply([]byte(cmd), 5*time.Second).Error()
		switch {
		case err == nil:
			return
		case !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost):
			t.Fatalf("apply %s: %v", cmd, err)
		}
		t.Logf("apply %s: %v; again through the next leader", cmd, err)
	}
	t.Fatalf("apply %s: leadership kept moving", cmd)
}

// listFSM is a state machine that records the commands applied, in order,
// each once.
type listFSM struct {
	events chan<- raft.Observation
	mu     sync.Mutex
	list   []string
}

func (f *listFSM) notify() {
	select {
	case f.events <- raft.Observation{Data: "applied"}:
	default: // the waiter has wake-ups pending already
	}
}

func (f *listFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	if cmd := string(l.Data); !slices.Contains(f.list, cmd) {
		f.list = append(f.list, cmd)
	}
	f.mu.Unlock()
	f.notify()
	return nil
}

func (f *listFSM) items() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.list)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) { return listSnapshot(f.items()), nil }

func (f *listFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var list []string
	if err := json.NewDecoder(rc).Decode(&list); err != nil {
		return err
	}
	f.mu.Lock()
	f.list = list
	f.mu.Unlock()
	f.notify()
	return nil
}

type listSnapshot []string

func (s listSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode([]string(s)); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (listSnapshot) Release() {}
