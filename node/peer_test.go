package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/repltest"
)

// streamToGatedBeta starts alpha alone and runs a session to its peer
// beta over a GateStream (open: sends go through; else every send
// blocks, a peer that stops reading), with beta Connected and UpToDate.
// The test drives that session itself; ended gets what its Run returns.
func streamToGatedBeta(t *testing.T, open bool, timeout time.Duration) (v *Volume, p *peer, ended chan error) {
	t.Helper()
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	v = c.vol("alpha")
	p = v.peers.byName["beta"]
	v.stopPeers()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g := repltest.NewGateStream(ctx)
	if open {
		close(g.Gate)
	}
	s := newSession(context.Background(), p, transport.NewReplStream(g, cancel), timeout, true)
	takeStreamAs(v, p, s, replication.Connected, replication.UpToDate)
	ended = make(chan error, 1)
	go func() { ended <- s.Run(nil) }()
	return v, p, ended
}

// takeStreamAs makes s p's stream as a handshake that decided repl would:
// the peer's state in v's state machine, installed as a step's is (on the
// volume's loop, published to the view), and the view's stream and disk.
func takeStreamAs(v *Volume, p *peer, s *session.Session, repl replication.ReplState, disk replication.DiskState) {
	v.loop.Ask(func() {
		p.update(func(pv *peerView) { pv.sess, pv.peerDisk = s, string(disk) })
		v.mu.Lock()
		defer v.mu.Unlock()
		old := v.modelLocked()
		next := old.Clone()
		q := next.Peers[p.name]
		q.Repl, q.Session = repl, s.ID()
		next.Peers[p.name] = q
		v.installLocked(old, next, volstate.Ready{}, nil)
	})
}

// statePeer is the peer name in v's state (not its model: no fact).
func statePeer(v *Volume, name string) volstate.Peer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st.Peers[name]
}

// TestAHungPeerCostsAWriteAtMostThePeerTimeout: a peer that takes the
// stream and then answers nothing (a SIGSTOPped process: TCP is up, the
// sends even go through) is given up after peer_timeout: the write waiting
// for it completes, unacknowledged, its blocks marked for the peer after
// the volume started tracking it.
func TestAHungPeerCostsAWriteAtMostThePeerTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	v, p, ended := streamToGatedBeta(t, true, timeout) // sends go through; nothing ever comes back
	began := time.Now()
	pd, err := p.submit(replication.Entry{Op: replication.OpWrite, Off: 4096, Length: 4096, Data: make([]byte, 4096)}, 'C', nil, false)
	if err != nil || pd == nil {
		t.Fatalf("submit to a streaming peer: %v, %v", pd, err)
	}
	select {
	case <-pd.Done():
	case <-time.After(10 * timeout):
		t.Fatal("the write still waits for the hung peer")
	}
	took := time.Since(began)
	if pd.Acked() || pd.Err() != nil {
		t.Fatalf("entry completed acked=%v err=%v, want unacknowledged and tracked", pd.Acked(), pd.Err())
	}
	if took < timeout || took > timeout+time.Second {
		t.Fatalf("the hung peer held the write %s, want about the peer timeout (%s)", took, timeout)
	}
	if err := <-ended; !errors.Is(err, ErrPeerTimeout) {
		t.Fatalf("session ended with %v, want ErrPeerTimeout", err)
	}
	if !p.bm.Test(1) {
		t.Fatal("the block the hung peer missed is not marked in its bitmap")
	}
	if !v.tracking("beta") {
		t.Fatal("the volume does not track beta after it missed a write")
	}
}

