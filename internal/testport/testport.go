package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
)

// lowest is the lowest port Pick chooses.
const lowest = 10000

var given sync.Map // "127.0.0.1:port" → true: never given twice in a process

// Pick returns a free 127.0.0.1:port below the kernel's ephemeral range,
// free for TCP (and for UDP too, with udp) when picked, and never
// returned before in this process.
func Pick(t testing.TB, udp bool) string {
	t.Helper()
	high := ephemeralLow() - 1
	for range 10000 {
		addr := fmt.Sprintf("127.0.0.1:%d", lowest+rand.IntN(high-lowest+1))
		if _, loaded := given.LoadOrStore(addr, true); loaded {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ok := true
		if udp {
			u, err := net.ListenPacket("udp", addr)
			if err == nil {
				u.Close()
			}
			ok = err == nil
		}
		l.Close()
		if ok {
			return addr
		}
	}
	t.Fatalf("no free port between %d and %d on 127.0.0.1", lowest, high)
	return ""
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
