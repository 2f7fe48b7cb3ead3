package control

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// The control port's connections: bounded in number (in all, and from
// one host), and, with TLS, handshaken before the HTTP server sees them,
// so that a refusal is logged in words and a plaintext client is told.

// Limits of the control port. A node's peers hold one connection each,
// and so does a page or a replctl command: these leave room for many
// operators and tools, while a client that opens 10,000 connections gets
// the ones beyond refused (closed at once, and logged) and costs the node
// no more file descriptors than these.
const (
	MaxConns        = 1024
	MaxConnsPerHost = 256
	// handshakeTimeout bounds a TLS handshake: a client that
	// connects and says nothing holds its slot no longer.
	handshakeTimeout = 10 * time.Second
	// refusedLogEvery: while connections are refused for the limit, one
	// line says how many, at most this often.
	refusedLogEvery = 10 * time.Second
)

// Listener accepts a port's connections within the limits and, with
// tlsConfig set, hands out only those whose TLS handshake succeeded, as
// *tls.Conn (net/http negotiates HTTP/2 by ALPN on them). Its accept loop
// and each handshake run on goroutines of their own; Accept, Close and a
// connection's Close may be called from any goroutine.
type Listener struct {
	inner      net.Listener
	tlsConfig  *tls.Config
	max, per   int
	log        *slog.Logger
	what       string
	refusals   *RefusalLog
	ready      chan net.Conn
	done       chan struct{}
	closeOnce  sync.Once
	mu         sync.Mutex // a leaf: nothing is taken under it
	open       int
	perHost    map[string]int
	refused    int // refused since the last line about it
	lastLogged time.Time
}

// NewListener guards inner: at most max connections in all and per from
// one host; what names the port in the log lines, which go to log, and
// the refusals to refusals. tlsConfig is nil for a plaintext port.
func NewListener(inner net.Listener, what string, tlsConfig *tls.Config, max, per int, log *slog.Logger, refusals *RefusalLog) *Listener {
	l := &Listener{inner: inner, tlsConfig: tlsConfig, max: max, per: per, log: log, what: what,
		refusals: refusals, ready: make(chan net.Conn), done: make(chan struct{}), perHost: map[string]int{}}
	go l.acceptLoop()
	return l
}

func (l *Listener) acceptLoop() {
	for {
		c, err := l.inner.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.Close()
				return
			}
			// Out of file descriptors, or a connection aborted: the
			// listener itself is fine.
			select {
			case <-l.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		host := hostOf(c.RemoteAddr().String())
		if !l.admit(host) {
			c.Close()
			continue
		}
		cc := &countedConn{Conn: c, release: func() { l.release(host) }}
		if l.tlsConfig == nil {
			l.handOut(cc)
			continue
		}
		go l.handshake(cc)
	}
}

// admit counts a new connection from host, or refuses it beyond a limit.
func (l *Listener) admit(host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var why string
	switch {
	case l.open >= l.max:
		why = fmt.Sprintf("%d connections are open, the limit", l.open)
	case l.perHost[host] >= l.per:
		why = fmt.Sprintf("%d connections from %s are open, the limit per host", l.perHost[host], host)
	default:
		l.open++
		l.perHost[host]++
		return true
	}
	l.refused++
	if now := time.Now(); now.Sub(l.lastLogged) >= refusedLogEvery {
		l.log.Warn(fmt.Sprintf("refused %d new %s connection(s): %s; the node goes on serving", l.refused, l.what, why), "last_from", host)
		l.refused, l.lastLogged = 0, now
	}
	return false
}

func (l *Listener) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.perHost[host]--; l.perHost[host] <= 0 {
		delete(l.perHost, host)
	}
}

func (l *Listener) handOut(c net.Conn) {
	select {
	case l.ready <- c:
	case <-l.done:
		c.Close()
	}
}

// Plaintext answers to a client that does not speak TLS to a TLS port: an
// HTTP/1 request gets a page in words, anything else (a plaintext gRPC
// client) a TLS alert, which tells it the port speaks TLS.
var (
	plainHTTPAnswer = "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nThis node serves HTTPS: use https://.\n"
	plainTLSAlert   = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46} // fatal protocol_version
)

func (l *Listener) handshake(c net.Conn) {
	tc := tls.Server(c, l.tlsConfig)
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	err := tc.Handshake()
	c.SetDeadline(time.Time{})
	if err == nil {
		l.handOut(tc)
		return
	}
	from := c.RemoteAddr().String()
	var notTLS tls.RecordHeaderError
	var ne net.Error
	switch {
	case errors.As(err, &notTLS):
		if notTLS.Conn != nil {
			if looksLikeHTTP1(notTLS.RecordHeader) {
				io.WriteString(notTLS.Conn, plainHTTPAnswer)
			} else {
				notTLS.Conn.Write(plainTLSAlert)
			}
		}
		why := "a client spoke plaintext to this TLS port: a replctl without --tls-dir, a node without the cluster's tls: section, or a browser at http://"
		l.refusals.Note(hostOf(from), why, "refused a "+l.what+" connection", "from", from, "why", why)
	case errors.Is(err, io.EOF):
		// A look at the port (replctl's probe, a node's liveness check).
		l.log.Debug("a "+l.what+" connection closed before its TLS handshake", "from", from)
	case errors.As(err, &ne) && ne.Timeout():
		why := fmt.Sprintf("no TLS handshake within %s", handshakeTimeout)
		l.refusals.Note(hostOf(from), why, "refused a "+l.what+" connection", "from", from, "why", why)
	default:
		why := "the TLS handshake failed: " + err.Error()
		l.refusals.Note(hostOf(from), why, "refused a "+l.what+" connection", "from", from, "why", why)
	}
	tc.Close()
}

// looksLikeHTTP1 says whether a record header is the start of an HTTP/1
// request, as net/http tells it.
func looksLikeHTTP1(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *Listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// countedConn gives its slot back when it closes.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
