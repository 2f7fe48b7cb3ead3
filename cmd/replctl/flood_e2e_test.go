package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestE2EReadFloodKeepsMemoryBounded runs two replnode processes and lets 40
// NBD clients each pipeline 40 READs of 32 MiB (the maximum request) into
// the primary without reading a single reply: 50 GiB of replies asked for.
// The primary's resident memory must grow by at most what its NBD server's
// budgets allow (the transport/nbd defaults the node runs with: a node
// budget of 256 MiB, a 1 MiB reserve per connection, a 64 MiB buffer pool),
// a well-behaved client must be served meanwhile, and once the flood's
// connections close the memory must come back.
func TestE2EReadFloodKeepsMemoryBounded(t *testing.T) {
	e2e(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const (
		size        = 256 << 20
		floodConns  = 40
		floodReads  = 40
		readLength  = 32 << 20
		nodeBudget  = 256 << 20 // nbd.Config defaults
		reserve     = 1 << 20
		poolCap     = 64 << 20
		slack       = 64 << 20 // Go heap and stacks, connection buffers, replication
		growthBound = nodeBudget + (floodConns+1)*reserve + poolCap + slack
		backBound   = poolCap + slack
	)
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	uri := "nbd://" + c.nodes["alpha"].NBD + "/" + volName
	pid := c.procs["alpha"].Process.Pid
	rest := floodRSS(t, pid)
	t.Logf("primary at rest: RSS %d MiB", rest>>20)

	sampler := startRSSSampler(t, pid)
	var flood []*rawNBD
	closeFlood := func() {
		for _, f := range flood {
			f.conn.Close() // gone without reading or a DISC
		}
		flood = nil
	}
	t.Cleanup(closeFlood)
	for i := range floodConns {
		f, err := dialRawNBD(uri)
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		flood = append(flood, f)
		var reqs []byte
		for j := range floodReads {
			f.handle++
			reqs = append(reqs, reqHeader(nbdCmdRead, 0, f.handle, uint64(j%(size/readLength))*readLength, readLength)...)
		}
		_ = f.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := f.conn.Write(reqs); err != nil {
			t.Fatalf("flood connection %d: sending %d READs: %v", i, floodReads, err)
		}
	}
	// The flood has taken hold once the primary holds a good part of its node budget in replies.
	if !within(30*time.Second, 100*time.Millisecond, func() bool { return floodRSS(t, pid)-rest >= nodeBudget/2 }) {
		t.Fatalf("the flood never took hold: RSS %d MiB, at rest %d MiB", floodRSS(t, pid)>>20, rest>>20)
	}

	// A well-behaved client, one request at a time, 4 KiB to 1 MiB, is served within seconds.
	good, err := dialRawNBD(uri)
	if err != nil {
		t.Fatalf("a new client while the flood hangs: %v", err)
	}
	defer good.close()
	sizes := []int{4 << 10, 64 << 10, 256 << 10, 1 << 20}
	var slowest time.Duration
	for i := range 24 {
		n := sizes[i%len(sizes)]
		off := uint64(size - 8<<20 + i*(64<<10))
		data := bytes.Repeat([]byte{byte(i + 1)}, n)
		start := time.Now()
		if errno, _, err := good.request(nbdCmdWrite, 0, off, uint32(n), data, 0); err != nil || errno != 0 {
			t.Fatalf("write %d of %d bytes while the flood hangs: errno %d, %v", i, n, errno, err)
		}
		got, err := good.read(off, n)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d of %d bytes while the flood hangs: %v", i, n, err)
		}
		took := time.Since(start)
		slowest = max(slowest, took)
		if took > 5*time.Second {
			t.Fatalf("write+read of %d bytes took %v while the flood hangs", n, took)
		}
	}
	start := time.Now()
	qemuIO(t, uri, "write -P 0x5a 4M 1M", "read -P 0x5a 4M 1M", "read 0 4k")
	t.Logf("well-behaved clients while the flood hangs: slowest raw write+read %v; qemu-io (new connection) %v",
		slowest, time.Since(start))
	time.Sleep(2 * time.Second) // the flood goes on: give the memory every chance to grow
	peak := sampler.peak()
	t.Logf("during the flood: peak RSS %d MiB, growth %d MiB, bound %d MiB (node budget %d + %d reserves of %d + pool %d + slack %d)",
		peak>>20, (peak-rest)>>20, growthBound>>20, nodeBudget>>20, floodConns+1, reserve>>20, poolCap>>20, slack>>20)
	if peak-rest > growthBound {
		t.Fatalf("RSS grew by %d MiB during the flood, over the bound of %d MiB", (peak-rest)>>20, growthBound>>20)
	}

	closeFlood()
	closed := time.Now()
	var now int64
	if !within(30*time.Second, 200*time.Millisecond, func() bool {
		now = floodRSS(t, pid)
		return now-rest <= backBound
	}) {
		t.Fatalf("RSS still %d MiB (%d MiB over rest) 30 s after the flood's connections closed, want within %d MiB",
			now>>20, (now-rest)>>20, backBound>>20)
	}
	t.Logf("after the flood: RSS %d MiB (%+d MiB over rest) %v after its connections closed", now>>20, (now-rest)>>20, time.Since(closed).Round(time.Millisecond))
	// What the pool kept is given back once idle for a trim interval or two (not asserted: the
	// Go heap's share returns at the runtime's pace).
	within(20*time.Second, 200*time.Millisecond, func() bool { return floodRSS(t, pid)-rest <= 16<<20 })
	t.Logf("%v after the flood: RSS %d MiB, at rest %d MiB", time.Since(closed).Round(time.Millisecond), floodRSS(t, pid)>>20, rest>>20)
	qemuIO(t, uri, "read -P 0x5a 4M 1M")
}

// floodRSS returns the resident memory of process pid (VmRSS) in bytes.
func floodRSS(t *testing.T, pid int) int64 {
	t.Helper()
	rss, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss
}

func readRSS(pid int) (int64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no VmRSS line", path)
}

// rssSampler records the highest RSS of a process, sampled every 50 ms until the test ends.
type rssSampler struct {
	mu   sync.Mutex
	max  int64
	stop chan struct{}
	done chan struct{}
}

func startRSSSampler(t *testing.T, pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := readRSS(pid); err == nil {
				s.mu.Lock()
				s.max = max(s.max, rss)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		close(s.stop)
		<-s.done
	})
	return s
}

func (s *rssSampler) peak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}
