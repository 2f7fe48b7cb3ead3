package node

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// nbdLoadScript is a steady client load through a real NBD client
// (libnbd's nbdsh): four connections, each writing 4 KiB blocks of its own
// region with contents unique to the write, reading back that block and
// one it wrote earlier, and flushing every eighth round. Every failed
// request and every read that returns other data than was last written
// is printed as an "error" line; a count of rounds as "ops N". At EOF on
// stdin the workers stop, read back every block they wrote once more, and
// the script ends with "done".
const nbdLoadScript = `
import sys, threading, random
BS = 4096
stop = threading.Event()
lock = threading.Lock()
count = [0, 0]

def say(*words):
    with lock:
        print(*words, flush=True)

def fail(what, off, err):
    with lock:
        count[1] += 1
        print("error", what, off, str(err).replace("\n", " "), flush=True)

def worker(k):
    hd = nbd.NBD()
    hd.connect_uri(URI)
    rnd = random.Random(k)
    expect = {}
    n = 0
    def check(off):
        try:
            got = hd.pread(BS, off)
        except nbd.Error as e:
            fail("read", off, e)
            return
        if off in expect and got != expect[off]:
            fail("read", off, "returned other data than was last written")
    while not stop.is_set():
        n += 1
        off = BASE + (k * REGION + rnd.randrange(REGION)) * BS
        data = (b"%d:%d:%d;" % (k, n, off)).ljust(64, b".") * (BS // 64)
        try:
            hd.pwrite(data, off)
            expect[off] = data
        except nbd.Error as e:
            expect.pop(off, None)
            fail("write", off, e)
        check(off)
        check(rnd.choice(list(expect)) if expect else off)
        if n % 8 == 0:
            try:
                hd.flush()
            except nbd.Error as e:
                fail("flush", 0, e)
        with lock:
            count[0] += 1
            if count[0] % 20 == 0:
                print("ops", count[0], flush=True)
    for off in sorted(expect):
        check(off)
    hd.shutdown()

threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
for t in threads:
    t.start()
say("started")
for line in sys.stdin:
    pass
stop.set()
for t in threads:
    t.join()
say("done", count[0], count[1])
`

// nbdLoad is nbdLoadScript running against an export.
type nbdLoad struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  *os.File
	ops    atomic.Int64
	mu     sync.Mutex
	errors []string
	done   chan struct{}
	final  string
	stderr strings.Builder
}

// startNBDLoad starts the load on uri over workers connections, each on a
// region of regionBlocks 4 KiB blocks, the first from base on.
func startNBDLoad(t *testing.T, uri string, base int64, workers, regionBlocks int) *nbdLoad {
	t.Helper()
	nbdtest.RequireTool(t, "nbdsh")
	path, err := nbdtest.LookTool("nbdsh")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("URI = %q\nBASE = %d\nWORKERS = %d\nREGION = %d\n%s", uri, base, workers, regionBlocks, nbdLoadScript)
	l := &nbdLoad{t: t, done: make(chan struct{})}
	l.cmd = exec.Command(path, "-c", script)
	l.cmd.Env = append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH"))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	l.cmd.Stdin, l.stdin = r, w
	out, err := l.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	l.cmd.Stderr = &l.stderr
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	started := make(chan struct{})
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch f := strings.Fields(line); {
			case len(f) == 0:
			case f[0] == "started":
				close(started)
			case f[0] == "ops" && len(f) == 2:
				var n int64
				fmt.Sscan(f[1], &n)
				l.ops.Store(n)
			case f[0] == "done":
				l.final = line
			default:
				l.mu.Lock()
				l.errors = append(l.errors, line)
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { l.stop() })
	select {
	case <-started:
	case <-l.done:
		t.Fatalf("nbdsh ended before it started its load: %s", l.stderr.String())
	}
	return l
}

