package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Frame is one message of the replication stream: an encoded frame of the
// replication wire format. A Frame handed to Send must not be touched again:
// the transport returns its buffer to the pool once it is on the wire.
type Frame struct {
	buf *[]byte
}

// Bytes returns the frame's contents.
func (f *Frame) Bytes() []byte {
	if f.buf == nil {
		return nil
	}
	return *f.buf
}

// NewFrame returns a frame with an empty buffer of capacity n from the pool.
// Append to Buffer and set it back with SetBytes.
func NewFrame(n int) *Frame {
	b := mem.DefaultBufferPool().Get(n)
	*b = (*b)[:0]
	return &Frame{buf: b}
}

// SetBytes replaces the frame contents (b should be grown from Bytes()).
func (f *Frame) SetBytes(b []byte) { *f.buf = b }

// Release returns the frame's buffer to the pool; the frame must not be
// used afterwards. Only frames that were not sent need it.
func (f *Frame) Release() {
	if f.buf != nil {
		mem.DefaultBufferPool().Put(f.buf)
		f.buf = nil
	}
}

// rawCodec sends a Frame's bytes as they are: no marshal copy, and the
// buffer goes back to the pool when gRPC has written it.
type rawCodec struct{}

func (rawCodec) Name() string { return "replvol-frame" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*Frame)
	if !ok || f.buf == nil {
		return nil, fmt.Errorf("replication codec: cannot send %T", v)
	}
	b := f.buf
	f.buf = nil
	return mem.BufferSlice{mem.NewBuffer(b, mem.DefaultBufferPool())}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("replication codec: cannot receive into %T", v)
	}
	n := data.Len()
	if f.buf == nil || cap(*f.buf) < n {
		f.Release()
		f.buf = mem.DefaultBufferPool().Get(n)
	}
	*f.buf = (*f.buf)[:n]
	data.CopyTo(*f.buf)
	return nil
}

// MaxFrameSize bounds one replication message, both ways and on both
// ends: the longest frame the replication wire format makes, a batch of
// one entry of 32 MiB (replication.MaxFrameLen: this package does not
// import the rules, node checks that the two agree). A longer one fails
// the stream (the sender's gRPC refuses to send it; a receiver refuses it
// with ResourceExhausted) before a byte of it is buffered.
const MaxFrameSize = 5 + 24 + 32<<20

// handshakeTimeout bounds a replication connection's TLS handshake on the
// server: a client that connects and stalls holds a goroutine and a
// descriptor that long at most.
const handshakeTimeout = 10 * time.Second

// ReplOption configures DialRepl and NewReplServer.
type ReplOption func(*replOptions)

type replOptions struct {
	tls    *tls.Config
	failed func(remote net.Addr, err error)
}

