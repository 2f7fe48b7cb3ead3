package control

import (
	"io"
	"log/slog"
	"testing"
)

// TestTheControlPortCountsConnectionsInAllAndPerHost: the limit's
// counting, host by host: a host at its own limit is refused while
// others are let in, every host is refused at the total, and a closed
// connection gives its slot back.
func TestTheControlPortCountsConnectionsInAllAndPerHost(t *testing.T) {
	l := &Listener{max: 4, per: 2, log: slog.New(slog.NewTextHandler(io.Discard, nil)), what: "control", perHost: map[string]int{}}
	for _, step := range []struct {
		host string
		want bool
	}{
		{"10.0.0.1", true}, {"10.0.0.1", true}, {"10.0.0.1", false}, // its own limit
		{"10.0.0.2", true}, {"10.0.0.3", true}, // the total is reached
		{"10.0.0.4", false},
	} {
		if got := l.admit(step.host); got != step.want {
			t.Fatalf("admit(%s) = %v with %d open (%v)", step.host, got, l.open, l.perHost)
		}
	}
	l.release("10.0.0.1")
	if !l.admit("10.0.0.4") || l.admit("10.0.0.5") {
		t.Fatal("a released slot is not taken once")
	}
	l.release("10.0.0.2")
	if _, ok := l.perHost["10.0.0.2"]; ok {
		t.Fatal("a host with no connection left is still counted")
	}
}
