package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/internal/pki"
)

// Raft over mutual TLS 1.3 with the cluster's CA (Config.TLS): a
// connection is accepted only from a node's certificate of the CA, and a
// connection raft dials goes only to the node whose raft address it is (a
// node added at runtime, whose address is in no cluster file this node
// read, may be any node of the CA: which one is logged). A stranger's
// node can neither vote nor be heard.
//
// Raft's port admits its connections within limits (package connlimit):
// the members' addresses (raft's and gossip's, from the cluster file and
// AddVoter) are the cluster's own, and keep half of the handshake slots
// for themselves; an address that is not a member's may have a few
// handshakes in progress, each closed once past its deadline, and a full
// port closes a stranger's oldest handshake for a member's connection.

const (
	// maxHandshakes bounds the TLS handshakes in progress on raft's
	// port; strangerHandshakes of them may be strangers', and
	// perStrangerHandshakes one stranger's address.
	maxHandshakes         = 64
	strangerHandshakes    = maxHandshakes / 2
	perStrangerHandshakes = 4
	// maxRaftConns bounds raft's connections: each peer keeps a few.
	maxRaftConns = 1024
	// minHandshakeTimeout is the least a handshake is given, whatever
	// RaftIOTimeout says; a stranger's gets no more than that while the
	// port is busy.
	minHandshakeTimeout = time.Second
	// refusalQuiet and maxRefusalsKept: a refusal is logged once per peer
	// and cause, again after this long without it; so many are kept.
	refusalQuiet    = 10 * time.Minute
	maxRefusalsKept = 256
)

// tlsLayer is raft's stream layer over TLS. Accept hands raft only
// connections whose handshake completed: handshakes run concurrently, each
// under a deadline, so a peer that stalls one does not hold up raft's
// accept loop.
type tlsLayer struct {
	raw     *streamLayer
	b       *pki.Bundle
	timeout time.Duration
	logger  *slog.Logger
	// refused is told each refusal logged (Config.Refused); nil: none.
	refused func(words string)
	once    *logonce.Set
	clock   clock.Clock // the handshakes' deadlines, the pause after a failed accept

	mu      lockorder.Mutex
	names   map[string]string // raft address → node name
	shaking map[net.Conn]bool // connections in their handshake

	// known is the members' addresses; admission admits each connection.
	known     *connlimit.Known
	admission *connlimit.Limiter

	accepted chan net.Conn
	done     chan struct{}
	close    sync.Once
	wg       sync.WaitGroup
}

