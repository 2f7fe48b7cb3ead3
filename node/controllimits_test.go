package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// TestTooManyControlConnectionsAreRefusedAndTheNodeServesOn: alpha's
// control port takes at most 8 connections (6 from one host). A client
// that opens 40 gets the ones beyond the limit closed at once, and alpha
// logs one line for them; the operator's client connected before keeps
// working, and alpha keeps replicating to beta; once the flood ends new
// clients are served again.
func TestTooManyControlConnectionsAreRefusedAndTheNodeServesOn(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	log := c.logTo("alpha")
	o := c.opts["alpha"]
	o.controlConns, o.controlConnsPerHost = 8, 6
	c.opts["alpha"] = o
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	addr := c.nodes["alpha"].ControlAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := transport.DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	if _, err := before.NodeStatus(ctx, &transport.StatusRequest{}); err != nil {
		t.Fatal(err)
	}

	var flood []net.Conn
	defer func() {
		for _, conn := range flood {
			conn.Close()
		}
	}()
	refused := 0
	for i := 0; i < 40; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, conn)
		// A refused connection is closed at once: its read ends.
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
			refused++
		}
	}
	// The earlier client holds one connection, beta's control client
	// maybe another: 4 or 5 more from this host fit.
	if accepted := 40 - refused; accepted < 4 || accepted > 5 {
		t.Fatalf("%d of 40 connections were accepted, want 4 or 5 (6 per host, one or two held already)", accepted)
	}
	eventually(t, func() bool { return log.count("refused 1 new control connection(s)", "limit per host") == 1 }, "alpha logs the refusals")
	if n := log.count("new control connection(s)"); n != 1 {
		t.Fatalf("alpha logged the refused connections %d times, want once:\n%s", n, log)
	}
	if _, err := before.ClusterStatus(ctx, &transport.StatusRequest{}); err != nil {
		t.Fatalf("the client connected before the flood: %v", err)
	}
	if err := c.vol("alpha").WriteAt(ctx, pattern(7, 4096), 0, false); err != nil {
		t.Fatalf("alpha's volume during the flood: %v", err)
	}
	for _, conn := range flood {
		conn.Close()
	}
	flood = nil
	after, err := transport.DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	eventually(t, func() bool {
		_, err := after.NodeStatus(ctx, &transport.StatusRequest{})
		return err == nil
	}, "a new client is served once the flood ended")
	c.waitInSync()
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// rawJSON is the control API's codec, for a client without replctl's
// limits.
type rawJSON struct{}

func (rawJSON) Name() string { return "json" }

func (rawJSON) Marshal(v any) (mem.BufferSlice, error) {
	b, err := json.Marshal(v)
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawJSON) Unmarshal(data mem.BufferSlice, v any) error {
	return json.Unmarshal(data.Materialize(), v)
}

// TestAnOversizedControlRequestIsRefused: a request beyond
// transport.MaxControlRequest (a 2 MiB volume name) is refused with
// ResourceExhausted before it is decoded, and the node answers the next
// call.
func TestAnOversizedControlRequestIsRefused(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	addr := c.nodes["alpha"].ControlAddr()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawJSON{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	huge := &transport.ConnectRequest{Volume: strings.Repeat("v", 2<<20)}
	err = cc.Invoke(ctx, "/replvol.Control/Disconnect", huge, new(transport.ConnectReply))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 MiB request: %v, want ResourceExhausted", err)
	}
	var st transport.NodeStatus
	if err := cc.Invoke(ctx, "/replvol.Control/NodeStatus", &transport.StatusRequest{}, &st); err != nil || st.Node.Name != "alpha" {
		t.Fatalf("the next call: %+v %v", st.Node, err)
	}
}
