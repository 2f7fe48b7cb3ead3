package node

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// TestTooManyControlConnectionsAreRefusedAndTheNodeServesOn: alpha's
// control port takes at most 16 connections (6 from one host that is not
// a node of the cluster). A client at 127.0.0.2 that opens 40 gets the
// ones beyond its share closed at once, and alpha logs one line for them;
// the operator's client connected before keeps working, a new one at
// 127.0.0.1 (the nodes' address) is served, and alpha keeps replicating
// to beta; once the flood ends new clients are served again.
func TestTooManyControlConnectionsAreRefusedAndTheNodeServesOn(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	log := c.logTo("alpha")
	o := c.opts["alpha"]
	o.controlConns, o.controlConnsPerHost = 16, 6
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
	stranger := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for i := 0; i < 40; i++ {
		conn, err := stranger.Dial("tcp", addr)
		if isReset(err) {
			continue // refused so fast that connect saw it
		}
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, conn)
	}
	controlPort := func() connlimit.Stats {
		for _, p := range c.nodes["alpha"].admissions() {
			if p.port == "control" {
				return p.stats
			}
		}
		t.Fatal("alpha has no control port")
		return connlimit.Stats{}
	}
	eventually(t, func() bool { return controlPort().Count(connlimit.SourceOpen) == 34 }, "34 of the 40 refused: 6 per host")
	if st := controlPort(); st.StrangerOpen != 6 {
		t.Fatalf("the stranger holds %d connections, want 6 (%+v)", st.StrangerOpen, st)
	}
	eventually(t, func() bool {
		return log.count("control: from 127.0.0.2, refused 1 new connection(s)", "the most one address may hold") == 1
	}, "alpha logs the refusals")
	if n := log.count("control: from 127.0.0.2"); n != 1 {
		t.Fatalf("alpha logged the refused connections %d times, want once:\n%s", n, log)
	}
	during, err := transport.DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()
	if _, err := during.NodeStatus(ctx, &transport.StatusRequest{}); err != nil {
		t.Fatalf("a new client at the nodes' address during the flood: %v", err)
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