// TestASecondaryOnASlowDiskIsNotTakenForHung: beta's disk takes three
// peer timeouts to write one block. While it applies the write beta
// tells alpha it is alive, so alpha keeps the stream (no timeout, no
// reconnection) and the write completes on both, acknowledged.
func TestASecondaryOnASlowDiskIsNotTakenForHung(t *testing.T) {
	const timeout = 300 * time.Millisecond
	c := newTestCluster(t, 4<<20)
	c.cfg.Volumes[0].PeerTimeout = Duration(timeout)
	var slow *fault.Disk
	c.opts["beta"] = Options{OpenDisk: openFaulty(func(d *fault.Disk) { slow = d })}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	slow.Add(fault.On(fault.Write).Range(1<<20, 4096).Delay(3 * timeout))
	v := c.vol("alpha")
	s := v.peers.byName["beta"].session()
	began := time.Now()
	if err := v.WriteAt(context.Background(), pattern(9, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < 3*timeout {
		t.Fatalf("the write completed after %s, before beta's disk took it (%s)", took, 3*timeout)
	}
	if now := v.peers.byName["beta"].session(); now != s {
		t.Fatal("alpha replaced its stream to beta while beta's disk was slow: it took beta for hung")
	}
	if v.peers.byName["beta"].bm.Test(1 << 20 / replication.BlockSize) {
		t.Fatal("the write is marked for beta: alpha gave up on it")
	}
	c.requireIdentical()
}

// TestAPeerShowsWhatItsStreamSaysByTheRules: the news of a peer's stream
// and link is stepped through the volume's rules (the state machine's
// peer is the state), and published to the peer's view. A resync paused
// by congestion is Ahead, and SyncSource again once drained; a sync-done
// acknowledged while Ahead leaves the peer Ahead and its disk as it was;
// the news of an older stream changes nothing; a lost link is
// Connecting, a stopped one StandAlone.
func TestAPeerShowsWhatItsStreamSaysByTheRules(t *testing.T) {
	v, p, _ := streamToGatedBeta(t, true, time.Minute)
	s := p.session()
	takeStreamAs(v, p, s, replication.SyncSource, replication.Inconsistent)
	cur, older := s.ID(), s.ID()-1
	check := func(step string, want replication.ReplState, disk replication.DiskState) {
		t.Helper()
		v.loop.Ask(func() {}) // past the news told
		pv := p.snapshot()
		if st := statePeer(v, "beta"); st.Repl != want || st.Session != pv.sid || pv.state != want || pv.peerDisk != string(disk) {
			t.Fatalf("%s: the machine has beta %s on stream %d, its view %s on stream %d with disk %s; want %s with disk %s",
				step, st.Repl, st.Session, pv.state, pv.sid, pv.peerDisk, want, disk)
		}
	}
	for i, c := range []struct {
		e    volstate.StreamEvent
		want replication.ReplState
		disk replication.DiskState
	}{
		{volstate.PeerCongested{Peer: "beta", Session: older}, replication.SyncSource, replication.Inconsistent},
		{volstate.PeerCongested{Peer: "beta", Session: cur}, replication.Ahead, replication.Inconsistent},
		{volstate.PeerInSync{Peer: "beta", Session: cur}, replication.Ahead, replication.Inconsistent},
		{volstate.PeerDrained{Peer: "beta", Session: cur, Resyncing: true}, replication.SyncSource, replication.Inconsistent},
		{volstate.PeerInSync{Peer: "beta", Session: older}, replication.SyncSource, replication.Inconsistent},
		{volstate.PeerInSync{Peer: "beta", Session: cur}, replication.Connected, replication.UpToDate},
		{volstate.PeerCatchingUp{Peer: "beta", Session: cur}, replication.SyncSource, replication.UpToDate},
	} {
		p.Stream(c.e)
		check(fmt.Sprintf("step %d, %T of stream %d", i, c.e, func() uint64 { _, sid := c.e.Stream(); return sid }()), c.want, c.disk)
	}
	p.askNews(volstate.LinkDown{Peer: "beta"}, nil)
	check("the link lost its stream", replication.Connecting, replication.UpToDate)
	p.askNews(volstate.LinkDown{Peer: "beta", ForGood: true}, nil)
	check("the link stopped", replication.StandAlone, replication.UpToDate)
}
