package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
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

// MaxFrameSize bounds one replication frame.
const MaxFrameSize = 64 << 20

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
}

// Send queues a frame; the frame is consumed.
func (r *ReplStream) Send(f *Frame) error { return streamError(r.s.SendMsg(f)) }

// Recv reads the next frame into f (reusing its buffer).
func (r *ReplStream) Recv(f *Frame) error { return streamError(r.s.RecvMsg(f)) }

// Context is the stream's context; it ends when the stream does.
func (r *ReplStream) Context() context.Context { return r.s.Context() }

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
func NewReplServer(h ReplHandler) *ReplServer {
	g := grpc.NewServer(
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(MaxFrameSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Second, Timeout: 2 * time.Second}),
	)
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
	// dialer puts a stream that cannot open into words.
	dialer *dialer
}

// DialRepl prepares a connection to a peer; it connects lazily and
// reconnects by itself.
func DialRepl(addr string) (*ReplClient, error) {
	d := newDialer(addr, false)
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithContextDialer(d.dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(MaxFrameSize)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 2 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
		grpc.WithWriteBufferSize(256<<10),
		grpc.WithReadBufferSize(256<<10),
	)
	if err != nil {
		return nil, fmt.Errorf("replication client for %s: %w", addr, err)
	}
	return &ReplClient{cc: cc, dialer: d}, nil
}

// Open starts a stream. It fails fast if the peer is unreachable.
func (c *ReplClient) Open(ctx context.Context) (*ReplStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.cc.NewStream(ctx, &replStreamDesc, replStreamMethod)
	if err != nil {
		cancel()
		return nil, c.dialer.openError(err)
	}
	return &ReplStream{s: s, cancel: cancel}, nil
}

// Close closes the connection.
func (c *ReplClient) Close() error { return c.cc.Close() }
