package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// dUnknown is a peer's disk state while it is not connected.
const dUnknown = "DUnknown"

// peer is the primary's side of replication to one secondary. Its run
// goroutine connects (handshake.go decides what the connection does),
// runs a session per stream (package session; peersession.go is the
// peer as a session sees it), and reconnects; while no session
// runs, writes mark the peer's bitmap instead.
type peer struct {
	v    *Volume
	name string
	addr string
	// bm marks the blocks this peer misses; it lives in the volume's
	// on-disk metadata. The generation it starts from is the volume's
	// st.Durable.Gens.Bitmaps[name].
	bm *metadata.PeerBitmap
	// client is used by the run goroutine only.
	client *transport.ReplClient

	// view is the peer as the write path, status and the metrics read it
	// without a lock (view.Load: one consistent snapshot), replaced whole
	// (update) on the volume's loop. Its replication state and stream
	// (state, sid) and pulling below are published copies of the peer's
	// state in the volume's state machine (Volume.st.Peers), which only a
	// step's install writes (publishPeersLocked); the rest is the link's:
	// the stream itself (sess, which a stream's end takes off at once:
	// route), what the last handshake decided, the reason the link is
	// down, what the peer holds.
	view atomic.Pointer[peerView]
	// sessions numbers the peer's streams (the last one made).
	sessions atomic.Uint64
	// connects counts the handshakes that connected (the "connected"
	// event): run tells every loss of a stream that was up.
	connects atomic.Uint64
	// unpaused is closed while resync may run; replaced by an open channel
	// while the operator has it paused (setPaused).
	unpaused atomic.Pointer[chan struct{}]

	// pulling: this primary copies newer data from the peer (it is the
	// SyncTarget), published from the state machine's Peer.Pulling with
	// the view; pullTotal is what it missed when the copy began.
	pulling   atomic.Bool
	pullTotal atomic.Int64

	resyncTotal atomic.Int64
	resyncDone  atomic.Int64
	resyncStart atomic.Int64 // unix nanoseconds when the resync began
	// csumsSkipped counts resync bytes a checksum showed were in sync.
	csumsSkipped atomic.Int64
	resyncSent   atomic.Int64
	// takesLost: the peer's last HelloReply said it records the ranges a
	// resync holds back as unrecoverable (OpResyncLost); set by the run
	// goroutine BEFORE the session that resyncs starts.
	takesLost   atomic.Bool
	framesSent  atomic.Uint64
	entriesSent atomic.Uint64

	// lag accounts what clients were told is written but the peer does
	// not hold yet (protocols A and B); writeSeq numbers its writes. The
	// running session's loop owns lag (each session's loop in turn, which
	// hands it on at its end) and publishes lagView after each change.
	lag      replication.Lag
	lagView  atomic.Pointer[lagView]
	writeSeq atomic.Uint64
	// pendingReads counts reads sent to the peer and not answered.
	pendingReads atomic.Int64

	// mayHold is the generation the peer may hold while this primary
	// tracks it: the one it reported in the last handshake, or that of
	// the latest sync-done built for it, set BEFORE the entry can reach
	// the peer (which may commit it and never have its ack arrive: the
	// stream ends, a crash). mayHoldUnknown: no handshake since this peer
	// was made (a restart), so the peer may hold the current generation
	// (a sync-done acknowledged to a primary that crashed). Both change
	// only on the volume's loop (setMayHold checks it in the deadlock
	// build), under v.stateMu, which the write path's look at them
	// (trackLocked) holds. A write that misses the peer while it may hold the
	// current generation moves the primary on, tracked or not
	// (trackLocked): the peer must never look as up to date as the
	// primary. The current generation only ever moves to a fresh one, so
	// the latest generation the peer may have taken is the only one that
	// can be current.
	mayHold        atomic.Pointer[replication.Generation]
	mayHoldUnknown bool

	// Online verify of this peer.
	verifying   atomic.Bool
	verifyDone  atomic.Int64
	verifyTotal atomic.Int64
	verifyFound atomic.Int64
	verifyStart atomic.Int64 // unix nanoseconds when the verify began

	// The last resync (or pull) that finished.
	lastResync atomic.Pointer[lastResync]

	wg      sync.WaitGroup
	running atomic.Bool
	// resumeSeq counts the operator's connects: a refusal found by a
	// connection that began before the latest one is not final.
	resumeSeq atomic.Int64
}

