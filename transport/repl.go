package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/frame"
)

// Frame is one message of the replication stream (package frame, which
// links no network, holds it; these names stay for the rest of the tree).
type Frame = frame.Frame

// NewFrame returns a frame with an empty buffer of capacity n from the pool
// (frame.New).
func NewFrame(n int) *Frame { return frame.New(n) }

// MaxFrameSize bounds one replication message, both ways and on both
// ends (frame.MaxSize). Send refuses a longer one, and a receiver ends
// the stream on its header, before a byte of it is buffered
// (ErrFrameTooLarge both).
const MaxFrameSize = frame.MaxSize

// handshakeTimeout bounds a replication connection's opening (its TLS
// handshake and the preambles) on the dialing end: a server that accepts
// and answers nothing is told apart. The server's end has its limits'
// deadline (replAdmission): a client that connects and stalls holds a
// goroutine and a descriptor that long at most.
const handshakeTimeout = 10 * time.Second

// Limits of a replication server's connections (package connlimit). Only
// the cluster's nodes (ReplKnown) open replication streams, one per volume
// and peer, so they may hold many; an address that is not known may hold a
// few, enough for a node added at runtime from an address in no cluster
// file, while a stranger's flood costs little.
const (
	replMaxOpen             = 16384
	replMaxHandshakes       = 1024
	replStrangerConns       = 128
	replPerStrangerAddress  = 8
	replHandshakesUnderLoad = time.Second
)

// replAdmission is the replication port's connection limits.
func replAdmission(o replOptions) connlimit.Config {
	return connlimit.Config{
		Port:                "replication",
		MaxOpen:             replMaxOpen,
		MaxHandshakes:       replMaxHandshakes,
		StrangerOpen:        replStrangerConns,
		StrangerHandshakes:  replStrangerConns,
		PerSourceOpen:       replPerStrangerAddress,
		PerSourceHandshakes: replPerStrangerAddress,
		HandshakeTimeout:    connlimit.DefaultHandshakeTimeout,
		PressureTimeout:     replHandshakesUnderLoad,
		Known:               o.known,
		Logger:              o.logger,
	}
}

// ReplOption configures DialRepl and NewReplServer.
type ReplOption func(*replOptions)

type replOptions struct {
	tls    *tls.Config
	failed func(remote net.Addr, err error)
	known  *connlimit.Known
	logger *slog.Logger
}

func replOptionsOf(opts []ReplOption) replOptions {
	var o replOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// ReplTLS makes the stream mutual TLS with conf (a node's
// pki.Bundle.ServerConfig for NewReplServer, ClientConfig for DialRepl);
// without it the stream is plaintext.
func ReplTLS(conf *tls.Config) ReplOption {
	return func(o *replOptions) { o.tls = conf }
}

// ReplKnown gives NewReplServer the addresses of the cluster's nodes: they
// are held to no per-address limit, and have most of the server's
// connections kept for them (package connlimit).
func ReplKnown(k *connlimit.Known) ReplOption {
	return func(o *replOptions) { o.known = k }
}

// ReplLogger gives NewReplServer a logger for the connections its limits
// refuse (a line per address and interval); without it they are counted
// only (ReplServer.Admission).
func ReplLogger(l *slog.Logger) ReplOption {
	return func(o *replOptions) { o.logger = l }
}

// ReplHandshakeFailed has NewReplServer call f for each connection whose
// TLS handshake failed (pki.ExplainHandshake says why). f is called from
// the connection's goroutine and must not block.
func ReplHandshakeFailed(f func(remote net.Addr, err error)) ReplOption {
	return func(o *replOptions) { o.failed = f }
}

// MsgStream is what a replication stream is made of: a connection's
// framing (stream.go), or a test double that injects faults
// (NewReplStream). SendMsg takes and RecvMsg fills a *Frame. SendMsg may
// be called from several goroutines at once: each frame goes out whole
// (the connection's framing holds its write lock across a frame).
type MsgStream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
	Context() context.Context
}

// NewReplStream wraps s, whose SendMsg takes and RecvMsg fills a *Frame;
// Close calls cancel (when not nil), which must make blocked calls of s
// return. The node's streams come from DialRepl and the server; tests use
// it to put a stream that stalls or fails under the replication code.
func NewReplStream(s MsgStream, cancel context.CancelFunc) *ReplStream {
	return &ReplStream{s: s, cancel: cancel}
}

// ReplStream is one replication stream. Several goroutines may Send at
// once, each frame whole, while one Recvs; two concurrent Recvs are not
// allowed.
type ReplStream struct {
	s      MsgStream
	cancel context.CancelFunc
	tls    *tls.ConnectionState
}

