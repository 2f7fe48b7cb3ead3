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
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// helloTimeout bounds the handshake of a new stream.
const helloTimeout = 5 * time.Second

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
	hello := replication.Hello{Volume: v.name, From: v.self, To: p.name, Epoch: v.d.epoch, Size: v.size.Load(), Generation: v.d.gens.Current, UUIDs: v.uuidsLocked(p.name),
		Settings: v.agreedSettings(), Wire: replication.WireVersion, HandedOver: v.handedOver.Load()}
	v.mu.Unlock()
	if err := sendJSON(stream, replication.FrameHello, hello); err != nil {
		if ref := tlsRefusal(p.name, err); ref != nil {
			return ref // the handshake failed under the open stream
		}
		return fmt.Errorf("connect to %s at %s: %w", p.name, p.addr, err)
	}
	timer := time.AfterFunc(helloTimeout, cancelHello)
	reply, err := recvHelloReply(stream)
	timer.Stop()
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
	if err := p.outdateBeforeResync(reply); err != nil {
		return err
	}

	// Decide, and switch new writes from the bitmap to the stream, in one
	// step: a write is either marked before it or queued after it.
	s := newSession(hctx, p, stream, v.cfg.PeerTimeoutOrDefault())
	v.stateMu.Lock()
	if size := v.size.Load(); size != hello.Size {
		// The volume grew during the handshake (resize.go): the peer
		// agreed to the old size. Ask again with the new one.
		v.stateMu.Unlock()
		return fmt.Errorf("%s grew to %d bytes during the handshake with %s: connecting again", v.name, size, p.name)
	}
	plan, err := p.decide(reply)
	if err != nil {
		v.stateMu.Unlock()
		return err
	}
	var done *session.Pending
	if !plan.sync && !plan.pull {
		done = p.syncDone(v.currentGeneration())
	}
	late := !plan.sync && !plan.pull && p.bm.Count() > 0
	next := peerView{sess: s, rule: plan.rule, decision: plan.outcome, peerDisk: p.snapshot().peerDisk, held: p.snapshot().held}
	switch {
	case plan.pull:
		// The peer is the source: it holds every block this node misses.
		next.state, next.peerDisk = replication.Connected, string(replication.UpToDate)
		p.pullTotal.Store(v.localMissing.Bytes())
		p.resyncStart.Store(time.Now().UnixNano())
		p.pulling.Store(true)
	case plan.sync:
		next.state, next.peerDisk = replication.SyncSource, string(replication.Inconsistent)
		// The progress counters restart before the state says SyncSource.
		p.resyncTotal.Store(p.bm.Bytes())
		p.resyncDone.Store(0)
		p.resyncStart.Store(time.Now().UnixNano())
		s.Preload(session.NewPending(replication.Entry{Op: replication.OpSyncStart, Data: plan.syncGen[:]}))
	default:
		next.state = replication.Connected
		s.Preload(done)
	}
	// Writes find the stream from here (markUnlessStreaming decides under
	// v.stateMu, held here): a write is marked before it or queued after.
	was := p.update(func(pv *peerView) { held := pv.held; *pv = next; pv.held = held }).state
	s.Start()
	v.stateMu.Unlock()
	if late {
		// A block was marked between the decision and the switch to the
		// stream: decide again, with it.
		v.log.Warn("blocks marked during the handshake; reconnecting to resync them", "peer", p.name)
		s.Cancel()
	}
	v.peerAnswered(p.name, plan.pull)
	v.log.Info("peer connected", "peer", p.name, "rule", plan.rule, "decision", plan.outcome, "out_of_sync", p.bm.Bytes(), "local_missing", v.localMissing.Bytes())
	now := p.snapshot().state
	v.node.emit(statefile.Event{Volume: v.name, Kind: "connected", Peer: p.name, Old: string(was), New: string(now), Message: fmt.Sprintf("%s connected: %s by rule=%s; %s out of sync on %s, %s on %s", p.name, plan.outcome, plan.rule, human.Bytes(p.bm.Bytes()), p.name, human.Bytes(v.localMissing.Bytes()), v.self)})

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
	err = s.Run(work)
	p.pulling.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	return err
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