// peerView is one snapshot of a peer's replication state.
type peerView struct {
	sess  *session.Session // nil while not streaming
	state replication.ReplState
	// sid numbers the stream state belongs to (session.Config.ID): the
	// news of another stream changes nothing (stream).
	sid      uint64
	peerDisk string
	why      reason
	rule     string // the generation rule of the last connection
	decision string // and what it decided
	// held is the generation the peer last acknowledged holding: when it
	// stops receiving writes, its bitmap starts from there.
	held replication.Generation
	// ending is the last stream that ended (Ended): a FLUSH that finds no
	// stream waits until it marked what the peer may hold only in its
	// cache (session.Session.Finished; submit.go).
	ending *session.Session
}

// streamed records in the view what news of one of the peer's streams
// tells beyond its replication state (which the volume's rules step): a
// peer in sync on the view's stream is UpToDate, not while Ahead (it
// misses what is marked meanwhile).
func (pv *peerView) streamed(e volstate.StreamEvent) {
	_, inSync := e.(volstate.PeerInSync)
	if _, sid := e.Stream(); inSync && sid == pv.sid && pv.state == replication.Connected {
		pv.peerDisk = string(replication.UpToDate)
	}
}

// repl is the peer's replication state as the volume's rules read it: a
// view whose stream ended (Ended: writes go to the bitmap from there on)
// streams nothing, though its state shows the loss only once the link
// stepped it (lost).
func (pv *peerView) repl() replication.ReplState {
	if pv.sess == nil && pv.state != replication.StandAlone {
		return replication.Connecting
	}
	return pv.state
}

// lastResync is the last resync (or pull) that finished.
type lastResync struct {
	bytes   int64
	seconds float64
	ended   time.Time
}

// closedChan is a closed channel: resync is not paused.
var closedChan = func() *chan struct{} { c := make(chan struct{}); close(c); return &c }()

// snapshot returns the peer's replication state now.
func (p *peer) snapshot() *peerView { return p.view.Load() }

// update replaces the peer's view by change applied to a copy, and returns
// the view it replaced. Only the volume's loop changes the view
// (node/volloop; checked in the deadlock build): code off the loop tells
// it (tellUpdate) or asks it (askUpdate). The one change made elsewhere
// is a stream's end, which takes the writes' route off the stream at once
// (Ended, route).
func (p *peer) update(change func(*peerView)) *peerView {
	if p.v != nil && p.v.loop != nil {
		p.v.loop.Check("a change of the view of peer", p.name)
	}
	return p.swap(change)
}

// tellUpdate has the volume's loop update the view (volloop.Loop.Tell),
// without waiting: news of a session's loop.
func (p *peer) tellUpdate(change func(*peerView)) {
	if p.v == nil || p.v.loop == nil {
		p.swap(change) // a peer of a test, with no volume around it
		return
	}
	p.v.loop.Tell(func() { p.update(change) })
}

// askUpdate has the volume's loop update the view (volloop.Loop.Ask) and
// returns the view it replaced: for a goroutine the loop never waits for.
func (p *peer) askUpdate(change func(*peerView)) *peerView {
	if p.v == nil || p.v.loop == nil {
		return p.swap(change)
	}
	var was *peerView
	p.v.loop.Ask(func() { was = p.update(change) })
	return was
}

// News of the peer's link and streams (volstate's LinkStarted, LinkDown
// and StreamEvents) changes the peer's state in the volume's state
// machine: it is a step like any other, taken on the volume's loop under
// v.stateMu (takeNews), told by a session's loop, which must not wait
// (tellNews), or asked by the peer's link (askNews). Such a step writes
// nothing durable and has no action; its install publishes the peer's new
// state to the view (publishPeersLocked), and view then records in it
// what the news says beyond the state (a reason, the rule that refused).

