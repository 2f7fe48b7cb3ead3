package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// What the pool kept is given back once idle for a trim interval or two, and the Go heap's
	// share at the runtime's pace: neither is asserted, so the test does not wait for them (it
	// runs alone, and up to 20 s of that wait was the whole suite's); the log shows where the
	// memory stands as the test ends.
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

// TestE2EFloodsFromStrangersDenyNoService: two data nodes and a witness,
// raft and gossip, each in its own network namespace, TLS on every link
// (NBD too). Five more namespaces, addresses with no certificate, flood
// every TCP port of every node: NBD (connections that send nothing, and
// negotiations that stop half way through their TLS ClientHello), the
// control port (half ClientHellos, 230 per address, as in issue 27),
// raft and replication (both). A flooding connection that ends is made
// again, as an attacker does. While the flood goes on, from the host's
// address on the bridge, a stranger too:
//   - nbdinfo and qemu-io over TLS read and write the primary's volume;
//   - replctl status over TLS answers from every node, and over alpha's
//     unix socket;
//   - writes replicate (beta stays UpToDate and Connected), raft keeps its
//     leader and the volume its primary and epoch;
//   - beta, stopped and started again, connects to its peers through the
//     flood, and catches up.
//
// Each node counts the refused connections by port in /metrics, and logs
// them a line per flooding address and interval, not a line per
// connection.
func TestE2EFloodsFromStrangersDenyNoService(t *testing.T) {
	e2e(t)
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Netns: true, TLS: true, NBDTLS: "required", Size: 32 << 20})
	c.startAll()
	v0 := c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	// A leader that is a volume's primary hands its office to another
	// voter once it has led for a while (cluster.LeadershipSettle): wait
	// for that, so that the leader the flood must not move is the one
	// that stays.
	settledLeader := func(when string) string {
		t.Helper()
		var leader string
		if !within(30*time.Second, 50*time.Millisecond, func() bool {
			sd, _, err := c.status("alpha")
			if err != nil {
				return false
			}
			leader = sd.Cluster.Leader
			return leader != "" && leader != v0.Primary
		}) {
			t.Fatalf("%s: leader %q, primary %q; want a leader other than the primary", when, leader, v0.Primary)
		}
		return leader
	}
	leader := settledLeader("before the flood")
	epoch := v0.Epoch
	if v0.Primary != "alpha" {
		t.Fatalf("before the flood: primary %q, want alpha", v0.Primary)
	}

	var flooders []string
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("flood%d", i)
		c.lab.addNode(name)
		flooders = append(flooders, name)
	}
	port := func(node, which string) string {
		n := c.nodes[node]
		switch which {
		case "nbd":
			return n.NBD
		case "control":
			return n.Control
		case "raft":
			return n.Raft
		case "replication":
			return n.Replication
		}
		t.Fatalf("no port %s", which)
		return ""
	}
	var targets []floodTarget
	add := func(node, which string, kind floodKind, per int) {
		targets = append(targets, floodTarget{name: node + " " + which + " " + kind.String(), addr: port(node, which), kind: kind, per: per})
	}
	add("alpha", "nbd", floodIdle, 300)
	add("alpha", "nbd", floodHalfNBD, 60)
	for _, node := range c.nodeNames() {
		add(node, "control", floodHalfTLS, 230)
		add(node, "raft", floodHalfTLS, 30)
		add(node, "raft", floodIdle, 10)
		if node != witnessName {
			add(node, "replication", floodIdle, 20)
			add(node, "replication", floodHalfTLS, 20)
		}
	}
	started := time.Now()
	f := startFlood(t, c.lab, flooders, targets)
	f.waitTried(t, 2*time.Minute)
	t.Logf("flood: %d connections from %d addresses tried once, %v after it began; %d held now, %d ended within %v of their connect",
		f.workers, len(flooders), time.Since(started).Round(time.Millisecond), f.held.Load(), f.cut.Load(), floodCut)

	certs := filepath.Join(c.tlsDir, "nbd-client")
	nbds := "nbds://" + c.nodes["alpha"].NBD + "/" + volName + "?tls-certificates=" + certs
	for round := range 3 {
		begun := time.Now()
		if round == 2 {
			// A peer that starts anew must connect through the flood: to
			// raft and the control ports of the others, and alpha to its
			// replication port.
			c.stop("beta")
			qemuIOTLS(t, c, "alpha", "write -P 0xbb 8M 1M", "flush")
			c.start("beta")
			c.waitListening("beta", 30*time.Second)
			if leader == "beta" {
				// beta's stop handed its office on, maybe to alpha,
				// which hands it on again as the primary does.
				leader = settledLeader("after beta, the leader, restarted")
			}
		}
		if r := runCmd(30*time.Second, nil, nbdinfo, nbds); !r.ok() || !strings.Contains(r.out, "with TLS") {
			t.Fatalf("round %d: nbdinfo %s during the flood: %s", round, nbds, r)
		}
		off := fmt.Sprintf("%dM", round+1)
		pat := fmt.Sprintf("0x%x", 0xc0+round)
		qemuIOTLS(t, c, "alpha", "write -P "+pat+" "+off+" 1M", "read -P "+pat+" "+off+" 1M", "flush")
		for _, node := range c.nodeNames() {
			sd, v, err := c.status(node)
			if err != nil {
				t.Fatalf("round %d: replctl status over TLS via %s during the flood: %v", round, node, err)
			}
			if sd.Cluster.Leader != leader || v.Primary != "alpha" || v.Epoch != epoch {
				t.Fatalf("round %d: via %s, leader %q, primary %q, epoch %d during the flood; before it: %q, alpha, %d",
					round, node, sd.Cluster.Leader, v.Primary, v.Epoch, leader, epoch)
			}
		}
		if r := runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "status", "--json", "--addr", c.socket("alpha")); !r.ok() {
			t.Fatalf("round %d: replctl status over alpha's unix socket during the flood: %s", round, r)
		}
		c.waitFor("alpha", "the writes replicated to beta during the flood", syncTimeout, raftInSync)
		t.Logf("round %d: NBD, status and replication served in %v; the flood holds %d connections, %d cut so far",
			round, time.Since(begun).Round(time.Millisecond), f.held.Load(), f.cut.Load())
	}

	// The refusals are counted by port.
	resp, err := c.apiGet("alpha", "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"nbd", "control", "raft", "replication"} {
		if n := metricSum(string(body), "replvol_connections_refused_total", `port="`+p+`"`); n == 0 {
			t.Errorf("alpha's /metrics counts no refused %s connection during the flood", p)
		}
	}
	f.stop()
	lasted := time.Since(started)

	// A line per flooding address, port and interval at most: never a line
	// per connection.
	for _, node := range c.nodeNames() {
		b, err := os.ReadFile(filepath.Join(c.dir, node+".log"))
		if err != nil {
			t.Fatal(err)
		}
		ports := 4
		if node == witnessName {
			ports = 2
		}
		bound := 3 * ports * (int(lasted/(10*time.Second)) + 2)
		var counts []string
		for _, fl := range flooders {
			ip := c.lab.ip(fl)
			n := 0
			for line := range strings.Lines(string(b)) {
				if strings.Contains(line, ip+":") || strings.Contains(line, ip+",") || strings.Contains(line, ip+" ") || strings.Contains(line, ip+`"`) {
					n++
				}
			}
			if n > bound {
				t.Errorf("%s's log names %s in %d lines in %v of flood, over %d (a line per address, port and interval)", node, ip, n, lasted.Round(time.Second), bound)
			}
			counts = append(counts, fmt.Sprint(n))
		}
		t.Logf("%s's log: %s lines name the flooding addresses in %v", node, strings.Join(counts, ", "), lasted.Round(time.Second))
	}
	c.waitFor("alpha", "in sync after the flood", syncTimeout, raftInSync)
	qemuIOTLS(t, c, "alpha", "read -P 0xc0 1M 1M", "read -P 0xc2 3M 1M", "read -P 0xbb 8M 1M")
}

