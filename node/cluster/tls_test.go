package cluster

import (
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/testport"
	"github.com/replvol/replvol/replication"
)

// count is how many of lines contain every one of words.
func count(lines []string, words ...string) int {
	n := 0
	for _, l := range lines {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

var logTime = regexp.MustCompile(`^time=\S+ `)

// requireLoggedOnce fails when a refusal of the raft TLS layer, or a
// gossip warning, was logged twice from one host: each is logged once per
// peer and cause, not at every retry.
func requireLoggedOnce(t *testing.T, node string, lines []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range lines {
		if !strings.Contains(l, `msg="raft: `) && !strings.Contains(l, "module=gossip") {
			continue
		}
		key := portless(logTime.ReplaceAllString(l, ""))
		if seen[key] {
			t.Errorf("%s logged twice: %s", node, l)
		}
		seen[key] = true
	}
}

// TestRaftOverTLSElectsAndCommits: with the cluster's certificates raft
// runs over mutual TLS 1.3: the nodes elect a leader and commit, although
// connections that never start their handshake sit on every node's raft
// port (a handshake runs beside raft's accept loop, never in it). A
// plaintext raft RPC gets no answer, and the refusal is logged once.
func TestRaftOverTLSElectsAndCommits(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.withTLS()
	for _, m := range n.initial {
		for range 8 { // 8 s of stalled handshakes, were they serial
			c, err := net.Dial("tcp", m.Raft)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}
	n.startAll()
	leader := n.waitLeader(t)
	follower := n.follower(t, leader)
	ctx := testContext(t, 5*time.Second)
	va, err := follower.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"}))
	if err != nil {
		t.Fatalf("a proposal through %s: %v", follower.self, err)
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" applies the proposal", 2*time.Second, func() bool {
			got, ok := c.Authority().Volume("vol")
			return ok && reflect.DeepEqual(got, va)
		})
	}

	plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	addr := raft.ServerAddress(n.members[leader.self].Raft)
	for range 2 {
		var resp raft.AppendEntriesResponse
		req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(plain.LocalAddr())}, Term: 1}
		if err := plain.AppendEntries(raft.ServerID(leader.self), addr, req, &resp); err == nil {
			t.Fatalf("%s answered a plaintext raft RPC: %+v", leader.self, resp)
		}
	}
	waitFor(t, leader.self+" logs the plaintext client", 2*time.Second, func() bool {
		return count(n.logsOf(leader.self), "raft: refused a connection: a node at 127.0.0.1 does not speak TLS") == 1
	})
	requireLoggedOnce(t, leader.self, n.logsOf(leader.self))
}

// TestAStrangersNodeCannotJoin: a node started as w with a certificate of
// another CA and that CA's gossip key, at w's addresses, is no member:
// a and b elect and commit without it, it never hears of a leader, gossip
// never counts it alive, and it cannot vote: with b stopped, a is alone
// and leads nobody. Each refusal is logged once, in words.
func TestAStrangersNodeCannotJoin(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.withTLS()
	n.stranger("w")
	n.startAll()
	a, b, w := n.node("a"), n.node("b"), n.node("w")
	waitFor(t, "a and b agree on a leader", 5*time.Second, func() bool {
		sa, sb := a.Status(), b.Status()
		return sa.Quorum && sb.Quorum && sa.Leader != "" && sa.Leader == sb.Leader
	})
	ctx := testContext(t, 5*time.Second)
	if _, err := a.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatalf("a and b commit without w: %v", err)
	}
	waitFor(t, "b applies the commit", 2*time.Second, func() bool {
		_, ok := b.Authority().Volume("vol")
		return ok
	})
	// Rounds of raft retries and gossip rejoins go by.
	time.Sleep(10 * testTiming.RejoinInterval)
	if s := w.Status(); s.Leader != "" || s.Quorum {
		t.Fatalf("the stranger hears of a leader: %+v", s)
	}
	if _, ok := w.Authority().Volume("vol"); ok {
		t.Fatal("the stranger received the state machine")
	}
	for _, c := range []*Cluster{a, b} {
		for _, m := range c.Status().Members {
			if m.Name == "w" && m.State == Alive {
				t.Fatalf("%s's gossip counts the stranger alive", c.self)
			}
		}
	}
	for _, m := range w.Status().Members {
		if m.Name != "w" && m.State == Alive {
			t.Fatalf("the stranger's gossip counts %s alive", m.Name)
		}
	}

	n.stop("b")
	waitFor(t, "a, left with the stranger, loses its quorum", 5*time.Second, func() bool { return !a.Status().Quorum })
	time.Sleep(10 * testTiming.ElectionTimeout)
	if s := a.Status(); s.Leader != "" && s.Quorum {
		t.Fatalf("a and the stranger elected a leader: %+v", s)
	}

	logs := n.logsOf("a")
	if count(logs, "raft: w at "+n.members["w"].Raft+" presented a certificate of another CA: node w (serial ", "not signed by this cluster's CA") != 1 {
		t.Errorf("a did not log once that w presented another CA's certificate:\n%s", strings.Join(logs, "\n"))
	}
	if count(logs, "module=gossip") == 0 {
		t.Errorf("a logged nothing of the stranger's gossip:\n%s", strings.Join(logs, "\n"))
	}
	requireLoggedOnce(t, "a", logs)
}