// tellNews steps e on the volume's loop (volloop.Loop.Tell), without
// waiting, then changes the view by view (nil: nothing more).
func (p *peer) tellNews(e volstate.Event, view func(*peerView)) {
	p.v.loop.Tell(func() { p.takeNews(e, view) })
}

// askNews steps e on the volume's loop (volloop.Loop.Ask), then changes
// the view by view, and returns the peer's replication state before the
// step: for a goroutine the loop never waits for.
func (p *peer) askNews(e volstate.Event, view func(*peerView)) replication.ReplState {
	var was replication.ReplState
	p.v.loop.Ask(func() {
		was = p.snapshot().state
		p.takeNews(e, view)
	})
	return was
}

// takeNews steps e, then changes the view by view. Callers are on the
// volume's loop (or it ended: nothing else changes the state any more).
func (p *peer) takeNews(e volstate.Event, view func(*peerView)) {
	v := p.v
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	if _, err := v.stepLocked(e, nil, nil); err != nil {
		// Never: news writes nothing, so no write of it fails.
		v.log.Error("the news of a peer's link", "peer", p.name, "event", fmt.Sprintf("%T", e), "err", err)
	}
	if view != nil {
		p.update(view)
	}
}

// swap is update's compare-and-swap, which keeps a change made meanwhile
// by the one other writer (route): none is lost, and none waits.
func (p *peer) swap(change func(*peerView)) *peerView {
	for {
		old := p.view.Load()
		next := *old
		change(&next)
		if p.view.CompareAndSwap(old, &next) {
			p.v.changed.notify()
			return old
		}
	}
}

func newPeer(v *Volume, name string) *peer {
	nc, _ := v.node.config().Node(name)
	bm, ok := v.durable.md.Bitmap(v.node.config().NodeID(name))
	if !ok {
		panic(fmt.Sprintf("metadata of %s has no bitmap for peer %s", v.name, name)) // openMD created one per peer
	}
	p := &peer{v: v, name: name, addr: nc.Replication, bm: bm, mayHoldUnknown: true}
	// The peer's state as the volume's state machine holds it (callers
	// hold v.mu).
	st := v.st.Peers[name]
	p.view.Store(&peerView{state: st.Repl, sid: st.Session, peerDisk: dUnknown})
	p.pulling.Store(st.Pulling)
	p.unpaused.Store(closedChan)
	p.lastResync.Store(&lastResync{})
	return p
}

// start starts the peer's link; the step that starts it (StartPeers,
// LinkStarted) made the peer Connecting.
func (p *peer) start(ctx context.Context) {
	p.update(func(pv *peerView) { pv.why = reason{} })
	p.wg.Add(1)
	p.running.Store(true)
	go func() {
		defer p.wg.Done()
		defer p.running.Store(false)
		p.run(ctx)
	}()
}

func (p *peer) wait() { p.wg.Wait() }

// session returns the running session, or nil.
func (p *peer) session() *session.Session { return p.snapshot().sess }

