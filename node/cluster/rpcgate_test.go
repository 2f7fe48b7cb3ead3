package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/replication"
)

// The rule of the raft RPC gate as a table: who an RPC says sent it,
// against the certificate of its connection, raft's voters and the
// cluster file.
func TestJudgeRaftRPC(t *testing.T) {
	node := func(name string) pki.Identity { return pki.Identity{Role: pki.RoleNode, Name: name} }
	hdr := func(id, addr string) raft.RPCHeader { return raft.RPCHeader{ID: []byte(id), Addr: []byte(addr)} }
	const aAddr, bAddr, dAddr = "10.0.0.1:7803", "10.0.0.2:7803", "10.0.0.4:7803"
	voters := map[string]string{"a": aAddr, "b": bAddr, "w": "10.0.0.3:7803"}
	members := map[string]string{"a": aAddr, "b": bAddr, "w": "10.0.0.3:7803", "d": dAddr}
	book := newAddrBook(nil, nil)
	senders := rpcSenders{voters: voters, members: members, leader: "a", same: book.same}
	cases := []struct {
		name    string
		cmd     any
		cert    pki.Identity
		noTLS   bool
		senders *rpcSenders
		want    rpcCause
	}{
		{name: "the leader's heartbeat", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("a", aAddr), Term: 3}, cert: node("a")},
		{name: "the same address written otherwise", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("a", "10.0.0.01:7803"), Term: 3}, cert: node("a"), want: rpcWrongAddress},
		{name: "an IPv4 address mapped in IPv6", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("a", "[::ffff:10.0.0.1]:7803"), Term: 3}, cert: node("a")},
		{name: "an AppendEntries as mallory", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("mallory", "10.0.0.9:7803"), Term: 1 << 40}, cert: node("b"), want: rpcNotItsCertificate},
		{name: "an AppendEntries in another real node's name", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("a", aAddr), Term: 1 << 40}, cert: node("b"), want: rpcNotItsCertificate},
		{name: "the operator's certificate", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("operator", aAddr), Term: 1}, cert: pki.Identity{Role: pki.RoleOperator, Name: "operator"}, want: rpcNotItsCertificate},
		{name: "its own name at another node's address", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("b", aAddr), Term: 1 << 40}, cert: node("b"), want: rpcWrongAddress},
		//lint:ignore SA1019 raft reads Leader when Addr is empty
		{name: "its own address but another in the deprecated Leader field", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("b", bAddr), Term: 4, Leader: []byte(aAddr)}, cert: node("b"), want: rpcWrongAddress},
		//lint:ignore SA1019 raft reads Candidate when Addr is empty
		{name: "no header address, and another node's in the deprecated Candidate field", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("b", ""), Term: 4, Candidate: []byte(aAddr)}, cert: node("b"), want: rpcWrongAddress},
		{name: "no ID", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("", bAddr), Term: 4}, cert: node("b"), want: rpcNoSender},
		{name: "no address", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("b", ""), Term: 4}, cert: node("b"), want: rpcNoSender},
		{name: "a node of the CA in no configuration and no cluster file", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("x", "10.0.0.8:7803"), Term: 1 << 40}, cert: node("x"), want: rpcNotAVoter},
		{name: "a node of the cluster file the configuration lacks may lead (the follower is behind)", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("d", dAddr), Term: 9}, cert: node("d")},
		{name: "... and install a snapshot", cmd: &raft.InstallSnapshotRequest{RPCHeader: hdr("d", dAddr), Term: 9, Leader: []byte(dAddr)}, cert: node("d")},
		{name: "... but not ask for votes", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("d", dAddr), Term: 9}, cert: node("d"), want: rpcNotAVoter},
		{name: "... nor a pre-vote", cmd: &raft.RequestPreVoteRequest{RPCHeader: hdr("d", dAddr), Term: 9}, cert: node("d"), want: rpcNotAVoter},
		{name: "a voter's vote request", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("b", bAddr), Term: 4}, cert: node("b")},
		{name: "a vote request in another node's name", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("a", aAddr), Term: 1 << 40, LeadershipTransfer: true}, cert: node("b"), want: rpcNotItsCertificate},
		{name: "a pre-vote as mallory", cmd: &raft.RequestPreVoteRequest{RPCHeader: hdr("mallory", bAddr), Term: 1 << 40}, cert: node("b"), want: rpcNotItsCertificate},
		{name: "the leader's TimeoutNow", cmd: &raft.TimeoutNowRequest{RPCHeader: hdr("a", aAddr)}, cert: node("a")},
		{name: "a TimeoutNow of a voter that does not lead", cmd: &raft.TimeoutNowRequest{RPCHeader: hdr("b", bAddr)}, cert: node("b"), want: rpcNotTheLeader},
		{name: "a command raft does not know", cmd: &raft.AppendEntriesResponse{RPCHeader: hdr("a", aAddr)}, cert: node("a"), want: rpcUnknown},
		{name: "without TLS: a voter", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("b", bAddr), Term: 4}, noTLS: true},
		{name: "without TLS: mallory", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("mallory", bAddr), Term: 1 << 40}, noTLS: true, want: rpcNotAVoter},
		{name: "without TLS: a voter's name at another address", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("b", aAddr), Term: 1 << 40}, noTLS: true, want: rpcWrongAddress},
		{name: "before any configuration: the cluster file's nodes vote", cmd: &raft.RequestVoteRequest{RPCHeader: hdr("d", dAddr), Term: 1}, cert: node("d"),
			senders: &rpcSenders{voters: map[string]string{}, members: members, same: book.same}},
		{name: "before any configuration: mallory does not", cmd: &raft.AppendEntriesRequest{RPCHeader: hdr("mallory", dAddr), Term: 1}, cert: node("mallory"),
			senders: &rpcSenders{voters: map[string]string{}, members: members, same: book.same}, want: rpcNotAVoter},
	}
	for _, c := range cases {
		s := senders
		if c.senders != nil {
			s = *c.senders
		}
		got, words := judgeRPC(claimOf(c.cmd), c.cert, !c.noTLS, s)
		if got != c.want {
			t.Errorf("%s: %q (%s), want %q", c.name, got, words, c.want)
		}
		if (got == "") != (words == "") {
			t.Errorf("%s: cause %q with words %q", c.name, got, words)
		}
	}
}

