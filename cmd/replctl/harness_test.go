package main

// Self-tests of the cluster-test harness (clusterenv_test.go,
// netns_test.go, linearizability_test.go, nbdfailover_test.go): each pins
// what the failover, partition and linearizability tests of issue 9 rely
// on, against today's replnode.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/replvol/replvol/node"
)

// fakeTB records what checkLinearizable reports instead of failing the
// test that checks it.
type fakeTB struct {
	testing.TB
	failed bool
	msgs   []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Logf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

// htmlNamed returns the visualization file a message names, if any.
func (f *fakeTB) htmlNamed() string {
	for _, m := range f.msgs {
		if i := strings.Index(m, "visualization: "); i >= 0 {
			return strings.TrimSpace(m[i+len("visualization: "):])
		}
	}
	return ""
}

// TestHarnessLinearizabilityChecker pins the register model and the
// handling of writes nobody knows the outcome of: such a write may take
// effect late or never, but once a read saw it, it cannot vanish.
func TestHarnessLinearizabilityChecker(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	w := func(client, block int, value uint64, call, ret int, outcome opOutcome) histOp {
		return histOp{Client: client, Kind: opWrite, Block: block, Value: uint64(block+1)<<48 | value, Call: ms(call), Return: ms(ret), Outcome: outcome, Node: "alpha"}
	}
	r := func(client, block int, value uint64, call, ret int, outcome opOutcome) histOp {
		v := value
		if v != 0 && v != tornValue {
			v |= uint64(block+1) << 48
		}
		return histOp{Client: client, Kind: opRead, Block: block, Value: v, Call: ms(call), Return: ms(ret), Outcome: outcome, Node: "alpha"}
	}
	for _, tc := range []struct {
		name    string
		history []histOp
		want    porcupine.CheckResult
	}{
		{"a read concurrent with a write sees the old value, a later read the new one", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(0, 0, 2, 20, 40, opOK),
			r(1, 0, 1, 25, 30, opOK),
			r(1, 0, 2, 45, 50, opOK),
		}, porcupine.Ok},
		{"two concurrent writes land in either order", []histOp{
			w(0, 0, 1, 0, 20, opOK),
			w(1, 0, 2, 5, 25, opOK),
			r(2, 0, 1, 30, 35, opOK),
			r(2, 0, 1, 40, 45, opOK),
		}, porcupine.Ok},
		{"blocks are independent registers", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(0, 1, 2, 20, 30, opOK),
			r(1, 0, 1, 40, 50, opOK),
			r(1, 1, 2, 40, 50, opOK),
			r(1, 2, 0, 40, 50, opOK),
		}, porcupine.Ok},
		{"a stale read after a completed write", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(0, 0, 2, 20, 30, opOK),
			r(1, 0, 1, 40, 50, opOK),
		}, porcupine.Illegal},
		{"a read of zeroes after a completed write (a lost write)", []histOp{
			w(0, 3, 7, 0, 10, opOK),
			r(1, 3, 0, 20, 30, opOK),
		}, porcupine.Illegal},
		{"a timed-out write that shows up much later", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(1, 0, 2, 20, 30, opTimedOut),
			r(2, 0, 1, 40, 50, opOK),
			r(2, 0, 2, 60, 70, opOK),
		}, porcupine.Ok},
		{"a failed write that never took effect", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(1, 0, 2, 20, 30, opFailed),
			r(2, 0, 1, 40, 50, opOK),
			r(2, 0, 1, 60, 70, opOK),
		}, porcupine.Ok},
		{"a timed-out write seen by a read, then gone", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			w(1, 0, 2, 20, 30, opTimedOut),
			r(2, 0, 2, 40, 50, opOK),
			r(2, 0, 1, 60, 70, opOK),
		}, porcupine.Illegal},
		{"a failed read observed nothing", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			r(1, 0, 0, 20, 30, opFailed),
			r(1, 0, 0, 40, 50, opTimedOut),
		}, porcupine.Ok},
		{"a torn read", []histOp{
			w(0, 0, 1, 0, 10, opOK),
			r(1, 0, tornValue, 20, 30, opOK),
		}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTB{TB: t}
			got := checkLinearizable(ft, tc.history, linearizabilityTimeout)
			if got != tc.want {
				t.Fatalf("checkLinearizable = %s, want %s; it said:\n%s", got, tc.want, strings.Join(ft.msgs, "\n"))
			}
			if ft.failed != (tc.want != porcupine.Ok) {
				t.Fatalf("checkLinearizable failed the test: %v, want %v; it said:\n%s", ft.failed, tc.want != porcupine.Ok, strings.Join(ft.msgs, "\n"))
			}
			if tc.want == porcupine.Illegal {
				html := ft.htmlNamed()
				fi, err := os.Stat(html)
				if err != nil || fi.Size() == 0 {
					t.Fatalf("no visualization written (%q: %v); it said:\n%s", html, err, strings.Join(ft.msgs, "\n"))
				}
				os.Remove(html)
			}
		})
	}

	t.Run("a check that times out is reported as inconclusive", func(t *testing.T) {
		// 40 concurrent writes of unknown outcome, then a read of a value
		// none wrote: proving that illegal means trying every subset.
		var h []histOp
		for i := range 40 {
			h = append(h, w(i, 0, uint64(i+1), 0, 10, opTimedOut))
		}
		h = append(h, r(41, 0, 1000, 20, 30, opOK))
		ft := &fakeTB{TB: t}
		got := checkLinearizable(ft, h, 50*time.Millisecond)
		if got != porcupine.Unknown || !ft.failed || !strings.Contains(strings.Join(ft.msgs, "\n"), "inconclusive") {
			t.Fatalf("checkLinearizable = %s (failed %v), want Unknown reported as inconclusive; it said:\n%s", got, ft.failed, strings.Join(ft.msgs, "\n"))
		}
		os.Remove(ft.htmlNamed())
	})

	t.Run("an op recorder shared by clients", func(t *testing.T) {
		rec := newOpRecorder()
		done := make(chan struct{})
		for c := range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				client := rec.newClient()
				for i := range 50 {
					b := (c + i) % 3
					v := rec.nextValue(b)
					id := rec.begin(client, opWrite, b, v)
					rec.finish(id, opOK, 0, "alpha", nil)
				}
			}()
		}
		for range 4 {
			<-done
		}
		h := rec.history()
		if len(h) != 200 {
			t.Fatalf("%d ops recorded, want 200", len(h))
		}
		for _, op := range h {
			if op.Return < op.Call || op.Outcome != opOK {
				t.Fatalf("bad op %+v", op)
			}
		}
		checkLinearizable(t, h, linearizabilityTimeout)
	})

	t.Run("block contents", func(t *testing.T) {
		rec := newOpRecorder()
		v := rec.nextValue(2)
		if got := decodeBlock(2, encodeBlock(v)); got != v {
			t.Fatalf("decodeBlock(encodeBlock(%x)) = %x", v, got)
		}
		if got := decodeBlock(1, encodeBlock(v)); got != tornValue {
			t.Fatalf("block 2's value read in block 1 decodes as %x, want torn", got)
		}
		b := encodeBlock(v)
		b[4000] ^= 1
		if got := decodeBlock(2, b); got != tornValue {
			t.Fatalf("a torn block decodes as %x", got)
		}
		if got := decodeBlock(2, make([]byte, blockSize)); got != 0 {
			t.Fatalf("zeroes decode as %x", got)
		}
	})
}

