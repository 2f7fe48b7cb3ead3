package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// helloTimeout bounds the handshake of a new stream.
const helloTimeout = 5 * time.Second

// peerInconsistentRule names the decision to copy every block to a peer
// whose disk is Inconsistent while the generations say nothing is to be
// copied (volstate.FullResync): status shows it as sync_rule.
const peerInconsistentRule = "peer-inconsistent"

// syncPlan is what a primary does with a peer that just connected.
type syncPlan struct {
	// rule names the generation rule that decided and outcome what it
	// decided, for logs and status.
	rule, outcome string
	// sync: resync the blocks marked for the peer (this node is the
	// SyncSource); syncGen is the generation that bitmap starts from.
	sync    bool
	syncGen replication.Generation
	// pull: the peer holds newer data; this primary copies the blocks it
	// misses from the peer (it is the SyncTarget, and serves reads of
	// those blocks from the peer meanwhile), then takes peerGen.
	pull    bool
	peerGen replication.Generation
}

// connect runs one connection to the peer: the handshake, the decision,
// and the stream until it ends. A refusal comes back as a *refusal.
func (p *peer) connect(ctx context.Context) error {
	v := p.v
	if p.client == nil {
		c, err := transport.DialRepl(p.addr, v.node.replDialOptions(p.name, p.addr)...)
		if err != nil {
			return err
		}
		p.client = c
	}
	hctx, cancelHello := context.WithCancel(ctx)
	defer cancelHello()
	stream, err := p.client.Open(hctx)
	var unreachable *transport.StreamError
	if errors.As(err, &unreachable) && unreachable.Reach != "" {
		return unreachable.Named(p.name) // "cannot reach beta at ...: why"
	}
	if ref := tlsRefusal(p.name, err); ref != nil {
		return ref // "beta presented a certificate of another CA: ..."
	}
	if err != nil {
		return fmt.Errorf("connect to %s at %s: %w", p.name, p.addr, err)
	}
	if wrap := v.node.wrapStream; wrap != nil {
		stream = wrap(p.name, stream)
	}
	defer stream.Close()

	v.mu.Lock()
	hello := replication.Hello{Volume: v.name, From: v.self, To: p.name, Epoch: v.st.Durable.Epoch, Size: v.size.Load(), Generation: v.st.Durable.Gens.Current, UUIDs: v.uuidsLocked(p.name),
		Settings: v.agreedSettings(), Wire: replication.WireVersion, HandedOver: v.handedOver.Load()}
	v.mu.Unlock()
	if err := sendJSON(stream, replication.FrameHello, hello); err != nil {
		if ref := tlsRefusal(p.name, err); ref != nil {
			return ref // the handshake failed under the open stream
		}
		return fmt.Errorf("connect to %s at %s: %w", p.name, p.addr, err)
	}
	stopTimer := afterFunc(v.clock, helloTimeout, cancelHello)
	reply, err := recvHelloReply(stream)
	stopTimer()
	if err != nil {
		if ref := tlsRefusal(p.name, err); ref != nil {
			return ref
		}
		return fmt.Errorf("handshake with %s at %s: %w", p.name, p.addr, err)
	}
	if err := replication.CheckWireVersion(v.self, p.name, reply.Wire); err != nil {
		// A peer from before the check accepts any primary: this side
		// refuses for it, before any data moves.
		return refusalOf(replication.HelloReply{Refused: replication.RefusedWireVersion, Reason: err.Error()})
	}
	v.compareSettings(p.name, reply.Settings)
	if !reply.Accepted {
		return refusalOf(reply)
	}
	// Whether raft has the peer Outdated, as this handshake found it:
	// before its own record below, which a resync of the peer makes.
	outdated := v.raftOutdated(p.name)
	if err := p.outdateBeforeResync(reply, outdated); err != nil {
		return err
	}

	// Decide, and switch new writes from the bitmap to the stream, in one
	// step: a write is either marked before it or queued after it.
	p.takesLost.Store(reply.Lost)
	s := newSession(hctx, p, stream, v.cfg.PeerTimeoutOrDefault(), reply.Sums)
	var plan syncPlan
	var was replication.ReplState
	var late bool
	if cerr := v.loop.Call(func() { plan, was, late, err = p.takeStream(s, reply, outdated, hello.Size) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	if late {
		// A block was marked between the decision and the switch to the
		// stream: decide again, with it.
		v.log.Warn("blocks marked during the handshake; reconnecting to resync them", "peer", p.name)
		s.Cancel()
	}
	v.peerAnswered(p.name, plan.pull)
	p.connects.Add(1)
	v.log.Info("peer connected", "peer", p.name, "rule", plan.rule, "decision", plan.outcome, "out_of_sync", p.bm.Bytes(), "local_missing", v.durable.localMissing.Bytes())
	now := p.snapshot().state
	// Words for people; the rule's name is the event's reason (JSON).
	v.node.emit(statefile.Event{Volume: v.name, Kind: "connected", Peer: p.name, Old: string(was), New: string(now), Reason: plan.rule,
		Message: fmt.Sprintf("%s connected: %s; %s out of sync on %s, %s on %s", p.name, replication.ConnectWords(plan.outcome, plan.rule),
			human.Bytes(p.bm.Bytes()), p.name, human.Bytes(v.durable.localMissing.Bytes()), v.self)})

	var work func() error
	switch {
	case plan.sync:
		work = func() error {
			// The congestion controller starts no catch-up meanwhile.
			s.SetCatchingUp(true)
			defer s.SetCatchingUp(false)
			return p.resync(s)
		}
	case plan.pull:
		work = func() error { return p.pull(s, plan.peerGen) }
	}
	// A pull ends with the stream (the link's LinkDown, which follows).
	err = s.Run(work)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// takeStream decides what the connection with the peer does (decide: the
// marks, then the volume's rules), and switches new writes from the
// bitmap to the session s, in one step under v.stateMu: a write is either
// marked before it or queued after it. It runs on the volume's loop
// (volloop.Loop.Call), so the step is taken there, between the volume's
// drives. It returns the plan, the peer's state before the switch, and
// whether a block was marked between the decision and the switch.
func (p *peer) takeStream(s *session.Session, reply replication.HelloReply, outdated bool, helloSize int64) (syncPlan, replication.ReplState, bool, error) {
	v := p.v
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	if size := v.size.Load(); size != helloSize {
		// The volume grew during the handshake (resize.go): the peer
		// agreed to the old size. Ask again with the new one.
		return syncPlan{}, "", false, fmt.Errorf("%s grew to %d bytes during the handshake with %s: connecting again", v.name, size, p.name)
	}
	was := p.snapshot().state
	plan, err := p.decide(reply, outdated, s.ID())
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			ref.was = was
		}
		return plan, "", false, err
	}
	var done *session.Pending
	if !plan.sync && !plan.pull {
		done = p.syncDone(v.currentGeneration())
	}
	late := !plan.sync && !plan.pull && p.bm.Count() > 0
	// The step (decide's PeerConnected) made the peer's state, with this
	// stream's number, and published it to the view: the view takes the
	// stream and what the handshake decided.
	peerDisk := p.snapshot().peerDisk
	switch {
	case plan.pull:
		// The peer is the source: it holds every block this node misses.
		peerDisk = string(replication.UpToDate)
		p.pullTotal.Store(v.durable.localMissing.Bytes())
		p.resyncStart.Store(p.v.clock.Now().UnixNano())
	case plan.sync:
		peerDisk = string(replication.Inconsistent)
		// The progress counters restart before the state says SyncSource.
		p.resyncTotal.Store(p.bm.Bytes())
		p.resyncDone.Store(0)
		p.resyncStart.Store(p.v.clock.Now().UnixNano())
		s.Preload(session.NewPending(replication.Entry{Op: replication.OpSyncStart, Data: plan.syncGen[:]}))
	default:
		s.Preload(done)
	}
	// Writes find the stream from here (markUnlessStreaming decides under
	// v.stateMu, held here): a write is marked before it or queued after.
	p.update(func(pv *peerView) {
		*pv = peerView{sess: s, state: pv.state, sid: pv.sid, held: pv.held, rule: plan.rule, decision: plan.outcome, peerDisk: peerDisk}
	})
	s.Start()
	return plan, was, late, nil
}

// bitmapRuns lists bm's marked blocks as [first, count] runs.
func bitmapRuns(bm *metadata.PeerBitmap) [][2]int64 {
	var runs [][2]int64
	for cur := int64(0); ; {
		start, n, ok := bm.NextRun(cur, 1<<20)
		if !ok {
			return runs
		}
		runs = append(runs, [2]int64{start, n})
		cur = start + n
	}
}

// changedBytes is what the peer changed that this node does not have: the
// bytes its bitmap marks (Changes), or, from a node that does not send
// them, what its runs cover (runs coarsened for the frame cover more).
func changedBytes(reply replication.HelloReply) int64 {
	if reply.Changes > 0 {
		return reply.Changes
	}
	return runsBytes(reply.Changed)
}

func runsBytes(runs [][2]int64) int64 {
	var n int64
	for _, r := range runs {
		n += r[1] * replication.BlockSize
	}
	return n
}

// decide compares this primary's generations with the peer's and
// prepares what the connection does. It marks the blocks the connection
// moves (node's bitmaps, which the state machine does not hold), then the
// volume's rules decide (volstate.PeerConnected: DRBD's table,
// replication.CompareUUIDs): a refusal, a resync or a pull, whose state
// is durable BEFORE this returns. outdated: raft had the peer Outdated
// under this primary when the handshake began (it is never a source of
// a copy onto it). Callers hold v.stateMu.
func (p *peer) decide(reply replication.HelloReply, outdated bool, sid uint64) (syncPlan, error) {
	v := p.v
	v.mu.Lock()
	local, gens, role := v.uuidsLocked(p.name), v.st.Durable.Gens.Clone(), v.roleLocked()
	v.mu.Unlock()
	if role != replication.Primary {
		// It stepped down during the handshake; its senders stop.
		return syncPlan{}, fmt.Errorf("%s is no longer the primary of %s: not connecting %s", v.self, v.name, p.name)
	}
	d := replication.CompareUUIDs(local, reply.UUIDs, replication.Primary, replication.Secondary)
	// A peer raft has Outdated is never copied onto this primary: it
	// becomes the source of what either side marked.
	if outdated {
		d = d.TowardOutdated()
	}
	// What the peer holds now (a resync between equal generations tracks
	// it while it holds this node's current one).
	p.setMayHold(reply.UUIDs.Current)
	p.mayHoldUnknown = false
	plan := syncPlan{rule: d.Rule, outcome: d.Outcome.String()}
	mark := func(runs [][2]int64) {
		for _, r := range runs {
			p.bm.SetBits(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
		}
	}
	discard := !reply.DiscardFrom.IsZero()
	sourceOK := reply.Disk == replication.UpToDate || reply.Disk == replication.Consistent
	switch {
	case discard:
		// The peer gives up its changes since the split: resync what it
		// changed and what we changed, if we share that starting point.
		// That point is this node's bitmap generation for the peer, or,
		// when it wrote nothing since, its current one.
		from, ok := gens.Bitmaps[p.name]
		if !ok {
			from = gens.Current
		}
		if from == reply.DiscardFrom {
			mark(reply.Discard)
			plan.rule, plan.outcome = "discard-my-data", replication.BitmapResyncSource.String()
		} else {
			p.bm.SetAll()
			plan.rule, plan.outcome = "discard-my-data-unrelated", replication.FullResyncSource.String()
		}
	case d.Outcome == replication.UnrelatedData || d.Outcome.IsSplitBrain() || (d.Outcome.IsTarget() && !sourceOK) ||
		(outdated && local.Current.IsZero()) || v.pullingFrom(p.name) != nil:
		// Refused: nothing moves. (A primary with no generation of its
		// own is no source for an Outdated peer; and it pulls from one
		// peer at a time.)
	case d.Outcome.IsTarget():
		p.markPull(d, reply)
	default:
		mark(reply.Changed)
		if d.Outcome == replication.FullResyncSource {
			p.bm.SetAll()
		}
	}
	pulling := func(volstate.Cause) reason {
		return because(CausePulling, "%s holds newer data (%v): copying %s from it", p.name, d, human.Bytes(v.durable.localMissing.Bytes()))
	}
	acts, err := v.stepLocked(volstate.PeerConnected{Peer: p.name, Session: sid, UUIDs: reply.UUIDs, PeerDisk: reply.Disk,
		Marked: p.bm.Count() > 0, DiscardFrom: discard, NextGen: replication.NewGeneration(), PeerOutdated: outdated}, pulling, nil)
	if err != nil {
		return plan, err
	}
	for _, a := range acts {
		switch a.Kind {
		case volstate.RefusePeer:
			return plan, p.handshakeRefusal(a.Cause, d, reply)
		case volstate.StartPull:
			// The peer's copy of what was marked for it is the one to
			// keep: it is copied back (markPull), not sent.
			p.bm.ClearBits(0, v.size.Load())
			plan.pull, plan.peerGen = true, reply.UUIDs.Current
		case volstate.StartResync:
			// The peer's copy will be this bitmap's generation plus the
			// blocks sent.
			v.mu.Lock()
			plan.sync, plan.syncGen = true, v.st.Durable.Gens.Bitmaps[p.name]
			v.mu.Unlock()
			if a.Detail == volstate.FullResync {
				// The peer is Inconsistent and no generation says what it
				// misses: every block (before the session counts them).
				p.bm.SetAll()
				plan.rule, plan.outcome = peerInconsistentRule, replication.FullResyncSource.String()
			} else if d.Outcome == replication.NoResync && !discard {
				plan.outcome = replication.BitmapResyncSource.String() + " (blocks marked)"
			}
		}
	}
	return plan, nil
}

// handshakeRefusal puts the rules' refusal of a connection into words.
func (p *peer) handshakeRefusal(cause volstate.Cause, d replication.UUIDDecision, reply replication.HelloReply) *refusal {
	v := p.v
	ref := &refusal{cause: Cause(cause), final: cause != volstate.CausePulling, rule: d.Rule}
	switch Cause(cause) {
	case CausePulling:
		from := "another peer"
		if src := v.pullingFrom(p.name); src != nil {
			from = src.name
		}
		ref.text = fmt.Sprintf("%s copies newer data from %s and holds no generation until that ends: %s is connected again then", v.self, from, p.name)
	case CauseSplitBrain:
		ref.text = fmt.Sprintf("%s and %s both changed the data since their last common generation: %s", v.self, p.name, replication.RuleWords(d.Rule))
		ref.peer = replication.SplitBrainSide{Changes: changedBytes(reply), PrimarySince: reply.PrimarySince}
	case CauseNoSource:
		if d.Outcome.IsTarget() && reply.DiscardFrom.IsZero() {
			ref.text = fmt.Sprintf("%s holds newer data than this primary (%s) but its disk is %s: nothing consistent to copy", p.name, replication.RuleWords(d.Rule), reply.Disk)
			break
		}
		// This primary holds no consistent data and the peer holds none
		// newer: there is nothing to serve or to copy.
		ref.text = fmt.Sprintf("neither %s nor %s holds data of %s to copy; make one node's data the volume's with replctl primary %s --node NODE --force --yes (a full resync to the other follows)",
			v.self, p.name, v.name, v.name)
	}
	return ref
}

// markPull marks what this primary copies from a peer that holds newer
// data, BEFORE the rules make it Inconsistent: every block it marked for
// the peer (the peer's copy of those is the one to keep: writes made during
// a pull complete only on both nodes) and what the peer changed.
func (p *peer) markPull(d replication.UUIDDecision, reply replication.HelloReply) {
	v := p.v
	for _, r := range bitmapRuns(p.bm) {
		v.durable.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
	}
	if d.Outcome == replication.FullResyncTarget {
		v.durable.localMissing.SetRange(0, v.size.Load())
		return
	}
	for _, r := range reply.Changed {
		v.durable.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
	}
}

// pull copies from the peer every block this primary misses, then takes
// the peer's generation and tells the peer it is in sync. Reads of the
// missing blocks go to the peer meanwhile (DRBD 9's primary SyncTarget).
// The rules end the pull once nothing is missing as the step is taken
// (volstate.ResyncFinished, refused with ErrLocalMissing while a write
// marked a block after the copy passed it: the copy goes again).
func (p *peer) pull(s *session.Session, peerGen replication.Generation) error {
	v := p.v
	began, total := p.v.clock.Now(), v.durable.localMissing.Bytes()
	v.node.peerEvent(v.name, "pull", p.name, fmt.Sprintf("%s copies %s of newer data from %s", v.self, human.Bytes(total), p.name))
	for {
		if err := v.copyMissingFromPeer(s.Context(), p.waitUnpaused); err != nil {
			return err
		}
		// The copied data is durable (copyMissingFromPeer synced) BEFORE
		// the generation says this disk holds it.
		err := v.drive(volstate.ResyncFinished{Peer: p.name, AsTarget: true, Current: peerGen, OwnHistory: true}, driveOptions{
			install: func(volstate.Change) {
				// The peer's sync-done is in its stream in the same step
				// as the generation: a generation a write moves on to
				// later (trackLocked, under v.stateMu, held here) is
				// announced after it. Enqueue waits only while s's inbox
				// is full, for s's loop, which takes no lock of the volume
				// and never waits for its loop while it takes messages
				// (it takes v.stateMu only at its end, in StartTracking,
				// once its last drain took every message delivered; one
				// delivered after that is refused at once): so this
				// install never waits for the volume's loop or its locks.
				s.Enqueue(p.syncDoneLocked(peerGen))
				// The other peers in sync took every block the pull
				// copied in their streams (forwardPulled): they get the
				// generation after them, as a write's new generation is
				// announced (trackLocked). Left at the one before the
				// pull, which this node's history no longer holds, one
				// would meet it next as a split brain. A peer away is
				// tracked from it instead (Generations.PullFinishedWithout).
				for _, q := range v.peers.list {
					if q != p {
						q.announceGenerationLocked(peerGen)
					}
				}
			},
		})
		if errors.Is(err, volstate.ErrLocalMissing) {
			continue
		}
		if err != nil {
			return err
		}
		v.log.Info("pulled newer data from the peer", "peer", p.name, "bytes", total, "seconds", p.v.clock.Since(began).Seconds())
		v.node.peerEvent(v.name, "pull-done", p.name, fmt.Sprintf("%s copied %s from %s in %.1fs: UpToDate", v.self, human.Bytes(total), p.name, p.v.clock.Since(began).Seconds()))
		return nil
	}
}

func sendJSON(s *transport.ReplStream, t replication.FrameType, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f := transport.NewFrame(len(data) + 1)
	f.SetBytes(append(append(f.Bytes(), byte(t)), data...))
	return s.Send(f)
}

// sendHelloReply answers a Hello, with this node's wire version.
func sendHelloReply(s *transport.ReplStream, r replication.HelloReply) error {
	r.Wire, r.Sums, r.Lost = replication.WireVersion, true, true
	return sendJSON(s, replication.FrameHelloReply, r)
}

// recvHello receives the Hello that opens a stream.
func recvHello(s *transport.ReplStream) (replication.Hello, error) {
	return recvDecoded(s, replication.DecodeHello)
}

// recvHelloReply receives the answer to this node's Hello.
func recvHelloReply(s *transport.ReplStream) (replication.HelloReply, error) {
	return recvDecoded(s, replication.DecodeHelloReply)
}

func recvDecoded[T any](s *transport.ReplStream, decode func([]byte) (T, error)) (T, error) {
	f := &transport.Frame{}
	defer f.Release()
	if err := s.Recv(f); err != nil {
		var zero T
		return zero, err
	}
	return decode(f.Bytes())
}