// TestARaftAddressWithAHostNameIsMatchedResolved: raft sends the address
// a node listens on, its host name resolved; the book takes that form for
// a cluster file's address with a host name once it has looked it up.
func TestARaftAddressWithAHostNameIsMatchedResolved(t *testing.T) {
	b := newAddrBook(nil, nil)
	lookups := make(chan string, 4)
	b.resolve = func(addr string) (string, error) {
		lookups <- addr
		return "10.0.0.2:7803", nil
	}
	b.learn(Member{Name: "b", Raft: "b.example:7803"})
	if got := <-lookups; got != "b.example:7803" {
		t.Fatalf("looked up %q", got)
	}
	b.close() // waits for the lookup to be recorded
	if !b.same("10.0.0.2:7803", "b.example:7803") || !b.same("b.example:7803", "b.example:7803") {
		t.Fatal("the resolved form of b's address is not b's")
	}
	if b.same("10.0.0.3:7803", "b.example:7803") || b.same("10.0.0.2:7804", "b.example:7803") {
		t.Fatal("another address counts as b's")
	}
}

// forger holds a node's (or anyone's) certificate of the cluster's CA and
// sends hand-made raft RPCs to the nodes' raft ports over mutual TLS:
// raft's own NetworkTransport, dialling only.
type forger struct {
	*raft.NetworkTransport
}

func newForger(t *testing.T, b *pki.Bundle) *forger {
	layer := &forgerLayer{b: b, done: make(chan struct{})}
	f := &forger{raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 1, Timeout: 2 * time.Second, Logger: hclog.NewNullLogger(),
	})}
	t.Cleanup(func() { f.Close() })
	return f
}

type forgerLayer struct {
	b    *pki.Bundle
	done chan struct{}
	once sync.Once
}

func (l *forgerLayer) Accept() (net.Conn, error) {
	<-l.done
	return nil, net.ErrClosed
}

func (l *forgerLayer) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *forgerLayer) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9} }

func (l *forgerLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	return tls.DialWithDialer(d, "tcp", string(addr), l.b.ClientConfig(string(addr), pki.Roles(pki.RoleNode)))
}

// forgery is one hand-made RPC: send returns the error it got.
type forgery struct {
	name string
	send func(f *forger, to Member) error
}

const hugeTerm = 1 << 40

func header(id, addr string) raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}
}

