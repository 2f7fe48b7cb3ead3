package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/internal/testport"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"golang.org/x/sys/unix"
)

// testCluster is alpha and beta in this process, on 127.0.0.1 free ports,
// with file disks in a temp dir.
type testCluster struct {
	t     testing.TB
	dir   string
	cfg   *Config
	nodes map[string]*Node
	opts  map[string]Options
	// logs keeps the end of what each node logged (at INFO and above),
	// for the failure of a wait to show: the goroutines say where a node
	// waits, its log says why.
	logs map[string]*logTail
}

// logTail is the last logTailBytes of a log.
type logTail struct {
	mu  mutex
	buf []byte
}

const logTailBytes = 64 << 10

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - logTailBytes; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// logNodes logs the end of each node's log.
func (c *testCluster) logNodes() {
	for _, name := range slices.Sorted(maps.Keys(c.logs)) {
		c.t.Logf("the end of %s's log:\n%s", name, c.logs[name])
	}
}

func newTestCluster(t testing.TB, size int64) *testCluster {
	t.Helper()
	return newTestClusterOf(t, size, "alpha", "beta")
}

// newTestClusterOf is newTestCluster with the given data nodes; the first
// is the volume's primary.
func newTestClusterOf(t testing.TB, size int64, names ...string) *testCluster {
	t.Helper()
	c := &testCluster{t: t, dir: t.TempDir(), cfg: &Config{}, nodes: map[string]*Node{}, opts: map[string]Options{}, logs: map[string]*logTail{}}
	vol := VolumeConfig{Name: "vol0", Size: VolumeSize(size), Protocol: "C", Primary: names[0], Disks: map[string]DiskConfig{}}
	for _, name := range names {
		nc := NodeConfig{Name: name, StateDir: filepath.Join(c.dir, name)}
		nc.Control, nc.Replication, nc.NBD = freeAddr(t), freeAddr(t), freeAddr(t)
		c.cfg.Nodes = append(c.cfg.Nodes, nc)
		img := filepath.Join(c.dir, name+".img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, deviceSizeFor(t, size, len(names)-1)); err != nil {
			t.Fatal(err)
		}
		vol.Disks[name] = SinglePath(img)
	}
	c.cfg.Volumes = []VolumeConfig{vol}
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A test that failed shows how its nodes saw it: the assertion
		// says what went wrong, their logs why (a peer that timed out, a
		// resync that began again).
		if t.Failed() {
			c.logNodes()
		}
		for _, n := range c.nodes {
			n.Close()
		}
	})
	return c
}