func replOptionsOf(opts []ReplOption) replOptions {
	var o replOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// ReplTLS makes the stream mutual TLS with conf (a node's
// pki.Bundle.ServerConfig for NewReplServer, ClientConfig for DialRepl)
// through gRPC's TLS credentials; without it the stream is plaintext. The
// frames keep their raw codec: TLS adds no copy of its own.
func ReplTLS(conf *tls.Config) ReplOption {
	return func(o *replOptions) { o.tls = conf }
}

// ReplHandshakeFailed has NewReplServer call f for each connection whose
// TLS handshake failed (pki.ExplainHandshake says why). f is called from
// the connection's goroutine and must not block.
func ReplHandshakeFailed(f func(remote net.Addr, err error)) ReplOption {
	return func(o *replOptions) { o.failed = f }
}

// watchedCreds is gRPC's TLS credentials with each handshake's outcome
// kept: a client's in last (a stream that cannot open then says why in
// words, from values), a server's failures given to failed.
type watchedCreds struct {
	credentials.TransportCredentials
	last   *lastHandshake
	failed func(net.Addr, error)
}

func (c *watchedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err == nil {
		conn, err = awaitVerdict(ctx, conn)
	}
	c.last.set(err)
	if err != nil {
		return nil, nil, err
	}
	return conn, info, nil
}

// awaitVerdict waits for the server's first bytes after the handshake.
// With TLS 1.3 the server checks the client's certificate after the
// client's handshake returned, and refuses it with an alert in place of
// its first bytes; a gRPC server sends its settings at once. Reading them
// here makes the refusal the handshake's error, before gRPC writes
// anything (a write to the closed connection would hide the alert). The
// bytes read are served first.
func awaitVerdict(ctx context.Context, conn net.Conn) (net.Conn, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	conn.SetReadDeadline(deadline)
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &answeredConn{Conn: conn, first: buf[:n]}, nil
}

// answeredConn serves the bytes awaitVerdict read, then reads on.
type answeredConn struct {
	net.Conn
	first []byte
}

func (c *answeredConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// lastHandshake is how a replication client's last TLS handshake ended
// (awaitVerdict included): its error; nil when it succeeded, or when the
// last connect did not get as far (a failed dial clears it).
type lastHandshake struct {
	mu  sync.Mutex
	err error
}

func (h *lastHandshake) set(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
}

// refused is the error of a stream that could not open because the TLS
// handshake failed (pki.ExplainHandshake finds a refusal in it), or nil.
// A peer that accepts connections but completes no handshake is
// ReachNoAnswer, as a hung node is.
func (h *lastHandshake) refused(addr string, err error) *StreamError {
	if h == nil || status.Code(err) != codes.Unavailable {
		return nil
	}
	h.mu.Lock()
	failed := h.err
	h.mu.Unlock()
	switch {
	case failed == nil:
		return nil
	case pki.ExplainHandshake(failed) == nil && (errors.Is(failed, context.DeadlineExceeded) || errors.Is(failed, os.ErrDeadlineExceeded)):
		why := "it accepts connections but completes no TLS handshake: is replnode hung or paused?"
		return &StreamError{words: fmt.Sprintf("cannot reach %s: %s", addr, why), Reach: ReachNoAnswer, addr: addr, why: why, err: err, dial: failed}
	}
	return &StreamError{words: pki.HandshakeWords(addr, failed), err: err, dial: failed}
}

func (c *watchedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil && c.failed != nil {
		c.failed(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: c.TransportCredentials.Clone(), last: c.last, failed: c.failed}
}

var replStreamDesc = grpc.StreamDesc{
	StreamName:    "Stream",
	ServerStreams: true,
	ClientStreams: true,
}

const replStreamMethod = "/replvol.Replication/Stream"

// MsgStream is what client and server streams share: gRPC's, or a test
// double that injects faults (NewReplStream).
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

// ReplStream is one replication stream. One goroutine may Send while
// another Recvs; two concurrent Sends (or Recvs) are not allowed.
type ReplStream struct {
	s      MsgStream
	cancel context.CancelFunc
	// refused explains a client stream's error as its connection's
	// failed TLS handshake, or is nil (ReplClient.Open sets it).
	refused func(error) *StreamError
}

// Send queues a frame; the frame is consumed.
func (r *ReplStream) Send(f *Frame) error { return r.err(r.s.SendMsg(f)) }

// Recv reads the next frame into f (reusing its buffer).
func (r *ReplStream) Recv(f *Frame) error { return r.err(r.s.RecvMsg(f)) }

// err is a Send's or Recv's error in words: the TLS handshake's refusal
// when that is what ended the stream.
func (r *ReplStream) err(err error) error {
	if err != nil && r.refused != nil {
		if se := r.refused(err); se != nil {
			return se
		}
	}
	return streamError(err)
}

// Context is the stream's context; it ends when the stream does.
func (r *ReplStream) Context() context.Context { return r.s.Context() }

// TLS is the state of the stream's TLS connection (on a server: the
// client's verified certificate, pki.PeerIdentity), or nil for a
// plaintext stream.
func (r *ReplStream) TLS() *tls.ConnectionState {
	p, ok := peer.FromContext(r.s.Context())
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	return &info.State
}

// Close ends a client stream. On the server side, return from the handler.
func (r *ReplStream) Close() {
	if r.cancel != nil {
		r.cancel()
	}
}

// ReplHandler serves one incoming replication stream until it returns.
type ReplHandler func(s *ReplStream) error

// ReplServer accepts replication streams.
type ReplServer struct {
	g *grpc.Server
}

// NewReplServer returns a server that hands each stream to h.
func NewReplServer(h ReplHandler, opts ...ReplOption) *ReplServer {
	o := replOptionsOf(opts)
	sopts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(MaxFrameSize),
		grpc.MaxSendMsgSize(MaxFrameSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Second, Timeout: 2 * time.Second}),
		grpc.ConnectionTimeout(handshakeTimeout),
	}
	if o.tls != nil {
		// No read buffer of gRPC's over TLS: the TLS connection buffers a
		// record already, and a second buffer costs a copy of every byte.
		sopts = append(sopts, grpc.Creds(&watchedCreds{TransportCredentials: credentials.NewTLS(o.tls), failed: o.failed}), grpc.ReadBufferSize(0))
	}
	g := grpc.NewServer(sopts...)
	desc := replStreamDesc
	desc.Handler = func(_ any, stream grpc.ServerStream) error {
		return h(&ReplStream{s: stream})
	}
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: "replvol.Replication",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{desc},
	}, struct{}{})
	return &ReplServer{g: g}
}