// TestHarnessClusterConfig writes the config of three data nodes and a
// witness with raft and gossip, checks the node package accepts it as a
// clustered file with automatic failover, and starts every replnode.
func TestHarnessClusterConfig(t *testing.T) {
	e2e(t)
	c := newProcClusterN(t, clusterOpts{DataNodes: 3, Witness: true, Raft: true, Failover: "auto",
		PeerTimeout: 500 * time.Millisecond, RecordHooks: true})
	cfg, err := node.LoadConfig(c.cfgPath)
	if err != nil {
		raw, _ := os.ReadFile(c.cfgPath)
		t.Fatalf("the harness wrote a config replnode refuses: %v\n%s", err, raw)
	}
	if want := []string{"alpha", "beta", "gamma", "witness"}; !slices.Equal(c.nodeNames(), want) {
		t.Fatalf("nodes %v, want %v", c.nodeNames(), want)
	}
	if want := []string{"alpha", "beta", "gamma"}; !slices.Equal(c.dataNodes(), want) {
		t.Fatalf("data nodes %v, want %v", c.dataNodes(), want)
	}
	if auto, why := cfg.FailoverMode(); !auto || !cfg.Clustered() {
		t.Fatalf("config is clustered %v, failover auto %v (%s), want both", cfg.Clustered(), auto, why)
	}
	w, _ := cfg.Node("witness")
	if !w.IsWitness() || w.NBD != "" || w.Replication != "" || w.Raft == "" || w.Gossip == "" {
		t.Fatalf("witness entry %+v: want role witness, raft and gossip, no nbd or replication", w)
	}
	v := cfg.Volumes[0]
	if _, ok := v.Disks["witness"]; ok || len(v.Disks) != 3 || v.OnPromote == "" || v.OnDemote == "" ||
		time.Duration(v.PeerTimeout) != 500*time.Millisecond {
		t.Fatalf("volume %+v: want disks on the 3 data nodes, hooks, peer_timeout 500ms", v)
	}
	seen := map[string]string{}
	for _, n := range cfg.Nodes {
		for _, a := range []string{n.Control, n.Replication, n.NBD, n.Raft, n.Gossip} {
			if a == "" {
				continue
			}
			if !strings.HasPrefix(a, "127.0.0.1:") {
				t.Fatalf("node %s listens on %s: want 127.0.0.1 only", n.Name, a)
			}
			if other, dup := seen[a]; dup {
				t.Fatalf("%s is given to %s and %s", a, other, n.Name)
			}
			seen[a] = n.Name
		}
	}
	// The existing two-node constructor is unchanged: no raft, no role.
	plain, err := node.LoadConfig(newProcCluster(t, 64<<20, 61).cfgPath)
	if err != nil {
		t.Fatalf("newProcCluster's config: %v", err)
	}
	if plain.Clustered() || len(plain.Nodes) != 2 || plain.Nodes[0].Role != "" {
		t.Fatalf("newProcCluster's config: clustered %v, %d nodes, want today's two-node file", plain.Clustered(), len(plain.Nodes))
	}

	c.startAll()
	for _, n := range c.nodeNames() {
		if ps := c.procs[n].ProcessState; ps != nil {
			t.Fatalf("replnode %s exited: %s", n, ps)
		}
	}
	s, _, err := c.status("alpha")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodeNames() {
		if alive, listed := s.nodeAlive(n); !alive || !listed {
			t.Fatalf("alpha's status: node %s listed %v alive %v", n, listed, alive)
		}
	}
	t.Logf("cluster view from alpha: %+v", s.Cluster)
	if hooks := c.hookRuns(); len(hooks) > 0 {
		t.Logf("hooks run: %+v", hooks)
	}

	// In namespaces: each node on its own address, fixed ports; the
	// witness runs there too and answers the host.
	nc := newProcClusterN(t, clusterOpts{Witness: true, Raft: true, Netns: true})
	ncfg, err := node.LoadConfig(nc.cfgPath)
	if err != nil {
		raw, _ := os.ReadFile(nc.cfgPath)
		t.Fatalf("the harness wrote a config replnode refuses: %v\n%s", err, raw)
	}
	for _, n := range ncfg.Nodes {
		for _, a := range []string{n.Control, n.Replication, n.NBD, n.Raft, n.Gossip} {
			if a != "" && !strings.HasPrefix(a, nc.lab.ip(n.Name)+":") {
				t.Fatalf("node %s listens on %s, not on its namespace's address %s", n.Name, a, nc.lab.ip(n.Name))
			}
		}
	}
	nc.start(witnessName)
	nc.waitListening(witnessName, 30*time.Second)
}

