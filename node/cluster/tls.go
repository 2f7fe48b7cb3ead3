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

	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/internal/pki"
)

// Raft over mutual TLS 1.3 with the cluster's CA (Config.TLS): a
// connection is accepted only from a node's certificate of the CA, and a
// connection raft dials goes only to the node whose raft address it is (a
// node added at runtime, whose address is in no cluster file this node
// read, may be any node of the CA: which one is logged). A stranger's
// node can neither vote nor be heard.

const (
	// maxHandshakes bounds the TLS handshakes in progress on raft's
	// port: beyond, a new connection is closed at once.
	maxHandshakes = 64
	// minHandshakeTimeout is the least a handshake is given, whatever
	// RaftIOTimeout says.
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

	mu      sync.Mutex
	names   map[string]string // raft address → node name
	shaking map[net.Conn]bool // connections in their handshake

	accepted chan net.Conn
	slots    chan struct{}
	done     chan struct{}
	close    sync.Once
	wg       sync.WaitGroup
}

func newTLSLayer(raw *streamLayer, b *pki.Bundle, members []Member, timeout time.Duration, logger *slog.Logger, refused func(string)) *tlsLayer {
	l := &tlsLayer{
		raw: raw, b: b, timeout: max(timeout, minHandshakeTimeout), logger: logger, refused: refused,
		once:     logonce.New(refusalQuiet, maxRefusalsKept, nil),
		names:    map[string]string{},
		shaking:  map[net.Conn]bool{},
		accepted: make(chan net.Conn),
		slots:    make(chan struct{}, maxHandshakes),
		done:     make(chan struct{}),
	}
	for _, m := range members {
		l.names[m.Raft] = m.Name
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// learn notes m's raft address, so that a connection to it must reach m.
func (l *tlsLayer) learn(m Member) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names[m.Raft] = m.Name
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
			select {
			case <-l.done:
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		select {
		case l.slots <- struct{}{}:
		default:
			conn.Close()
			l.refuse("accept "+hostOf(conn.RemoteAddr()), "raft: refused a connection from %s: %d TLS handshakes are in progress already", hostOf(conn.RemoteAddr()), maxHandshakes)
			continue
		}
		if !l.track(conn) {
			conn.Close()
			<-l.slots
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.slots }()
			l.handshake(conn)
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

// handshake completes an accepted connection's TLS handshake, within the
// timeout, and hands it to Accept; a refused one is logged and closed.
func (l *tlsLayer) handshake(raw net.Conn) {
	defer l.untrack(raw)
	tc := tls.Server(raw, pki.RequireCertificate(l.b.ServerConfig(true, pki.Roles(pki.RoleNode))))
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		select {
		case <-l.done:
			return // this node stops: no refusal
		default:
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