// run connects, streams and reconnects until ctx ends or a refusal that
// only an operator can lift (split brain, unrelated data, a newer primary).
func (p *peer) run(ctx context.Context) {
	defer func() {
		if p.client != nil {
			p.client.Close()
			p.client = nil
		}
	}()
	delay := 100 * time.Millisecond
	var lastCause Cause = "start"
	for ctx.Err() == nil {
		began := p.v.clock.Now()
		seq := p.resumeSeq.Load()
		connects := p.connects.Load()
		err := p.connect(ctx)
		if p.connects.Load() != connects {
			// This attempt connected: its loss is news, whatever the
			// cause of the one before it.
			lastCause = "connected"
		}
		if ctx.Err() != nil {
			break
		}
		var ref *refusal
		if errors.As(err, &ref) && ref.final {
			if p.resumeSeq.Load() != seq {
				continue // the operator connected meanwhile: try again
			}
			p.refused(ref)
			break
		}
		why := reason{}
		switch {
		case err == nil:
		case errors.As(err, &ref):
			why = reason{cause: ref.cause, text: err.Error()}
		case errors.Is(err, ErrPeerTimeout):
			why = reason{cause: CausePeerTimeout, text: err.Error()}
		case errors.Is(err, session.ErrPeerDiskFailed):
			why = reason{cause: CauseDiskFailed, text: err.Error()}
		case errors.Is(err, session.ErrFrameRefused):
			why = reason{cause: CauseFrameRefused, text: err.Error()}
		case errors.Is(err, errSourceUnrecoverable):
			why = reason{cause: CauseSourceUnrecoverable, text: err.Error()}
		default:
			why = reason{cause: CausePeerLost, text: err.Error()}
		}
		// connect returns once its stream ended: the stream the view shows,
		// this attempt's or an older one, is lost.
		was := p.askNews(volstate.LinkDown{Peer: p.name}, func(pv *peerView) { pv.why = why })
		if ref != nil && ref.was != "" {
			// A refusal the handshake's step made StandAlone.
			was = ref.was
		}
		// A lost peer is worth a warning once, not every retry.
		if why.cause != lastCause {
			if err != nil {
				p.v.log.Warn("replication to peer down; retrying", "peer", p.name, "cause", why.cause, "err", err)
				p.v.node.emit(statefile.Event{Volume: p.v.name, Kind: "peer-lost", Peer: p.name, Old: string(was), New: string(replication.Connecting),
					Reason: string(why.cause), Message: fmt.Sprintf("replication to %s down (%s): %v; retrying", p.name, why.cause, err)})
			}
			lastCause = why.cause
		} else if err != nil {
			p.v.log.Debug("replication to peer still down", "peer", p.name, "err", err)
		}
		if p.v.clock.Since(began) > 5*time.Second {
			delay = 100 * time.Millisecond
		}
		waitOut(ctx, p.v.clock, delay)
		delay = min(delay*2, 2*time.Second)
	}
	if ctx.Err() != nil {
		// The link is stopped: its last stream is lost for good.
		p.askNews(volstate.LinkDown{Peer: p.name, ForGood: true}, nil)
	}
}

// refused records a refusal that holds until an operator acts: the peer is
// StandAlone with the reason; an older primary stops its IO.
func (p *peer) refused(ref *refusal) {
	v := p.v
	why := reason{cause: ref.cause, text: ref.text}
	kind := "refused"
	switch ref.cause {
	case CauseUnrelated:
		kind = "unrelated-data"
		if why.text == "" {
			why.text = fmt.Sprintf("%s: not syncing either way; if %s's data should go, run replctl create-md %s --force --yes on it (a full resync follows)", replication.RuleWords(ref.rule), p.name, v.name)
		}
	case CauseFenced:
		kind = "fenced"
		v.fence(ref.peerEpoch, why.text)
	case CauseSplitBrain:
		kind = "split-brain"
		why = p.splitBrain(ref)
	}
	was := p.askNews(volstate.LinkDown{Peer: p.name, ForGood: true}, func(pv *peerView) {
		pv.why = why
		if ref.rule != "" {
			// The rule that refused is the last connection's rule
			// (sync_rule in the JSON); the words are in why.
			pv.rule = ref.rule
		}
	})
	if ref.was != "" {
		// A refusal the handshake's step made StandAlone.
		was = ref.was
	}
	level := slog.LevelError
	if ref.cause == CauseFenced {
		// An old primary meeting the new one: the expected way back,
		// nothing an operator must fix.
		level = slog.LevelWarn
	}
	v.log.Log(context.Background(), level, "refused to sync", "peer", p.name, "cause", ref.cause, "rule", ref.rule, "reason", why.text)
	v.node.emit(statefile.Event{Volume: v.name, Kind: kind, Peer: p.name, Old: string(was), New: string(replication.StandAlone), Reason: string(ref.cause),
		Message: fmt.Sprintf("%s: %s", p.name, why.text)})
}