func appendEntries(id, addr string, term, commit uint64) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		req := &raft.AppendEntriesRequest{RPCHeader: header(id, addr), Term: term, LeaderCommitIndex: commit}
		return f.AppendEntries(raft.ServerID(to.Name), raft.ServerAddress(to.Raft), req, &raft.AppendEntriesResponse{})
	}
}

func pipelined(id, addr string) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		p, err := f.AppendEntriesPipeline(raft.ServerID(to.Name), raft.ServerAddress(to.Raft))
		if err != nil {
			return err
		}
		defer p.Close()
		req := &raft.AppendEntriesRequest{RPCHeader: header(id, addr), Term: hugeTerm, LeaderCommitIndex: 1}
		fut, err := p.AppendEntries(req, &raft.AppendEntriesResponse{})
		if err != nil {
			return err
		}
		return fut.Error()
	}
}

func requestVote(id, addr string) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		req := &raft.RequestVoteRequest{RPCHeader: header(id, addr), Term: hugeTerm,
			LastLogIndex: hugeTerm, LastLogTerm: hugeTerm, LeadershipTransfer: true}
		return f.RequestVote(raft.ServerID(to.Name), raft.ServerAddress(to.Raft), req, &raft.RequestVoteResponse{})
	}
}

func requestPreVote(id, addr string) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		req := &raft.RequestPreVoteRequest{RPCHeader: header(id, addr), Term: hugeTerm, LastLogIndex: hugeTerm, LastLogTerm: hugeTerm}
		return f.RequestPreVote(raft.ServerID(to.Name), raft.ServerAddress(to.Raft), req, &raft.RequestPreVoteResponse{})
	}
}

func timeoutNow(id, addr string) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		return f.TimeoutNow(raft.ServerID(to.Name), raft.ServerAddress(to.Raft), &raft.TimeoutNowRequest{RPCHeader: header(id, addr)}, &raft.TimeoutNowResponse{})
	}
}

func installSnapshot(id, addr string) func(*forger, Member) error {
	return func(f *forger, to Member) error {
		data := bytes.Repeat([]byte{'x'}, 64)
		req := &raft.InstallSnapshotRequest{RPCHeader: header(id, addr), SnapshotVersion: raft.SnapshotVersionMax, Term: hugeTerm,
			Leader: []byte(addr), LastLogIndex: hugeTerm, LastLogTerm: hugeTerm, Size: int64(len(data))}
		return f.InstallSnapshot(raft.ServerID(to.Name), raft.ServerAddress(to.Raft), req, &raft.InstallSnapshotResponse{}, bytes.NewReader(data))
	}
}

// raftView is what one node's raft says of the cluster.
type raftView struct {
	term   uint64
	leader string
}

func viewOf(c *Cluster) raftView {
	_, id := c.raft.LeaderWithID()
	return raftView{term: c.raft.CurrentTerm(), leader: string(id)}
}