// decide compares this primary's generations with the peer's
// (replication.CompareUUIDs, DRBD's table) and prepares what the
// connection does; every state change it needs is durable BEFORE it
// returns. Callers hold v.stateMu.
func (p *peer) decide(reply replication.HelloReply) (syncPlan, error) {
	v := p.v
	v.mu.Lock()
	local, gens := v.uuidsLocked(p.name), v.d.gens.Clone()
	v.mu.Unlock()
	d := replication.CompareUUIDs(local, reply.UUIDs, replication.Primary, replication.Secondary)
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
	repair, repaired := func(*durable) {}, false
	switch {
	case !reply.DiscardFrom.IsZero():
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
		plan.sync = true
	case d.Outcome == replication.UnrelatedData:
		return plan, &refusal{cause: CauseUnrelated, final: true, rule: d.Rule}
	case d.Outcome.IsSplitBrain():
		return plan, &refusal{
			cause: CauseSplitBrain, final: true, rule: d.Rule,
			text: fmt.Sprintf("%s and %s both changed the data since their last common generation (%v)", v.self, p.name, d),
			peer: replication.SplitBrainSide{Changes: changedBytes(reply), PrimarySince: reply.PrimarySince},
		}
	case d.Outcome.IsTarget():
		if reply.Disk != replication.UpToDate && reply.Disk != replication.Consistent {
			return plan, &refusal{cause: CauseNoSource, final: true, rule: d.Rule,
				text: fmt.Sprintf("%s holds newer data than this primary (%v) but its disk is %s: nothing consistent to copy", p.name, d, reply.Disk)}
		}
		return p.planPull(d, reply)
	default:
		if d.Repair != nil && !d.Repair.Bitmap.IsZero() {
			b := d.Repair.Bitmap
			repair, repaired = func(x *durable) { x.gens = x.gens.ResyncStartedAsSource(p.name, b) }, true
			gens = gens.ResyncStartedAsSource(p.name, b)
		}
		mark(reply.Changed)
		if d.Outcome == replication.FullResyncSource {
			p.bm.SetAll()
		}
		plan.sync = d.Outcome.IsSource() || p.bm.Count() > 0
		if d.Outcome == replication.NoResync && plan.sync {
			plan.outcome = replication.BitmapResyncSource.String() + " (blocks marked)"
		}
	}
	if gens.Current.IsZero() {
		// This primary holds no consistent data and the peer holds none
		// newer: there is nothing to serve or to copy.
		return plan, &refusal{cause: CauseNoSource, final: true, rule: d.Rule, text: fmt.Sprintf(
			"neither %s nor %s holds data of %s to copy (%v); make one node's data the volume's with replctl primary %s --node NODE --force --yes (a full resync to the other follows)",
			v.self, p.name, v.name, d, v.name)}
	}
	if !plan.sync {
		if repaired {
			return plan, v.commit(repair, nil)
		}
		return plan, nil
	}
	// The peer's copy will be this bitmap's generation plus the blocks
	// sent; a resync that begins without one gets a fresh one, so that an
	// interrupted resync resumes from the bitmap (the peer reports it).
	g, ok := gens.Bitmaps[p.name]
	if !ok || g.IsZero() {
		g = replication.NewGeneration()
	}
	plan.syncGen = g
	return plan, v.commit(func(x *durable) {
		repair(x)
		x.gens = x.gens.ResyncStartedAsSource(p.name, g)
	}, nil)
}

// planPull prepares this primary to copy newer data from the peer: the
// blocks it misses are marked, and it is Inconsistent, durably, BEFORE any
// block is copied (its old generation kept to resume from). Callers hold
// v.stateMu.
func (p *peer) planPull(d replication.UUIDDecision, reply replication.HelloReply) (syncPlan, error) {
	v := p.v
	plan := syncPlan{rule: d.Rule, outcome: d.Outcome.String(), pull: true, peerGen: reply.UUIDs.Current}
	// Everything this node marked for the peer is copied back from it
	// too: the peer's copy of those blocks is the one to keep (writes
	// made during a pull complete only on both nodes).
	for _, r := range bitmapRuns(p.bm) {
		v.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
	}
	if d.Outcome == replication.FullResyncTarget {
		v.localMissing.SetRange(0, v.size.Load())
	} else {
		for _, r := range reply.Changed {
			v.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
		}
	}
	err := v.commit(func(x *durable) {
		if !x.gens.Current.IsZero() {
			x.syncGen = x.gens.Current
			x.gens = x.gens.Inconsistent()
		}
		delete(x.gens.Bitmaps, p.name)
	}, func() {
		v.diskState = replication.Inconsistent
		v.why = because(CausePulling, "%s holds newer data (%v): copying %s from it", p.name, d, human.Bytes(v.localMissing.Bytes()))
	})
	if err != nil {
		return plan, err
	}
	p.bm.ClearBits(0, v.size.Load())
	return plan, nil
}

// pull copies from the peer every block this primary misses, then takes
// the peer's generation and tells the peer it is in sync. Reads of the
// missing blocks go to the peer meanwhile (DRBD 9's primary SyncTarget).
func (p *peer) pull(s *session.Session, peerGen replication.Generation) error {
	v := p.v
	began, total := time.Now(), v.localMissing.Bytes()
	v.node.peerEvent(v.name, "pull", p.name, fmt.Sprintf("%s copies %s of newer data from %s", v.self, human.Bytes(total), p.name))
	for {
		if err := v.copyMissingFromPeer(s.Context(), p.waitUnpaused); err != nil {
			return err
		}
		v.stateMu.Lock()
		if v.localMissing.Count() > 0 {
			v.stateMu.Unlock()
			continue
		}
		// The copied data is durable (copyMissingFromPeer synced) BEFORE
		// the generation says this disk holds it.
		err := v.commit(func(x *durable) {
			x.gens = x.gens.ResyncFinishedAsTarget(p.name, peerGen, x.gens.History)
			x.syncGen = replication.Generation{}
		}, func() {
			v.diskState = replication.UpToDate
			v.why = reason{}
		})
		if err != nil {
			v.stateMu.Unlock()
			return err
		}
		s.Enqueue(p.syncDone(peerGen))
		p.pulling.Store(false)
		v.stateMu.Unlock()
		v.log.Info("pulled newer data from the peer", "peer", p.name, "bytes", total, "seconds", time.Since(began).Seconds())
		v.node.peerEvent(v.name, "pull-done", p.name, fmt.Sprintf("%s copied %s from %s in %.1fs: UpToDate", v.self, human.Bytes(total), p.name, time.Since(began).Seconds()))
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
	r.Wire = replication.WireVersion
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
