package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/internal/poll"
	"github.com/replvol/replvol/internal/testport"
)

// testTiming is tuned for loopback: raft notices a lost leader within
// 300–600 ms, memberlist a dead node within about 1 s, and a lease lasts
// 600 ms so that the lease tests stay quick.
var testTiming = Timing{
	HeartbeatTimeout:   300 * time.Millisecond,
	ElectionTimeout:    300 * time.Millisecond,
	LeaderLeaseTimeout: 150 * time.Millisecond,
	RaftIOTimeout:      time.Second,
	LeaseDuration:      600 * time.Millisecond,
	RejoinInterval:     300 * time.Millisecond,
}

var errPartitioned = errors.New("test network: partitioned")

// testNet runs Clusters in this process on 127.0.0.1. Raft's streams and
// the forwarded requests pass through it, so it can cut a node off from
// the others (gossip is not cut: tests that need a node gone for gossip
// stop it).
type testNet struct {
	t        *testing.T
	forwards atomic.Int64

	mu       sync.Mutex
	members  map[string]Member
	initial  []Member // the cluster file every bootstrapping node gets
	dirs     map[string]string
	running  map[string]*Cluster
	links    map[string]*fault.Link // each node's raft connections
	byRaft   map[string]string      // raft address → node name
	spare    map[string]bool        // added at runtime: NoBootstrap
	listened map[string]net.Listener
	// With withTLS: each node's certificate and gossip key; logs keeps
	// what each node logged at WARN and above.
	tls  map[string]*pki.Bundle
	keys map[string][]byte
	logs map[string]*testLogWriter
	// logLevel is the least level logged (default WARN).
	logLevel slog.Level
	// clock, when set before a node starts, is its Config.Clock.
	clock clock.Clock
	// timing is what a node starts with (testTiming unless a test sets
	// another before it starts the nodes).
	timing Timing
	// reply, when set, is given every forwarded request's reply (as the
	// leader sent it) and returns the reply its sender receives: a fault
	// of the way back.
	reply func(req ForwardRequest, r ForwardReply) ForwardReply
}

func member(name string) Member  { return Member{Name: name} }
func witness(name string) Member { return Member{Name: name, Witness: true} }

func newTestNet(t *testing.T, members ...Member) *testNet {
	n := &testNet{
		t: t, members: map[string]Member{}, dirs: map[string]string{}, running: map[string]*Cluster{},
		links: map[string]*fault.Link{}, byRaft: map[string]string{},
		spare: map[string]bool{}, listened: map[string]net.Listener{},
		tls: map[string]*pki.Bundle{}, keys: map[string][]byte{}, logs: map[string]*testLogWriter{},
		logLevel: slog.LevelWarn, timing: testTiming,
	}
	for _, m := range members {
		n.initial = append(n.initial, n.define(m))
	}
	t.Cleanup(n.stopAll)
	return n
}

// define picks the member's addresses and state directory.
func (n *testNet) define(m Member) Member {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.t.Fatal(err)
	}
	m.Raft, m.Gossip = ln.Addr().String(), testport.Pick(n.t, true)
	dir := filepath.Join(n.t.TempDir(), m.Name)
	// A spare is defined while the others run: their raft dials read
	// byRaft (faultLayer.Dial) under n.mu.
	n.mu.Lock()
	defer n.mu.Unlock()
	n.members[m.Name] = m
	n.listened[m.Name] = ln
	n.byRaft[m.Raft] = m.Name
	n.dirs[m.Name] = dir
	return m
}

// defineSpare adds a member that is in no one's cluster file: it starts
// with NoBootstrap and joins through AddVoter.
func (n *testNet) defineSpare(m Member) Member {
	m = n.define(m)
	n.mu.Lock()
	n.spare[m.Name] = true
	n.mu.Unlock()
	return m
}

func (n *testNet) start(name string) *Cluster {
	n.t.Helper()
	n.mu.Lock()
	m := n.members[name]
	ln := n.listened[name]
	delete(n.listened, name)
	members := n.initial
	if n.spare[name] {
		members = append(append([]Member{}, n.initial...), m)
	}
	n.mu.Unlock()
	if ln == nil { // a restart: the same address again
		var err error
		if ln, err = net.Listen("tcp", m.Raft); err != nil {
			n.t.Fatalf("listen again on %s: %v", m.Raft, err)
		}
	}
	link := n.link(name)
	layer := &faultLayer{Listener: link.Listen(ln), net: n, name: name, link: link}
	n.mu.Lock()
	logs := n.logs[name]
	if logs == nil {
		logs = newTestLogWriter(n.t)
		logs.level = n.logLevel
		n.logs[name] = logs
	}
	bundle, key, timing := n.tls[name], n.keys[name], n.timing
	dir, spare := n.dirs[name], n.spare[name]
	n.mu.Unlock()
	c, err := Open(Config{
		Self: name, Members: members, Dir: dir, Logger: logs.logger(),
		RaftListener: layer, Forward: n.forwarder(name), NoBootstrap: spare, Timing: timing,
		TLS: bundle, GossipKey: key, Clock: n.clock,
	})
	if err != nil {
		n.t.Fatalf("open %s: %v", name, err)
	}
	n.mu.Lock()
	n.running[name] = c
	n.mu.Unlock()
	return c
}