// TestHarnessNetnsPartition runs alpha and beta (today's replnode) each
// in its own network namespace: the host reaches both, a partition of
// beta cuts TCP between them both ways and status says so from either
// side, healing restores it and the volume syncs again. A client in
// alpha's namespace writes through the NBD export. Afterwards nothing of
// the lab is left on the host.
func TestHarnessNetnsPartition(t *testing.T) {
	e2eBeside(t)
	var lab *netLab
	t.Run("partition", func(t *testing.T) {
		c := newProcClusterN(t, clusterOpts{Netns: true, Size: 16 << 20, PeerTimeout: 500 * time.Millisecond})
		lab = c.lab
		for _, n := range c.nodeNames() {
			if !strings.HasPrefix(c.nodes[n].Control, "10.77.") {
				t.Fatalf("node %s's control address %s is not on the lab's subnet", n, c.nodes[n].Control)
			}
		}
		c.startAll()
		for _, n := range c.nodeNames() {
			// ip netns exec execs replnode in place: signals reach it.
			exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", c.procs[n].Process.Pid))
			if err != nil || filepath.Base(exe) != "replnode" {
				t.Fatalf("pid %d of node %s runs %q (%v), want replnode", c.procs[n].Process.Pid, n, exe, err)
			}
		}
		c.waitInSync("alpha")

		// A client next to alpha writes and reads through the export.
		f := newFailoverNBD(c.targetsFrom("alpha"), 5*time.Second)
		defer f.close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.connect(ctx); err != nil {
			t.Fatal(err)
		}
		v := uint64(1)<<48 | 42 // block 0's value 42
		if _, outcome, err := f.write(ctx, 0, encodeBlock(v)); outcome != opOK {
			t.Fatalf("write from alpha's namespace: %s %v", outcome, err)
		}
		if data, node, outcome, err := f.read(ctx, 0, blockSize); outcome != opOK || decodeBlock(0, data) != v || node != "alpha" {
			t.Fatalf("read from alpha's namespace: %s on %s (%v): %s", outcome, node, err, describeValue(decodeBlock(0, data)))
		}

		alphaDial, betaDial := c.lab.dialer("alpha"), c.lab.dialer("beta")
		waitTCP(t, alphaDial, c.nodes["beta"].Replication, 5*time.Second)
		waitTCP(t, betaDial, c.nodes["alpha"].Control, 5*time.Second)

		c.partition("beta")
		waitNoTCP(t, alphaDial, c.nodes["beta"].Control, 5*time.Second)
		waitNoTCP(t, betaDial, c.nodes["alpha"].Control, 5*time.Second)
		waitNoTCP(t, nil, c.nodes["beta"].Control, 5*time.Second)
		// beta's own address still answers inside its namespace.
		waitTCP(t, betaDial, c.nodes["beta"].Control, 5*time.Second)
		waitNodeAlive(t, "from the host via alpha", func() result { return c.ctl("alpha", "status", "--json") }, "beta", false)
		waitNodeAlive(t, "inside beta's namespace via beta", func() result { return c.ctlFrom("beta", "beta", "status", "--json") }, "alpha", false)
		// The primary goes on writing; beta misses it.
		if _, outcome, err := f.write(ctx, registerStride, encodeBlock(uint64(2)<<48|43)); outcome != opOK {
			t.Fatalf("write on the cut-off cluster: %s %v", outcome, err)
		}

		c.heal("beta")
		waitTCP(t, alphaDial, c.nodes["beta"].Control, 10*time.Second)
		waitTCP(t, nil, c.nodes["beta"].Control, 10*time.Second)
		waitNodeAlive(t, "from the host via alpha", func() result { return c.ctl("alpha", "status", "--json") }, "beta", true)
		waitNodeAlive(t, "inside beta's namespace via beta", func() result { return c.ctlFrom("beta", "beta", "status", "--json") }, "alpha", true)
		c.waitInSync("beta")
	})
	if lab == nil {
		return
	}
	if left := lab.leftovers(); len(left) > 0 {
		t.Fatalf("the lab's cleanup left %v on the host", left)
	}
}