// metricSum adds the values of the samples of metric whose labels contain
// every one of labels.
func metricSum(text, metric string, labels ...string) float64 {
	var sum float64
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(rest, l)
		}
		fields := strings.Fields(rest)
		if !match || len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// floodKind is what a flooding connection does once connected, before it
// waits for the server to close it.
type floodKind int

const (
	// floodIdle sends nothing.
	floodIdle floodKind = iota
	// floodHalfTLS sends the first half of a TLS ClientHello.
	floodHalfTLS
	// floodHalfNBD reads the NBD greeting, sends its flags and
	// NBD_OPT_STARTTLS, reads the answer, and sends half a ClientHello: a
	// negotiation that never ends.
	floodHalfNBD
)

func (k floodKind) String() string {
	return [...]string{"idle", "half-tls", "half-nbd"}[k]
}

// floodTarget is a port flooded by per connections from each flooding
// address, all of one kind.
type floodTarget struct {
	name string
	addr string
	kind floodKind
	per  int
}

// floodCut: a flooding connection that ends sooner after its connect was
// refused (reset, or closed at once); it is made again after a back-off
// that doubles up to floodMaxBackoff. One that was held is made again
// after floodRedial: the flood keeps its pressure.
const (
	floodCut        = 200 * time.Millisecond
	floodRedial     = 100 * time.Millisecond
	floodMaxBackoff = 8 * time.Second
)

