package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// ControlServer is the control API a node implements. Errors should carry
// a gRPC status code (codes.FailedPrecondition, codes.NotFound, ...); their
// message reaches the operator as it is.
type ControlServer interface {
	NodeStatus(context.Context, *StatusRequest) (*NodeStatus, error)
	ClusterStatus(context.Context, *StatusRequest) (*ClusterStatus, error)
	Primary(context.Context, *PrimaryRequest) (*PrimaryReply, error)
	Demote(context.Context, *DemoteRequest) (*DemoteReply, error)
	Promote(context.Context, *PromoteRequest) (*PromoteReply, error)
	Connect(context.Context, *ConnectRequest) (*ConnectReply, error)
	Disconnect(context.Context, *ConnectRequest) (*ConnectReply, error)
	Resync(context.Context, *ResyncRequest) (*ResyncReply, error)
	PathAction(context.Context, *PathRequest) (*PathReply, error)
	Verify(context.Context, *VerifyRequest) (*VerifyReply, error)
	// ClusterForward carries a cluster message (a raft proposal, a lease
	// renewal) to the node that must handle it, the raft leader.
	ClusterForward(context.Context, *ClusterMessage) (*ClusterMessage, error)
	// Membership adds or removes a raft voter.
	Membership(context.Context, *MembershipRequest) (*MembershipReply, error)
	// Adjust changes a volume's replication settings online.
	Adjust(context.Context, *AdjustRequest) (*AdjustReply, error)
	// Resize grows a volume online.
	Resize(context.Context, *ResizeRequest) (*ResizeReply, error)
	// Claim takes, confirms or gives back a volume's mount claim on its
	// primary (replctl mount and umount).
	Claim(context.Context, *ClaimRequest) (*ClaimReply, error)
	// AwaitServing answers once the node serves a volume as its primary
	// at the request's epoch or a later one, or fails when the call's
	// deadline passes first. A node of an earlier release answers
	// codes.Unimplemented.
	AwaitServing(context.Context, *AwaitServingRequest) (*AwaitServingReply, error)
	// Scrub starts, pauses, resumes or stops the scrub of a volume on
	// every node that holds a disk of it (on r.Node alone, when set).
	Scrub(context.Context, *ScrubRequest) (*ScrubReply, error)
	// ReadBlocks reads a range of a volume on its primary as a client's
	// read is (verified, and repaired from a peer when bad): a
	// secondary's scrub takes the good copy of a bad block from it.
	// Between nodes only.
	ReadBlocks(context.Context, *ReadBlocksRequest) (*ReadBlocksReply, error)
	// VolumeCreate, VolumeDelete and VolumeList create, delete and list
	// the volumes made at run time from storage pools (volumes.go); any
	// node forwards them to the raft leader.
	VolumeCreate(context.Context, *VolumeCreateRequest) (*VolumeCreateReply, error)
	VolumeDelete(context.Context, *VolumeDeleteRequest) (*VolumeDeleteReply, error)
	VolumeList(context.Context, *VolumeListRequest) (*VolumeListReply, error)
	// Pools lists the storage pools of every node, or of one.
	Pools(context.Context, *PoolsRequest) (*PoolsReply, error)
	// Events streams the node's events (history first, then live) to
	// send until ctx ends or send fails.
	Events(ctx context.Context, r *EventsRequest, send func(*Event) error) error
}

// jsonCodec carries the control API's Go structs as JSON: the API is low
// rate, and JSON keeps one status model for gRPC, the web page and --json.
type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }

func (jsonCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (jsonCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return json.Unmarshal(data.Materialize(), v)
}

const controlService = "replvol.Control"

func unary[Req, Resp any](name string, call func(ControlServer, context.Context, *Req) (*Resp, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := new(Req)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, r any) (any, error) { return call(srv.(ControlServer), ctx, r.(*Req)) }
			if ic == nil {
				return h(ctx, req)
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + controlService + "/" + name}, h)
		},
	}
}

var controlDesc = grpc.ServiceDesc{
	ServiceName: controlService,
	HandlerType: (*ControlServer)(nil),
	Methods: []grpc.MethodDesc{
		unary(MethodNodeStatus, ControlServer.NodeStatus),
		unary(MethodClusterStatus, ControlServer.ClusterStatus),
		unary(MethodPrimary, ControlServer.Primary),
		unary(MethodDemote, ControlServer.Demote),
		unary(MethodPromote, ControlServer.Promote),
		unary(MethodConnect, ControlServer.Connect),
		unary(MethodDisconnect, ControlServer.Disconnect),
		unary(MethodResync, ControlServer.Resync),
		unary(MethodPathAction, ControlServer.PathAction),
		unary(MethodVerify, ControlServer.Verify),
		unary(MethodClusterForward, ControlServer.ClusterForward),
		unary(MethodMembership, ControlServer.Membership),
		unary(MethodAdjust, ControlServer.Adjust),
		unary(MethodResize, ControlServer.Resize),
		unary(MethodClaim, ControlServer.Claim),
		unary(MethodAwaitServing, ControlServer.AwaitServing),
		unary(MethodScrub, ControlServer.Scrub),
		unary(MethodReadBlocks, ControlServer.ReadBlocks),
		unary(MethodVolumeCreate, ControlServer.VolumeCreate),
		unary(MethodVolumeDelete, ControlServer.VolumeDelete),
		unary(MethodVolumeList, ControlServer.VolumeList),
		unary(MethodPools, ControlServer.Pools),
	},
	Streams: []grpc.StreamDesc{{
		StreamName:    MethodEvents,
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			req := new(EventsRequest)
			if err := stream.RecvMsg(req); err != nil {
				return err
			}
			return srv.(ControlServer).Events(stream.Context(), req, func(e *Event) error { return stream.SendMsg(e) })
		},
	}},
}