// waitOps waits until the load has made n more rounds than at start.
func (l *nbdLoad) waitOps(from, n int64, what string) {
	l.t.Helper()
	if !within(2*time.Minute, 5*time.Millisecond, func() bool { return l.ops.Load() >= from+n }) {
		l.t.Fatalf("%s: the NBD load made %d rounds, want %d more than %d: %s", what, l.ops.Load(), n, from, l.stderr.String())
	}
}

// stop ends the load (its final read back included) and returns the
// client's errors.
func (l *nbdLoad) stop() []string {
	if l.stdin != nil {
		l.stdin.Close()
		l.stdin = nil
		select {
		case <-l.done:
		case <-time.After(2 * time.Minute):
			// A node that no longer answers: the test fails, and leaves
			// no process behind.
			l.cmd.Process.Kill()
			<-l.done
		}
		err := l.cmd.Wait()
		if err != nil {
			l.mu.Lock()
			l.errors = append(l.errors, fmt.Sprintf("nbdsh: %v: %s", err, l.stderr.String()))
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errors
}

// lastEventSeq is the Seq of node name's last event (0: none yet).
func (c *testCluster) lastEventSeq(name string) uint64 {
	c.t.Helper()
	evs, err := c.nodes[name].store.Events(1)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(evs) == 0 {
		return 0
	}
	return evs[0].Seq
}

// eventsSince is node name's events after the one numbered seq.
func (c *testCluster) eventsSince(name string, seq uint64) []statefile.Event {
	c.t.Helper()
	evs, err := c.nodes[name].store.Events(10000)
	if err != nil {
		c.t.Fatal(err)
	}
	return slices.DeleteFunc(evs, func(e statefile.Event) bool { return e.Seq <= seq })
}

// streamsSince counts node name's connections to peer after event seq,
// and gives the messages of its lost streams (peer-lost events): every
// loss of a stream that was up is told, and so is the first failure of an
// outage to connect.
func (c *testCluster) streamsSince(name, peer string, seq uint64) (connects int, losses []string) {
	c.t.Helper()
	for _, e := range c.eventsSince(name, seq) {
		switch {
		case e.Peer != peer:
		case e.Kind == "connected":
			connects++
		case e.Kind == "peer-lost":
			losses = append(losses, e.Message)
		}
	}
	return connects, losses
}

// eventKinds counts the events of node name by kind.
func (c *testCluster) eventKinds(name string) map[string]int {
	c.t.Helper()
	evs, err := c.nodes[name].store.Events(10000)
	if err != nil {
		c.t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[e.Kind]++
	}
	return kinds
}

// TestAFailingPrimaryDiskCostsNoClientErrorAndDetachesOnce: under a steady
// load of writes and reads through alpha's NBD export, alpha's disk fails
// every write with EIO, then every read too. alpha detaches its disk once
// and serves every request through beta, which is Connected and
// UpToDate: no client request fails and no read returns other data than
// was written. While the disk fails, its probes fail and it stays
// detached (it was re-attached each second before, about twenty flaps in
// five seconds, and a write failed at each). Once the disk is repaired it
// is re-attached once, after the blocks it missed were copied back, and
// both replicas are UpToDate with the same data.
//
// Without its disk and without a peer alpha owes its client an EIO, and
// on a starved machine it had no peer: beta answered nothing for longer
// than the default peer_timeout (2 s) while alpha read from it, alpha
// dropped the stream, and 75 requests failed. The peer_timeout here is a
// minute, less than each of the test's waits (two minutes), so that only
// a stall that fails the test anyway loses beta; a lost stream is an
// error of its own, and client errors say whether beta was lost.
func TestAFailingPrimaryDiskCostsNoClientErrorAndDetachesOnce(t *testing.T) {
	beside(t)
	const size = 16 << 20
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].PeerTimeout = Duration(time.Minute)
	// Probes every 20 ms, backing off to 160 ms, and 100 ms of passing
	// probes before a re-attach: the defaults (1 s, 16 s, 3 s) scaled down.
	policy := reattachPolicy{Probe: 20 * time.Millisecond, MaxBackoff: 160 * time.Millisecond, Stable: 100 * time.Millisecond}
	c.opts["alpha"] = Options{OpenDisk: openFaulty(nil), reattach: policy}
	logs := c.logTo("alpha")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	since := c.lastEventSeq("alpha")
	fd := c.faultDisk("alpha")

	// The load runs on [1 MiB, 9 MiB); the disk fails there.
	const loadOff, loadLen = 1 << 20, 8 << 20
	load := startNBDLoad(t, "nbd://"+c.nodes["alpha"].NBDAddr()+"/vol0", loadOff, 4, loadLen/4/4096)
	load.waitOps(0, 100, "before the fault")

	writes := fault.On(fault.Write).Range(loadOff, loadLen).Err(syscall.EIO)
	fd.Add(writes)
	from := load.ops.Load()
	if !within(2*time.Minute, 5*time.Millisecond, func() bool {
		return writes.Hits() >= 6 && replica(c.status(), "alpha").Disk == "Diskless"
	}) {
		t.Fatalf("writes failing: %d writes failed, alpha is %s", writes.Hits(), replica(c.status(), "alpha").Disk)
	}
	load.waitOps(from, 200, "writes failing")

	reads := fault.On(fault.Read).Range(loadOff, loadLen).Err(syscall.EIO)
	fd.Add(reads)
	from = load.ops.Load()
	if !within(2*time.Minute, 5*time.Millisecond, func() bool { return reads.Hits() >= 4 }) {
		t.Fatalf("reads failing too: %d reads failed", reads.Hits())
	}
	load.waitOps(from, 200, "reads failing too")
	t.Logf("while the disk failed: %d writes and %d reads failed on alpha's disk", writes.Hits(), reads.Hits())

	fd.SetInjector(nil) // repaired
	if !within(2*time.Minute, 5*time.Millisecond, func() bool {
		a, b := replica(c.status(), "alpha"), replica(c.status(), "beta")
		return a.Disk == "UpToDate" && a.OutOfSyncBytes == 0 && b.Disk == "UpToDate" && b.Replication == "Connected"
	}) {
		t.Fatalf("after the repair: alpha %+v, beta %+v", replica(c.status(), "alpha"), replica(c.status(), "beta"))
	}
	from = load.ops.Load()
	load.waitOps(from, 200, "after the re-attach")

	errs := load.stop()
	t.Logf("NBD load: %s", load.final)
	// Each connection to beta since the load began followed a lost
	// stream, and each lost stream is told with its cause.
	reconnects, why := c.streamsSince("alpha", "beta", since)
	if reconnects > 0 || len(why) > 0 {
		t.Errorf("alpha lost beta's stream, which the test needs, and connected again %d times: %q", reconnects, why)
	}
	if len(errs) > 0 {
		t.Errorf("%d client errors, want none (alpha connected to beta again %d times meanwhile); the first: %q", len(errs), reconnects, errs[:min(len(errs), 10)])
	}
	kinds := c.eventKinds("alpha")
	if kinds["detached"] != 1 || kinds["attached"] != 1 {
		t.Errorf("alpha's events: %d detached and %d attached, want 1 and 1 (all: %v)", kinds["detached"], kinds["attached"], kinds)
	}
	// Each transition is logged once, and the failing probes once per
	// back-off (40, 80 and 160 ms).
	detached, attached := logs.count("local disk detached"), logs.count("local disk re-attached")
	failing := logs.count("still fails its probe")
	if detached != 1 || attached != 1 || failing > 3 {
		t.Errorf("alpha's log: %d lines of the detach, %d of the re-attach and %d of failing probes, want 1, 1 and at most 3:\n%s", detached, attached, failing, logs.String())
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestAWriteThatFailsHereAfterItReachedThePeerIsUndoneThere: beta is
// being resynced, so no peer is in sync and alpha's disk is not detached
// when it fails one write. That write went to beta's stream before alpha's
// disk failed it; the client is told it failed. alpha sends beta what its
// own disk holds in that block, after the write, before the write is
// over: once the resync ends the two are identical, where beta would
// otherwise hold the failed write while both count each other in sync
// (the simulation's finding failed-write-diverges).
func TestAWriteThatFailsHereAfterItReachedThePeerIsUndoneThere(t *testing.T) {
	beside(t)
	const size = 8 << 20
	c := newTestCluster(t, size)
	var disk atomic.Pointer[fault.Disk]
	c.opts["alpha"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { disk.Store(d) })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	a := c.vol("alpha")
	c.vol("beta").setAdminDown(true)
	eventually(t, func() bool { return !a.peers.byName["beta"].connected() }, "beta disconnected")
	for i := range 64 {
		if err := a.WriteAt(ctx, pattern(byte(i+1), 4096), int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	slow := int64(64 << 10) // a second for the 64 blocks: the write below runs during the resync
	if _, err := a.adjust("", "", &slow); err != nil {
		t.Fatal(err)
	}
	c.vol("beta").setAdminDown(false)
	eventually(t, func() bool { return a.peers.byName["beta"].status().Replication == string(replication.SyncSource) }, "alpha resyncing beta")

	const off = size / 2 // a block the resync does not copy
	disk.Load().Add(fault.On(fault.Write).Range(off, 4096).Times(1).Err(errInjectedDisk))
	if err := a.WriteAt(ctx, pattern(0xee, 4096), off, false); err == nil {
		t.Fatal("a write alpha's disk failed, with no peer in sync, completed")
	}
	if a.peers.byName["beta"].status().Replication != string(replication.SyncSource) {
		t.Fatal("the resync ended before the failed write: the test shows nothing")
	}
	unlimited := int64(0)
	if _, err := a.adjust("", "", &unlimited); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestARevertLeavesTheBlocksThisDiskMissesToThePull: revertPeers sends
// the peers what the local disk holds in a failed write's blocks, but a
// block the local disk misses (a pull under way copies it from its
// source, whose copy is the one kept, and passes it on) holds nothing to
// send: its stale bytes would overwrite the source's block. The sim's
// seed 1206 reached it: a write failed as its primary began to pull, and
// the revert put the primary's stale block on the source. Here alpha
// misses the first of two blocks (as a pull's localMissing says) and
// holds stale bytes there; the revert of a write over both leaves beta's
// first block as it is and gives it alpha's second.
func TestARevertLeavesTheBlocksThisDiskMissesToThePull(t *testing.T) {
	const size = 8 << 20
	const off = 1 << 20
	c := newTestCluster(t, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	a := c.vol("alpha")
	kept := pattern(0x11, 4096)
	if err := a.WriteAt(ctx, append(append([]byte(nil), kept...), pattern(0x22, 4096)...), off, true); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	// alpha's own disk: stale bytes in the block it misses, and new ones
	// in the next (as if the failed write's local half reached neither).
	stale, held := pattern(0x33, 4096), pattern(0x44, 4096)
	if _, err := a.disk.WriteAt(stale, off); err != nil {
		t.Fatal(err)
	}
	if _, err := a.disk.WriteAt(held, off+4096); err != nil {
		t.Fatal(err)
	}
	a.durable.localMissing.SetRange(off, 4096)
	a.revertPeers(replication.Entry{Op: replication.OpWrite, Off: off, Length: 8192}, nil)
	a.durable.localMissing.ClearRange(off, 4096)
	if _, err := a.disk.WriteAt(kept, off); err != nil { // as the pull would
		t.Fatal(err)
	}
	eventually(t, func() bool {
		got := make([]byte, 4096)
		_, err := c.vol("beta").disk.ReadAt(got, off+4096)
		return err == nil && bytes.Equal(got, held)
	}, "beta holds alpha's block the revert sent")
	got := make([]byte, 4096)
	if _, err := c.vol("beta").disk.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, kept) {
		t.Fatalf("the revert overwrote beta's block at %d, which alpha misses, with alpha's stale bytes (%v)", off, bytes.Equal(got, stale))
	}
}