// flood is the connections of startFlood. Each is one goroutine that
// connects from its namespace (a few at a time: each connect takes an OS
// thread into the namespace), does what its kind says, reads until the
// server closes, and connects again.
type flood struct {
	workers int
	tried   sync.WaitGroup // each worker's first try
	done    chan struct{}
	wg      sync.WaitGroup
	dials   chan struct{} // bounds the connects in progress
	held    atomic.Int64  // connections open now
	cut     atomic.Int64  // connections that ended within floodCut of their connect, or failed it

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startFlood(t *testing.T, lab *netLab, from []string, targets []floodTarget) *flood {
	t.Helper()
	hello := halfClientHello(t)
	f := &flood{done: make(chan struct{}), dials: make(chan struct{}, 32), conns: map[net.Conn]struct{}{}}
	for _, name := range from {
		dial := lab.dialer(name)
		for _, tg := range targets {
			for range tg.per {
				f.workers++
				f.tried.Add(1)
				f.wg.Go(func() { f.work(dial, tg, hello) })
			}
		}
	}
	t.Cleanup(f.stop)
	return f
}

// waitTried waits until every flooding connection was tried once.
func (f *flood) waitTried(t *testing.T, timeout time.Duration) {
	t.Helper()
	ch := make(chan struct{})
	go func() { f.tried.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("the flood's %d connections were not all tried within %v", f.workers, timeout)
	}
}

// stop ends the flood: every connection is closed and no more are made.
func (f *flood) stop() {
	select {
	case <-f.done:
		return
	default:
	}
	close(f.done)
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *flood) work(dial dialFunc, tg floodTarget, hello []byte) {
	first := true
	backoff := time.Duration(0)
	for {
		began := time.Now()
		err := f.once(dial, tg, hello)
		if first {
			f.tried.Done()
			first = false
		}
		pause := floodRedial
		if err != nil || time.Since(began) < floodCut {
			f.cut.Add(1)
			backoff = min(max(2*backoff, 500*time.Millisecond), floodMaxBackoff)
			pause = backoff
		} else {
			backoff = 0
		}
		timer := time.NewTimer(pause)
		select {
		case <-f.done:
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// once makes one flooding connection and holds it until the server
// closes it or the flood stops.
func (f *flood) once(dial dialFunc, tg floodTarget, hello []byte) error {
	select {
	case f.dials <- struct{}{}:
	case <-f.done:
		return net.ErrClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	conn, err := dial(ctx, "tcp", tg.addr)
	cancel()
	<-f.dials
	if err != nil {
		return err
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0) // no TIME_WAIT left behind
	}
	f.mu.Lock()
	select {
	case <-f.done:
		f.mu.Unlock()
		conn.Close()
		return net.ErrClosed
	default:
	}
	f.conns[conn] = struct{}{}
	f.mu.Unlock()
	f.held.Add(1)
	defer func() {
		f.held.Add(-1)
		f.mu.Lock()
		delete(f.conns, conn)
		f.mu.Unlock()
		conn.Close()
	}()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	switch tg.kind {
	case floodHalfTLS:
		if _, err := conn.Write(hello); err != nil {
			return err
		}
	case floodHalfNBD:
		var greeting [18]byte
		if _, err := io.ReadFull(conn, greeting[:]); err != nil {
			return err
		}
		opt := binary.BigEndian.AppendUint32(nil, 3)                 // NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES
		opt = binary.BigEndian.AppendUint64(opt, 0x49484156454F5054) // IHAVEOPT
		opt = binary.BigEndian.AppendUint32(opt, 5)                  // NBD_OPT_STARTTLS
		opt = binary.BigEndian.AppendUint32(opt, 0)
		if _, err := conn.Write(opt); err != nil {
			return err
		}
		var reply [20]byte
		if _, err := io.ReadFull(conn, reply[:]); err != nil {
			return err
		}
		if _, err := conn.Write(hello); err != nil {
			return err
		}
	}
	_ = conn.SetDeadline(time.Time{})
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			return nil
		}
	}
}

// halfClientHello is the first half of the TLS ClientHello crypto/tls
// sends: a handshake that never ends.
func halfClientHello(t *testing.T) []byte {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		_ = tls.Client(client, &tls.Config{ServerName: "replvol", InsecureSkipVerify: true}).Handshake()
	}()
	defer client.Close()
	defer server.Close()
	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
	var header [5]byte
	if _, err := io.ReadFull(server, header[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(header[3:]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatal(err)
	}
	hello := append(header[:], body...)
	return hello[:len(hello)/2]
}
