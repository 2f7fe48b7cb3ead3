package cluster

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
)

// TestStrangersCannotTakeRaftsHandshakeSlots: 8 addresses that are no
// member's (127.0.0.2-9) keep 10 connections each on every node's raft
// port, each starting a TLS handshake it never finishes and made again
// when the node closes it: more than raft's 64 handshake slots. The
// members (127.0.0.1) are never refused: they elect a leader and commit
// through the flood; the strangers hold no more than their share.
//
// A member's handshake has RaftIOTimeout (at least a second) before it is
// closed unfinished, a stranger's a second while the port is busy. With
// the package's RaftIOTimeout of a second, a loaded machine (the flood
// itself keeps it busy: hundreds of connections a second accepted and
// closed under the race detector) closed the members' handshakes
// unfinished, 17 to 19 a node in ten seconds, and no leader was elected
// within 15 s. The members get the default's room and more here
// (10 s), raft the slower elections of a test that needs a stable leader
// and a minute to elect one, so that what the test tells apart is a
// member's slot from a stranger's, not the machine's speed from a second.
func TestStrangersCannotTakeRaftsHandshakeSlots(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
	n.timing.RaftIOTimeout = 10 * time.Second
	n.timing.HeartbeatTimeout, n.timing.ElectionTimeout, n.timing.LeaderLeaseTimeout = 1500*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond
	n.withTLS()
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var tried sync.WaitGroup
	for _, m := range n.initial {
		for a := range 8 {
			for range 10 {
				tried.Add(1)
				flood.Go(func() { stallHandshakes(m.Raft, net.IPv4(127, 0, 0, byte(2+a)), stop, tried.Done) })
			}
		}
	}
	t.Cleanup(func() { close(stop); flood.Wait() })
	tried.Wait()

	n.startAll()
	// The test asserts that the members elect a leader through the
	// flood, not how soon: on a loaded machine each election round of a
	// starved process takes seconds.
	leader := n.waitLeaderWithin(t, time.Minute)
	follower := n.follower(t, leader)
	ctx := testContext(t, 30*time.Second)
	if _, err := follower.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatalf("a proposal through %s during the flood: %v", follower.self, err)
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" applies the proposal", 30*time.Second, func() bool {
			_, ok := c.Authority().Volume("vol")
			return ok
		})
		st, ok := c.RaftAdmission()
		if !ok || st.StrangerHandshakes > strangerHandshakes || st.Refused() == 0 {
			t.Errorf("%s's raft admission %+v: want the strangers within their %d handshakes, the rest refused", c.self, st, strangerHandshakes)
		}
		// A member's connection is never refused, nor its handshake
		// closed to make room; one that is still unfinished after the
		// busy port's deadline is closed as anyone's is (a machine that
		// slow: raft dials again).
		for _, line := range n.logsOf(c.self) {
			slowOnly := strings.Contains(line, "from=127.0.0.1 ") && strings.Contains(line, " refused=0 ") && !strings.Contains(line, "to make room")
			if !slowOnly && strings.Contains(line, "127.0.0.1") && strings.Contains(line, "refused") {
				t.Errorf("%s refused a member's connection: %s", c.self, line)
			}
		}
	}
}

// stallHandshakes keeps a connection from local to addr that starts a TLS
// handshake and never finishes it, made again once addr closes it, until
// stop. first is called once the first connection was tried (and its
// bytes sent).
func stallHandshakes(addr string, local net.IP, stop <-chan struct{}, first func()) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local}, Timeout: time.Second}
	for i := 0; ; i++ {
		began := time.Now()
		c, err := d.Dial("tcp", addr)
		if err == nil {
			c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) // a ClientHello's first bytes
		}
		if i == 0 {
			first()
		}
		if err == nil {
			done := make(chan struct{})
			go func() {
				select {
				case <-stop:
				case <-done:
				}
				c.Close()
			}()
			c.Read(make([]byte, 1)) // until the node closes it
			close(done)
		}
		pause := time.Millisecond
		if time.Since(began) < 100*time.Millisecond {
			pause = 100 * time.Millisecond // refused: the flood goes on, at a pace
		}
		select {
		case <-stop:
			return
		case <-time.After(pause):
		}
	}
}
