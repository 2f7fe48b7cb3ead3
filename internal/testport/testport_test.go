package testport

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// TestAPortAnotherProcessReservedIsNotPicked: a port whose reservation
// belongs to a running process (pid 1 here) is not taken, even though
// nothing listens on it; one whose process is gone is taken over.
func TestAPortAnotherProcessReservedIsNotPicked(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	const port = 10001
	if err := os.MkdirAll(filepath.Dir(reservation(port)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reservation(port), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if reserve(port) {
		t.Fatal("took the reservation of a running process")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reservation(port), []byte(strconv.Itoa(gone.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !reserve(port) {
		t.Fatal("did not take over the reservation of a process that is gone")
	}
	if b, _ := os.ReadFile(reservation(port)); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("the reservation holds %q, want this process's pid", b)
	}
}

// TestPickRunReservesEveryPortUntilTheTestEnds: the run's ports are each
// reserved while the test runs, and free of reservations after it.
func TestPickRunReservesEveryPortUntilTheTestEnds(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	var base int
	t.Run("pick", func(t *testing.T) {
		base = PickRun(t, 5)
		for p := base; p < base+5; p++ {
			if _, err := os.Stat(reservation(p)); err != nil {
				t.Fatalf("port %d of the run is not reserved: %v", p, err)
			}
		}
	})
	for p := base; p < base+5; p++ {
		if _, err := os.Stat(reservation(p)); !os.IsNotExist(err) {
			t.Fatalf("port %d still reserved after the test ended (%v)", p, err)
		}
	}
}