// Send sends a frame; the frame is consumed.
func (r *ReplStream) Send(f *Frame) error { return r.s.SendMsg(f) }

// Recv reads the next frame into f (reusing its buffer).
func (r *ReplStream) Recv(f *Frame) error { return r.s.RecvMsg(f) }

// Context is the stream's context; it ends when the stream does.
func (r *ReplStream) Context() context.Context { return r.s.Context() }

// Arrivals is what the stream says of its long frames as they arrive, or
// nil when its MsgStream says nothing of them (a test double).
func (r *ReplStream) Arrivals() Arrivals {
	a, _ := r.s.(Arrivals)
	return a
}

// TLS is the state of the stream's TLS connection (on a server: the
// client's verified certificate, pki.PeerIdentity), or nil for a
// plaintext stream.
func (r *ReplStream) TLS() *tls.ConnectionState { return r.tls }

// Close ends a client stream. On the server side, return from the handler.
func (r *ReplStream) Close() {
	if r.cancel != nil {
		r.cancel()
	}
}

// ReplHandler serves one incoming replication stream until it returns.
type ReplHandler func(s *ReplStream) error

// ReplServer accepts replication streams, one per connection.
type ReplServer struct {
	h ReplHandler
	o replOptions
	// admission admits each connection within the port's limits.
	admission *connlimit.Limiter

	mu        lockorder.Mutex
	stopped   bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	// handlers counts the connections whose handler has not returned:
	// added under mu while not stopped, so Stop's Wait sees them all.
	handlers sync.WaitGroup
}

// NewReplServer returns a server that hands each stream to h.
func NewReplServer(h ReplHandler, opts ...ReplOption) *ReplServer {
	o := replOptionsOf(opts)
	return &ReplServer{h: h, o: o, admission: connlimit.New(replAdmission(o)), listeners: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
}

// Admission is the counts of the server's connection limits.
func (s *ReplServer) Admission() connlimit.Stats { return s.admission.Stats() }

// Serve accepts connections on l until Stop.
func (s *ReplServer) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors, for now: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		slot, err := s.admission.Admit(c)
		if err != nil {
			continue // closed, counted and logged by the limits
		}
		if !s.track(c) {
			slot.Release()
			c.Close()
			return nil
		}
		go s.serveConn(c, slot)
	}
}

// track adds c to the connections Stop closes and waits for; false
// once stopped.
func (s *ReplServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.conns[c] = struct{}{}
	s.handlers.Add(1)
	return true
}

func (s *ReplServer) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// serveConn opens the stream of one connection (TLS, then the
// preambles, by its slot's deadline), serves it and ends it with the
// handler's error in words.
func (s *ReplServer) serveConn(raw net.Conn, slot *connlimit.Slot) {
	defer s.untrack(raw)
	defer slot.Release()
	handled := false
	handlerDone := func() {
		if !handled {
			handled = true
			s.handlers.Done()
		}
	}
	defer handlerDone()
	tuneConn(raw)
	raw.SetDeadline(slot.Deadline())
	conn := raw
	var state *tls.ConnectionState
	if s.o.tls != nil {
		tc := tls.Server(raw, s.o.tls)
		if err := tc.Handshake(); err != nil {
			if s.o.failed != nil && slot.ClosedBy() == 0 {
				s.o.failed(raw.RemoteAddr(), err)
			}
			raw.Close()
			return
		}
		cs := tc.ConnectionState()
		conn, state = tc, &cs
	}
	var pre [len(streamPreamble)]byte
	if _, err := io.ReadFull(conn, pre[:]); err != nil || pre != streamPreamble {
		// Not a replication stream of this version (a port scan, an
		// older replvol speaking gRPC): nothing to serve.
		conn.Close()
		return
	}
	if _, err := conn.Write(streamPreamble[:]); err != nil || !slot.Negotiated() {
		conn.Close()
		return
	}
	raw.SetDeadline(time.Time{})
	fc := newFrameConn(context.Background(), conn, state, acceptedReadBuffer)
	err := s.h(&ReplStream{s: fc, tls: state})
	handlerDone()
	if err != nil {
		fc.end(endError, err.Error())
	} else {
		fc.end(endClean, "")
	}
	fc.linger()
}

// Stop closes the listeners and every connection, and returns once every
// handler has: handlers see their streams fail, and no stream is served
// after Stop (a node closes its volumes' disks next).
func (s *ReplServer) Stop() {
	s.mu.Lock()
	s.stopped = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.handlers.Wait()
}

// ReplClient opens replication streams to one peer, each on a connection
// of its own.
type ReplClient struct {
	addr string
	o    replOptions
	// dialer puts a connection that failed into words.
	dialer *dialer

	mu      lockorder.Mutex
	closed  bool
	streams map[*frameConn]struct{}
}