// TestANodeAddedAtRuntimeIsReachedOverTLS: d, added at runtime, has a
// raft address that no other node's cluster file names: a leader that did
// not add it accepts any node's certificate there, and says which it was.
// It replicates to d over TLS.
func TestANodeAddedAtRuntimeIsReachedOverTLS(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.logLevel = slog.LevelInfo
	d := n.defineSpare(member("d"))
	n.withTLS()
	n.startAll()
	leader := n.waitLeader(t)
	dc := n.start("d")
	if _, err := leader.AddVoter(testContext(t, 5*time.Second), d); err != nil {
		t.Fatalf("add d: %v", err)
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" counts d a voter", 5*time.Second, func() bool {
			return slices.Equal(c.Status().Voters, []string{"a", "b", "d", "w"})
		})
	}
	// To a node that did not add d (a loaded machine may elect another
	// leader meanwhile: then from that one).
	var next *Cluster
	for try := 0; ; try++ {
		next = nil
		for _, c := range n.nodes() {
			if c != leader && c != dc {
				next = c
			}
		}
		err := leader.TransferLeadership(testContext(t, 5*time.Second), next.self)
		if err != nil && (!errors.Is(err, errNotLeader) || try == 5) {
			t.Fatalf("transfer leadership to %s: %v", next.self, err)
		}
		// A loaded machine may elect another leader right after the
		// transfer: then it is made again.
		if err == nil && within(5*time.Second, 10*time.Millisecond, func() bool { return next.raft.State() == raft.Leader }) {
			break
		}
		if try == 5 {
			t.Fatalf("%s does not lead after 6 transfers of the leadership to it", next.self)
		}
		leader = n.waitLeader(t)
	}
	if _, err := next.Propose(testContext(t, 5*time.Second), replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatalf("a proposal through %s: %v", next.self, err)
	}
	waitFor(t, "d applies it", 5*time.Second, func() bool {
		_, ok := dc.Authority().Volume("vol")
		return ok
	})
	if got := count(n.logsOf(next.self), "an address in no cluster file", "address="+d.Raft, `certificate="node d"`); got != 1 {
		t.Fatalf("%s logged d's certificate %d times, want once:\n%s", next.self, got, strings.Join(n.logsOf(next.self), "\n"))
	}
}

// TestGossipCountsOnlyTheClustersNodes: a process with the cluster's
// gossip key (every node holds it) gossips as "mallory": no node counts
// mallory a member, and each logs the refusal once. The key names no
// node, so the name is all gossip can bind; what gossip says decides
// nothing alone (node/failover's watch).
func TestGossipCountsOnlyTheClustersNodes(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.withTLS()
	n.startAll()
	n.waitLeader(t)
	host, port, err := net.SplitHostPort(testport.Pick(t, true))
	if err != nil {
		t.Fatal(err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name, mc.Label = "mallory", "replvol"
	mc.BindAddr = host
	if mc.BindPort, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	mc.AdvertisePort = mc.BindPort
	mc.SecretKey, mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = n.keys["a"], true, true
	mc.Logger = log.New(io.Discard, "", 0)
	mallory, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mallory.Shutdown() })
	var addrs []string
	for _, m := range n.initial {
		addrs = append(addrs, m.Gossip)
	}
	if joined, err := mallory.Join(addrs); err != nil || joined != len(addrs) {
		t.Fatalf("mallory reached %d of the nodes' gossip: %v", joined, err)
	}
	listed := func(c *Cluster) bool {
		for _, m := range c.Status().Members {
			if m.Name == "mallory" {
				return true
			}
		}
		return false
	}
	refusal := `memberlist: ignoring alive message for 'mallory': \"mallory\" is no node of this cluster`
	for _, c := range n.nodes() {
		waitFor(t, c.self+" takes or refuses mallory", 5*time.Second, func() bool {
			return listed(c) || count(n.logsOf(c.self), refusal) > 0
		})
	}
	// Gossip rounds go by: mallory announces itself again and again.
	time.Sleep(5 * testTiming.RejoinInterval)
	for _, c := range n.nodes() {
		if listed(c) {
			t.Errorf("%s counts mallory a member: %+v", c.self, c.Status().Members)
		}
		if got := count(n.logsOf(c.self), refusal); got != 1 {
			t.Errorf("%s logged the refusal of mallory %d times, want once:\n%s", c.self, got, strings.Join(n.logsOf(c.self), "\n"))
		}
	}
}
