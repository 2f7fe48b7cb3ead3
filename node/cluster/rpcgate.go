package cluster

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/internal/pki"
)

// A raft RPC names its sender: the header's ID and Addr, and in
// AppendEntries, RequestVote and InstallSnapshot also the deprecated
// Leader or Candidate field (raft reads it when Addr is empty). Raft
// believes what it reads: an AppendEntries that said it came from
// "mallory" at term 2^40 made every node follow mallory, for good.
//
// gatedTransport is raft's transport with every inbound RPC checked
// against the connection it came on before raft sees it. Raft's
// NetworkTransport decodes RPCs itself and hands them on without the
// connection, so each accepted connection gets a NetworkTransport of its
// own (raft's decoding, unchanged, heartbeat fast path included), whose
// RPCs are checked against that connection's certificate and passed to
// the one Consumer raft reads. Outbound RPCs go through a
// NetworkTransport that only dials, one batch at a time (no pipelining).
// An RPC is let through when
//   - it names a sender (an ID and an address),
//   - with TLS, the ID is the node its connection's certificate names,
//   - the ID is a voter of this node's latest raft configuration; a vote
//     (RequestVote, RequestPreVote) or a TimeoutNow must be, while an
//     AppendEntries or an InstallSnapshot may also come from a node of
//     this node's cluster file (or added at runtime), since a follower
//     whose log is behind may not know its leader's configuration yet;
//     before this node has any configuration, the cluster file's nodes
//     count,
//   - every address it names is that node's raft address,
//   - a TimeoutNow (start an election at once: the leader hands its
//     office over) comes from the leader this node follows.
//
// A refused RPC gets an error answer (an InstallSnapshot, whose snapshot
// follows on the stream, has its connection closed instead) and reaches
// raft never: it changes no term and no leader. The refusal is logged
// once per certificate (without TLS, per host) and cause.
//
// What this does not do: a holder of a voter's own certificate and key
// is that voter, to raft as to every other link; raft trusts its voters
// (it is not Byzantine fault tolerant), so that holder can still disturb
// raft in that voter's name. And a node removed from raft but still
// listed in a cluster file may still send AppendEntries: remove it from
// the files too.

// rpcCause is why an inbound raft RPC was refused.
type rpcCause string

// Causes of refusal.
const (
	// rpcUnknown: a command raft does not know.
	rpcUnknown rpcCause = "unknown-rpc"
	// rpcNoSender: the RPC names no ID or no address.
	rpcNoSender rpcCause = "no-sender"
	// rpcNotItsCertificate: the ID is not the node the connection's
	// certificate names.
	rpcNotItsCertificate rpcCause = "not-its-certificate"
	// rpcNotAVoter: the ID is not a voter (or, for AppendEntries and
	// InstallSnapshot, not a node this node knows).
	rpcNotAVoter rpcCause = "not-a-voter"
	// rpcWrongAddress: an address the RPC names is not its sender's raft
	// address.
	rpcWrongAddress rpcCause = "wrong-address"
	// rpcNotTheLeader: a TimeoutNow (the leader handing its office to
	// this node) from another node than the leader this node follows.
	rpcNotTheLeader rpcCause = "not-the-leader"
)

// rpcClaim is who an inbound RPC says sent it.
type rpcClaim struct {
	kind string // "AppendEntries", ...; "" for a command raft does not know
	id   string
	// addrs are the non-empty addresses it names for its sender.
	addrs []string
	term  uint64 // none for TimeoutNow
	// elects: a vote or a TimeoutNow, which only a voter sends.
	elects bool
}

// what names the RPC in words: "AppendEntries at term 7".
func (c rpcClaim) what() string {
	if c.term == 0 {
		return c.kind
	}
	return fmt.Sprintf("%s at term %d", c.kind, c.term)
}