// TestForgedRaftRPCsChangeNoTermNorLeader: a process that holds the real
// certificate of a follower (f) sends every node raft RPCs at term 2^40:
// AppendEntries (a heartbeat, one with a commit index, a pipelined one) as
// "mallory" and in the name of another node; RequestVote, RequestPreVote,
// InstallSnapshot and TimeoutNow in another node's name; an AppendEntries
// in its own name but another node's address; a TimeoutNow in its own
// name (it does not lead). A node of the CA in no configuration and the
// operator's certificate send a heartbeat too. Every one is refused: no
// node's term or leader changes, the primary's lease renewals (its IO
// goes on only while they succeed) keep succeeding, each without its
// lease running out, and a proposal commits. Each node logs each refusal
// once per certificate and cause.
func TestForgedRaftRPCsChangeNoTermNorLeader(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	// Slower raft than the package's other tests: a busy machine that
	// holds a node up for a moment must not make an election of its own.
	n.timing.HeartbeatTimeout, n.timing.ElectionTimeout, n.timing.LeaderLeaseTimeout = 1500*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond
	n.timing.LeaseDuration = 3 * time.Second
	others := n.withTLSAnd("x")
	n.startAll()
	leader := n.waitLeader(t)
	ctx := testContext(t, 60*time.Second)
	if _, err := leader.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatal(err)
	}
	primary := n.node("a")
	validUntil, err := primary.RenewLease(ctx, "vol", 1)
	if err != nil {
		t.Fatal(err)
	}
	holder := n.follower(t, leader) // the forger holds this node's certificate
	var other Member                // a real node that is neither the leader nor the holder
	for _, m := range n.initial {
		if m.Name != leader.self && m.Name != holder.self {
			other = m
		}
	}
	own := n.members[holder.self]
	before := map[string]raftView{}
	for _, c := range n.nodes() {
		before[c.self] = viewOf(c)
	}

	// The primary's client: it renews the lease as the node layer does
	// (every third of it), each renewal due before the lease runs out.
	type stall struct {
		at  time.Time
		err error
	}
	stop := make(chan struct{})
	stalls := make(chan stall, 64)
	var renewals atomic.Int64
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			rctx, cancel := context.WithDeadline(ctx, validUntil)
			until, err := primary.RenewLease(rctx, "vol", 1)
			cancel()
			now := time.Now()
			switch {
			case err != nil:
				stalls <- stall{now, err}
			case now.After(validUntil):
				stalls <- stall{now, errors.New("renewed after the lease ran out")}
			default:
				renewals.Add(1)
				validUntil = until
			}
			if err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(n.timing.LeaseDuration / 3):
			}
		}
	}()

	mallory := "127.0.0.1:1"
	forgeries := []forgery{
		{"a heartbeat as mallory", appendEntries("mallory", mallory, hugeTerm, 0)},
		{"an AppendEntries as mallory with a commit index", appendEntries("mallory", mallory, hugeTerm, 1)},
		{"a pipelined AppendEntries as mallory", pipelined("mallory", mallory)},
		{"a heartbeat in another node's name", appendEntries(other.Name, other.Raft, hugeTerm, 0)},
		// At the term in force: a follower would take the sender for
		// its leader without a new term.
		{"a heartbeat in another node's name at the current term", appendEntries(other.Name, other.Raft, before[other.Name].term, 0)},
		{"an AppendEntries in the leader's name", appendEntries(leader.self, n.members[leader.self].Raft, hugeTerm, 1)},
		{"a RequestVote in another node's name", requestVote(other.Name, other.Raft)},
		{"a RequestVote as mallory", requestVote("mallory", mallory)},
		{"a RequestPreVote in another node's name", requestPreVote(other.Name, other.Raft)},
		{"a TimeoutNow in the leader's name", timeoutNow(leader.self, n.members[leader.self].Raft)},
		{"a heartbeat in its own name at another node's address", appendEntries(own.Name, other.Raft, hugeTerm, 0)},
		{"a TimeoutNow in its own name (it does not lead)", timeoutNow(own.Name, own.Raft)},
		// Last: before the gate, raft panicked on this one (a snapshot
		// without a configuration), taking the node down.
		{"an InstallSnapshot in another node's name", installSnapshot(other.Name, other.Raft)},
	}
	f := newForger(t, n.tls[holder.self])
	outsider := newForger(t, others["x"])
	operator := newForger(t, others["operator"])
	// The attack repeats, at least three rounds and until the primary
	// renewed three times meanwhile (or its client stopped: it stalled).
