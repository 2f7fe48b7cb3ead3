//go:build linux

package nbd_test

// This test pins what 10,000 connections from five addresses can cost a Server: each address
// may have MaxNegotiatingPerAddress negotiations in progress (the rest are closed as they are
// accepted, with a log line per address, not one per connection), so the file descriptors and
// memory they hold stay bounded, a client connected before goes on reading and writing
// meanwhile, and a new client from another address is served during the flood. Once the
// flood ends new clients are served again.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// openFiles counts this process's file descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// residentBytes is this process's resident memory (VmRSS).
func residentBytes(t *testing.T) int64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kib); err != nil {
				t.Fatal(err)
			}
			return kib << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// raiseFileLimit makes RLIMIT_NOFILE at least need for the test, and restores it after.
func raiseFileLimit(t *testing.T, need uint64) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if old.Cur >= need {
		return
	}
	raised := syscall.Rlimit{Cur: need, Max: max(old.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		t.Fatalf("this test holds both ends of 10,000 connections: it needs %d file descriptors, and RLIMIT_NOFILE is %d (hard %d) and cannot be raised: %v; run it with ulimit -n %d",
			need, old.Cur, old.Max, err, need)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// realClient is nbdsh connected to uri, writing and reading a block when asked.
type realClient struct {
	stdin *os.File
	out   *bufio.Scanner
}

const realClientScript = `
import sys
print("connected", flush=True)
for line in sys.stdin:
    off = int(line)
    data = bytes([off // 32768 % 251]) * 32768
    h.pwrite(data, off)
    assert h.pread(32768, off) == data
    h.flush()
    print("ok", flush=True)
h.shutdown()
`

func startRealClient(t *testing.T, uri string) *realClient {
	t.Helper()
	path, err := nbdtest.LookTool("nbdsh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, path, "-u", uri, "-c", realClientScript)
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH"))
	stdin, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	t.Cleanup(func() {
		w.Close() // EOF: the script disconnects and exits
		if err := cmd.Wait(); err != nil {
			t.Errorf("nbdsh: %v\n%s", err, stderr.String())
		}
		cancel()
	})
	c := &realClient{stdin: w, out: bufio.NewScanner(stdout)}
	if !c.out.Scan() || c.out.Text() != "connected" {
		t.Fatalf("nbdsh did not connect: %q\n%s", c.out.Text(), stderr.String())
	}
	return c
}

// writeRead has the client write a 32 KiB block at off, read it back and flush.
func (c *realClient) writeRead(t *testing.T, off int64) {
	t.Helper()
	if _, err := fmt.Fprintln(c.stdin, off); err != nil {
		t.Fatal(err)
	}
	if !c.out.Scan() || c.out.Text() != "ok" {
		t.Fatalf("nbdsh write and read at %d: %q %v", off, c.out.Text(), c.out.Err())
	}
}

func TestTenThousandConnectionsAreBoundedAndTheServerGoesOnServing(t *testing.T) {
	nbdtest.RequireTool(t, "nbdsh", "nbdinfo")
	const (
		connections = 10000
		flooders    = 5  // the flood comes from 127.0.0.2 to 127.0.0.6; the clients from 127.0.0.1
		pipeliners  = 20 // of the connections, from 127.0.0.1: negotiate, then pipeline READs and read nothing
		readLength  = 1 << 20
		reads       = 16
		perAddress  = 16 // the default MaxNegotiatingPerAddress
	)
	start := time.Now()
	logs := &logStore{}
	s := startServer(t, map[string]nbd.Export{"vol": nbdtest.NewMemExport(floodExportSize)}, func(c *nbd.Config) {
		// Default MaxConnections, MaxOpenConnections and per-address limits; a small node
		// budget and pool so the pipeliners' memory bound is small too.
		c.NodeBudget = nbd.MaxRequestLength
		c.ConnectionReserve = 64 << 10
		c.MaxPooledBytes = 8 << 20
		c.Logger = slog.New(recordingHandler{store: logs})
	})
	st := s.Stats()
	maxOpen := int(st.MaxOpenConnections)
	if maxOpen != 1024 {
		t.Fatalf("default MaxOpenConnections %d, want 1024 (4 × MaxConnections)", maxOpen)
	}
	raiseFileLimit(t, connections+uint64(maxOpen)+1024)

	client := startRealClient(t, s.uri("vol"))
	client.writeRead(t, 0)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := residentBytes(t)
	filesBefore := openFiles(t)

	conns := make([]net.Conn, 0, connections)
	closeAll := func() {
		for _, c := range conns {
			if tcp, ok := c.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0) // a reset: no TIME_WAIT left behind on either side
			}
			c.Close()
		}
		conns = conns[:0]
	}
	t.Cleanup(closeAll)
	for i := range pipeliners {
		c := s.dial(t, "vol")
		for j := range reads {
			off := uint64(i*reads+j) * readLength % (floodExportSize - readLength)
			if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdRead, Offset: off, Length: readLength}); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, c.Conn)
	}
	// The rest, from five other addresses, from a few goroutines (one each would be 10,000):
	// three in four connect and say nothing, one in four sends its flags and half an option
	// header, a negotiation that never ends.
	idle := make([]net.Conn, connections-pipeliners)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < len(idle); i += 8 {
				d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%flooders))}}
				c, err := d.Dial("tcp", s.addr)
				if errors.Is(err, syscall.ECONNRESET) {
					continue // refused so fast that connect saw the reset
				}
				if errors.Is(err, syscall.EMFILE) {
					errs <- fmt.Errorf("connection %d: file descriptors exhausted: the server holds %d connections open (MaxOpenConnections %d): %w",
						i, s.Stats().OpenConnections, maxOpen, err)
					return
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
				if i%4 == 0 {
					_, _ = c.Write([]byte{0, 0, 0, 3, 'I', 'H', 'A', 'V', 'E'}) // flags, and half an option's magic
				}
				idle[i] = c
			}
		})
	}
	wg.Wait()
	close(errs)
	for _, c := range idle {
		if c != nil {
			conns = append(conns, c)
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	flooded := time.Since(start)
	t.Logf("%d connections made, %d of them still open at the client, after %v", connections, len(conns), flooded)

	// Every connection was accepted or refused; each flooding address has at most its share
	// open, and the rest were refused.
	waitUntil(t, "every connection accepted or refused", func() (bool, string) {
		st := s.Stats()
		return st.AcceptedConnections+st.RefusedAtAccept == connections+1,
			fmt.Sprintf("%d accepted, %d refused", st.AcceptedConnections, st.RefusedAtAccept)
	})
	st = s.Stats()
	if bound := int64(pipeliners + 1 + flooders*perAddress); st.OpenConnections > bound || st.Admission.Count(connlimit.SourceHandshakes) < connections/2 {
		t.Fatalf("%d open and %d refused for their address's negotiations, want at most %d open (%d per flooding address) and the rest refused",
			st.OpenConnections, st.Admission.Count(connlimit.SourceHandshakes), bound, perAddress)
	}
	// The client connected before is served meanwhile (its requests fit in its reserve while
	// the pipeliners hold the node budget), and so is a new one.
	for i := range 3 {
		client.writeRead(t, int64(i+1)<<20)
	}
	mustRun(t, "nbdinfo", s.uri("vol"))

	// Bounded: the server's descriptors (ours are the client ends), and memory.
	files := openFiles(t) - filesBefore - len(conns)
	if files > maxOpen+64 {
		t.Errorf("the server holds %d more file descriptors, want at most MaxOpenConnections %d (+64)", files, maxOpen)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	rssGrown := residentBytes(t) - rssBefore
	// Per open connection its goroutine, small read buffer and state; per client end a
	// net.Conn. Request buffers are mapped outside the heap: the node budget, a reserve per
	// connection in transmission, and the pool bound them (Config).
	heapBound := int64(maxOpen)*32<<10 + connections*2<<10 + 32<<20
	buffersBound := nbd.MaxRequestLength + st.TransmittingConnections*64<<10 + 8<<20
	st = s.Stats()
	t.Logf("server: %d connections open, %d refused, %d in transmission, %d bytes in flight (peak %d), %d pooled; %d more fds; heap+stacks grew %d MiB (bound %d MiB), resident memory %d MiB",
		st.OpenConnections, st.RefusedAtAccept, st.TransmittingConnections, st.InFlightBytes, st.PeakInFlightBytes, st.PooledBytes, files, grown>>20, heapBound>>20, rssGrown>>20)
	if grown > heapBound {
		t.Errorf("heap and stacks grew by %d MiB during the flood, over the bound of %d MiB", grown>>20, heapBound>>20)
	}
	if st.PeakInFlightBytes+st.PooledBytes > buffersBound {
		t.Errorf("request buffers: %d bytes in flight at the peak and %d pooled, over the bound of %d", st.PeakInFlightBytes, st.PooledBytes, buffersBound)
	}
	if rssGrown > heapBound+buffersBound+64<<20 && !raceEnabled {
		t.Errorf("resident memory grew by %d MiB during the flood, over %d MiB", rssGrown>>20, (heapBound+buffersBound+64<<20)>>20)
	}

	// A log line per flooding address and interval says its connections are refused, not one
	// per connection.
	intervals := int(time.Since(start)/(10*time.Second)) + 1
	for a := range flooders {
		from := fmt.Sprintf("nbd: from 127.0.0.%d,", 2+a)
		var lines []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, from) {
				lines = append(lines, line)
			}
		}
		if len(lines) < 1 || len(lines) > intervals || !strings.HasPrefix(lines[0], "WARN") || !strings.Contains(lines[0], "16 handshakes from that address are in progress") {
			t.Errorf("%d log lines about refused connections from %s in %d intervals, want a Warn per interval naming the limit:\n%s",
				len(lines), from, intervals, strings.Join(lines, "\n"))
		}
	}

	// The flood ends: its connections close, and a new client is served.
	closeAll()
	waitUntil(t, "the flood's connections closed", func() (bool, string) {
		n := s.Stats().OpenConnections
		return n == 1, fmt.Sprint(n, " open")
	})
	mustRun(t, "nbdinfo", s.uri("vol"))
	client.writeRead(t, 8<<20)
	if took := time.Since(start); took > 10*time.Second {
		t.Logf("the test took %v (the flood %v)", took, flooded)
	}
}