// claimOf reads the sender an RPC's command names.
func claimOf(cmd any) rpcClaim {
	claim := func(kind string, h raft.RPCHeader, term uint64, elects bool, deprecated []byte) rpcClaim {
		c := rpcClaim{kind: kind, id: string(h.ID), term: term, elects: elects}
		for _, a := range [][]byte{h.Addr, deprecated} {
			if len(a) > 0 {
				c.addrs = append(c.addrs, string(a))
			}
		}
		return c
	}
	// The deprecated Leader and Candidate are read because raft reads
	// them when Addr is empty.
	switch c := cmd.(type) {
	case *raft.AppendEntriesRequest:
		//lint:ignore SA1019 raft reads Leader when Addr is empty
		return claim("AppendEntries", c.RPCHeader, c.Term, false, c.Leader)
	case *raft.InstallSnapshotRequest:
		return claim("InstallSnapshot", c.RPCHeader, c.Term, false, c.Leader)
	case *raft.RequestVoteRequest:
		//lint:ignore SA1019 raft reads Candidate when Addr is empty
		return claim("RequestVote", c.RPCHeader, c.Term, true, c.Candidate)
	case *raft.RequestPreVoteRequest:
		return claim("RequestPreVote", c.RPCHeader, c.Term, true, nil)
	case *raft.TimeoutNowRequest:
		return claim("TimeoutNow", c.RPCHeader, 0, true, nil)
	}
	return rpcClaim{}
}

// rpcSenders is whom this node takes raft RPCs from.
type rpcSenders struct {
	// voters are the voters of its latest raft configuration: ID → raft
	// address.
	voters map[string]string
	// members are the nodes of its cluster file and those added at
	// runtime: name → raft address.
	members map[string]string
	// leader is the leader this node follows ("" when none).
	leader string
	// same reports whether an address an RPC names is the configured one
	// (addrBook.same).
	same func(claimed, configured string) bool
}

// judgeRPC is the rule: "" when the RPC claiming c may reach raft,
// otherwise the cause and the refusal in words. cert is whom the
// connection's certificate names (withTLS: the connection is TLS).
func judgeRPC(c rpcClaim, cert pki.Identity, withTLS bool, s rpcSenders) (rpcCause, string) {
	switch {
	case c.kind == "":
		return rpcUnknown, "a command raft does not know"
	case c.id == "" || len(c.addrs) == 0:
		return rpcNoSender, fmt.Sprintf("its %s names no sender (ID %q, address %q)", c.kind, c.id, strings.Join(c.addrs, ", "))
	case withTLS && (cert.Role != pki.RoleNode || cert.Name != c.id):
		return rpcNotItsCertificate, fmt.Sprintf("its %s claims to come from %q, but the connection presented the certificate of %s: a node's certificate stands for that node only", c.what(), c.id, cert)
	}
	addr, ok := s.voters[c.id]
	if !ok && (!c.elects || len(s.voters) == 0) {
		addr, ok = s.members[c.id]
	}
	if !ok {
		voters := slices.Sorted(maps.Keys(s.voters))
		if c.elects {
			return rpcNotAVoter, fmt.Sprintf("its %s comes from %q, which is not a voter of this node's raft configuration (voters: %s)", c.what(), c.id, strings.Join(voters, ", "))
		}
		return rpcNotAVoter, fmt.Sprintf("its %s comes from %q, which is neither a voter of this node's raft configuration (voters: %s) nor a node of its cluster file", c.what(), c.id, strings.Join(voters, ", "))
	}
	for _, a := range c.addrs {
		if !s.same(a, addr) {
			return rpcWrongAddress, fmt.Sprintf("its %s from %q names the raft address %s, but %s's raft address is %s", c.what(), c.id, a, c.id, addr)
		}
	}
	if c.kind == "TimeoutNow" && c.id != s.leader {
		leader := s.leader
		if leader == "" {
			leader = "none"
		}
		return rpcNotTheLeader, fmt.Sprintf("its TimeoutNow (start an election at once) comes from %q, which is not the leader this node follows (%s)", c.id, leader)
	}
	return "", ""
}

// gateConfig is what newGatedTransport needs.
type gateConfig struct {
	// listener accepts raft's connections (a TLS one hands over only
	// connections whose handshake completed) and dials for raft.
	listener raft.StreamLayer
	// withTLS: every connection must name its sender by certificate.
	withTLS bool
	members []Member
	timeout time.Duration
	logger  *slog.Logger
	hcl     hclog.Logger
	// refused is told each refusal logged (Config.Refused); nil: none.
	refused func(words string)
	// clock paces the pause after a failed accept and the address
	// book's lookups; nil: the real one.
	clock clock.Clock
}