// Serve accepts connections on l until Stop.
func (s *ReplServer) Serve(l net.Listener) error {
	err := s.g.Serve(l)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stop closes every stream and the listener.
func (s *ReplServer) Stop() { s.g.Stop() }

// ReplClient dials one peer's replication server.
type ReplClient struct {
	cc *grpc.ClientConn
	// dialer puts a stream that cannot open into words, and handshake
	// (nil without TLS) one whose TLS failed.
	dialer    *dialer
	handshake *lastHandshake
}

// DialRepl prepares a connection to a peer; it connects lazily and
// reconnects by itself.
func DialRepl(addr string, opts ...ReplOption) (*ReplClient, error) {
	o := replOptionsOf(opts)
	d := newDialer(addr, false)
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	var last *lastHandshake
	dial := d.dial
	readBuffer := 256 << 10
	if o.tls != nil {
		readBuffer = 0 // TLS buffers a record already (see NewReplServer)
		last = &lastHandshake{}
		creds = &watchedCreds{TransportCredentials: credentials.NewTLS(o.tls), last: last}
		// The last outcome stands until the next one: a handshake's, or
		// a dial that did not get as far. (Cleared when a dial starts,
		// the refusal was lost to gRPC's next attempt racing the stream
		// that failed, and a refused certificate read as a lost peer.)
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := d.dial(ctx, addr)
			if err != nil {
				last.set(nil)
			}
			return conn, err
		}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(MaxFrameSize), grpc.MaxCallSendMsgSize(MaxFrameSize)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 2 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
		grpc.WithWriteBufferSize(256<<10),
		grpc.WithReadBufferSize(readBuffer),
	)
	if err != nil {
		return nil, fmt.Errorf("replication client for %s: %w", addr, err)
	}
	return &ReplClient{cc: cc, dialer: d, handshake: last}, nil
}

// Open starts a stream. It fails fast if the peer is unreachable.
func (c *ReplClient) Open(ctx context.Context) (*ReplStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.cc.NewStream(ctx, &replStreamDesc, replStreamMethod)
	if err != nil {
		cancel()
		if se := c.handshake.refused(c.dialer.addr, err); se != nil {
			return nil, se
		}
		return nil, c.dialer.openError(err)
	}
	// gRPC opens the stream before the connection is up: a handshake that
	// fails then surfaces at the first Send or Recv, and is told the same.
	refused := func(err error) *StreamError { return c.handshake.refused(c.dialer.addr, err) }
	return &ReplStream{s: s, cancel: cancel, refused: refused}, nil
}

// Close closes the connection.
func (c *ReplClient) Close() error { return c.cc.Close() }