// DialRepl prepares a client of the peer at addr; Open connects.
func DialRepl(addr string, opts ...ReplOption) (*ReplClient, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("replication client for %s: %w", addr, err)
	}
	return &ReplClient{addr: addr, o: replOptionsOf(opts), dialer: newDialer(addr, false), streams: map[*frameConn]struct{}{}}, nil
}

// Open connects and opens a stream; the connection lives as long as the
// stream. It fails fast, in words, when the peer cannot be reached, its
// TLS refuses this side or this side refuses it, or it answers nothing
// within handshakeTimeout (or ctx's deadline, if sooner).
func (c *ReplClient) Open(ctx context.Context) (*ReplStream, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, &StreamError{words: "stream closed here", err: net.ErrClosed}
	}
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	raw, err := c.dialer.dial(dctx, c.addr)
	if err != nil {
		if se := c.dialer.unreachable(err); se != nil {
			return nil, se
		}
		return nil, &StreamError{words: "cannot reach " + c.addr + ": " + DialWords(err), err: err}
	}
	tuneConn(raw)
	stop := context.AfterFunc(dctx, func() { raw.SetDeadline(time.Now()) })
	conn, state, err := c.open(dctx, raw)
	stop()
	if err != nil {
		raw.Close()
		return nil, err
	}
	raw.SetDeadline(time.Time{})
	fc := newFrameConn(ctx, conn, state, dialledReadBuffer)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		fc.cancel()
		return nil, &StreamError{words: "stream closed here", err: net.ErrClosed}
	}
	c.streams[fc] = struct{}{}
	c.mu.Unlock()
	context.AfterFunc(fc.ctx, func() {
		c.mu.Lock()
		delete(c.streams, fc)
		c.mu.Unlock()
	})
	return &ReplStream{s: fc, cancel: fc.close, tls: state}, nil
}

// open runs the TLS handshake (with TLS) and the preambles on raw, before
// the deadline set on ctx.
func (c *ReplClient) open(ctx context.Context, raw net.Conn) (net.Conn, *tls.ConnectionState, error) {
	deadline, _ := ctx.Deadline()
	raw.SetDeadline(deadline)
	conn := raw
	var state *tls.ConnectionState
	if c.o.tls != nil {
		tc := tls.Client(raw, c.o.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, nil, c.refused(err)
		}
		cs := tc.ConnectionState()
		conn, state = tc, &cs
	}
	// With TLS 1.3 the server checks this side's certificate after this
	// side's handshake returned, and refuses it with an alert in place
	// of its preamble: the refusal is the first read's error.
	var pre [len(streamPreamble)]byte
	_, err := conn.Write(streamPreamble[:])
	if err == nil {
		_, err = io.ReadFull(conn, pre[:])
	}
	switch {
	case err != nil && state != nil:
		return nil, nil, c.refused(err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		why := "it accepts connections but answers nothing: is replnode hung or paused?"
		return nil, nil, &StreamError{words: fmt.Sprintf("cannot reach %s: %s", c.addr, why), Reach: ReachNoAnswer, addr: c.addr, why: why, err: err}
	case err != nil:
		words := fmt.Sprintf("%s closed the replication connection before it answered: it requires TLS (its cluster file has a tls: section and this node's has none), or it is not a replvol replication port of this version", c.addr)
		return nil, nil, &StreamError{words: words, err: err}
	case pre != streamPreamble:
		return nil, nil, &StreamError{words: fmt.Sprintf("%s answered, but not as a replvol replication port of this version (preamble %q)", c.addr, pre[:]), err: errMalformed}
	}
	return conn, state, nil
}

// refused is the error of a stream whose TLS failed: the handshake's
// refusal in words, or, when the handshake never ended, a peer that
// accepts connections and answers nothing.
func (c *ReplClient) refused(err error) *StreamError {
	if pki.ExplainHandshake(err) == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) {
		why := "it accepts connections but completes no TLS handshake: is replnode hung or paused?"
		return &StreamError{words: fmt.Sprintf("cannot reach %s: %s", c.addr, why), Reach: ReachNoAnswer, addr: c.addr, why: why, err: err}
	}
	return &StreamError{words: pki.HandshakeWords(c.addr, err), err: err}
}

// Close ends every stream of the client.
func (c *ReplClient) Close() error {
	c.mu.Lock()
	c.closed = true
	streams := make([]*frameConn, 0, len(c.streams))
	for fc := range c.streams {
		streams = append(streams, fc)
	}
	c.mu.Unlock()
	for _, fc := range streams {
		fc.close()
	}
	return nil
}