// gatedTransport is raft's transport with each inbound RPC checked against
// the certificate of its connection (see above). Raft reads Consumer and
// calls SetHeartbeatHandler and Close; the embedded NetworkTransport
// carries the outbound RPCs.
type gatedTransport struct {
	*raft.NetworkTransport

	cfg  gateConfig
	book *addrBook
	once *logonce.Set

	consume chan raft.RPC
	// contact fires after each heartbeat that raft took: a follower's
	// LastContact is new then (AwaitQuorum waits on it).
	contact *broadcast

	mu        lockorder.Mutex
	heartbeat func(raft.RPC)
	config    func() (raft.Configuration, string, bool)
	inbound   map[*inboundConn]bool
	started   bool

	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup
	// beating counts the heartbeats inside raft's fast path, which runs
	// on a connection transport's goroutine (none of wg's): Close waits
	// for them, so that none reaches raft's store after raft's shutdown
	// (the node closes the store then).
	beating sync.WaitGroup
}

func newGatedTransport(cfg gateConfig) *gatedTransport {
	cfg.clock = clock.Or(cfg.clock)
	t := &gatedTransport{
		cfg:     cfg,
		book:    newAddrBook(cfg.logger, cfg.clock),
		contact: newBroadcast(),
		once:    logonce.New(refusalQuiet, maxRefusalsKept, nil),
		consume: make(chan raft.RPC),
		inbound: map[*inboundConn]bool{},
		done:    make(chan struct{}),
	}
	for _, m := range cfg.members {
		t.book.learn(m)
	}
	t.NetworkTransport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  &dialOnly{StreamLayer: cfg.listener, done: make(chan struct{})},
		MaxPool: 3,
		// No pipelining: raft's pipelined replication (v1.8.0) can block
		// for good once a follower refuses a batch while the next is on
		// its way (TestARefusedAppendNeverWedgesReplication). One batch
		// at a time costs this cluster's small raft traffic nothing that
		// matters (hashicorp/raft PR #541 measured pipelining as worth
		// little).
		MaxRPCsInFlight: 1,
		Timeout:         cfg.timeout,
		Logger:          cfg.hcl,
	})
	return t
}

// start lets inbound RPCs in, checked against config (raft's latest
// configuration and the ID of the leader this node follows; false when
// raft does not answer): call it once raft runs.
func (t *gatedTransport) start(config func() (raft.Configuration, string, bool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.done:
		return
	default:
	}
	t.config, t.started = config, true
	t.wg.Add(1)
	go t.acceptLoop()
}

// learn notes a node added at runtime (AddVoter).
func (t *gatedTransport) learn(m Member) { t.book.learn(m) }

// Consumer is where raft takes the inbound RPCs that passed.
func (t *gatedTransport) Consumer() <-chan raft.RPC { return t.consume }

// SetHeartbeatHandler takes raft's fast path for heartbeats: a heartbeat
// that passes goes there.
func (t *gatedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.heartbeat = cb
}

// Close stops the outbound transport, the listener and every inbound
// connection, and waits for their goroutines.
func (t *gatedTransport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		close(t.done)
		for in := range t.inbound {
			in.Close()
		}
		t.mu.Unlock()
		_ = t.NetworkTransport.Close()
		t.closeErr = t.cfg.listener.Close()
		t.wg.Wait()
		t.beating.Wait()
		t.book.close()
	})
	return t.closeErr
}

func (t *gatedTransport) acceptLoop() {
	defer t.wg.Done()
	delay := 5 * time.Millisecond
	for {
		conn, err := t.cfg.listener.Accept()
		if err != nil {
			pause := t.cfg.clock.NewTimer(delay)
			select {
			case <-t.done:
				pause.Stop()
				return
			case <-pause.C():
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		t.serve(conn)
	}
}

// serve gives an accepted connection its own NetworkTransport, whose
// RPCs are checked against the connection's certificate.
func (t *gatedTransport) serve(conn net.Conn) {
	in := &inboundConn{Conn: conn, host: hostOf(conn.RemoteAddr()), ready: make(chan struct{}), closed: make(chan struct{})}
	if tc, ok := conn.(interface{ ConnectionState() tls.ConnectionState }); ok {
		cs := tc.ConnectionState()
		in.cert, _ = pki.PeerIdentity(&cs)
	}
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		conn.Close()
		return
	default:
	}
	t.inbound[in] = true
	t.wg.Add(1)
	t.mu.Unlock()
	in.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  &oneConn{in: in},
		Timeout: t.cfg.timeout,
		Logger:  t.cfg.hcl,
	})
	in.trans.SetHeartbeatHandler(func(rpc raft.RPC) { t.onHeartbeat(in, rpc) })
	close(in.ready) // its transport takes the connection now
	go t.pump(in)
}