// waitNodeAlive polls a status command until it says node is (or is
// not) alive.
func waitNodeAlive(t *testing.T, via string, status func() result, node string, want bool) {
	t.Helper()
	var last string
	if !within(15*time.Second, 100*time.Millisecond, func() bool {
		r := status()
		if r.ok() {
			s, err := parseStatus(r.out)
			if err == nil {
				alive, listed := s.nodeAlive(node)
				if listed && alive == want {
					return true
				}
				last = fmt.Sprintf("listed %v alive %v", listed, alive)
			} else {
				last = err.Error()
			}
		} else {
			last = r.String()
		}
		return false
	}) {
		t.Fatalf("status %s: node %s alive is not %v after 15s; last: %s", via, node, want, last)
	}
}

// TestHarnessFailoverClients runs the register clients and the ack writer
// against alpha and beta on 127.0.0.1 across today's manual failover
// (kill -9 of alpha, replctl primary --force on beta): both follow the
// export to beta, the history is linearizable and every acknowledged
// write reads back from beta.
func TestHarnessFailoverClients(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Size: 32 << 20})
	c.startAll()
	c.waitInSync("alpha")

	rec := newOpRecorder()
	stopClients := startRegisterClients(t, c.targets(), rec, registerOpts{Clients: 3, Blocks: 4, OpTimeout: 3 * time.Second, Think: 2 * time.Millisecond})
	aw := startAckWriter(t, c.targets(), ackWriterOpts{Writers: 2, Base: 8 << 20, Limit: 32 << 20, OpTimeout: 3 * time.Second, Think: time.Millisecond})
	aw.waitAck(t, time.Time{}, 10*time.Second, "write #100 acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" && a.Seq >= 100 })
	rec.waitCompleted(t, "alpha", 100, 10*time.Second)

	// Today's manual failover: the primary dies, an operator promotes beta.
	killed := time.Now()
	c.kill("alpha")
	if r := c.ctl("beta", "primary", volName, "--node", "beta", "--force", "--yes"); !r.ok() {
		t.Fatalf("replctl primary %s --node beta --force --yes: %s", volName, r)
	}
	if p := c.waitPrimary("beta", 10*time.Second, "alpha"); p != "beta" {
		t.Fatalf("status names %s primary, want beta", p)
	}
	first := aw.waitAck(t, killed, 20*time.Second, "a write acknowledged by beta", func(a ackedWrite) bool { return a.Node == "beta" })
	t.Logf("kill -9 alpha, promote beta by hand: first write acknowledged by beta %s after the kill", first.At.Sub(killed).Round(time.Millisecond))
	rec.waitCompleted(t, "beta", 100, 10*time.Second)
	stopClients()
	acked, unacked := aw.stop()

	checkLinearizable(t, rec.history(), linearizabilityTimeout)
	if lost := verifyAcked(t, c.targets(), acked, unacked, 30*time.Second); len(lost) > 0 {
		return
	}
	// The verifier does report a lost write: one past the last written.
	next := acked[len(acked)-1].Seq + 100
	ft := &fakeTB{TB: t}
	bogus := ackedWrite{Seq: next, Off: 8<<20 + next*blockSize, Node: "alpha", At: time.Now()}
	if lost := verifyAcked(ft, c.targets(), []ackedWrite{bogus}, nil, 30*time.Second); len(lost) != 1 || !ft.failed || lost[0].Found != "zeroes" {
		t.Fatalf("a write that never happened: verifyAcked found %+v (failed the test: %v)", lost, ft.failed)
	}
	var onAlpha, onBeta int
	for _, a := range acked {
		switch a.Node {
		case "alpha":
			onAlpha++
		case "beta":
			onBeta++
		}
	}
	if onAlpha == 0 || onBeta == 0 {
		t.Fatalf("acknowledged writes: %d by alpha, %d by beta: want some by each", onAlpha, onBeta)
	}
}