// beside marks a test whose time goes into waiting for its nodes (leases,
// elections, failovers, restarts, resyncs held back by a rate, a copy
// that must still run when looked at) and which asserts no time, rate or
// count of wakeups of its own: it runs beside the other such tests, go
// test's -parallel at a time, after the package's other tests. Each test
// cluster has its own temporary directory and ports (testport reserves
// them across processes too), and no test of the package changes a
// package-level variable, so they do not meet. A test that bounds how
// long something takes, a rate or a number of messages in a time stays
// without it: beside the others it would measure the machine. So does a
// test of a raft cluster (newRaftCluster, startThreeUnderRaft): its
// elections and lease are short (300 ms, 900 ms), and a node starved
// beside two other clusters loses them, so that what the test waits for
// (10 s at most, eventually) comes late. So does a test of paths_test.go,
// whose fault paths share lastFault.
func beside(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// useExternalMetadata gives alpha and beta external metadata: each data
// file cut to the volume's size bytes, and beside it a metadata file
// (.md) of the size metadata.ExternalSizeFor gives for alExtents (0: the
// default) and sums.
func (c *testCluster) useExternalMetadata(size int64, alExtents int, sums bool) {
	c.t.Helper()
	c.cfg.Volumes[0].Metadata = "external"
	for _, name := range []string{"alpha", "beta"} {
		dc := c.cfg.Volumes[0].Disks[name]
		if err := os.Truncate(dc.Paths[0].Path, size); err != nil {
			c.t.Fatal(err)
		}
		dc.Meta = dc.Paths[0].Path + ".md"
		n, err := metadata.ExternalSizeFor(size, alExtents, 1, sums)
		if err != nil {
			c.t.Fatal(err)
		}
		if err := os.WriteFile(dc.Meta, nil, 0o644); err != nil {
			c.t.Fatal(err)
		}
		if err := os.Truncate(dc.Meta, n); err != nil {
			c.t.Fatal(err)
		}
		c.cfg.Volumes[0].Disks[name] = dc
	}
}

// deviceSize is the backing file a volume of size bytes needs: the data
// and the internal metadata at its end.
func deviceSize(t testing.TB, size int64) int64 { return deviceSizeFor(t, size, 1) }

// deviceSizeFor is deviceSize with a bitmap for each of peers.
func deviceSizeFor(t testing.TB, size int64, peers int) int64 {
	n, err := metadata.InternalDeviceSizeFor(size, 0, peers, true)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// freeAddr reserves a free port; the node listens on it right after. The
// kernel may hand the same port out twice once it is closed, so the ports
// this test binary already gave out are skipped.
func freeAddr(t testing.TB) string {
	t.Helper()
	return testport.Pick(t, true)
}

func (c *testCluster) start(name string) *Node {
	c.t.Helper()
	opts := c.opts[name]
	opts.wrapStore = func(s stateStore) stateStore { return &faultyStore{stateStore: s} }
	if opts.Logger == nil && os.Getenv("REPLVOL_TEST_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("test-node", name)
	}
	if opts.Logger == nil && c.logs != nil {
		if c.logs[name] == nil {
			c.logs[name] = &logTail{}
		}
		opts.Logger = slog.New(slog.NewTextHandler(c.logs[name], nil))
	}
	n, err := New(cloneConfig(c.cfg), name, opts)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	if err := n.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.nodes[name] = n
	return n
}

// cloneConfig is a deep copy of the config: each node of a test cluster reads
// its own, as each replnode reads its own file, so a test may change c.cfg
// for the next start while the other nodes run.
func cloneConfig(c *Config) *Config {
	out := *c
	out.Nodes = slices.Clone(c.Nodes)
	out.Volumes = slices.Clone(c.Volumes)
	for i, v := range out.Volumes {
		disks := make(map[string]DiskConfig, len(v.Disks))
		for name, d := range v.Disks {
			d.Paths = slices.Clone(d.Paths)
			disks[name] = d
		}
		out.Volumes[i].Disks = disks
	}
	if c.TLS != nil {
		tls := *c.TLS
		out.TLS = &tls
	}
	return &out
}

// startInSync starts the named nodes in that order and waits until they
// are in sync.
func (c *testCluster) startInSync(names ...string) {
	c.t.Helper()
	for _, n := range names {
		c.start(n)
	}
	c.waitInSync()
}

func (c *testCluster) stop(name string) {
	c.t.Helper()
	if err := c.nodes[name].Close(); err != nil {
		c.t.Fatalf("stop %s: %v", name, err)
	}
	delete(c.nodes, name)
}

func (c *testCluster) vol(name string) *Volume { return c.nodes[name].volumes()["vol0"] }

func (c *testCluster) any() *Node {
	for _, n := range c.nodes {
		return n
	}
	return nil
}

func (c *testCluster) status() *transport.ClusterStatus {
	c.t.Helper()
	st, err := c.any().clusterStatus(context.Background(), 0)
	if err != nil {
		c.t.Fatal(err)
	}
	return st
}

func replica(st *transport.ClusterStatus, node string) transport.ReplicaStatus {
	for _, r := range st.Volumes[0].Replicas {
		if r.Node == node {
			return r
		}
	}
	return transport.ReplicaStatus{}
}

// waitInSync waits until every replica is UpToDate and Connected.
func (c *testCluster) waitInSync() {
	c.t.Helper()
	var st *transport.ClusterStatus
	if !within(30*time.Second, 10*time.Millisecond, func() bool {
		st = c.status()
		ok := true
		for _, r := range st.Volumes[0].Replicas {
			ok = ok && r.Disk == "UpToDate" && r.Replication == "Connected" && r.OutOfSyncBytes == 0
		}
		return ok
	}) {
		// What every goroutine waits on says why.
		var dump strings.Builder
		pprof.Lookup("goroutine").WriteTo(&dump, 1)
		c.t.Log(dump.String())
		c.t.Fatalf("replicas not in sync: %+v", st.Volumes[0].Replicas)
	}
}

func (c *testCluster) disk(name string) []byte {
	c.t.Helper()
	b, err := os.ReadFile(c.cfg.Volumes[0].Disks[name].Paths[0].Path)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

func (c *testCluster) requireIdentical() {
	c.t.Helper()
	c.requireIdenticalUpTo(int64(c.cfg.Volumes[0].Size))
}

// requireIdenticalUpTo is requireIdentical for the first size bytes.
func (c *testCluster) requireIdenticalUpTo(size int64) {
	c.t.Helper()
	var names []string
	for name := range c.cfg.Volumes[0].Disks {
		names = append(names, name)
	}
	sort.Strings(names)
	open := func(name string) *os.File {
		f, err := os.Open(c.cfg.Volumes[0].Disks[name].Paths[0].Path)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { f.Close() })
		return f
	}
	a := open(names[0])
	x, y := make([]byte, 4<<20), make([]byte, 4<<20)
	for _, other := range names[1:] {
		b := open(other)
		// Only the volume's bytes: a multipath label may follow.
		for off := int64(0); off < size; off += int64(len(x)) {
			n := min(int64(len(x)), size-off)
			if holeUpTo(a, off, n) && holeUpTo(b, off, n) {
				continue // zeroes on both
			}
			_, errA := a.ReadAt(x[:n], off)
			_, errB := b.ReadAt(y[:n], off)
			if errA != nil || errB != nil {
				c.t.Fatalf("backing files shorter than the volume: %v, %v", errA, errB)
			}
			if bytes.Equal(x[:n], y[:n]) {
				continue
			}
			for i := range x[:n] {
				if x[i] != y[i] {
					at := off + int64(i)
					c.t.Fatalf("backing files of %s and %s differ, first at byte %d (block %d)", names[0], other, at, at/4096)
				}
			}
		}
	}
}

// holeUpTo reports whether f holds no data in [off, off+n).
func holeUpTo(f *os.File, off, n int64) bool {
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if err == unix.ENXIO {
		return true // no data from off to the end
	}
	return err == nil && next >= off+n
}

// eventually waits for cond, which an asynchronous event makes true.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	if !within(10*time.Second, 10*time.Millisecond, cond) {
		t.Fatalf("timed out waiting: %s", what)
	}
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

func TestProtocolCWriteIsOnPeerBeforeItCompletes(t *testing.T) {
	c := newTestCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	for i, off := range []int64{0, 4096, 1000, 5<<20 + 17} {
		data := pattern(byte(i+1), 3000+i*4096)
		if err := c.vol("alpha").WriteAt(ctx, data, off, false); err != nil {
			t.Fatal(err)
		}
		// No flush, no wait: the write completed, so beta has written it.
		got := make([]byte, len(data))
		if _, err := c.vol("beta").disk.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("write %d at %d completed but is not on beta", i, off)
		}
	}
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.requireIdentical()
}

