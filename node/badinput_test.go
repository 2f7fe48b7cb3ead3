package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// logRecorder keeps a node's log records, for a test to look for one.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for line := range strings.SplitSeq(strings.TrimSpace(string(p)), "\n") {
		r.lines = append(r.lines, line)
	}
	return len(p), nil
}

func (r *logRecorder) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// problemsSince returns the lines logged after the first n, at WARN or
// ERROR.
func (r *logRecorder) problemsSince(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines[min(n, len(r.lines)):] {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

func (r *logRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// garbage is bytes no protocol of a node speaks.
func garbage(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestGarbageOnEveryPortIsRefusedAndTheNodeKeepsServing: random bytes sent
// to each of alpha's ports (control, replication, NBD, raft, gossip over
// TCP and UDP) get the sender an error or a closed connection, never
// change the volume, and alpha goes on replicating, answering status and
// voting; raft's and gossip's ports log a warning or error naming the
// garbage.
func TestGarbageOnEveryPortIsRefusedAndTheNodeKeepsServing(t *testing.T) {
	const size = 8 << 20
	c := newRaftCluster(t, size)
	var log logRecorder
	o := c.opts["alpha"]
	o.Logger = log.logger()
	c.opts["alpha"] = o
	c.start("wit")
	alpha := c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(context.Background(), pattern(1, 64<<10), 0, false) == nil }, "alpha serves under its lease")
	c.waitInSync()
	self := alpha.self

	for i, port := range []struct {
		name, network, addr string
		// answer, for a port that answers garbage, is what the answer
		// starts with; logged, whether the port logs it.
		answer string
		logged bool
	}{
		{"control", "tcp", alpha.ControlAddr(), "HTTP/1.1 400 Bad Request", false},
		{"replication", "tcp", alpha.lnRepl.Addr().String(), "", false},
		{"nbd", "tcp", alpha.lnNBD.Addr().String(), "NBDMAGIC", false},
		{"raft", "tcp", self.Raft, "", true},
		{"gossip", "tcp", self.Gossip, "", true},
		{"gossip", "udp", self.Gossip, "", true},
	} {
		t.Run(port.name+"/"+port.network, func(t *testing.T) {
			logged := log.count()
			conn, err := net.Dial(port.network, port.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write(garbage(uint64(i+1), 1024)); err != nil {
				t.Fatal(err)
			}
			if port.network == "tcp" {
				// The node answers with an error, or says nothing, and
				// closes the connection.
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(bufio.NewReader(conn))
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("%s kept a connection of garbage open for 10 s (it sent %q)", port.name, got)
				}
				if !bytes.HasPrefix(got, []byte(port.answer)) {
					t.Fatalf("%s answered garbage with %q, want %q", port.name, got, port.answer)
				}
				t.Logf("%s: answered %q, then closed (%v)", port.name, firstLine(got), err)
			}
			if port.logged {
				if !within(30*time.Second, 10*time.Millisecond, func() bool { return len(log.problemsSince(logged)) > 0 }) {
					t.Fatalf("%s logged nothing of the garbage in 30 s", port.name)
				}
				t.Logf("%s logged: %s", port.name, log.problemsSince(logged)[0])
			}
		})
	}

	// alpha goes on: it replicates a write, its raft and gossip see the
	// others, and the volume holds what it held.
	if err := a.WriteAt(context.Background(), pattern(2, 4096), 1<<20, false); err != nil {
		t.Fatalf("a write after the garbage: %v", err)
	}
	c.waitInSync()
	c.requireIdentical()
	// A leader that is the primary hands its office on after a while, and
	// gossip may suspect a node for a moment on a busy machine: what must
	// hold is that raft has a leader and gossip sees every node alive
	// again, not at one look.
	var st *transport.ClusterStatus
	if !within(30*time.Second, 20*time.Millisecond, func() bool {
		st = c.status()
		if st.Cluster.Leader == "" {
			return false
		}
		for _, n := range st.Nodes {
			if !n.Alive || n.Membership != "alive" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("30 s after the garbage, no raft leader or a node not alive: %+v, nodes %+v", st.Cluster, st.Nodes)
	}
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return strings.TrimSpace(string(line))
}

// TestAPeerThatStopsReadingCostsAWriteAtMostThePeerTimeout: a peer whose
// end of the stream stops reading (its receive window full: every send
// blocks) holds a write no longer than peer_timeout; the write completes
// unacknowledged, its blocks are marked for the peer, and the stream is
// given up with ErrPeerTimeout, freeing what it held.
func TestAPeerThatStopsReadingCostsAWriteAtMostThePeerTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	_, p, ended := streamToGatedBeta(t, false, timeout) // the gate never opens: every send blocks
	began := time.Now()
	pd, err := p.submit(replication.Entry{Op: replication.OpWrite, Off: 8192, Length: 4096, Data: make([]byte, 4096)}, 'C', nil, false)
	if err != nil || pd == nil {
		t.Fatalf("submit to a streaming peer: %v, %v", pd, err)
	}
	select {
	case <-pd.Done():
	case <-time.After(10 * timeout):
		t.Fatal("the write still waits for the peer that stopped reading")
	}
	if took := time.Since(began); took > timeout+time.Second {
		t.Fatalf("the peer held the write %s, want about the peer timeout (%s)", took, timeout)
	}
	if pd.Acked() || pd.Err() != nil {
		t.Fatalf("entry completed acked=%v err=%v, want unacknowledged and tracked", pd.Acked(), pd.Err())
	}
	if err := <-ended; !errors.Is(err, ErrPeerTimeout) {
		t.Fatalf("session ended with %v, want ErrPeerTimeout", err)
	}
	if !p.bm.Test(2) {
		t.Fatal("the block the peer missed is not marked in its bitmap")
	}
}

// TestPromotingWithoutAQuorumIsRefusedUnlessForced: with the primary and
// the witness gone, beta is one voter of three and raft decides nothing.
// An operator's switchover to beta is refused at once, saying that only
// --force --yes promotes it; --force without --yes is refused, saying
// what the promotion would lose. beta stays Secondary.
func TestPromotingWithoutAQuorumIsRefusedUnlessForced(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	c.crash("alpha")
	c.stop("wit")
	ctl, err := transport.DialControl(c.nodes["beta"].ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for _, tc := range []struct {
		name string
		req  transport.PrimaryRequest
		want string
	}{
		{"a switchover", transport.PrimaryRequest{Volume: "vol0", Node: "beta"}, "promote beta with --force --yes"},
		{"--force without --yes", transport.PrimaryRequest{Volume: "vol0", Node: "beta", Force: true}, "Add --yes to go ahead"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		began := time.Now()
		_, err := ctl.Primary(ctx, &tc.req)
		cancel()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s without a quorum: %v, want FailedPrecondition saying %q", tc.name, err, tc.want)
		}
		if took := time.Since(began); took > 5*time.Second {
			t.Fatalf("%s without a quorum was refused after %s, want at once", tc.name, took)
		}
		t.Logf("%s: %v", tc.name, status.Convert(err).Message())
	}
	if st := c.vol("beta").status(); st.Role != string(replication.Secondary) {
		t.Fatalf("beta is %s after the refusals", st.Role)
	}
}
