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
func TestStrangersCannotTakeRaftsHandshakeSlots(t *testing.T) {
	n := newTestNet(t, member("a"), member("b"), witness("w"))
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
	leader := n.waitLeader(t)
	follower := n.follower(t, leader)
	ctx := testContext(t, 5*time.Second)
	if _, err := follower.Propose(ctx, replication.InitCommand("vol", "a", 1, []string{"a", "b"})); err != nil {
		t.Fatalf("a proposal through %s during the flood: %v", follower.self, err)
	}
	for _, c := range n.nodes() {
		waitFor(t, c.self+" applies the proposal", 5*time.Second, func() bool {
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
