package control

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// failingListener's Accept returns what the test sends on results, and
// counts its calls on calls.
type failingListener struct {
	results chan error
	calls   chan struct{}
	closed  chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.calls <- struct{}{}
	select {
	case err := <-l.results:
		return nil, err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *failingListener) Close() error   { close(l.closed); return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestAFailedAcceptPausesOnTheInjectedClock: after an accept that failed
// (out of file descriptors, say), the port pauses 5 ms of Limits.Clock
// before it accepts again.
func TestAFailedAcceptPausesOnTheInjectedClock(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	inner := &failingListener{results: make(chan error), calls: make(chan struct{}, 4), closed: make(chan struct{})}
	log := slog.New(slog.DiscardHandler)
	l := NewListener(inner, "control", nil, Limits{Max: 8, PerHost: 8, Clock: fake}, log, NewRefusalLog(log, time.Minute, 16))
	defer l.Close()
	within := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("not within 10s: %s", what)
		}
	}
	within("the first accept", inner.calls)
	inner.results <- errors.New("accept: too many open files")
	armed := make(chan struct{})
	go func() { fake.WaitArmed(1); close(armed) }()
	within("the pause is armed on the injected clock", armed)
	select {
	case <-inner.calls:
		t.Fatal("the port accepted again before its pause ran out")
	default:
	}
	fake.Advance(5 * time.Millisecond)
	within("the accept after the pause", inner.calls)
}
