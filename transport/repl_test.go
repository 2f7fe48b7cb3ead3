package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/poll"

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

// TestAReplicationFloodKeepsNoNodeOut: strangers at 20 addresses open
// 40 idle connections each to a replication server; each address keeps
// at most its share (8), the strangers together at most theirs (128),
// the rest are refused at once; meanwhile a node of the cluster (a known
// address) opens 20 streams and each carries a frame.
func TestAReplicationFloodKeepsNoNodeOut(t *testing.T) {
	got := make(chan []byte, 20)
	srv := NewReplServer(func(s *ReplStream) error {
		f := &Frame{}
		if err := s.Recv(f); err != nil {
			return err
		}
		got <- append([]byte(nil), f.Bytes()...)
		return nil
	}, ReplKnown(connlimit.NewKnown(netip.MustParseAddr("127.0.0.1"))))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	const addresses, per = 20, 40
	for a := range addresses {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+a))}}
		for range per {
			c, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				continue // refused so fast that connect saw it
			}
			flood = append(flood, c)
		}
	}
	waitFor(t, "every flooding connection admitted or refused", func() bool {
		st := srv.Admission()
		return st.Admitted+st.Refused() >= addresses*per
	})
	st := srv.Admission()
	// 20 addresses × 8 is more than the strangers' 128: newcomers took
	// the places of the biggest holders' oldest handshakes, or were refused.
	if st.StrangerOpen > replStrangerConns || st.Count(connlimit.SourceOpen)+st.Count(connlimit.SourceHandshakes) == 0 ||
		st.Count(connlimit.PortFull)+st.Count(connlimit.HandshakesFull)+st.Count(connlimit.Evicted) == 0 {
		t.Fatalf("stats %+v: want at most %d strangers' connections, each address refused beyond %d, and the strangers' share full",
			st, replStrangerConns, replPerStrangerAddress)
	}

	c, err := DialRepl(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		s, err := c.Open(ctx)
		if err != nil {
			t.Fatalf("stream %d of a node during the flood: %v", i, err)
		}
		f := NewFrame(4)
		f.SetBytes(fmt.Appendf(f.Bytes(), "%04d", i))
		if err := s.Send(f); err != nil {
			t.Fatalf("stream %d of a node during the flood: %v", i, err)
		}
		select {
		case b := <-got:
			if string(b) != fmt.Sprintf("%04d", i) {
				t.Fatalf("stream %d carried %q", i, b)
			}
		case <-ctx.Done():
			t.Fatalf("stream %d's frame never reached the handler", i)
		}
		s.Close()
	}
}

// waitFor polls cond until it holds, or fails the test after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll.Within(30*time.Second, 10*time.Millisecond, cond) {
		t.Fatalf("%s: not within 30 s", what)
	}
}
