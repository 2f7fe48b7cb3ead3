package transport

import (
	"errors"
	"io"
	"strings"
	"testing"

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