attack:
	for round := 0; round < 3 || renewals.Load() < 3; round++ {
		select {
		case <-ended:
			break attack // its stall is reported below
		default:
		}
		for _, to := range n.initial {
			for _, fg := range forgeries {
				if fg.name == "a TimeoutNow in its own name (it does not lead)" && to.Name == own.Name {
					continue
				}
				if err := fg.send(f, to); err == nil {
					t.Errorf("round %d: %s to %s was answered", round, fg.name, to.Name)
				} else if round == 0 && fg.name == "a heartbeat as mallory" && !strings.Contains(err.Error(), `claims to come from "mallory", but the connection presented the certificate of node `+own.Name) {
					t.Errorf("%s to %s: %v", fg.name, to.Name, err)
				}
				for _, c := range n.nodes() {
					if got := viewOf(c); got != before[c.self] {
						t.Fatalf("after %s to %s, %s's raft: term %d, leader %q; before the forgeries: term %d, leader %q",
							fg.name, to.Name, c.self, got.term, got.leader, before[c.self].term, before[c.self].leader)
					}
				}
			}
			if err := appendEntries("x", "127.0.0.1:2", hugeTerm, 0)(outsider, to); err == nil {
				t.Errorf("a heartbeat of node x, in no configuration, to %s was answered", to.Name)
			}
			if err := appendEntries(own.Name, own.Raft, hugeTerm, 0)(operator, to); err == nil {
				t.Errorf("a heartbeat with the operator's certificate to %s was answered", to.Name)
			}
		}
	}
	if _, err := holder.Propose(ctx, replication.MarkOutdatedCommand("vol", 1, "b")); err != nil {
		t.Fatalf("a proposal after the forgeries: %v", err)
	}
	close(stop)
	<-ended
	close(stalls)
	for s := range stalls {
		t.Errorf("the primary's lease renewal at %s: %v (its IO would stall)", s.at.Format("15:04:05.000"), s.err)
	}
	for _, c := range n.nodes() {
		if got := viewOf(c); got != before[c.self] {
			t.Fatalf("%s's raft: term %d, leader %q; before the forgeries: term %d, leader %q", c.self, got.term, got.leader, before[c.self].term, before[c.self].leader)
		}
	}

	for _, m := range n.initial {
		logs := n.logsOf(m.Name)
		holderAt := "raft: refused an RPC of node " + own.Name + " at 127.0.0.1: "
		for _, cause := range []rpcCause{rpcNotItsCertificate, rpcWrongAddress} {
			if got := count(logs, holderAt, "cause="+string(cause)); got != 1 {
				t.Errorf("%s logged the refusal of %s's certificate for %s %d times, want once:\n%s", m.Name, own.Name, cause, got, strings.Join(logs, "\n"))
			}
		}
		if m.Name != own.Name && count(logs, holderAt, "cause="+string(rpcNotTheLeader)) != 1 {
			t.Errorf("%s did not log once that %s, which does not lead, sent a TimeoutNow:\n%s", m.Name, own.Name, strings.Join(logs, "\n"))
		}
		if got := count(logs, "raft: refused an RPC of node x at 127.0.0.1: ", "cause="+string(rpcNotAVoter)); got != 1 {
			t.Errorf("%s logged the refusal of node x %d times, want once:\n%s", m.Name, got, strings.Join(logs, "\n"))
		}
		waitFor(t, m.Name+" logs the operator's certificate refused", 2*time.Second, func() bool {
			return count(n.logsOf(m.Name), "raft: refused a connection", "operator operator") == 1
		})
		requireLoggedOnce(t, m.Name, n.logsOf(m.Name))
	}
}

// fickleFollower is a raft follower made of raft's NetworkTransport
// alone: it answers heartbeats at once and every AppendEntries with
// success, but the next one with a refusal once told to (as a follower
// does whose log does not match, or that learned of a newer term). It
// keeps no log (the leader trusts its answers).
type fickleFollower struct {
	trans      *raft.NetworkTransport
	refuseNext atomic.Bool
	// refused counts the AppendEntries refused.
	refused atomic.Int64
	done    chan struct{}
}

func newFickleFollower(t *testing.T) *fickleFollower {
	trans, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f := &fickleFollower{trans: trans, done: make(chan struct{})}
	trans.SetHeartbeatHandler(func(rpc raft.RPC) {
		req := rpc.Command.(*raft.AppendEntriesRequest)
		rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: true}, nil)
	})
	go func() {
		for {
			select {
			case rpc := <-trans.Consumer():
				f.answer(rpc)
			case <-f.done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(f.done)
		trans.Close()
	})
	return f
}

func (f *fickleFollower) answer(rpc raft.RPC) {
	req, ok := rpc.Command.(*raft.AppendEntriesRequest)
	if !ok {
		rpc.Respond(nil, fmt.Errorf("a fickle follower takes AppendEntries only"))
		return
	}
	last := req.PrevLogEntry
	if n := len(req.Entries); n > 0 {
		last = req.Entries[n-1].Index
	}
	if f.refuseNext.CompareAndSwap(true, false) {
		f.refused.Add(1)
		rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, LastLog: req.PrevLogEntry, Success: false}, nil)
		return
	}
	rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, LastLog: last, Success: true}, nil)
}

type countingFSM struct{ applied atomic.Int64 }