func (n *testNet) startAll() {
	for _, m := range n.initial {
		n.start(m.Name)
	}
}

// stop closes the node as a crash would.
func (n *testNet) stop(name string) {
	n.t.Helper()
	n.mu.Lock()
	c := n.running[name]
	delete(n.running, name)
	n.mu.Unlock()
	if err := c.Close(); err != nil {
		n.t.Errorf("close %s: %v", name, err)
	}
}

func (n *testNet) stopAll() {
	n.mu.Lock()
	var names []string
	for name := range n.running {
		names = append(names, name)
	}
	n.mu.Unlock()
	for _, name := range names {
		n.stop(name)
	}
}

func (n *testNet) node(name string) *Cluster {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running[name]
}

func (n *testNet) nodes() []*Cluster {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*Cluster
	for _, c := range n.running {
		out = append(out, c)
	}
	return out
}

// link is the fault.Link of the node's raft connections.
func (n *testNet) link(name string) *fault.Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[name]
	if l == nil {
		l = fault.NewLink()
		n.links[name] = l
	}
	return l
}

// partition cuts the node off (also before it starts): its raft
// connections close, no new one opens, and forwarded requests from or to
// it fail.
func (n *testNet) partition(name string) { n.link(name).Cut() }

func (n *testNet) heal(name string) { n.link(name).Heal() }

func (n *testNet) isCut(names ...string) bool {
	for _, name := range names {
		if name != "" && n.link(name).Partitioned() {
			return true
		}
	}
	return false
}

func (n *testNet) forwarder(from string) Forwarder {
	return func(ctx context.Context, leader string, req ForwardRequest) (ForwardReply, error) {
		if n.isCut(from, leader) {
			return ForwardReply{}, errPartitioned
		}
		c := n.node(leader)
		if c == nil {
			return ForwardReply{}, fmt.Errorf("test network: %s is not running", leader)
		}
		n.forwards.Add(1)
		r := c.HandleForward(ctx, req)
		n.mu.Lock()
		fault := n.reply
		n.mu.Unlock()
		if fault != nil {
			r = fault(req, r)
		}
		return r, nil
	}
}

// waitLeader waits until every running node names the same running
// leader with a quorum, and returns it. An election under a flood of
// strangers on a loaded machine took more than 5 s: it gets 15.
func (n *testNet) waitLeader(t *testing.T) *Cluster {
	t.Helper()
	return n.waitLeaderWithin(t, 15*time.Second)
}

// waitLeaderWithin is waitLeader with another deadline.
func (n *testNet) waitLeaderWithin(t *testing.T, timeout time.Duration) *Cluster {
	t.Helper()
	var leader *Cluster
	waitFor(t, "one leader every running node agrees on", timeout, func() bool {
		leader = nil
		var name string
		for _, c := range n.nodes() {
			s := c.Status()
			if s.Leader == "" || !s.Quorum || (name != "" && s.Leader != name) {
				return false
			}
			name = s.Leader
		}
		leader = n.node(name)
		return leader != nil && leader.raft.State() == raft.Leader
	}, n.raftViews)
	return leader
}