// splitBrain handles a split brain found with this peer: neither side
// syncs unless the volume's after-sb policy names a victim, else the
// operator picks one. A primary that meets a primary of a newer epoch
// stops its IO at once.
func (p *peer) splitBrain(ref *refusal) reason {
	v := p.v
	text := fmt.Sprintf("split-brain: %s and %s both took writes as primary; resolve with replctl connect %s --discard-my-data --node VICTIM", v.self, p.name, v.name)
	if ref.rule != "" {
		text = fmt.Sprintf("split-brain: %s and %s both changed the data since they last met, and nothing says whose changes to keep; resolve with replctl connect %s --discard-my-data --node VICTIM", v.self, p.name, v.name)
	}
	if ref.peerPrimary && ref.peerEpoch > v.epoch() {
		v.fence(ref.peerEpoch, fmt.Sprintf("%s is primary at the newer epoch %d and the data diverged (split brain)", p.name, ref.peerEpoch))
	}
	victim, policy := v.splitBrainVictim(p, ref.peer)
	if victim != replication.VictimNone && (ref.peerPrimary || victim == replication.VictimPeer) {
		who := p.name
		if victim == replication.VictimMe {
			who = v.self
		}
		text = fmt.Sprintf("split-brain: policy %s makes %s discard its changes", policy, who)
	} else {
		victim = replication.VictimNone
	}
	why := reason{cause: CauseSplitBrain, text: text}
	if err := v.drive(volstate.SplitBrainFound{Peer: p.name, Rule: ref.rule}, driveOptions{texts: func(volstate.Cause) reason { return why }}); err != nil {
		// The volume closes: it discards nothing.
		return why
	}
	if victim == replication.VictimMe {
		// Only now: the discard is refused unless the machine knows of
		// the split brain, which the step above told it.
		v.bg.Add(1)
		go func() {
			defer v.bg.Done()
			v.autoDiscard(p.name, policy)
		}()
	}
	return why
}

// syncDone builds the entry that makes the peer UpToDate at gen: the peer
// adopts this node's lineage (its history, with the peer's bitmap
// generation retired into it, as it is here once the peer acks). Once the
// peer acknowledged it, SyncDoneAcked retires the bitmap generation here,
// durably, BEFORE the peer counts as UpToDate.
func (p *peer) syncDone(gen replication.Generation) *session.Pending {
	p.v.mu.Lock()
	defer p.v.mu.Unlock()
	return p.syncDoneLocked(gen)
}

// syncDoneLocked is syncDone; callers hold v.mu.
func (p *peer) syncDoneLocked(gen replication.Generation) *session.Pending {
	// From here the peer may hold gen, acknowledged or not.
	p.setMayHold(gen)
	after := p.v.st.Durable.Gens.ResyncFinishedAsSource(p.name)
	data := append([]byte(nil), gen[:]...)
	for _, h := range after.History {
		data = append(data, h[:]...)
	}
	pd := session.NewPending(replication.Entry{Op: replication.OpSyncDone, Data: data})
	pd.Kind, pd.Gen = session.EntrySyncDone, gen
	return pd
}

// setMayHold records that the peer may hold gen (mayHold): a state of
// the peer, which only the volume's loop changes.
func (p *peer) setMayHold(gen replication.Generation) {
	if p.v != nil && p.v.loop != nil {
		p.v.loop.Check("a change of the generation that may be held by peer", p.name)
	}
	p.mayHold.Store(&gen)
}

// mayHoldNow is the generation the peer may hold (mayHold); zero: none.
func (p *peer) mayHoldNow() replication.Generation {
	if g := p.mayHold.Load(); g != nil {
		return *g
	}
	return replication.Generation{}
}