func newTLSLayer(raw *streamLayer, b *pki.Bundle, members []Member, timeout time.Duration, logger *slog.Logger, refused func(string), clk clock.Clock) *tlsLayer {
	clk = clock.Or(clk)
	l := &tlsLayer{
		raw: raw, b: b, timeout: max(timeout, minHandshakeTimeout), logger: logger, refused: refused, clock: clk,
		once:     logonce.New(refusalQuiet, maxRefusalsKept, nil),
		names:    map[string]string{},
		shaking:  map[net.Conn]bool{},
		known:    connlimit.NewKnown(),
		accepted: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	l.admission = connlimit.New(connlimit.Config{
		Port:                "raft",
		MaxOpen:             maxRaftConns,
		MaxHandshakes:       maxHandshakes,
		StrangerOpen:        strangerHandshakes,
		StrangerHandshakes:  strangerHandshakes,
		PerSourceOpen:       perStrangerHandshakes,
		PerSourceHandshakes: perStrangerHandshakes,
		HandshakeTimeout:    l.timeout,
		PressureTimeout:     minHandshakeTimeout,
		Known:               l.known,
		Logger:              logger,
		Clock:               clk,
	})
	for _, m := range members {
		l.names[m.Raft] = m.Name
		l.knowHosts(m)
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// learn notes m's raft address, so that a connection to it must reach m,
// and its hosts as a member's.
func (l *tlsLayer) learn(m Member) {
	l.knowHosts(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names[m.Raft] = m.Name
}

// resolveTimeout bounds the lookup of a member's host names.
const resolveTimeout = 5 * time.Second

// knowHosts makes m's raft and gossip hosts known to the admission.
func (l *tlsLayer) knowHosts(m Member) {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	for _, addr := range []string{m.Raft, m.Gossip} {
		if addr == "" {
			continue
		}
		if err := l.known.AddHost(ctx, addr); err != nil {
			l.logger.Warn("raft: a member's address does not resolve: its connections count as a stranger's against raft's connection limits", "member", m.Name, "err", err)
		}
	}
}

// RaftAdmission is the counts of raft's connection limits; false without
// TLS (raft's port then has none).
func (c *Cluster) RaftAdmission() (connlimit.Stats, bool) {
	if c.tls == nil {
		return connlimit.Stats{}, false
	}
	return c.tls.admission.Stats(), true
}

func (l *tlsLayer) nameOf(addr raft.ServerAddress) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name, ok := l.names[string(addr)]
	return name, ok
}

func (l *tlsLayer) acceptLoop() {
	defer l.wg.Done()
	delay := 5 * time.Millisecond
	for {
		conn, err := l.raw.Accept()
		if err != nil {
			pause := l.clock.NewTimer(delay)
			select {
			case <-l.done:
				pause.Stop()
				return
			case <-pause.C():
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		slot, err := l.admission.Admit(conn)
		if err != nil {
			continue // closed, counted and logged by the limits
		}
		if !l.track(conn) {
			slot.Release()
			conn.Close()
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.handshake(conn, slot)
		}()
	}
}

// track notes a connection in its handshake; false once the layer closed.
func (l *tlsLayer) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		return false
	default:
	}
	l.shaking[c] = true
	return true
}

func (l *tlsLayer) untrack(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.shaking, c)
}

// handshake completes an accepted connection's TLS handshake, by its
// slot's deadline, and hands it to Accept; a refused one is logged and
// closed, one the limits closed is theirs to log. Closing the connection
// raft is handed gives its slot back.
func (l *tlsLayer) handshake(raw net.Conn, slot *connlimit.Slot) {
	defer l.untrack(raw)
	tc := tls.Server(slot.Wrap(raw), pki.RequireCertificate(l.b.ServerConfig(true, pki.Roles(pki.RoleNode))))
	ctx, cancel := context.WithDeadline(context.Background(), slot.Deadline())
	defer cancel()
	err := tc.HandshakeContext(ctx)
	if err == nil && !slot.Negotiated() {
		err = net.ErrClosed
	}
	if err != nil {
		tc.Close()
		select {
		case <-l.done:
			return // this node stops: no refusal
		default:
		}
		if slot.ClosedBy() != 0 {
			return
		}
		host := hostOf(raw.RemoteAddr())
		l.failed("accept "+host, "raft: refused a connection: ", "a node at "+host, err)
		return
	}
	select {
	case l.accepted <- tc:
	case <-l.done:
		tc.Close()
	}
}

// Accept returns the next connection whose TLS handshake completed.
func (l *tlsLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("raft TLS listener: %w", net.ErrClosed)
	}
}

// Close stops accepting, ends the handshakes in progress, and closes the
// listener.
func (l *tlsLayer) Close() error {
	var err error
	l.close.Do(func() {
		l.mu.Lock()
		close(l.done)
		for c := range l.shaking {
			c.Close()
		}
		l.mu.Unlock()
		err = l.raw.Close()
		l.wg.Wait()
	})
	return err
}

func (l *tlsLayer) Addr() net.Addr { return l.raw.Addr() }

// Dial connects to the raft address and completes the TLS handshake
// within timeout: the certificate must name the node of that address, or
// any node for an address in no cluster file this node read.
func (l *tlsLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	raw, err := l.raw.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	name, known := l.nameOf(addr)
	accept := pki.Roles(pki.RoleNode)
	who := fmt.Sprintf("the node at %s", addr)
	if known {
		accept, who = pki.Exactly(pki.Identity{Role: pki.RoleNode, Name: name}), fmt.Sprintf("%s at %s", name, addr)
	}
	tc := tls.Client(raw, l.b.ClientConfig(string(addr), accept))
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, minHandshakeTimeout))
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		l.failed("dial "+string(addr), "raft: ", who, err)
		return nil, fmt.Errorf("raft TLS with %s: %w", who, err)
	}
	if !known {
		cs := tc.ConnectionState()
		id, _ := pki.PeerIdentity(&cs)
		if l.once.First("unknown " + string(addr) + " " + id.String()) {
			l.logger.Info("raft: an address in no cluster file this node read (a node added at runtime): accepted the certificate it presented", "address", addr, "certificate", id.String())
		}
	}
	// TLS 1.3: the peer's verdict on this node's certificate comes with
	// its first bytes. Raft writes first: a refusal is seen here when the
	// alert is read before a write hits the closed connection (the
	// refusing side logs it in any case).
	return pki.WatchRefusal(tc, func(he *pki.HandshakeError) {
		l.refuse("dial "+string(addr)+" "+he.Key(), "raft: %s", he.Words(who))
	}), nil
}

// failed logs a failed handshake with who: a refusal (a certificate, a
// peer without TLS) once per peer and cause, at WARN; anything else (the
// peer went away or stalled: no refusal) at DEBUG.
func (l *tlsLayer) failed(peer, prefix, who string, err error) {
	he := pki.ExplainHandshake(err)
	if he == nil {
		l.logger.Debug(prefix+pki.HandshakeWords(who, err), "peer", peer)
		return
	}
	l.refuse(peer+" "+he.Key(), "%s%s", prefix, he.Words(who))
}

// refuse logs a refusal once per key (peer and cause), and tells it.
func (l *tlsLayer) refuse(key, format string, a ...any) {
	words := fmt.Sprintf(format, a...)
	if !l.once.First(key) {
		l.logger.Debug(words)
		return
	}
	l.logger.Warn(words)
	if l.refused != nil {
		l.refused(words)
	}
}

func hostOf(a net.Addr) string {
	if a == nil {
		return "an unknown address"
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
