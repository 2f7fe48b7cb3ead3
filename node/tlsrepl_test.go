package node

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// lineLog keeps what a node logs, every level, in memory.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// count is how many lines hold every one of words.
func (l *lineLog) count(words ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			n++
		}
	}
	return n
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// captureLog has the named node log everything, DEBUG included, into the
// returned lineLog (not the test's log).
func captureLog(c *testCluster, name string) *lineLog {
	l := &lineLog{}
	o := c.opts[name]
	o.Logger = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c.opts[name] = o
	return l
}

// strangerConfig is c's config with the certificates and gossip key of
// another CA, issued for the named nodes: a second replctl certs init.
func strangerConfig(t *testing.T, c *testCluster, names ...string) (*Config, string) {
	t.Helper()
	dir := t.TempDir()
	var hs []pki.Holder
	for _, n := range names {
		hs = append(hs, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: n}, Hosts: []string{"127.0.0.1"}})
	}
	if _, err := pki.Init(dir, hs, false); err != nil {
		t.Fatal(err)
	}
	cfg := *c.cfg
	cfg.TLS = &TLSConfig{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "{node}.crt"), Key: filepath.Join(dir, "{node}.key"),
		GossipKey: filepath.Join(dir, "gossip.key")}
	return &cfg, dir
}

// startWith starts the named node of c from cfg instead of c's config.
func (c *testCluster) startWith(cfg *Config, name string) *Node {
	c.t.Helper()
	n, err := New(cfg, name, c.opts[name])
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	if err := n.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.nodes[name] = n
	return n
}

// plainRaftAnswers reports whether the raft server at addr answers a
// plaintext raft RPC.
func plainRaftAnswers(t *testing.T, id, addr string) bool {
	t.Helper()
	plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var resp raft.AppendEntriesResponse
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(plain.LocalAddr())}, Term: 1}
	return plain.AppendEntries(raft.ServerID(id), raft.ServerAddress(addr), req, &resp) == nil
}

// openStream opens a replication stream to addr with opts and sends
// hello; it returns the reply, or the error that ended the stream.
func openStream(t *testing.T, addr string, hello replication.Hello, opts ...transport.ReplOption) (replication.HelloReply, error) {
	t.Helper()
	cl, err := transport.DialRepl(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := cl.Open(ctx)
	if err != nil {
		return replication.HelloReply{}, err
	}
	defer s.Close()
	var reply replication.HelloReply
	if err := sendJSON(s, replication.FrameHello, hello); err != nil {
		return reply, err
	}
	f := &transport.Frame{}
	defer f.Release()
	if err := s.Recv(f); err != nil {
		return reply, err
	}
	b := f.Bytes()
	if len(b) == 0 || replication.FrameType(b[0]) != replication.FrameHelloReply {
		t.Fatalf("the answer to a Hello is no HelloReply: %q", b)
	}
	return reply, json.Unmarshal(b[1:], &reply)
}

// TestATLSClusterReplicatesFailsOverAndResyncs: with replctl certs init's
// files in the tls: section, two data nodes and a witness replicate; when
// the primary is killed raft promotes the other node, which serves every
// acknowledged write; the old primary comes back as its secondary, and a
// disconnected secondary resyncs exactly what it missed, as in a
// plaintext cluster. Every link is TLS: a plaintext replication client
// and a plaintext raft RPC get no answer.
func TestATLSClusterReplicatesFailsOverAndResyncs(t *testing.T) {
	const size = 8 << 20
	c := newRaftCluster(t, size)
	withTLS(t, c)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx := context.Background()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(1, 64<<10), 0, false) == nil }, "alpha serves under its lease")
	writeRandomBlocks(t, a, 50, 1)
	eventually(t, func() bool {
		va, ok := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return ok && va.IsUpToDate("beta")
	}, "raft knows beta UpToDate")

	want := c.disk("alpha")[:size]
	c.crash("alpha")
	b := c.vol("beta")
	eventually(t, func() bool { return b.status().Role == "Primary" && b.status().Serving }, "beta promoted")
	got := make([]byte, size)
	if err := b.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("beta does not hold every write alpha acknowledged")
	}
	writeRandomBlocks(t, b, 20, 2)
	c.start("alpha")
	c.waitInSync()
	if st := c.status(); st.Volumes[0].Primary != "beta" || replica(st, "alpha").Role != "Secondary" {
		t.Fatalf("after alpha came back: primary %s, alpha %s", st.Volumes[0].Primary, replica(st, "alpha").Role)
	}

	before := replica(c.status(), "alpha").ResyncedBytes
	c.vol("alpha").setAdminDown(true)
	eventually(t, func() bool { return b.peers.byName["alpha"].status().Replication != "Connected" }, "beta sees alpha gone")
	blocks := writeRandomBlocks(t, b, 100, 3)
	c.vol("alpha").setAdminDown(false)
	c.waitInSync()
	if moved := replica(c.status(), "alpha").ResyncedBytes - before; moved != int64(blocks)*4096 {
		t.Fatalf("alpha's resync moved %d bytes, want the %d blocks it missed", moved, blocks)
	}
	c.requireIdentical()

	hello := replication.Hello{Volume: "vol0", From: "beta", To: "alpha", Size: size}
	if reply, err := openStream(t, c.nodes["alpha"].lnRepl.Addr().String(), hello); err == nil {
		t.Fatalf("alpha answered a plaintext replication stream: %+v", reply)
	}
	for _, n := range c.cfg.Nodes {
		if plainRaftAnswers(t, n.Name, n.Raft) {
			t.Fatalf("%s answered a plaintext raft RPC", n.Name)
		}
	}
}

