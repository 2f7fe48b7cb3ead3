package transport

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// The control API's methods, as the server's Authorize sees them.
const (
	MethodNodeStatus     = "NodeStatus"
	MethodClusterStatus  = "ClusterStatus"
	MethodPrimary        = "Primary"
	MethodDemote         = "Demote"
	MethodPromote        = "Promote"
	MethodConnect        = "Connect"
	MethodDisconnect     = "Disconnect"
	MethodResync         = "Resync"
	MethodPathAction     = "PathAction"
	MethodVerify         = "Verify"
	MethodClusterForward = "ClusterForward"
	MethodMembership     = "Membership"
	MethodAdjust         = "Adjust"
	MethodResize         = "Resize"
	MethodClaim          = "Claim"
	MethodEvents         = "Events"
	MethodAwaitServing   = "AwaitServing"
	MethodScrub          = "Scrub"
	MethodReadBlocks     = "ReadBlocks"
)

// ControlMethods lists every method of the control API.
func ControlMethods() []string {
	var out []string
	for _, m := range controlDesc.Methods {
		out = append(out, m.MethodName)
	}
	for _, s := range controlDesc.Streams {
		out = append(out, s.StreamName)
	}
	return out
}

// Message sizes of the control API. Requests are small (a volume and a
// node name; the largest, a raft command a node forwards, is well under a
// kilobyte). Replies carry the status model: the status of a cluster of
// a thousand volumes with three replicas of four paths each, every field
// at its longest, is 15 MB of JSON (TestTheLargestStatusFitsTheReplyLimit),
// so a reply may be 64 MiB. A message beyond these limits is refused
// (codes.ResourceExhausted) before it is decoded, and neither side holds
// more than the limit for one.
const (
	MaxControlRequest = 1 << 20
	MaxControlReply   = 64 << 20
)

// ControlServerOption shapes NewControlGRPC's server.
type ControlServerOption func(*controlServerConfig)

type controlServerConfig struct {
	authorize func(ctx context.Context, method string) (context.Context, error)
}

// WithAuthorize runs authorize before every call and stream with the
// method's name (MethodPrimary, ...): an error (a gRPC status, in words)
// refuses it; otherwise the call runs with the context authorize returns.
// PeerTLS and ForwardedBy read what authorize needs from ctx.
func WithAuthorize(authorize func(ctx context.Context, method string) (context.Context, error)) ControlServerOption {
	return func(c *controlServerConfig) { c.authorize = authorize }
}

// methodName is the last part of a gRPC full method name.
func methodName(full string) string { return full[strings.LastIndexByte(full, '/')+1:] }

func (c *controlServerConfig) serverOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(jsonCodec{}),
		grpc.MaxRecvMsgSize(MaxControlRequest),
		grpc.MaxSendMsgSize(MaxControlReply),
	}
	if c.authorize == nil {
		return opts
	}
	authorize := c.authorize
	return append(opts,
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			ctx, err := authorize(ctx, methodName(info.FullMethod))
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			ctx, err := authorize(ss.Context(), methodName(info.FullMethod))
			if err != nil {
				return err
			}
			return handler(srv, &streamWithContext{ServerStream: ss, ctx: ctx})
		}))
}

type streamWithContext struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *streamWithContext) Context() context.Context { return s.ctx }

// PeerTLS is the TLS state of the connection a call arrived on; nil when
// it came without TLS.
func PeerTLS(ctx context.Context) *tls.ConnectionState {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		return &info.State
	}
	return nil
}

// PeerAddr is the address a call came from ("" when unknown).
func PeerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// Metadata that marks a call a node makes on someone's behalf.
const (
	mdForwardedBy = "replvol-forwarded-by"
	mdOnBehalfOf  = "replvol-on-behalf-of"
)

// Forwarded marks the calls made with the returned context as forwarded
// by node on behalf of whom (in words: "operator operator", "the unix
// socket", "the split-brain policy").
func Forwarded(ctx context.Context, node, whom string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwardedBy, node, mdOnBehalfOf, whom)
}

// ForwardedBy reads Forwarded's mark from an incoming call: the node that
// says it forwarded the call and on whose behalf; "" when unmarked.
func ForwardedBy(ctx context.Context) (node, whom string) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return "", ""
	}
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return first(mdForwardedBy), first(mdOnBehalfOf)
}

// DialOption shapes DialControl's client.
type DialOption func(*dialConfig)

type dialConfig struct {
	tls         *tls.Config
	outgoing    func(context.Context) context.Context
	onHandshake func(error)
}

// WithHandshakeFailure calls fn with the error of each TLS handshake with
// the node that failed (TLSWords says it in words), e.g. to log it.
func WithHandshakeFailure(fn func(error)) DialOption {
	return func(c *dialConfig) { c.onHandshake = fn }
}

// WithTLS makes the client speak TLS with cfg (a unix socket address
// ignores it: the socket needs no certificate).
func WithTLS(cfg *tls.Config) DialOption { return func(c *dialConfig) { c.tls = cfg } }

// WithOutgoing passes every call's context through fn first (a node marks
// the calls it forwards there).
func WithOutgoing(fn func(context.Context) context.Context) DialOption {
	return func(c *dialConfig) { c.outgoing = fn }
}

// UnixScheme starts a control address that is a unix socket:
// unix:///var/lib/replvol/control.sock.
const UnixScheme = "unix://"

// UnixPath is the socket path of a unix control address, and whether addr
// is one.
func UnixPath(addr string) (string, bool) {
	if !strings.HasPrefix(addr, UnixScheme) {
		return "", false
	}
	return strings.TrimPrefix(addr, UnixScheme), true
}

// maxSocketPath is the longest path a unix socket address holds
// (sun_path, with its terminating NUL).
const maxSocketPath = 107

// DialUnix connects to the unix socket at path, also when the path is
// longer than a socket address holds (through the directory's
// /proc/self/fd entry).
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(int(dir.Fd()))+"/"+filepath.Base(path))
}

// ListenUnix listens on a unix socket at path, mode 0600 from its first
// moment (it is made in a private directory, then renamed into place,
// replacing a stale socket), also when path is longer than a socket
// address holds. Closing the listener leaves the file: remove it then.
func ListenUnix(path string) (*net.UnixListener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".control-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dir, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	made := filepath.Join(tmp, "s")
	bind := made
	if len(bind) > maxSocketPath {
		bind = "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/s"
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bind, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(made, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(made, path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