// parseStatus parses `replctl status --json` output.
func parseStatus(out string) (*statusDoc, error) {
	var s statusDoc
	js := out
	if i := strings.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		return nil, fmt.Errorf("replctl status --json: %v in %q", err, out)
	}
	return &s, nil
}

// TestHarnessCatchesLostWrites: the checks do catch a primary that lacks
// acknowledged writes. beta is disconnected while alpha takes writes,
// then alpha dies and beta is forced primary: the linearizability check
// finds the history illegal and verifyAcked reports the writes only alpha
// had.
func TestHarnessCatchesLostWrites(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{Size: 32 << 20})
	c.startAll()
	c.waitInSync("alpha")
	c.mustCtl("alpha", "disconnect", volName, "--node", "alpha")

	rec := newOpRecorder()
	stopClients := startRegisterClients(t, c.targets(), rec, registerOpts{Clients: 3, Blocks: 4, OpTimeout: 3 * time.Second, Think: 2 * time.Millisecond})
	aw := startAckWriter(t, c.targets(), ackWriterOpts{Writers: 2, Base: 8 << 20, Limit: 32 << 20, OpTimeout: 3 * time.Second, Think: time.Millisecond})
	aw.waitAck(t, time.Time{}, 10*time.Second, "write #100 acknowledged by alpha", func(a ackedWrite) bool { return a.Node == "alpha" && a.Seq >= 100 })
	rec.waitCompleted(t, "alpha", 100, 10*time.Second)
	stopClients()
	c.kill("alpha")
	if r := c.ctl("beta", "primary", volName, "--node", "beta", "--force", "--yes"); !r.ok() {
		t.Fatalf("replctl primary %s --node beta --force --yes: %s", volName, r)
	}
	// One recorded read of every block on beta: each had writes on alpha.
	f := newFailoverNBD(c.targets(), 5*time.Second)
	defer f.close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := rec.newClient()
	for b := range 4 {
		if err := f.connect(ctx); err != nil {
			t.Fatal(err)
		}
		id := rec.begin(client, opRead, b, 0)
		data, node, outcome, err := f.read(ctx, uint64(b)*registerStride, blockSize)
		rec.finish(id, outcome, decodeBlock(b, data), node, err)
		if outcome != opOK || node != "beta" {
			t.Fatalf("read of block %d: %s on %s: %v", b, outcome, node, err)
		}
	}
	acked, unacked := aw.stop()

	ft := &fakeTB{TB: t}
	if res := checkLinearizable(ft, rec.history(), linearizabilityTimeout); res != porcupine.Illegal || !ft.failed {
		t.Fatalf("checkLinearizable = %s (failed %v), want Illegal; it said:\n%s", res, ft.failed, strings.Join(ft.msgs, "\n"))
	}
	t.Logf("as expected: %s", ft.msgs[len(ft.msgs)-1])
	os.Remove(ft.htmlNamed())

	ft = &fakeTB{TB: t}
	lost := verifyAcked(ft, c.targets(), acked, unacked, 30*time.Second)
	onAlpha := 0
	for _, a := range acked {
		if a.Node == "alpha" {
			onAlpha++
		}
	}
	if len(lost) != onAlpha || !ft.failed {
		t.Fatalf("verifyAcked found %d lost writes (failed %v), want the %d acknowledged by alpha alone", len(lost), ft.failed, onAlpha)
	}
	t.Logf("as expected: %d lost writes reported", len(lost))
}