// TestAStrangerWithAnotherCACannotConnectReplicateOrVote: a node started
// as beta with a certificate and gossip key of a second replctl certs
// init cannot connect, replicate or vote: alpha refuses to stream to it
// and says why on beta's link, it never hears of a raft leader, gossip
// does not count it alive, and once the witness stops alpha has no
// quorum (the stranger's vote does not count). Its stream to alpha is
// refused too. Each refusal is logged once, in words.
func TestAStrangerWithAnotherCACannotConnectReplicateOrVote(t *testing.T) {
	c := newRaftCluster(t, 8<<20)
	withTLS(t, c)
	stranger, strangerDir := strangerConfig(t, c, "beta")
	logs := captureLog(c, "alpha")
	c.start("wit")
	c.start("alpha")
	s := c.startWith(stranger, "beta")

	p := c.vol("alpha").peers.byName["beta"]
	eventually(t, func() bool { return p.status().ReasonCode == string(CauseIdentity) }, "alpha refuses the stranger's certificate")
	if ps := p.status(); ps.Replication == "Connected" || !strings.Contains(ps.Reason, "beta presented a certificate of another CA: node beta (serial ") {
		t.Fatalf("alpha's link to beta: %s: %s", ps.Replication, ps.Reason)
	}
	ctx := context.Background()
	eventually(t, func() bool { return c.vol("alpha").WriteAt(ctx, pattern(5, 64<<10), 0, false) == nil }, "alpha serves without beta")
	if got := c.disk("beta")[:64<<10]; !bytes.Equal(got, make([]byte, 64<<10)) {
		t.Fatal("alpha's write reached the stranger's disk")
	}

	// Its own stream to alpha, checking nothing of alpha's certificate.
	sb, err := pki.Load(filepath.Join(strangerDir, "ca.crt"), filepath.Join(strangerDir, "beta.crt"), filepath.Join(strangerDir, "beta.key"))
	if err != nil {
		t.Fatal(err)
	}
	conf := sb.ClientConfig("127.0.0.1", nil)
	conf.InsecureSkipVerify, conf.VerifyConnection = true, nil
	hello := replication.Hello{Volume: "vol0", From: "beta", To: "alpha", Size: 8 << 20}
	for range 3 {
		if reply, err := openStream(t, c.nodes["alpha"].lnRepl.Addr().String(), hello, transport.ReplTLS(conf)); err == nil {
			t.Fatalf("alpha took the stranger's stream: %+v", reply)
		}
	}

	time.Sleep(5 * clusterTick)
	if st := s.cl.c.Status(); st.Leader != "" || st.Quorum {
		t.Fatalf("the stranger hears of a raft leader: %+v", st)
	}
	for _, m := range c.nodes["alpha"].cl.c.Status().Members {
		if m.Name == "beta" && m.State == cluster.Alive {
			t.Fatal("alpha's gossip counts the stranger alive")
		}
	}
	c.stop("wit")
	eventually(t, func() bool { return !c.nodes["alpha"].cl.c.Status().Quorum }, "alpha, left with the stranger, loses its quorum")
	time.Sleep(3 * time.Second) // many election timeouts
	if st := c.nodes["alpha"].cl.c.Status(); st.Quorum {
		t.Fatalf("alpha and the stranger elected a leader: %+v", st)
	}

	// Once each, though every one was tried again and again.
	for _, tc := range []struct {
		what  string
		words []string
	}{
		{"the stranger's certificate on the replication link", []string{"level=WARN", "replication to peer down", "beta presented a certificate of another CA: node beta (serial "}},
		{"the stranger's certificate on raft", []string{"level=WARN", "raft: beta at " + c.cfg.Nodes[1].Raft + " presented a certificate of another CA: node beta (serial "}},
		{"the stranger's stream to alpha", []string{"level=WARN", "link=replication", "a client at 127.0.0.1 presented a certificate of another CA: node beta (serial "}},
	} {
		if got := logs.count(tc.words...); got != 1 {
			t.Errorf("%s: logged %d times at WARN, want once:\n%s", tc.what, got, logs)
		}
	}
	// The refusal is one cause however far the connection got before the
	// handshake failed (gRPC opens the stream first): never a lost peer.
	if got := logs.count("level=WARN", "replication to peer down", "peer=beta", "cause=peer-lost", "certificate"); got != 0 {
		t.Errorf("the stranger's refused handshake was logged %d times as a lost peer:\n%s", got, logs)
	}
	if logs.count("level=DEBUG", "replication to peer still down", "peer=beta") < 2 {
		t.Errorf("alpha did not retry beta (and log it at DEBUG):\n%s", logs)
	}
}