// NewControlGRPC returns a gRPC server carrying the control API, its
// messages bounded by MaxControlRequest and MaxControlReply. Serve it
// directly or through ServeHTTP next to the web page.
func NewControlGRPC(impl ControlServer, opts ...ControlServerOption) *grpc.Server {
	var c controlServerConfig
	for _, o := range opts {
		o(&c)
	}
	g := grpc.NewServer(c.serverOptions()...)
	g.RegisterService(&controlDesc, impl)
	return g
}

// ControlClient calls a node's control API.
type ControlClient struct {
	cc   *grpc.ClientConn
	addr string
	// wait makes commands wait for a node that is (re)connecting.
	wait bool
	// dialer puts failed calls into words.
	dialer *dialer
	// outgoing passes each call's context through (WithOutgoing).
	outgoing func(context.Context) context.Context
}

// WaitForReady makes the client's commands (not status calls) wait, within
// their deadline, for a node that is coming back, instead of failing at
// once. Nodes use it between themselves; an operator's CLI should not.
func (c *ControlClient) WaitForReady() *ControlClient {
	c.wait = true
	return c
}

// DialControl prepares a client for the node at addr: HOST:PORT, or
// unix:///PATH for a node's unix socket. Without WithTLS it speaks
// plaintext (a node without a tls: section, or its unix socket).
func DialControl(addr string, opts ...DialOption) (*ControlClient, error) {
	var c dialConfig
	for _, o := range opts {
		o(&c)
	}
	d := newDialer(addr, true)
	creds := insecure.NewCredentials()
	dialOpts := []grpc.DialOption{
		grpc.WithContextDialer(d.dial),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(jsonCodec{}),
			grpc.MaxCallRecvMsgSize(MaxControlReply), grpc.MaxCallSendMsgSize(MaxControlRequest)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
	}
	if _, unix := UnixPath(addr); unix {
		// The socket has no host name to put in :authority.
		dialOpts = append(dialOpts, grpc.WithAuthority("localhost"))
	} else if c.tls != nil {
		d.tls = true
		creds = &handshakeCreds{TransportCredentials: credentials.NewTLS(c.tls), d: d, failed: c.onHandshake}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, append(dialOpts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return nil, fmt.Errorf("control client for %s: %w", addr, err)
	}
	return &ControlClient{cc: cc, addr: addr, dialer: d, outgoing: c.outgoing}, nil
}

// Addr is the address the client talks to.
func (c *ControlClient) Addr() string { return c.addr }

// Close closes the connection.
func (c *ControlClient) Close() error { return c.cc.Close() }

func invoke[Resp any](ctx context.Context, c *ControlClient, method string, req any) (*Resp, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	if c.outgoing != nil {
		ctx = c.outgoing(ctx)
	}
	resp := new(Resp)
	start := time.Now()
	var opts []grpc.CallOption
	if c.wait && method != MethodNodeStatus && method != MethodClusterStatus {
		// Commands wait (within their deadline) for a node that is coming
		// back; status answers at once that a node is unreachable.
		opts = append(opts, grpc.WaitForReady(true))
	}
	err := c.cc.Invoke(ctx, "/"+controlService+"/"+method, req, resp, opts...)
	if status.Code(err) == codes.Unavailable && len(opts) == 0 {
		// The connection may only be waiting out its backoff after the
		// node restarted: reconnect now and give it a moment, so that a
		// node that is back is not reported unreachable, while one that
		// is down costs a status call at most statusRetry.
		c.cc.ResetConnectBackoff()
		first := err
		rctx, cancel := context.WithTimeout(ctx, statusRetry)
		defer cancel()
		err = c.cc.Invoke(rctx, "/"+controlService+"/"+method, req, resp, grpc.WaitForReady(true))
		if err != nil && rctx.Err() != nil && ctx.Err() == nil {
			err = first // the node is still unavailable
		}
	}
	if err != nil {
		return nil, c.dialer.callError(err, time.Since(start), ranOut(ctx))
	}
	return resp, nil
}

// ranOut reports whether ctx's deadline has come, or is about to: a node
// that answers "deadline exceeded" then ran out of the deadline the call
// gave it (gRPC passes it on), and did not answer in time.
func ranOut(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) < 50*time.Millisecond
}

// statusRetry bounds the second try of a call that found its node
// unreachable.
const statusRetry = 300 * time.Millisecond