// pump passes the connection's RPCs on, until the connection closes.
func (t *gatedTransport) pump(in *inboundConn) {
	defer t.wg.Done()
	defer func() {
		_ = in.trans.Close()
		t.mu.Lock()
		delete(t.inbound, in)
		t.mu.Unlock()
	}()
	for {
		select {
		case rpc := <-in.trans.Consumer():
			if t.pass(in, rpc) {
				t.deliver(in, rpc)
			}
		case <-in.closed:
			return
		}
	}
}

// onHeartbeat is the connection's heartbeat fast path: raft's, for a
// heartbeat that passes.
func (t *gatedTransport) onHeartbeat(in *inboundConn, rpc raft.RPC) {
	if !t.pass(in, rpc) {
		return
	}
	fn, ok := t.beginHeartbeat()
	if !ok {
		return // closed: raft is shut down, and its sender's wait ends with the connection
	}
	defer t.beating.Done()
	if fn != nil {
		fn(rpc) // raft's fast path: it has taken the heartbeat on return
		t.contact.fire()
		return
	}
	t.deliver(in, rpc)
}

// beginHeartbeat counts a heartbeat into beating unless the transport
// is closed, and returns raft's fast path (nil when raft set none).
func (t *gatedTransport) beginHeartbeat() (func(raft.RPC), bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.done:
		return nil, false
	default:
	}
	t.beating.Add(1)
	return t.heartbeat, true
}

// deliver hands rpc to raft. Its connection's transport waits for the
// answer, or for the connection's end.
func (t *gatedTransport) deliver(in *inboundConn, rpc raft.RPC) {
	select {
	case t.consume <- rpc:
	case <-in.closed:
	case <-t.done:
	}
}

// pass checks rpc against its connection, and refuses it if it may not
// reach raft: an error answer, or for an InstallSnapshot (its snapshot
// follows on the stream) the connection closed.
func (t *gatedTransport) pass(in *inboundConn, rpc raft.RPC) bool {
	c := claimOf(rpc.Command)
	cause, words := judgeRPC(c, in.cert, t.cfg.withTLS, t.senders())
	if cause == "" {
		return true
	}
	who, key := "a node at "+in.host, "rpc "+in.host+" "+string(cause)
	if t.cfg.withTLS {
		who, key = fmt.Sprintf("%s at %s", in.cert, in.host), "rpc "+in.cert.String()+" "+string(cause)
	}
	words = fmt.Sprintf("raft: refused an RPC of %s: %s", who, words)
	if t.once.First(key) {
		t.cfg.logger.Warn(words, "cause", string(cause))
		if t.cfg.refused != nil {
			t.cfg.refused(words)
		}
	} else {
		t.cfg.logger.Debug(words, "cause", string(cause))
	}
	if _, snapshot := rpc.Command.(*raft.InstallSnapshotRequest); snapshot {
		in.Close()
		return false
	}
	rpc.Respond(nil, fmt.Errorf("%s", words))
	return false
}

// senders is whom this node takes RPCs from now.
func (t *gatedTransport) senders() rpcSenders {
	s := rpcSenders{voters: map[string]string{}, members: t.book.members(), same: t.book.same}
	t.mu.Lock()
	config := t.config
	t.mu.Unlock()
	if config == nil {
		return s
	}
	if c, leader, ok := config(); ok {
		s.leader = leader
		for _, srv := range c.Servers {
			if srv.Suffrage == raft.Voter {
				s.voters[string(srv.ID)] = string(srv.Address)
			}
		}
	}
	return s
}

// inboundConn is an accepted raft connection and the transport that
// decodes its RPCs.
type inboundConn struct {
	net.Conn
	host  string
	cert  pki.Identity // zero without TLS
	trans *raft.NetworkTransport

	ready     chan struct{} // closed once trans may take the connection
	closed    chan struct{}
	closeOnce sync.Once
	taken     sync.Once
}

// Close closes the connection (raft's handler closes it when it ends).
func (in *inboundConn) Close() error {
	err := net.ErrClosed
	in.closeOnce.Do(func() {
		err = in.Conn.Close()
		close(in.closed)
	})
	return err
}