// SyncDoneAcked runs once the peer acknowledged syncDone(gen) on session
// s, off s's loop (it posts to the volume's loop, which writes stable
// storage; the volume's loop never waits for s's loop: a drive that stops
// the peers waits for them off the loop). It reports whether the peer is
// now in sync: the loop then makes it Connected and UpToDate. The rules
// decide that as the step is taken (volstate.ResyncFinished): s is still
// the peer's stream, gen the current generation and nothing is marked for
// the peer; otherwise the peer is not in sync yet, and nothing is
// written. If the bitmap generation cannot be retired durably, the peer
// is not in sync either, and the session ends.
func (p *peer) SyncDoneAcked(s *session.Session, gen replication.Generation) bool {
	v := p.v
	p.askUpdate(func(pv *peerView) { pv.held = gen })
	// The volume's rules retire the peer's bitmap generation (when it
	// was tracked), durably, and forget a crash of this primary.
	err := v.drive(volstate.ResyncFinished{Peer: p.name, Session: s.ID(), Current: gen}, driveOptions{})
	switch {
	case err == nil:
		return true
	case errors.Is(err, volstate.ErrNotInSync), errors.Is(err, volloop.ErrClosed):
		return false
	}
	v.log.Error("peer in sync, but its bitmap generation cannot be retired durably; it stays out of sync", "peer", p.name, "err", err)
	s.Fail(fmt.Errorf("%w: %v", ErrStateWrite, err))
	return false
}

// announceGenerationLocked tells an in-sync peer the primary's new
// generation. It returns the entry that carries it, to wait for (nil: the
// peer is not in sync, or its stream ended). Callers hold v.mu.
func (p *peer) announceGenerationLocked(gen replication.Generation) *session.Pending {
	pv := p.snapshot()
	if s := pv.sess; s != nil && pv.state == replication.Connected {
		if pd := p.syncDoneLocked(gen); s.Enqueue(pd) {
			return pd
		}
	}
	return nil
}

// inSync reports whether the peer holds every write: connected, its disk
// UpToDate, nothing marked for it.
func (p *peer) inSync() bool {
	pv := p.snapshot()
	return pv.sess != nil && pv.state == replication.Connected && pv.peerDisk == string(replication.UpToDate) && p.bm.Count() == 0
}

// connected reports whether the stream to the peer is up and not resyncing.
func (p *peer) connected() bool {
	pv := p.snapshot()
	return pv.sess != nil && pv.state == replication.Connected
}

// read reads [off, off+len(buf)) from the peer's disk, which must be in
// sync. It serves the primary while its own disk is detached, and a
// primary that copies newer data from its peer.
func (p *peer) read(ctx context.Context, buf []byte, off int64) error {
	pv := p.snapshot()
	s := pv.sess
	if s == nil || pv.state != replication.Connected || pv.peerDisk != string(replication.UpToDate) {
		return fmt.Errorf("%s is not connected and in sync", p.name)
	}
	pd := session.NewPending(replication.Entry{Op: replication.OpRead, Off: off, Length: int64(len(buf))})
	pd.Kind, pd.ReadBuf = session.EntryRead, buf
	if !s.Enqueue(pd) {
		return fmt.Errorf("read from %s: %w", p.name, session.ErrEnded)
	}
	var gone error
	select {
	case <-pd.Done():
	case <-ctx.Done():
		gone = ctx.Err()
	case <-s.Context().Done():
		// The session's end completes pd, but only after its work (this
		// read's caller) returned: do not wait for it.
		gone = fmt.Errorf("read from %s: %w", p.name, session.ErrEnded)
	}
	if gone != nil {
		// The caller takes buf back: an answer arriving later must not
		// write into it (readReply copies on the loop, which has ended or
		// drops the buffer here).
		s.Do(func() { pd.ReadBuf = nil })
		return gone
	}
	if !pd.ReadOK() {
		return fmt.Errorf("read of %d bytes at %d from %s failed", len(buf), off, p.name)
	}
	return nil
}