func TestOverlappingConcurrentWritesLeaveReplicasIdentical(t *testing.T) {
	c := newTestCluster(t, 1<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 200 {
				// Overlapping, unaligned writes all over 64 KiB.
				off := int64(r.IntN(60 << 10))
				n := 1 + r.IntN(8<<10)
				if off+int64(n) > 1<<20 {
					n = int((1 << 20) - off)
				}
				if err := c.vol("alpha").WriteAt(ctx, pattern(byte(w*31+i), n), off, i%17 == 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.requireIdentical()
}

func TestFlushAndFUAAreDurableOnThePeerBeforeTheyComplete(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	rec := &opRecorder{}
	c.opts["beta"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { d.Add(rec) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	v := c.vol("alpha")
	if err := v.WriteAt(ctx, pattern(1, 4096), 8192, false); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); got != "write@8192" {
		t.Fatalf("after a plain write beta's last op is %q", got)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); got != "sync" {
		t.Fatalf("flush completed but beta's last op is %q, not a sync", got)
	}
	if err := v.WriteAt(ctx, pattern(2, 4096), 12288, true); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); got != "fua@12288" {
		t.Fatalf("FUA write completed but beta's last op is %q", got)
	}
}

// distinctBlocks writes n random 4 KiB-aligned blocks and returns how many
// distinct blocks were written.
func writeRandomBlocks(t *testing.T, v *Volume, n int, seed uint64) int {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	blocks := map[int64]bool{}
	for i := range n {
		b := r.Int64N(v.size.Load() / 4096)
		blocks[b] = true
		if err := v.WriteAt(context.Background(), pattern(byte(i), 4096), b*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	return len(blocks)
}

func TestCatchUpAfterDisconnectMovesOnlyTheWrittenBlocks(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 64<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	before := replica(c.status(), "beta").ResyncedBytes
	c.vol("alpha").setAdminDown(true)
	blocks := writeRandomBlocks(t, c.vol("alpha"), 500, 1)
	if got := replica(c.status(), "beta").OutOfSyncBytes; got != int64(blocks)*4096 {
		t.Fatalf("out of sync %d bytes, want %d", got, blocks*4096)
	}
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	moved := replica(c.status(), "beta").ResyncedBytes - before
	c.requireDecision("alpha", "beta", replication.RuleBitmapSelf, "source-use-bitmap")
	if moved != int64(blocks)*4096 {
		t.Fatalf("catch-up moved %d bytes, want exactly the %d written blocks (%d bytes)", moved, blocks, blocks*4096)
	}
	c.requireIdentical()
}

func TestSecondaryDisconnectedByOperatorRefusesTheStream(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.vol("beta").setAdminDown(true)
	// Even with no writes, alpha notices (its heartbeat finds the stream gone).
	st := c.status()
	if r := replica(st, "beta"); r.Replication != "StandAlone" || !strings.Contains(r.Reason, "operator") {
		t.Fatalf("beta: %+v", r)
	}
	eventually(t, func() bool {
		p := c.vol("alpha").peers.byName["beta"].status()
		return p.Replication == "Connecting" && strings.Contains(p.Reason, "disconnected from vol0 by the operator")
	}, "alpha sees beta refusing the stream")
	writeRandomBlocks(t, c.vol("alpha"), 10, 2)
	c.vol("beta").setAdminDown(false)
	c.waitInSync()
	c.requireIdentical()
}

// TestSecondaryCleanRestartGetsABitmapResync: beta stops cleanly, alpha
// writes, and beta's restart is caught up with exactly the blocks written
// (DESIGN.md invariant 4), which status reports as the last resync.
//
// beta's ResyncedBytes counts what it received by resync, a run sent again
// included: a resync that a lost stream cut off resends the runs whose
// acks were lost, so the exact count holds for one uninterrupted resync
// only. On a starved machine beta answered nothing for more than the
// default peer_timeout (2 s) during the resync, alpha dropped the stream
// and the resync moved 310 blocks for 295 written. The peer_timeout here
// is a minute, longer than waitInSync gives the resync: only a stall that
// fails the test anyway ends the stream, and alpha's events must show the
// one resync, or the failure says how it was cut.
func TestSecondaryCleanRestartGetsABitmapResync(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 32<<20)
	c.cfg.Volumes[0].PeerTimeout = Duration(time.Minute)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	blocks := writeRandomBlocks(t, c.vol("alpha"), 300, 3)
	since := c.lastEventSeq("alpha")
	c.start("beta")
	c.waitInSync()
	connects, cuts := c.streamsSince("alpha", "beta", since)
	if connects != 1 || len(cuts) > 0 {
		t.Fatalf("beta's resync ran over %d streams, want one (what it received twice would count twice); alpha lost beta's stream: %q", connects, cuts)
	}
	if moved := replica(c.status(), "beta").ResyncedBytes; moved != int64(blocks)*4096 {
		t.Fatalf("beta restarted cleanly: resync moved %d bytes, want %d", moved, blocks*4096)
	}
	// Status reports that resync as the last one: its amount, not a total.
	eventually(t, func() bool { return !replica(c.status(), "beta").LastResyncEnded.IsZero() }, "the resync is recorded as the last one")
	if r := replica(c.status(), "beta"); r.LastResyncBytes != int64(blocks)*4096 || r.LastResyncSeconds <= 0 {
		t.Fatalf("last resync %d bytes in %.3fs, want %d bytes", r.LastResyncBytes, r.LastResyncSeconds, blocks*4096)
	}
	c.requireIdentical()
}

func TestSwitchoverKeepsEveryByteAndFencesTheOldPrimary(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	want := pattern(9, 64<<10)
	if err := c.vol("alpha").WriteAt(ctx, want, 4096, false); err != nil {
		t.Fatal(err)
	}
	api := c.nodes["alpha"].api
	r, err := api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Primary != "beta" || r.Epoch != 2 {
		t.Fatalf("switchover: %+v", r)
	}
	// The old primary serves no more IO, and NBD clients are sent to beta.
	if err := c.vol("alpha").WriteAt(ctx, pattern(1, 4096), 0, false); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("old primary accepted a write: %v", err)
	}
	if _, err := (*resolver)(c.nodes["alpha"]).Lookup("vol0"); err == nil || !strings.Contains(err.Error(), "the primary is beta") {
		t.Fatalf("lookup on old primary: %v", err)
	}
	got := make([]byte, len(want))
	if err := c.vol("beta").ReadAt(ctx, got, 4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("new primary read: %v, equal %v", err, bytes.Equal(got, want))
	}
	if err := c.vol("beta").WriteAt(ctx, pattern(3, 8192), 0, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()

	// A stream from the old epoch is refused and changes nothing.
	sum := sha256.Sum256(c.disk("alpha"))
	cl, err := transport.DialRepl(c.nodes["alpha"].lnRepl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hello := replication.Hello{Volume: "vol0", From: "beta", To: "alpha", Epoch: 1, Size: 8 << 20}
	if err := sendJSON(s, replication.FrameHello, hello); err != nil {
		t.Fatal(err)
	}
	reply, err := recvHelloReply(s)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Accepted || !strings.Contains(reply.Reason, "stale epoch") {
		t.Fatalf("old-epoch stream: %+v", reply)
	}
	if sha256.Sum256(c.disk("alpha")) != sum {
		t.Fatal("a refused stream changed alpha's disk")
	}
}

func TestSwitchoverToAnOutOfSyncNodeIsRefusedAndNothingChanges(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.vol("alpha").setAdminDown(true)
	writeRandomBlocks(t, c.vol("alpha"), 5, 4)
	ctx := context.Background()
	_, err := c.nodes["beta"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "not in sync") {
		t.Fatalf("switchover to an out-of-sync node: %v", err)
	}
	if err := c.vol("alpha").WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatalf("alpha stopped serving after a refused switchover: %v", err)
	}
	if c.vol("beta").status().Role != "Secondary" {
		t.Fatal("beta was promoted")
	}
}

func TestTrimAndWriteZeroesReplicate(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	v := c.vol("alpha")
	if err := v.WriteAt(ctx, pattern(5, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Trim(ctx, 64<<10, 128<<10); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(ctx, 300<<10, 5000, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 128<<10)
	if err := v.ReadAt(ctx, got, 64<<10); err != nil || !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatalf("trimmed range does not read as zeroes (%v)", err)
	}
	c.requireIdentical()
}

func TestFullResyncCanBePausedAndResumed(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	writeRandomBlocks(t, c.vol("alpha"), 50, 6)
	before := replica(c.status(), "beta").ResyncedBytes
	api := c.nodes["beta"].api // any node forwards to the primary
	ctx := context.Background()
	if _, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", Pause: true}); err != nil {
		t.Fatal(err)
	}
	r, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0"})
	if err != nil || r.Primary != "alpha" || len(r.Peers) != 1 {
		t.Fatalf("resync: %+v %v", r, err)
	}
	eventually(t, func() bool {
		b := replica(c.status(), "beta")
		return b.Replication == "PausedSyncT" && b.Disk == "Inconsistent" && b.ResyncDoneBytes == 0
	}, "beta Inconsistent and paused")
	if _, err := c.nodes["alpha"].api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 100 * time.Millisecond}); err == nil {
		t.Fatal("an Inconsistent node was promoted")
	}
	if _, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", Resume: true}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - before; moved != 8<<20 {
		t.Fatalf("full resync moved %d bytes, want the volume's %d", moved, 8<<20)
	}
	c.requireIdentical()
	if _, err := api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0", From: "beta"}); err == nil || !strings.Contains(err.Error(), "resync runs from the primary") {
		t.Fatalf("resync --from a secondary: %v", err)
	}
}

