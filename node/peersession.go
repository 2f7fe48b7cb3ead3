package node

import (
	"context"
	"time"

	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// The peer as its sessions see it (session.Peer): what a stream to the
// peer changes of the peer and its volume, and the catch-up resync it
// starts after congestion.

var _ session.Peer = (*peer)(nil)

// newSession makes p's session of stream s, whose handshake is done;
// sums: the peer takes the checksums of blocks (its HelloReply's Sums).
func newSession(ctx context.Context, p *peer, s *transport.ReplStream, timeout time.Duration, sums bool) *session.Session {
	cfg := session.Config{
		Name: p.name, ID: p.sessions.Add(1), Timeout: timeout, Bitmap: p.bm, Lag: &p.lag, WriteSeq: &p.writeSeq,
		Counters: session.Counters{
			FramesSent: &p.framesSent, EntriesSent: &p.entriesSent,
			ResyncDone: &p.resyncDone, ChecksumsSkipped: &p.csumsSkipped, VerifyDone: &p.verifyDone, VerifyFound: &p.verifyFound,
		},
		FreeBuffer: func(b *[]byte) { resyncBufs.Put(b) },
		Sums:       sums,
	}
	if p.v != nil {
		cfg.Log, cfg.Clock = p.v.log, p.v.clock
		if p.v.node != nil {
			cfg.Beat = p.v.node.pairBeat(p.name)
		}
	}
	return session.New(ctx, p, s, cfg)
}

// pairBeat returns the heartbeat this node shares with peer node name.
func (n *Node) pairBeat(name string) *session.PairBeat {
	b, _ := n.beats.LoadOrStore(name, &session.PairBeat{})
	return b.(*session.PairBeat)
}

// Stream steps the volume's rules with news of one of the peer's streams
// on the volume's loop, told (tellNews): the session's loop waits for
// neither the loop nor a lock of the volume. The news of a stream other
// than the peer's current one changes nothing.
func (p *peer) Stream(e volstate.StreamEvent) {
	p.tellNews(e, func(pv *peerView) { pv.streamed(e) })
}

// Ended ends the peer's stream s: writes go to its bitmap from here, at
// once (route), and a FLUSH waits for s's end (submit); the peer's disk
// is unknown from here, on the volume's loop, unless another stream took
// the view meanwhile.
func (p *peer) Ended(s *session.Session) {
	p.route(s)
	p.tellUpdate(func(pv *peerView) {
		if pv.sid == s.ID() && pv.sess == nil {
			pv.peerDisk = dUnknown
		}
	})
}

// route takes the writes' route off stream s, which ended, at once and
// off the volume's loop: the one change of the view that is not the
// loop's (update), and that touches the route alone (sess, ending).
func (p *peer) route(s *session.Session) {
	p.swap(func(pv *peerView) {
		if pv.sess == s {
			pv.sess = nil
		}
		pv.ending = s
	})
}

// StartTracking makes the volume track the peer, durably.
func (p *peer) StartTracking() error { return p.v.startTracking(p) }

// PublishLag makes the peer's lag readable outside the session's loop.
func (p *peer) PublishLag() {
	l := &p.lag
	p.lagView.Store(&lagView{bytes: l.Bytes(), oldest: l.Oldest()})
	p.v.changed.notify()
}

// Congestion is the volume's congestion settings now.
func (p *peer) Congestion() replication.CongestionConfig { return p.v.settings().congestion }

// CatchUp resyncs what was marked while Ahead: the peer is Inconsistent,
// durably, BEFORE the first block (OpSyncStart), and UpToDate again at the
// end (the resync's OpSyncDone). It reports whether the peer caught up.
func (p *peer) CatchUp(s *session.Session) bool {
	v := p.v
	v.mu.Lock()
	from, ok := v.st.Durable.Gens.Bitmaps[p.name]
	v.mu.Unlock()
	if !ok {
		return false // nothing was marked under a generation of its own
	}
	s.Do(func() { p.Stream(volstate.PeerCatchingUp{Peer: p.name, Session: s.ID()}) })
	p.resyncTotal.Store(p.bm.Bytes())
	p.resyncDone.Store(0)
	p.resyncStart.Store(p.v.clock.Now().UnixNano())
	if !s.Enqueue(session.NewPending(replication.Entry{Op: replication.OpSyncStart, Data: from[:]})) {
		return false
	}
	v.log.Info("catching up a peer that was Behind", "peer", p.name, "bytes", p.bm.Bytes())
	if err := p.resync(s); err != nil {
		s.Fail(err)
		return false
	}
	return true
}