// raftViews is how each running node sees raft, in words: its state,
// term, leader, last contact and, with TLS, its raft port's admission.
func (n *testNet) raftViews() string {
	var out []string
	for _, c := range n.nodes() {
		s := c.Status()
		contact := "never"
		if last := c.raft.LastContact(); !last.IsZero() {
			contact = time.Since(last).Round(time.Millisecond).String() + " ago"
		}
		v := fmt.Sprintf("%s: %s term %d, leader %q, quorum %v, last contact %s", c.self, c.raft.State(), c.raft.CurrentTerm(),
			s.Leader, s.Quorum, contact)
		if st, ok := c.RaftAdmission(); ok {
			v += fmt.Sprintf("; raft port: %+v, refused %d", st, st.Refused())
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// follower returns a running node that is not the leader.
func (n *testNet) follower(t *testing.T, leader *Cluster) *Cluster {
	t.Helper()
	for _, c := range n.nodes() {
		if c != leader {
			return c
		}
	}
	t.Fatal("no follower running")
	return nil
}

// waitFor polls cond, a condition on state the code under test changes,
// every 2 ms until it holds or timeout passes. A failure adds what each
// of why says (the state that tells why it did not hold).
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool, why ...func() string) {
	t.Helper()
	if !within(timeout, 2*time.Millisecond, cond) {
		var more []string
		for _, w := range why {
			more = append(more, w())
		}
		t.Fatalf("%s: not within %v\n%s", what, timeout, strings.Join(more, "\n"))
	}
}

// within calls cond every interval until it holds or timeout has passed,
// and reports whether it held: the package's one polling loop (waitFor's,
// and that of a wait whose caller says itself what a timeout means).
func within(timeout, interval time.Duration, cond func() bool) bool {
	return poll.Within(timeout, interval, cond)
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// faultLayer is a node's raft stream layer (net.Listener and Dial) on
// the node's fault.Link: a cut of the link closes the connections it had
// and refuses every new one from or to the node.
type faultLayer struct {
	net.Listener
	net  *testNet
	name string
	link *fault.Link
}

func (l *faultLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	l.net.mu.Lock()
	to := l.net.byRaft[string(addr)]
	l.net.mu.Unlock()
	if l.net.isCut(l.name, to) {
		return nil, errPartitioned
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return l.link.Conn(c), nil
}

// withTLS gives every member defined so far a certificate of one new CA
// (replctl certs init) and its gossip key: raft runs over TLS and gossip
// is encrypted.
func (n *testNet) withTLS() {
	n.mu.Lock()
	var names []string
	for name := range n.members {
		names = append(names, name)
	}
	n.mu.Unlock()
	n.issue(names)
}

// withTLSAnd is withTLS, and gives the CA's certificates also to the
// outsiders: nodes of no cluster file, which never start. It returns the
// bundle of each outsider and of the operator (by name, "operator").
func (n *testNet) withTLSAnd(outsiders ...string) map[string]*pki.Bundle {
	n.mu.Lock()
	var names []string
	for name := range n.members {
		names = append(names, name)
	}
	n.mu.Unlock()
	dir := n.issue(names, outsiders...)
	out := map[string]*pki.Bundle{}
	for _, name := range append(outsiders, "operator") {
		b, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile(name)), filepath.Join(dir, pki.KeyFile(name)))
		if err != nil {
			n.t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

// stranger gives the named members certificates of another CA, and that
// CA's gossip key: nodes of another cluster at the members' addresses.
func (n *testNet) stranger(names ...string) { n.issue(names) }

// issue makes a new CA, gives the named members its certificates and
// gossip key, writes certificates for the outsiders too, and returns the
// directory of the files.
func (n *testNet) issue(names []string, outsiders ...string) string {
	dir := n.t.TempDir()
	var hs []pki.Holder
	for _, name := range append(slices.Clone(names), outsiders...) {
		hs = append(hs, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: name}, Hosts: []string{"127.0.0.1"}})
	}
	if _, err := pki.Init(dir, hs, false); err != nil {
		n.t.Fatal(err)
	}
	key, err := pki.LoadGossipKey(filepath.Join(dir, pki.GossipFile))
	if err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		b, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile(name)), filepath.Join(dir, pki.KeyFile(name)))
		if err != nil {
			n.t.Fatal(err)
		}
		n.tls[name], n.keys[name] = b, key
	}
	return dir
}

// logsOf is what the node logged at logLevel and above.
func (n *testNet) logsOf(name string) []string {
	n.mu.Lock()
	w := n.logs[name]
	n.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.lines()
}

// newTestLogWriter logs warnings and errors to the test's log, until the
// test ends (raft's goroutines may log a little after Close), and keeps
// them.
func newTestLogWriter(t *testing.T) *testLogWriter {
	w := &testLogWriter{t: t, level: slog.LevelWarn}
	t.Cleanup(w.stop)
	return w
}

func (w *testLogWriter) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: w.level}))
}

type testLogWriter struct {
	level   slog.Level
	mu      sync.Mutex
	t       *testing.T
	stopped bool
	kept    []string
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	line := strings.TrimRight(string(p), "\n")
	w.kept = append(w.kept, line)
	if !w.stopped {
		w.t.Log(line)
	}
	return len(p), nil
}

func (w *testLogWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.kept)
}

func (w *testLogWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}