func TestResyncRateCapHoldsTheResyncBack(t *testing.T) {
	const size = 8 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].ResyncRate = 8 << 20 // 8 MiB/s
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if err := c.vol("alpha").WriteAt(context.Background(), pattern(1, size), 0, false); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := c.nodes["alpha"].api.Resync(context.Background(), &transport.ResyncRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	// 8 MiB at 8 MiB/s: the last run may start at 7/8 of a second.
	if took := time.Since(began); took < 700*time.Millisecond {
		t.Fatalf("an 8 MiB resync capped at 8 MiB/s took only %v", took)
	}
	c.requireIdentical()
}

// TestChecksumResyncSendsOnlyDifferingBlocks: with csums, a full resync of
// replicas that differ in 3 blocks moves only those 3 blocks.
func TestChecksumResyncSendsOnlyDifferingBlocks(t *testing.T) {
	beside(t)
	const size = 16 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].Csums = true
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	if err := c.vol("alpha").WriteAt(ctx, pattern(2, 4<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1 << 20, 3<<20 + 8192} {
		f.WriteAt([]byte("stale"), off)
	}
	f.Close()
	before := replica(c.status(), "beta").ResyncedBytes
	if _, err := c.nodes["alpha"].api.Resync(ctx, &transport.ResyncRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - before; moved != 3*4096 {
		t.Fatalf("checksum resync moved %d bytes, want the 3 differing blocks (%d)", moved, 3*4096)
	}
	c.requireIdentical()
}

// A stream from a node whose replication wire is two versions apart is
// refused before anything else, in words naming both versions; one from a
// node before versioning (no field) is judged as usual.
func TestAStreamFromAWireVersionTwoApartIsRefused(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	sum := sha256.Sum256(c.disk("beta"))
	for _, tc := range []struct {
		wire    int
		refused replication.Refusal
	}{
		{replication.WireVersion + 2, replication.RefusedWireVersion},
		{0, replication.RefusedStaleEpoch},
	} {
		cl, err := transport.DialRepl(c.nodes["beta"].lnRepl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := cl.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hello := replication.Hello{Volume: "vol0", From: "alpha", To: "beta", Epoch: 0, Size: 8 << 20, Wire: tc.wire}
		if err := sendJSON(s, replication.FrameHello, hello); err != nil {
			t.Fatal(err)
		}
		reply, err := recvHelloReply(s)
		s.Close()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		if reply.Accepted || reply.Refused != tc.refused || reply.Wire != replication.WireVersion {
			t.Fatalf("wire %d: %+v, want refused %s and wire %d", tc.wire, reply, tc.refused, replication.WireVersion)
		}
		if tc.refused == replication.RefusedWireVersion && !strings.Contains(reply.Reason, fmt.Sprintf("version %d", tc.wire)) {
			t.Fatalf("wire %d: reason %q does not name the version", tc.wire, reply.Reason)
		}
	}
	if sha256.Sum256(c.disk("beta")) != sum {
		t.Fatal("a refused stream changed beta's disk")
	}
	// The primary's replica line names the cause with its fixed word.
	if r := refusalOf(replication.HelloReply{Refused: replication.RefusedWireVersion, Reason: "x"}); r.cause != CauseWireVersion || r.final {
		t.Fatalf("a wire-version refusal: cause %s, final %v", r.cause, r.final)
	}
}

// TestEveryLossOfAStreamThatWasUpIsTold: alpha tells a lost stream once
// per outage (the retries of one outage are not news), and a stream that
// came up and was lost again is a new outage even when it ended the same
// way as the one before: beta stopped twice gives alpha two peer-lost
// events. Before, a loss went untold whenever the last loss told had
// the same cause: here alpha's tries before beta first listened.
func TestEveryLossOfAStreamThatWasUpIsTold(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	since := c.lastEventSeq("alpha")
	losses := func() int {
		_, lost := c.streamsSince("alpha", "beta", since)
		return len(lost)
	}
	for round := 1; round <= 2; round++ {
		c.stop("beta")
		if !within(30*time.Second, 20*time.Millisecond, func() bool { return losses() >= round }) {
			t.Fatalf("beta stopped %d times: alpha told %d lost streams, want %d", round, losses(), round)
		}
		c.start("beta")
		c.waitInSync()
	}
	if n := losses(); n != 2 {
		t.Fatalf("beta stopped twice: alpha told %d lost streams, want 2 (one per outage, not one per retry)", n)
	}
}