func (f *countingFSM) Apply(*raft.Log) any                 { f.applied.Add(1); return nil }
func (f *countingFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (f *countingFSM) Restore(io.ReadCloser) error         { return errors.New("no snapshots") }

// TestARefusedAppendNeverWedgesReplication: a leader on this package's
// transport, with a follower that refuses an AppendEntries now and then
// while the leader keeps committing: after each refusal the leader goes
// on committing, and it shuts down. raft's pipelined replication (which
// the transport no longer offers) could block for good after a refused
// batch: its decoder stopped on the refusal, the pipeline's answer reader
// waited to hand it the next answer, and the next batch waited for the
// answer reader. The leader replicated to that follower never again (so,
// without a majority, it committed nothing) while its heartbeats kept it
// leader, and its Shutdown waited forever. A refusal comes from a
// follower whose log does not match, from one that saw a newer term, or
// from the RPC gate (rpcgate.go), whose error answer counts as one.
func TestARefusedAppendNeverWedgesReplication(t *testing.T) {
	follower := newFickleFollower(t)
	trans, members := newQuietGate(t, "leader", Member{Name: "follower", Raft: string(follower.trans.LocalAddr())})
	conf := raft.DefaultConfig()
	conf.LocalID = "leader"
	conf.Logger = hclog.NewNullLogger()
	store := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	servers := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "leader", Address: raft.ServerAddress(members[0].Raft)}}}
	if err := raft.BootstrapCluster(conf, store, store, snaps, trans, servers); err != nil {
		t.Fatal(err)
	}
	fsm := &countingFSM{}
	r, err := raft.NewRaft(conf, fsm, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	applying := make(chan struct{})
	// An applier waits for its entry until the test ends: raft may never
	// answer an entry it took before its shutdown (hashicorp/raft issue 498).
	ended, end := context.WithCancel(context.Background())
	t.Cleanup(func() {
		close(stop)
		shutdown := make(chan error, 1)
		go func() { shutdown <- r.Shutdown().Error() }()
		select {
		case <-shutdown:
		case <-time.After(10 * time.Second):
			t.Error("the leader's raft did not shut down within 10 s")
		}
		end()
		<-applying
	})
	trans.start(func() (raft.Configuration, string, bool) {
		f := r.GetConfiguration()
		_, leader := r.LeaderWithID()
		return f.Configuration(), string(leader), f.Error() == nil
	})
	waitFor(t, "the leader leads", 5*time.Second, func() bool { return r.State() == raft.Leader })
	if err := r.AddVoter("follower", follower.trans.LocalAddr(), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	var appliers sync.WaitGroup
	for range 8 { // entries all along, from several writers: a batch goes out before the one before is answered
		appliers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = waitFuture(ended, r.Apply([]byte("x"), time.Second))
			}
		})
	}
	go func() {
		appliers.Wait()
		close(applying)
	}()
	for round := range 20 {
		refused := follower.refused.Load()
		follower.refuseNext.Store(true)
		waitFor(t, "the follower refuses a batch", 5*time.Second, func() bool { return follower.refused.Load() > refused })
		before := fsm.applied.Load()
		if !within(5*time.Second, time.Millisecond, func() bool { return fsm.applied.Load() > before+1 }) {
			t.Fatalf("round %d: after the follower refused a batch, the leader (leading: %v) commits nothing", round, r.State() == raft.Leader)
		}
	}
}

// TestCloseWaitsForTheHeartbeatsInsideRaft: raft's heartbeat fast path
// runs on a connection's goroutine, which raft's shutdown does not wait
// for; the transport's Close does, and lets no heartbeat in after it, so
// that none reaches raft's store once the node closed it (a heartbeat
// that did panicked raft: "failed to save current term: database not
// open").
func TestCloseWaitsForTheHeartbeatsInsideRaft(t *testing.T) {
	trans, _ := newQuietGate(t, "a")
	inRaft := make(chan struct{})
	release := make(chan struct{})
	trans.SetHeartbeatHandler(func(raft.RPC) {
		close(inRaft)
		<-release
	})
	fn, ok := trans.beginHeartbeat()
	if !ok {
		t.Fatal("an open transport refused a heartbeat")
	}
	go func() {
		defer trans.beating.Done()
		fn(raft.RPC{})
	}()
	<-inRaft
	closed := make(chan error, 1)
	go func() { closed <- trans.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a heartbeat was inside raft")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the heartbeat left raft")
	}
	if _, ok := trans.beginHeartbeat(); ok {
		t.Fatal("a closed transport let a heartbeat into raft")
	}
}

// newQuietGate is a gated transport on a loopback port of its own, for
// the node self among self and others, that logs nothing. members are
// self first, then others.
func newQuietGate(t *testing.T, self string, others ...Member) (*gatedTransport, []Member) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := newStreamLayer(ln, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	members := append([]Member{{Name: self, Raft: ln.Addr().String()}}, others...)
	trans := newGatedTransport(gateConfig{listener: raw, members: members, timeout: time.Second,
		logger: slog.New(slog.DiscardHandler), hcl: hclog.NewNullLogger()})
	return trans, members
}