func (p *peer) status() transport.PeerStatus {
	pv := p.snapshot()
	// The state as the volume's rules read it: a stream that ended is no
	// longer Connected (its writes go to the bitmap), though the link
	// steps the loss a moment later.
	repl := pv.repl()
	lagBytes, lagAge := p.lagOf(p.v.clock.Now())
	ps := transport.PeerStatus{
		Node: p.name, Replication: string(repl), PeerDisk: pv.peerDisk,
		LagBytes: lagBytes, LagSeconds: lagAge.Seconds(),
		OutOfSyncBytes: p.bm.Bytes(), SyncRule: pv.rule, SyncDecision: pv.decision,
		Reason: pv.why.text, ReasonCode: string(pv.why.cause),
		ResyncSentBytes: p.resyncSent.Load(),
		FramesSent:      p.framesSent.Load(),
		EntriesSent:     p.entriesSent.Load(),
	}
	paused := false
	select {
	case <-*p.unpaused.Load():
	default:
		paused = true
	}
	if repl == replication.SyncSource {
		ps.ResyncTotalBytes = p.resyncTotal.Load()
		ps.ResyncDoneBytes = p.resyncDone.Load()
		if secs := p.v.clock.Since(time.Unix(0, p.resyncStart.Load())).Seconds(); secs > 0 {
			ps.ResyncRate = int64(float64(ps.ResyncDoneBytes) / secs)
		}
		if paused {
			ps.Replication = string(replication.PausedSyncS)
		}
	}
	if p.pulling.Load() {
		ps.Replication = string(replication.SyncTarget)
		if paused {
			ps.Replication = string(replication.PausedSyncT)
		}
		ps.ResyncTotalBytes = p.pullTotal.Load()
		ps.ResyncDoneBytes = max(0, ps.ResyncTotalBytes-p.v.durable.localMissing.Bytes())
		if secs := p.v.clock.Since(time.Unix(0, p.resyncStart.Load())).Seconds(); secs > 0 {
			ps.ResyncRate = int64(float64(ps.ResyncDoneBytes) / secs)
		}
	}
	if p.v.tracking(p.name) && pv.sess == nil {
		ps.PeerDisk = string(replication.Outdated)
	}
	ps.VerifyDoneBytes, ps.VerifyTotalBytes, ps.VerifyFoundBytes = p.verifyDone.Load(), p.verifyTotal.Load(), p.verifyFound.Load()
	if p.verifying.Load() {
		if secs := p.v.clock.Since(time.Unix(0, p.verifyStart.Load())).Seconds(); secs > 0 {
			ps.VerifyRate = int64(float64(ps.VerifyDoneBytes) / secs)
		}
	}
	last := p.lastResync.Load()
	ps.LastResyncBytes, ps.LastResyncSeconds, ps.LastResyncEnded = last.bytes, last.seconds, last.ended
	ps.ResyncSkippedBytes = p.csumsSkipped.Load()
	if p.verifying.Load() && pv.state == replication.Connected {
		ps.Replication = string(replication.VerifyS)
	}
	return ps
}

// resyncFinished records a finished resync (or pull) of bytes that took
// seconds.
func (p *peer) resyncFinished(bytes int64, seconds float64) {
	p.lastResync.Store(&lastResync{bytes: bytes, seconds: seconds, ended: p.v.clock.Now()})
}

// setPaused pauses or resumes this peer's resync.
func (p *peer) setPaused(paused bool) {
	for {
		old := p.unpaused.Load()
		select {
		case <-*old:
			if !paused {
				return
			}
			open := make(chan struct{})
			if p.unpaused.CompareAndSwap(old, &open) {
				p.v.changed.notify()
				return
			}
		default:
			if paused {
				return
			}
			if p.unpaused.CompareAndSwap(old, closedChan) {
				close(*old) // only the swap that took it out closes it
				p.v.changed.notify()
				return
			}
		}
	}
}

// waitUnpaused returns when resync may run, or with ctx's error.
func (p *peer) waitUnpaused(ctx context.Context) error {
	select {
	case <-*p.unpaused.Load():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// restartSession ends the current stream; the reconnection decides again
// (a full resync after fullResync, the blocks verify marked).
func (p *peer) restartSession() {
	if s := p.session(); s != nil {
		s.Cancel()
	}
}

// fullResync marks the whole volume out of sync for this peer and restarts
// its stream, so that the peer is resynced from scratch (DRBD's invalidate
// of the peer). The peer is Inconsistent from the restart until resync ends.
func (p *peer) fullResync() error {
	if err := p.v.ensureOutdated(p.name); err != nil {
		return err
	}
	p.bm.SetAll()
	p.restartSession()
	return nil
}
