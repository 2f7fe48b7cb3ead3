package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestStreamErrorsAreWords(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unknown, "stream from alpha replaced or stopped"), "the peer ended the stream: stream from alpha replaced or stopped"},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), "connection lost: error reading from server: EOF"},
		{status.Error(codes.Canceled, "context canceled"), "stream closed here"},
		{status.Error(codes.PermissionDenied, "no"), "stream failed (PermissionDenied): no"},
	} {
		got := streamError(tc.err)
		if got.Error() != tc.want {
			t.Errorf("streamError(%v) = %q, want %q", tc.err, got, tc.want)
		}
		if strings.Contains(got.Error(), "rpc error") {
			t.Errorf("streamError(%v) = %q still reads as gRPC", tc.err, got)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("streamError(%v) does not wrap the gRPC error", tc.err)
		}
		var se *StreamError
		if !errors.As(got, &se) {
			t.Errorf("streamError(%v) is not a *StreamError", tc.err)
		}
	}
	if got := streamError(io.EOF); got != io.EOF {
		t.Errorf("streamError(io.EOF) = %v, want io.EOF itself (a clean end)", got)
	}
	other := errors.New("not grpc")
	if got := streamError(other); got != other {
		t.Errorf("streamError(%v) = %v, want it unchanged", other, got)
	}
	if streamError(nil) != nil {
		t.Error("streamError(nil) is not nil")
	}
}

// TestStopReturnsOnceEveryHandlerHas: a node closes its volumes' disks
// after its replication server stops, so Stop may not return while a
// handler still runs (one that goes on after its stream failed, as a
// step-down writing the superblock does).
func TestStopReturnsOnceEveryHandlerHas(t *testing.T) {
	started, recvFailed, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := NewReplServer(func(s *ReplStream) error {
		close(started)
		f := &Frame{}
		err := s.Recv(f)
		if err == nil {
			t.Error("the stream delivered a frame nobody sent")
		}
		close(recvFailed)
		<-release
		return err
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c, err := DialRepl(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	<-started
	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	<-recvFailed // the connection is closed: the handler's stream failed
	select {
	case <-stopped:
		t.Fatal("Stop returned while a handler still ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the handler did")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Stop: %v", err)
	}
}