// oneConn is the stream layer of an inbound connection's transport: it
// accepts that connection once, and dials nothing.
type oneConn struct{ in *inboundConn }

func (l *oneConn) Accept() (net.Conn, error) {
	select {
	case <-l.in.ready:
	case <-l.in.closed:
		return nil, net.ErrClosed
	}
	var first bool
	l.in.taken.Do(func() { first = true })
	if first {
		return l.in, nil
	}
	<-l.in.closed
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return l.in.Close() }
func (l *oneConn) Addr() net.Addr { return l.in.LocalAddr() }

func (l *oneConn) Dial(raft.ServerAddress, time.Duration) (net.Conn, error) {
	return nil, fmt.Errorf("raft: an inbound connection's transport dials nothing")
}

// dialOnly is the outbound transport's stream layer: it dials through
// the listener and accepts nothing (the gate accepts).
type dialOnly struct {
	raft.StreamLayer
	done chan struct{}
	once sync.Once
}

func (d *dialOnly) Accept() (net.Conn, error) {
	<-d.done
	return nil, net.ErrClosed
}

func (d *dialOnly) Close() error {
	d.once.Do(func() { close(d.done) })
	return nil
}

// addrBook is what this node knows of its peers' raft addresses: the
// cluster file's and those of nodes added at runtime, by name. A node
// advertises its raft address with the host name resolved (raft sends
// the address its stream layer listens on: the name resolved when that
// node started), so for an address with a host name the book keeps the
// resolved form too, looked up away from the RPCs' path: when learned,
// and again (at most every addrRetry) when an RPC names another.
type addrBook struct {
	logger  *slog.Logger
	clock   clock.Clock // when a lookup started, for addrRetry
	resolve func(addr string) (string, error)

	mu       lockorder.Mutex
	byName   map[string]string
	resolved map[string]string    // an address with a host name → as resolved
	tried    map[string]time.Time // when its lookup last started
	closed   bool
	wg       sync.WaitGroup
}

// addrRetry is how often an address with a host name is looked up again
// while RPCs name another form of it.
const addrRetry = 10 * time.Second

func newAddrBook(logger *slog.Logger, clk clock.Clock) *addrBook {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &addrBook{
		logger: logger, clock: clock.Or(clk),
		resolve: func(addr string) (string, error) {
			a, err := net.ResolveTCPAddr("tcp", addr)
			if err != nil {
				return "", err
			}
			return a.String(), nil
		},
		byName: map[string]string{}, resolved: map[string]string{}, tried: map[string]time.Time{},
	}
}

func (b *addrBook) learn(m Member) {
	b.mu.Lock()
	b.byName[m.Name] = m.Raft
	b.mu.Unlock()
	b.lookUp(m.Raft)
}

func (b *addrBook) members() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.byName)
}

// same reports whether claimed is the raft address configured: the same
// text, the same IP and port, or the host name resolved.
func (b *addrBook) same(claimed, configured string) bool {
	if claimed == configured {
		return true
	}
	if ip, ok := sameIPPort(claimed, configured); ok {
		return ip
	}
	b.mu.Lock()
	resolved, ok := b.resolved[configured]
	b.mu.Unlock()
	if ok {
		if same, ok := sameIPPort(claimed, resolved); ok && same {
			return true
		}
	}
	b.lookUp(configured)
	return false
}

// sameIPPort compares two HOST:PORT addresses whose hosts are IPs; ok is
// false when configured's host is not an IP.
func sameIPPort(claimed, configured string) (same, ok bool) {
	want, err := netip.ParseAddrPort(configured)
	if err != nil {
		return false, false
	}
	got, err := netip.ParseAddrPort(claimed)
	return err == nil && got.Addr().Unmap() == want.Addr().Unmap() && got.Port() == want.Port(), true
}

// lookUp resolves an address with a host name in the background, unless
// it was tried within addrRetry.
func (b *addrBook) lookUp(addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.clock.Since(b.tried[addr]) < addrRetry {
		return
	}
	b.tried[addr] = b.clock.Now()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		resolved, err := b.resolve(addr)
		if err != nil {
			b.logger.Debug("raft: look up a peer's address", "address", addr, "err", err)
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.resolved[addr] = resolved
	}()
}

func (b *addrBook) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}