// TestACertificateOfBetaCannotStandInForAlpha: a process that claims to
// be alpha (its Hello says From alpha) but holds beta's certificate is
// refused by beta with RefusedIdentity, in words on alpha's link; beta
// logs it once however often the primary tries, and takes no data.
func TestACertificateOfBetaCannotStandInForAlpha(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	dir := withTLS(t, c)
	logs := captureLog(c, "beta")
	c.start("beta")
	impostor, err := New(c.cfg, "alpha", c.opts["alpha"])
	if err != nil {
		t.Fatal(err)
	}
	if impostor.tls, err = pki.Load(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "beta.crt"), filepath.Join(dir, "beta.key")); err != nil {
		t.Fatal(err)
	}
	if err := impostor.Start(); err != nil {
		t.Fatal(err)
	}
	c.nodes["alpha"] = impostor

	p := c.vol("alpha").peers.byName["beta"]
	eventually(t, func() bool { return p.status().ReasonCode == string(CauseIdentity) }, "beta refuses the impostor")
	if ps := p.status(); !strings.Contains(ps.Reason, "claims to come from alpha but presented a certificate that names node beta") {
		t.Fatalf("the impostor's link to beta: %s: %s", ps.Replication, ps.Reason)
	}
	eventually(t, func() bool { return logs.count("level=DEBUG", "refused replication stream again", "from=alpha") >= 2 }, "the impostor tries again")
	if got := logs.count("level=WARN", "refused replication stream", "refusal=identity-mismatch"); got != 1 {
		t.Fatalf("beta logged the refusal %d times at WARN, want once:\n%s", got, logs)
	}
	if r := replica(c.status(), "beta"); r.Replication == "Connected" {
		t.Fatalf("beta took the impostor's stream: %+v", r)
	}
}

// TestANodeWithoutADiskOfTheVolumeCannotStreamIt: the witness's own
// certificate (it holds no disk of vol0) opens a stream in its own name at
// a newer epoch, with the generations alpha would send: beta does not
// take it as its new primary, and alpha, the primary, does not step down.
// Both refuse it in words, log it once, and replication goes on.
func TestANodeWithoutADiskOfTheVolumeCannotStreamIt(t *testing.T) {
	const size = 8 << 20
	c := newRaftCluster(t, size)
	dir := withTLS(t, c)
	logs := map[string]*lineLog{"alpha": captureLog(c, "alpha"), "beta": captureLog(c, "beta")}
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	a.mu.Lock()
	uuids, epoch := a.uuidsLocked("beta"), a.st.Durable.Epoch
	a.mu.Unlock()
	wit := loadBundle(t, dir, "wit")
	for range 2 {
		for _, to := range []string{"beta", "alpha"} {
			addr := c.nodes[to].lnRepl.Addr().String()
			hello := replication.Hello{Volume: "vol0", From: "wit", To: to, Epoch: epoch + 1, Size: size, UUIDs: uuids, Wire: replication.WireVersion}
			reply, err := openStream(t, addr, hello, transport.ReplTLS(wit.ClientConfig(addr, pki.Exactly(nodeIdentity(to)))))
			if err != nil {
				t.Fatalf("the witness's stream to %s: %v", to, err)
			}
			if reply.Accepted || reply.Refused != replication.RefusedIdentity || !strings.Contains(reply.Reason, "comes from wit, which holds no disk of vol0") {
				t.Fatalf("the witness's stream to %s at epoch %d: %+v", to, epoch+1, reply)
			}
		}
	}
	for _, name := range []string{"alpha", "beta"} {
		if got := logs[name].count("level=WARN", "refused replication stream", "from=wit"); got != 1 {
			t.Errorf("%s logged the witness's stream %d times at WARN, want once:\n%s", name, got, logs[name])
		}
	}
	st := c.status()
	if st.Volumes[0].Primary != "alpha" || replica(st, "alpha").Role != "Primary" || replica(st, "beta").Replication != "Connected" {
		t.Fatalf("after the witness's streams: primary %s, alpha %s, beta %s", st.Volumes[0].Primary, replica(st, "alpha").Role, replica(st, "beta").Replication)
	}
	writeRandomBlocks(t, a, 20, 7)
	c.waitInSync()
	c.requireIdentical()
}
