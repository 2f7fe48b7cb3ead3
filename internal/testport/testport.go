package testport

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// lowest is the lowest port Pick chooses.
const lowest = 10000

// Pick returns a free 127.0.0.1:port below the kernel's ephemeral range,
// free for TCP (and for UDP too, with udp) when picked, and reserved for
// t until it ends (see reserve).
func Pick(t testing.TB, udp bool) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", pick(t, 1, udp))
}

// PickRun returns the first of n consecutive free ports on 127.0.0.1
// below the kernel's ephemeral range, each reserved for t until it ends,
// for a script that numbers its ports from a base.
func PickRun(t testing.TB, n int) int {
	t.Helper()
	return pick(t, n, false)
}

func pick(t testing.TB, n int, udp bool) int {
	t.Helper()
	high := ephemeralLow() - n
	for range 10000 {
		base := lowest + rand.IntN(high-lowest+1)
		if reserveRun(t, base, n, udp) {
			return base
		}
	}
	t.Fatalf("no %d free ports in a row between %d and %d on 127.0.0.1", n, lowest, ephemeralLow()-1)
	return 0
}

// reserveRun reserves base..base+n-1 for t if each is free and nobody
// holds it; else it reserves none.
func reserveRun(t testing.TB, base, n int, udp bool) bool {
	var got []int
	release := func() {
		for _, p := range got {
			os.Remove(reservation(p))
		}
		os.Remove(filepath.Dir(reservation(base))) // when it is empty
	}
	for p := base; p < base+n; p++ {
		if !reserve(p) {
			release()
			return false
		}
		got = append(got, p)
		if !free(p, udp) {
			release()
			return false
		}
	}
	t.Cleanup(release)
	return true
}

// free says whether port p can be bound on 127.0.0.1 now.
func free(p int, udp bool) bool {
	addr := "127.0.0.1:" + strconv.Itoa(p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	if udp {
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		u.Close()
	}
	return true
}

// reserve takes port p for this process: it creates p's reservation file
// exclusively, holding this process's pid. A port is free to bind while
// a node that uses it is down between restarts, so a bind check alone
// would let another test take it; the reservation keeps every test
// process that picks here (go test runs several packages at once) off a
// port until the test that picked it ends. A reservation whose process
// is gone is taken over.
func reserve(p int) bool {
	if err := os.MkdirAll(filepath.Dir(reservation(p)), 0o755); err != nil {
		return true // no registry: the bind check alone
	}
	path := reservation(p)
	for range 2 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			fmt.Fprintf(f, "%d\n", os.Getpid())
			f.Close()
			return true
		}
		if !errors.Is(err, fs.ErrExist) || !stale(path) {
			return false
		}
		os.Remove(path)
	}
	return false
}

// stale says whether the reservation at path belongs to no running
// process (or to this one's predecessor with a reused pid: rare, and it
// only costs another pick).
func stale(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return false // being written
	}
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func reservation(p int) string {
	return filepath.Join(os.TempDir(), "replvol-testport", strconv.Itoa(p))
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err != nil || lo <= lowest+1000 {
		return 32768
	}
	return lo
}
