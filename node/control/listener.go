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

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/connlimit"
)

// The control port's connections: admitted within the limits of package
// connlimit (in all, from one host, and handshakes in progress, each
// under a deadline, with a share kept for the cluster's own nodes), and,
// with TLS, handshaken before the HTTP server sees them, so that a
// refusal is logged in words and a plaintext client is told.

// Limits of the control port. A node's peers hold one connection each,
// and so does a page or a replctl command: these leave room for many
// operators and tools, while a host that opens 10,000 connections gets
// the ones beyond its share refused (closed at once, and logged a line
// per host and interval) and costs the node no more file descriptors
// than these.
const (
	MaxConns        = 1024
	MaxConnsPerHost = 64
	// maxHandshakesPerHost bounds the TLS handshakes in progress from one
	// host that is not a node of the cluster: a client finishes its
	// handshake in milliseconds, only a flood holds many.
	maxHandshakesPerHost = 16
)

// Limits are a control port's: at most Max connections in all, and
// PerHost from one host that is not Known (the cluster's own nodes are
// held to no share of their own, and may use the part of Max kept for
// them). A Listener without TLS hands a connection out at once.
type Limits struct {
	Max, PerHost int
	Known        *connlimit.Known
	// HandshakeTimeout bounds a TLS handshake; default
	// connlimit.DefaultHandshakeTimeout (shorter while the port is busy).
	HandshakeTimeout time.Duration
	// Clock is the port's time: the handshakes' deadlines, the limits'
	// log intervals, the pause after a failed accept. Nil is
	// clock.Real().
	Clock clock.Clock
}

// admission is l's connection limits for the port named what.
func (l Limits) admission(what string, log *slog.Logger) connlimit.Config {
	handshakes := l.Max
	if l.Max >= 64 {
		handshakes = l.Max / 4
	}
	strangers := handshakes - handshakes/4
	return connlimit.Config{
		Port:                what,
		MaxOpen:             l.Max,
		MaxHandshakes:       handshakes,
		StrangerHandshakes:  max(strangers, 1),
		PerSourceOpen:       min(l.PerHost, l.Max-l.Max/8),
		PerSourceHandshakes: min(l.PerHost, maxHandshakesPerHost, max(strangers, 1)),
		HandshakeTimeout:    l.HandshakeTimeout,
		Known:               l.Known,
		Logger:              log,
		Clock:               l.Clock,
	}
}

// Listener accepts a port's connections within its limits and, with
// tlsConfig set, hands out only those whose TLS handshake succeeded, as
// *tls.Conn (net/http negotiates HTTP/2 by ALPN on them). Its accept loop
// and each handshake run on goroutines of their own; Accept, Close and a
// connection's Close may be called from any goroutine.
type Listener struct {
	inner     net.Listener
	tlsConfig *tls.Config
	admission *connlimit.Limiter
	log       *slog.Logger
	what      string
	refusals  *RefusalLog
	clock     clock.Clock
	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// NewListener guards inner within limits; what names the port in the log
// lines, which go to log, and the refusals to refusals. tlsConfig is nil
// for a plaintext port.
func NewListener(inner net.Listener, what string, tlsConfig *tls.Config, limits Limits, log *slog.Logger, refusals *RefusalLog) *Listener {
	l := &Listener{inner: inner, tlsConfig: tlsConfig, admission: connlimit.New(limits.admission(what, log)), log: log, what: what,
		refusals: refusals, clock: clock.Or(limits.Clock), ready: make(chan net.Conn), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// Admission is the counts of the port's connection limits.
func (l *Listener) Admission() connlimit.Stats { return l.admission.Stats() }

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
			pause := l.clock.NewTimer(5 * time.Millisecond)
			select {
			case <-l.done:
				pause.Stop()
				return
			case <-pause.C():
			}
			continue
		}
		slot, err := l.admission.Admit(c)
		if err != nil {
			continue // closed, counted and logged by the limits
		}
		if l.tlsConfig == nil {
			slot.Negotiated()
			l.handOut(slot.Wrap(c))
			continue
		}
		go l.handshake(slot.Wrap(c), slot)
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

// handshake runs c's TLS handshake by its slot's deadline and hands the
// connection out; a refused one is logged once per host and cause, one
// the limits closed or whose client went away is not.
func (l *Listener) handshake(c net.Conn, slot *connlimit.Slot) {
	tc := tls.Server(c, l.tlsConfig)
	began := l.clock.Now()
	c.SetDeadline(slot.Deadline())
	err := tc.Handshake()
	c.SetDeadline(time.Time{})
	if err == nil && slot.Negotiated() {
		l.handOut(tc)
		return
	}
	defer tc.Close()
	from := c.RemoteAddr().String()
	if err == nil || slot.ClosedBy() != 0 {
		return // the limits closed it, and count it
	}
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
			l.drain(notTLS.Conn, slot)
		}
		why := "a client spoke plaintext to this TLS port: a replctl without --tls-dir, a node without the cluster's tls: section, or a browser at http://"
		l.refusals.Note(hostOf(from), why, "refused a "+l.what+" connection", "from", from, "why", why)
	case errors.As(err, &ne) && ne.Timeout():
		why := fmt.Sprintf("no TLS handshake within %s", slot.Deadline().Sub(began).Round(time.Millisecond))
		l.refusals.Note(hostOf(from), "no TLS handshake in time", "refused a "+l.what+" connection", "from", from, "why", why)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, new(*net.OpError)):
		// A look at the port (replctl's probe, a node's liveness
		// check), or a client that went away or reset.
		l.log.Debug("a "+l.what+" connection ended before its TLS handshake did", "from", from, "err", err)
	default:
		why := "the TLS handshake failed: " + err.Error()
		l.refusals.Note(hostOf(from), why, "refused a "+l.what+" connection", "from", from, "why", why)
	}
}

// drainFor bounds how long a refused plaintext client is read after its
// answer: long enough for a client to read the answer and hang up.
const drainFor = time.Second

// drain reads and drops what a refused client sent, until it hangs up (or
// drainFor, its slot's deadline or 64 KiB is reached), before the
// connection is closed. A socket closed with unread bytes in its receive
// buffer resets the connection, and a client whose reset came before it
// read (or while it still wrote its request) never sees the answer: a
// plaintext replctl on a loaded machine then said the port "answers
// nothing" instead of "requires TLS".
func (l *Listener) drain(c net.Conn, slot *connlimit.Slot) {
	until := l.clock.Now().Add(drainFor)
	if d := slot.Deadline(); !d.IsZero() && d.Before(until) {
		until = d
	}
	c.SetReadDeadline(until)
	io.CopyN(io.Discard, c, 64<<10)
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
