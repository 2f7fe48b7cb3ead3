package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func rawGRPC(s string) bool {
	return strings.Contains(s, "rpc error") || strings.Contains(s, "desc =") || strings.Contains(s, "transport:") || strings.Contains(s, "Error while dialing")
}

func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestAControlCallToAStoppedNodeSaysSoInWords: a call to an address where
// nothing listens reads "cannot reach ADDR: connection refused", keeps its
// gRPC code and the dial error's value, and names the node once told.
func TestAControlCallToAStoppedNodeSaysSoInWords(t *testing.T) {
	addr := closedAddr(t)
	c, err := DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.NodeStatus(ctx, &StatusRequest{})
	want := "cannot reach " + addr + ": connection refused: nothing listens on that port"
	if err == nil || err.Error() != want {
		t.Fatalf("NodeStatus of a stopped node: %v, want %q", err, want)
	}
	if status.Code(err) != codes.Unavailable || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the words lost the values: code %v, ECONNREFUSED %v", status.Code(err), errors.Is(err, syscall.ECONNREFUSED))
	}
	if msg := status.Convert(err).Message(); msg != want {
		t.Errorf("status.Convert(err).Message() = %q, want the words", msg)
	}
	var se *StreamError
	if !errors.As(err, &se) || se.Reach != ReachRefused {
		t.Fatalf("not a *StreamError with Reach %q: %#v", ReachRefused, err)
	}
	if got, want := se.Named("beta").Error(), "cannot reach beta at "+addr+": connection refused: nothing listens on that port"; got != want {
		t.Errorf("Named = %q, want %q", got, want)
	}
	// The event stream says the same.
	err = c.Events(ctx, &EventsRequest{}, func(*Event) error { return nil })
	if err == nil || rawGRPC(err.Error()) || !strings.Contains(err.Error(), "cannot reach "+addr) {
		t.Errorf("Events of a stopped node: %v", err)
	}
}

// TestAReplicationStreamToAStoppedPeerSaysSoInWords: the same for the
// replication stream, which the peer-lost events and status reasons show.
func TestAReplicationStreamToAStoppedPeerSaysSoInWords(t *testing.T) {
	addr := closedAddr(t)
	c, err := DialRepl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Open(context.Background())
	want := "cannot reach " + addr + ": connection refused: nothing listens on that port"
	if err == nil || err.Error() != want || rawGRPC(err.Error()) {
		t.Fatalf("Open to a stopped peer: %v, want %q", err, want)
	}
}

// TestAHungNodeIsNotAnsweringNotStopped: a node that accepts connections
// and answers nothing (SIGSTOPped: the kernel still accepts) is told
// apart from a stopped one, as no-answer.
func TestAHungNodeIsNotAnsweringNotStopped(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // never accepted: the kernel completes the handshakes
	c, err := DialControl(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = c.NodeStatus(ctx, &StatusRequest{})
	var se *StreamError
	if !errors.As(err, &se) || se.Reach != ReachNoAnswer || rawGRPC(err.Error()) || !strings.Contains(err.Error(), "hung or paused") {
		t.Fatalf("NodeStatus of a hung node: %v (%#v), want no-answer in words", err, err)
	}
	if status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Unavailable {
		t.Errorf("code %v", status.Code(err))
	}
}

// slowNode answers its status only when the call's context ends.
type slowNode struct{ ControlServer }

func (slowNode) NodeStatus(ctx context.Context, _ *StatusRequest) (*NodeStatus, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (slowNode) Connect(context.Context, *ConnectRequest) (*ConnectReply, error) {
	return nil, status.Error(codes.FailedPrecondition, "vol0 has NBD clients")
}

func (slowNode) ClusterStatus(context.Context, *StatusRequest) (*ClusterStatus, error) {
	return &ClusterStatus{From: "slow"}, nil
}

// TestANodeThatStopsAnsweringSaysHowLongItWaited: a node that answered
// before and then does not within the call's deadline reads "did not
// answer: no answer within ...", not "context deadline exceeded"; the
// node's own errors stay its words.
func TestANodeThatStopsAnsweringSaysHowLongItWaited(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewControlGRPC(slowNode{})
	go g.Serve(l)
	defer g.Stop()
	c, err := DialControl(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ClusterStatus(context.Background(), &StatusRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.NodeStatus(ctx, &StatusRequest{})
	var se *StreamError
	// The words say how long the call waited: the 300 ms deadline, or
	// more on a starved machine, where the deadline's error comes late
	// (within a minute: the call's own time, not some other).
	prefix := l.Addr().String() + " did not answer: no answer within "
	waited := "(no duration)"
	if _, rest, ok := strings.Cut(fmt.Sprint(err), prefix); ok {
		waited, _, _ = strings.Cut(rest, ":")
	}
	if d, perr := time.ParseDuration(waited); !errors.As(err, &se) || se.Reach != ReachNoAnswer || perr != nil || d < 300*time.Millisecond || d > time.Minute {
		t.Fatalf("NodeStatus of a node that stopped answering: %v; want %q and the 300ms waited, or more", err, prefix)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("code %v, want DeadlineExceeded", status.Code(err))
	}
	// What the node says itself stays as it is.
	_, err = c.Connect(context.Background(), &ConnectRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || err.Error() != "vol0 has NBD clients" && st.Message() != "vol0 has NBD clients" {
		t.Errorf("a refusal of the node: %v", err)
	}
}
