package testport

import (
	"net"
	"strconv"
	"testing"
)

// TestPickGivesFreePortsBelowTheEphemeralRange: every port is bindable,
// below the range the kernel hands outgoing connections, and new.
func TestPickGivesFreePortsBelowTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		addr := Pick(t, true)
		if seen[addr] {
			t.Fatalf("%s given twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lowest || port >= ephemeralLow() {
			t.Fatalf("port %d outside [%d, %d)", port, lowest, ephemeralLow())
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		l.Close()
	}
}