// NodeStatus asks the node for its own view.
func (c *ControlClient) NodeStatus(ctx context.Context, r *StatusRequest) (*NodeStatus, error) {
	return invoke[NodeStatus](ctx, c, MethodNodeStatus, r)
}

// ClusterStatus asks the node to assemble the whole cluster's status.
func (c *ControlClient) ClusterStatus(ctx context.Context, r *StatusRequest) (*ClusterStatus, error) {
	return invoke[ClusterStatus](ctx, c, MethodClusterStatus, r)
}

// Primary asks for a switchover.
func (c *ControlClient) Primary(ctx context.Context, r *PrimaryRequest) (*PrimaryReply, error) {
	return invoke[PrimaryReply](ctx, c, MethodPrimary, r)
}

// Demote asks a primary to hand over.
func (c *ControlClient) Demote(ctx context.Context, r *DemoteRequest) (*DemoteReply, error) {
	return invoke[DemoteReply](ctx, c, MethodDemote, r)
}

// Promote makes the node primary.
func (c *ControlClient) Promote(ctx context.Context, r *PromoteRequest) (*PromoteReply, error) {
	return invoke[PromoteReply](ctx, c, MethodPromote, r)
}

// Connect lets a node replicate a volume again.
func (c *ControlClient) Connect(ctx context.Context, r *ConnectRequest) (*ConnectReply, error) {
	return invoke[ConnectReply](ctx, c, MethodConnect, r)
}

// Disconnect stops a node replicating a volume, on purpose.
func (c *ControlClient) Disconnect(ctx context.Context, r *ConnectRequest) (*ConnectReply, error) {
	return invoke[ConnectReply](ctx, c, MethodDisconnect, r)
}

// Resync starts, pauses or resumes a resync.
func (c *ControlClient) Resync(ctx context.Context, r *ResyncRequest) (*ResyncReply, error) {
	return invoke[ResyncReply](ctx, c, MethodResync, r)
}

// PathAction runs a path command (fail, restore, rotate, policy).
func (c *ControlClient) PathAction(ctx context.Context, r *PathRequest) (*PathReply, error) {
	return invoke[PathReply](ctx, c, MethodPathAction, r)
}

// Verify starts an online verify.
func (c *ControlClient) Verify(ctx context.Context, r *VerifyRequest) (*VerifyReply, error) {
	return invoke[VerifyReply](ctx, c, MethodVerify, r)
}

// ClusterForward carries a cluster message to the node.
func (c *ControlClient) ClusterForward(ctx context.Context, r *ClusterMessage) (*ClusterMessage, error) {
	return invoke[ClusterMessage](ctx, c, MethodClusterForward, r)
}

// Membership adds or removes a raft voter.
func (c *ControlClient) Membership(ctx context.Context, r *MembershipRequest) (*MembershipReply, error) {
	return invoke[MembershipReply](ctx, c, MethodMembership, r)
}

// Adjust changes a volume's replication settings online.
func (c *ControlClient) Adjust(ctx context.Context, r *AdjustRequest) (*AdjustReply, error) {
	return invoke[AdjustReply](ctx, c, MethodAdjust, r)
}

// Resize grows a volume online.
func (c *ControlClient) Resize(ctx context.Context, r *ResizeRequest) (*ResizeReply, error) {
	return invoke[ResizeReply](ctx, c, MethodResize, r)
}

// Claim takes, confirms or gives back a volume's mount claim.
func (c *ControlClient) Claim(ctx context.Context, r *ClaimRequest) (*ClaimReply, error) {
	return invoke[ClaimReply](ctx, c, MethodClaim, r)
}

// AwaitServing waits, within ctx's deadline, until the node serves a
// volume as its primary at r.Epoch or later.
func (c *ControlClient) AwaitServing(ctx context.Context, r *AwaitServingRequest) (*AwaitServingReply, error) {
	return invoke[AwaitServingReply](ctx, c, MethodAwaitServing, r)
}

// Scrub starts, pauses, resumes or stops a volume's scrub.
func (c *ControlClient) Scrub(ctx context.Context, r *ScrubRequest) (*ScrubReply, error) {
	return invoke[ScrubReply](ctx, c, MethodScrub, r)
}

// ReadBlocks reads a range of a volume from its primary, verified.
func (c *ControlClient) ReadBlocks(ctx context.Context, r *ReadBlocksRequest) (*ReadBlocksReply, error) {
	return invoke[ReadBlocksReply](ctx, c, MethodReadBlocks, r)
}

// Events streams a node's events to fn until ctx ends, fn fails or the
// node goes away.
func (c *ControlClient) Events(ctx context.Context, r *EventsRequest, fn func(*Event) error) error {
	start := time.Now()
	if c.outgoing != nil {
		ctx = c.outgoing(ctx)
	}
	stream, err := c.cc.NewStream(ctx, &controlDesc.Streams[0], "/"+controlService+"/"+MethodEvents)
	if err != nil {
		return c.dialer.callError(err, time.Since(start), ranOut(ctx))
	}
	if err := stream.SendMsg(r); err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		e := new(Event)
		if err := stream.RecvMsg(e); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return c.dialer.callError(err, time.Since(start), false)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}
