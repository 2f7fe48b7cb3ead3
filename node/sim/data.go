package sim

import (
	"errors"
	"maps"
	"slices"

	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/node/writepath"
	"github.com/replvol/replvol/replication"
)

// The data path, as node's write.go runs it: the client writes to whoever
// serves; the primary runs each write through node/writepath's machine,
// the same that orders node's writes, one stage per step or more in a
// seeded order (a crash can fall between any two): the extent enters the
// activity log; the write goes to every stream (protocol C), or a peer
// it misses is recorded Outdated in raft first and marked in the bitmap
// (node/writepath's Peer, which node's submit runs, for one peer after
// the other);
// it is written to the local disk's cache; the write waits for every
// stream's ack (the secondary's applier writes to its cache and
// acknowledges) and completes under the lease. Each stream is
// production's peer session (node/session, wire.go): the write is an
// entry in its queue, holding its extent in the activity log until it
// completes, and a session that ends hands it back, marked for the peer
// once the peer is tracked (settleEnds), with what the peer acknowledged
// from its cache since its last acknowledged flush (the session's cached
// set); a write a peer acknowledged from its cache waits for the end of
// that stream, if it ended, to have tracked the peer
// (session.CacheLossPending). Nothing is durable until a FLUSH, but a FUA
// write: it is written through, here and on every peer. A FLUSH (node's
// flushAll) syncs the local disk and sends a flush entry to every peer
// with a stream, in order after the writes, and completes once each of
// those acknowledged it, or its session ended and the end tracked the
// peer; a peer whose last session ended before the FLUSH has that end
// waited for (node's flushUnreached); a peer this primary has had no
// stream to since it became primary is tracked by the FLUSH itself
// before it completes (node's submit: trackUnstreamed), for it may hold
// an earlier primary's writes in its cache only.

var errWait = errors.New("waits for raft")

// client maybe starts one write at a node that admits it.
func (s *Sim) client() {
	if !s.chance(0.6) {
		return
	}
	var serving []*node
	for _, n := range s.dataNodes() {
		// A primary pulling newer data takes writes too, as node's does:
		// the sim's copy is one step, once the source answered every
		// write sent it (progressPulls), so a write either goes before
		// it, and the source's copy holds it, or after.
		if n.running(s.now) && volstate.Admit(n.st, s.now) == volstate.Serve && n.st.Disk != replication.Diskless {
			serving = append(serving, n)
		}
	}
	if len(serving) == 0 {
		return
	}
	n := serving[s.rng.IntN(len(serving))]
	switch r := s.rng.Float64(); {
	case r < pBadInput:
		s.badInput(n)
		return
	case r < pBadInput+pFlush:
		s.startFlush(n)
		return
	}
	fua := s.chance(pFUA)
	block := s.rng.IntN(blocks)
	for _, w := range n.writes {
		if w.block == block {
			return // a later write to a block waits for the earlier one
		}
	}
	s.nextWrite++
	w := &write{id: s.nextWrite, block: block, fua: fua, epoch: n.st.Durable.Epoch, started: s.now, waiting: map[string]bool{}, missed: map[string]bool{},
		flow: writepath.Begin('C', true)}
	// Attempted from here: it may reach a peer before the local disk.
	s.touch(n, block)
	n.writes = append(n.writes, w)
	s.progressWrites(n)
}

// ship sends w to p's stream: an entry of p's session.
func (s *Sim) ship(n *node, w *write, p string) {
	s.check.sent(n.sessions[p], w.block, w.id)
	n.al[w.block]++
	e, buf := dataEntry(replication.OpWrite, w.block, w.id, w.fua)
	pd := s.enqueue(n, p, e, buf, shipped{kind: shipWrite, id: w.id, block: w.block}, alHold{n, w.block})
	w.waiting[p], w.streamed = true, true
	w.pds = append(w.pds, pd)
}

// progressWrites completes (or fails) the node's writes that can.
func (s *Sim) progressWrites(n *node) {
	for _, w := range slices.Clone(n.writes) {
		if !n.up {
			return // it crashed between two stages of a write
		}
		switch s.progress(n, w) {
		case writeFailed:
			s.abandon(n, w)
		case writeAcknowledged:
			s.finish(n, w)
		}
	}
}

// writeState is where a write stands after progress.
type writeState uint8

const (
	writeWaits writeState = iota
	writeFailed
	writeAcknowledged
)

// abandon fails w: node gives the write up where it waits, and the
// machine runs its remaining stages with that failure (giveUp); its block
// is marked for the peers it missed (node's submit marks on an error
// too).
func (s *Sim) abandon(n *node, w *write) {
	s.giveUp(n, w)
	for _, p := range slices.Sorted(maps.Keys(w.missed)) {
		n.mark(p, w.block)
	}
	if w.streamed && !w.written && s.cfg.mutation != mutFailedWriteKept {
		s.revert(n, w)
	}
	s.finish(n, w)
}

// revert undoes, on the peers, a write that failed after it went to their
// streams and that n's disk does not hold (node's revertPeers): what n's
// disk holds in the block goes to every peer after it, in its stream, or
// marked for it, BEFORE the write is over (a later write to the block
// follows it).
func (s *Sim) revert(n *node, w *write) {
	if n.missing[w.block] {
		// A block the local disk misses holds nothing here to send: the
		// pull (under way, or the next one) brings the source's copy, the
		// one kept, and passes it on to the other peers (node's
		// revertPeers).
		n.leftToPull[w.block] = true
		s.tracef("%s: write %d failed after it went to the streams: block %d, which the disk misses, is left to the pull", n.name, w.id, w.block)
		return
	}
	v := n.disk.read(w.block)
	for _, p := range n.peers {
		if _, ok := n.sessions[p]; !ok {
			n.mark(p, w.block)
			continue
		}
		// The write is over only once its reverts completed (node's
		// revertPeers waits for them): its block stays in the activity
		// log until then, so a crash before a peer took the revert
		// leaves the block to the log's marks at the restart.
		n.al[w.block]++
		s.shipHeld(n, p, replication.OpWrite, w.block, v, alHold{n: n, block: w.block})
	}
	s.tracef("%s: write %d failed after it went to the streams: block %d reverted to %d on the peers", n.name, w.id, w.block, v)
}

// pullsFrom reports whether n pulls from a peer other than except (a
// pull under way on a stream that lasts).
func (s *Sim) pullsFrom(n *node, except string) bool {
	for peer, due := range n.pulls {
		if peer != except && n.sessions[peer] == due.session && due.session != 0 {
			return true
		}
	}
	return false
}

// cacheLoss is node's look for a stream that lost w's ack from its
// peer's cache (session.CacheLossPending over w's entries): pending while
// such a stream's end has not tracked its peer yet; an error when it
// could not.
func (s *Sim) cacheLoss(n *node, w *write) (pending bool, err error) {
	if s.cfg.mutation == mutAckBeforeCacheTracked {
		return false, nil
	}
	s.settleEnds(n)
	return session.CacheLossPending(w.pds)
}

// sourceAcked reports whether a peer n pulls newer data from took w
// (node's Wait stage counts only the pull's source while the primary
// pulls).
func (s *Sim) sourceAcked(n *node, w *write) bool {
	for p := range n.pulls {
		if w.ackedBy[p] {
			return true
		}
	}
	return false
}

// giveUp runs w's remaining stages at once, each that waits reporting a
// failure (raft not reached, the wait or the lease given up), as node's
// write does when its context ends or what it waits for fails. A local
// write is not given up: it runs.
func (s *Sim) giveUp(n *node, w *write) {
	for {
		switch w.flow.Next() {
		case writepath.Log:
			w.flow.Logged(false, false)
		case writepath.Ship:
			// The peers' parts run on, their trackings failing: what a
			// peer misses is marked (node's submit marks when its
			// tracking failed).
			if w.shipping {
				_ = s.shipAll(n, w, true)
			}
			w.shipping = true
			w.flow.Shipped(true)
		case writepath.Local:
			s.writeLocal(n, w)
		case writepath.Drain:
			w.flow.Drained()
		case writepath.Wait:
			w.flow.Waited(w.acked, s.sourceAcked(n, w), true)
		case writepath.CountLag:
			w.flow.Counted()
		case writepath.Lease:
			w.flow.Leased(false)
		case writepath.Done:
			return
		}
	}
}

// writeLocal runs w's Local stage: its data goes to n's disk (the cache,
// or through it when FUA).
func (s *Sim) writeLocal(n *node, w *write) {
	pulling := n.durable.Gens.Current.IsZero()
	if !s.diskWrite(n, w.block, w.id, w.fua) {
		// The sim's failed disk fails the write (node detaches the disk
		// when a peer is in sync; the sim does not model a primary
		// serving without its disk).
		s.tracef("%s: write %d block %d: disk error", n.name, w.id, w.block)
		w.localFailed = true
		w.flow.Wrote(false, true, pulling)
		_ = s.drive(n, volstate.DiskFailed{})
		return
	}
	// The sums once the data is on the disk; under FUA its page is
	// durable after it.
	n.sums.set(w.block, w.id)
	if w.fua {
		n.sums.flushPage(w.block / sumsPerPage)
	}
	w.written = true
	w.flow.Wrote(false, false, pulling)
}

func (s *Sim) finish(n *node, w *write) {
	if w.inLog {
		if n.al[w.block]--; n.al[w.block] <= 0 {
			delete(n.al, w.block)
		}
	}
	n.writes = slices.DeleteFunc(n.writes, func(x *write) bool { return x == w })
	// A resync that waited for this write reads its block now.
	for _, p := range slices.Sorted(maps.Keys(n.resyncLate)) {
		late := n.resyncLate[p]
		if !late.blocks[w.block] {
			continue
		}
		delete(late.blocks, w.block)
		if len(late.blocks) == 0 {
			delete(n.resyncLate, p)
		}
		if n.sessions[p] != late.session {
			continue
		}
		s.shipCopyOf(n, p, replication.OpResyncData, w.block, n.disk.read(w.block))
	}
}

// pStagePause is the chance that a write, having run a stage, runs its
// next one only at a later step: a crash, a lost link or a change of
// primary may fall between any two stages.
const pStagePause = 0.4

// progress moves w through the stages of node/writepath's machine, as far
// as it can now.
func (s *Sim) progress(n *node, w *write) writeState {
	if s.now.Sub(w.started) > writeTimeout {
		// Node gives a write up where it waits (for raft, for the
		// lease); abandon runs the rest of its stages so.
		s.tracef("%s: write %d timed out", n.name, w.id)
		return writeFailed
	}
	for {
		stage := w.flow.Next()
		switch stage {
		case writepath.Log:
			ok, full := s.alAdmit(n, w.block)
			if full {
				return writeWaits
			}
			if !ok {
				// A log that cannot be written: node detaches the disk
				// when a peer is in sync; the sim fails the write.
				s.tracef("%s: write %d block %d: activity log not written", n.name, w.id, w.block)
				w.flow.Logged(false, false)
				_ = s.drive(n, volstate.DiskFailed{})
				continue
			}
			n.al[w.block]++
			w.inLog = true
			w.flow.Logged(true, false)
		case writepath.Ship:
			if !w.shipping {
				w.shipping = true
				w.flow.Protocol(n.durable.Gens.Current.IsZero())
				w.ships = make([]writepath.Peer, len(n.peers))
				for i := range w.ships {
					w.ships[i] = writepath.BeginPeer(true)
				}
			}
			switch err := s.shipAll(n, w, false); {
			case errors.Is(err, errWait):
				return writeWaits
			case err != nil:
				s.tracef("%s: write %d fails: %v", n.name, w.id, err)
				w.flow.Shipped(true)
			default:
				w.flow.Shipped(false)
			}
		case writepath.Drain:
			if len(w.waiting) > 0 {
				return writeWaits
			}
			w.flow.Drained()
		case writepath.Local:
			s.writeLocal(n, w)
		case writepath.Wait:
			// A stream that ended left the write missing its peer: it is
			// tracked and marked before the write completes (node's
			// session end), whatever the wait.
			switch err := s.trackMissed(n, w); {
			case errors.Is(err, errWait):
				return writeWaits
			case err != nil:
				s.tracef("%s: write %d fails: %v", n.name, w.id, err)
				w.flow.Waited(w.acked, s.sourceAcked(n, w), true)
				continue
			}
			if w.flow.WaitFor() == writepath.WaitAcks && len(w.waiting) > 0 && s.cfg.mutation != mutAckWithoutPeer {
				return writeWaits
			}
			// A peer's session that ended with the write left could not
			// track the peer: the write fails (node's Pending.Err).
			if w.peerErr != nil {
				s.tracef("%s: write %d fails: %v", n.name, w.id, w.peerErr)
				w.flow.Waited(w.acked, s.sourceAcked(n, w), true)
				continue
			}
			// node's Wait stage (session.AwaitCacheLoss): a peer that
			// acknowledged the write from its cache and whose stream
			// ended since may have lost it; the write completes once the
			// end tracked the peer (settleEnds), and fails when it could
			// not.
			switch pending, err := s.cacheLoss(n, w); {
			case err != nil:
				s.tracef("%s: write %d fails: a peer that acknowledged it from its cache could not be tracked: %v", n.name, w.id, err)
				w.flow.Waited(w.acked, s.sourceAcked(n, w), true)
				continue
			case pending:
				return writeWaits
			}
			if len(n.announcing) > 0 && s.cfg.mutation != mutAnnounceNotAwaited {
				// A write completes only once the peers in sync took the
				// new generation it announced (node's Volume.track waits
				// for the sync-done entries): were the primary to crash
				// first, an in-sync peer would hold the write under the
				// old generation, which the Outdated peer holds too, and,
				// promoted, count that peer in sync and record it
				// UpToDate without the write.
				return writeWaits
			}
			w.flow.Waited(w.acked, s.sourceAcked(n, w), false)
		case writepath.CountLag:
			w.flow.Counted()
		case writepath.Lease:
			// node's last look for a stream that lost the write's ack
			// from its cache, under the lease (session.CacheLossPending):
			// the stream may have ended since the Wait stage looked.
			if s.cfg.mutation != mutCacheLossOnlyAtWait {
				switch pending, err := s.cacheLoss(n, w); {
				case err != nil:
					s.tracef("%s: write %d fails: a peer that acknowledged it from its cache could not be tracked: %v", n.name, w.id, err)
					w.flow.Leased(false)
					continue
				case pending:
					return writeWaits
				}
			}
			// The lease is checked right before the write completes.
			ok := volstate.Admit(n.st, s.now) == volstate.Serve && n.st.Durable.Epoch == w.epoch
			if !ok {
				s.tracef("%s: write %d not completed (%s)", n.name, w.id, volstate.Admit(n.st, s.now))
			}
			w.flow.Leased(ok)
		case writepath.Done:
			if o := w.flow.Outcome(); o != writepath.Completed {
				s.tracef("%s: write %d fails: %s", n.name, w.id, o)
				return writeFailed
			}
			s.check.acknowledged(s, n, w)
			return writeAcknowledged
		}
		if stage == writepath.Lease {
			// node returns the write's outcome right after its lease
			// check: the acknowledgement is that step's.
			continue
		}
		if s.chance(pCrashBetweenStages) {
			// kill -9 between two stages of a write: what the order of
			// the stages leaves on the disks and the links is all there is.
			s.tracef("%s: write %d block %d: crash after its %s stage", n.name, w.id, w.block, stage)
			s.crash(n)
			return writeWaits
		}
		if s.chance(pStagePause) {
			return writeWaits
		}
	}
}

// shipAll runs each peer's part of w's Ship stage (node/writepath's
// Peer, which node's submit runs), one peer after the other as node's
// submitAll does, each as far as it can now: errWait when raft is still
// to record a peer Outdated (the part goes on at a later step), else the
// first tracking that failed. givingUp: the write is given up where it
// waits (giveUp): a tracking still to be made fails.
func (s *Sim) shipAll(n *node, w *write, givingUp bool) error {
	for ; w.shipAt < len(n.peers); w.shipAt++ {
		switch err := s.shipTo(n, w, n.peers[w.shipAt], &w.ships[w.shipAt], givingUp); {
		case errors.Is(err, errWait):
			return err
		case err != nil && w.shipErr == nil:
			w.shipErr = err
		}
	}
	return w.shipErr
}

// shipTo runs peer p's part of w's Ship stage until it settled: the write
// goes to p's stream, or raft records p Outdated and the generation moves
// on (node's track), then the block is marked unless a stream to p
// started meanwhile (node's markUnlessStreaming: the write then goes to
// it). What the machine's order puts after the settling is left to a
// later step (node runs it on a goroutine of its own): n.later.
func (s *Sim) shipTo(n *node, w *write, p string, ship *writepath.Peer, givingUp bool) (err error) {
	for {
		switch ship.Next() {
		case writepath.Offer:
			if _, ok := n.sessions[p]; ok {
				s.ship(n, w, p)
				ship.Offered(writepath.Streamed)
			} else {
				ship.Offered(writepath.NoStream)
			}
		case writepath.Track:
			err = errGivenUp
			if !givingUp {
				err = s.ensureOutdated(n, p)
				if errors.Is(err, errWait) {
					return err
				}
				if err == nil {
					err = s.moveGeneration(n, p)
				}
			}
			ship.Tracked(err == nil)
		case writepath.Mark:
			ship.Marked(s.markFor(n, w, p, ship.MarkHow()))
		case writepath.Settle:
			ship.Settled()
			if ship.Next() != writepath.PeerDone {
				s.tracef("%s: write %d: %s's part of the ship stage settled with steps left (%s): later", n.name, w.id, p, ship.Next())
				n.later = append(n.later, laterShip{w: w, peer: p, ship: *ship})
			}
			return err
		case writepath.PeerDone:
			return err
		}
	}
}

// errGivenUp: the write was given up while it waited for raft to record
// a peer Outdated.
var errGivenUp = errors.New("given up waiting for raft")

// markFor runs a Mark step of w's ship to p: the block is marked unless a
// stream to p started (how says whether that is looked at).
func (s *Sim) markFor(n *node, w *write, p string, how writepath.MarkHow) writepath.MarkResult {
	switch how {
	case writepath.MarkUnlessStreaming:
		if _, ok := n.sessions[p]; ok {
			return writepath.MarkStreaming
		}
	case writepath.MarkByStream:
		panic("sim: no peer is Behind in the simulation")
	}
	n.mark(p, w.block)
	return writepath.MarkDone
}

// laterShip is the rest of a peer's part of a write's Ship stage, run
// after its settling: node runs it on a goroutine of its own, which a
// crash ends.
type laterShip struct {
	w    *write
	peer string
	ship writepath.Peer
}

// pLater is the chance that a step runs what was left for later
// (laterShip).
const pLater = 0.3

// runLater runs, at a seeded step, the rest of the parts of the Ship
// stage that settled with steps left. A crash loses those not yet run.
func (s *Sim) runLater(n *node) {
	left := n.later[:0]
	for _, l := range n.later {
		if !s.chance(pLater) {
			left = append(left, l)
			continue
		}
		s.tracef("%s: write %d: the rest of %s's part of the ship stage runs", n.name, l.w.id, l.peer)
		switch err := s.shipTo(n, l.w, l.peer, &l.ship, false); {
		case errors.Is(err, errWait):
			left = append(left, l)
		case err != nil:
			s.tracef("%s: write %d: the rest of %s's part: %v", n.name, l.w.id, l.peer, err)
		}
	}
	n.later = left
}

// trackMissed records, for each peer w misses because its stream ended
// (dropStream: node's session end), the peer Outdated in raft (node's
// ensureOutdated), moves the generation on where the rules say and marks
// the block in the peer's bitmap, in that order; a peer whose stream
// started meanwhile gets the write in it instead. errWait: raft is still
// to record one.
func (s *Sim) trackMissed(n *node, w *write) error {
	for _, p := range slices.Sorted(maps.Keys(w.missed)) {
		if err := s.ensureOutdated(n, p); err != nil {
			return err
		}
		if _, ok := n.sessions[p]; ok {
			// The peer connected meanwhile: the write goes to its
			// stream.
			s.ship(n, w, p)
			delete(w.missed, p)
			continue
		}
		if err := s.moveGeneration(n, p); err != nil {
			return err
		}
		n.mark(p, w.block)
		delete(w.missed, p)
	}
	return nil
}

// moveGeneration is the rest of node's Volume.track once raft recorded p
// Outdated: a peer that is not tracked, or may hold the current
// generation, moves it on (node's trackLocked), announced to the peers in
// sync. An error: the state could not move.
func (s *Sim) moveGeneration(n *node, p string) error {
	before := n.durable.Gens.Current
	mayHold := n.mayHold[p]
	if n.mayHoldUnknown[p] {
		mayHold = before
	}
	if s.cfg.mutation == mutMayHoldIgnored {
		mayHold = replication.Generation{}
	}
	if n.durable.Gens.Tracking(p) && mayHold != before {
		return nil
	}
	if err := s.drive(n, volstate.WriteMissed{Peer: p, Held: before, Next: s.newGen(), MayHold: mayHold}); err != nil {
		return err
	}
	if n.durable.Gens.Current != before {
		delete(n.mayHoldUnknown, p)
		s.announceGeneration(n, p)
	}
	return nil
}

// ensureOutdated has raft record peer Outdated at this primary's epoch,
// once per epoch.
func (s *Sim) ensureOutdated(n *node, peer string) error {
	if n.outdated[peer] == n.st.Durable.Epoch {
		return nil
	}
	return s.recordOutdated(n, peer)
}

// recordOutdated has raft record peer Outdated at n's epoch, whatever n
// remembers of an earlier record (node's recordOutdated): a handshake
// that resyncs the peer asks raft itself, so that a primary raft no
// longer knows at its epoch (fenced) resyncs nobody.
func (s *Sim) recordOutdated(n *node, peer string) error {
	epoch := n.st.Durable.Epoch
	if s.now.Before(n.outdatedRetry) {
		return errWait
	}
	n.outdatedRetry = s.now.Add(4 * tick)
	_, err := s.raft.apply(s, n, replication.MarkOutdatedCommand(volume, epoch, peer))
	switch {
	case err == nil:
		n.outdated[peer] = epoch
		return nil
	case errors.Is(err, replication.ErrStaleEpoch), errors.Is(err, replication.ErrNotPrimary):
		if n.st.Serving == volstate.OpenWithoutLease {
			return errWait // raft records the forced primary first (reclaim)
		}
		return err
	}
	return errWait
}

// failWrites answers every write in flight with an error.
func (s *Sim) failWrites(n *node, why string) {
	for _, w := range slices.Clone(n.writes) {
		s.tracef("%s: write %d failed (%s)", n.name, w.id, why)
		s.abandon(n, w)
	}
	for _, f := range n.flushes {
		s.tracef("%s: flush %d failed (%s)", n.name, f.id, why)
	}
	n.flushes = nil
}

// deliver hands every due message to its running receiver.
func (s *Sim) deliver() {
	for _, n := range s.nodes {
		if !n.running(s.now) || n.witness {
			continue
		}
		for _, m := range s.nodes {
			if m == n {
				continue
			}
			due := s.link(m.name, n.name).due(n.name, s.now)
			if s.cfg.mutation == mutApplyReordered {
				slices.Reverse(due)
			}
			for _, x := range due {
				s.receive(n, x)
			}
		}
	}
}

// receive hands n a message of its link: a frame of its primary's
// stream to its applier, or an ack frame of its peer to the session of
// its stream. A message of a stream that ended is dropped.
func (s *Sim) receive(n *node, m msg) {
	switch m.kind {
	case msgFrame:
		if n.incoming.from != m.from || n.incoming.id != m.session {
			return
		}
		s.receiveFrame(n, m)
	case msgFrameAck:
		s.receiveAck(n, m)
	}
}

// announceGeneration: the peers in sync (but missed) get the primary's
// new generation in their stream (node's announceGeneration: a sync-done
// entry, in order after the writes they hold).
func (s *Sim) announceGeneration(n *node, missed string) {
	for _, p := range n.peers {
		if sid, ok := n.sessions[p]; ok && p != missed && n.st.Peers[p].Repl == replication.Connected {
			n.announcing[p] = true
			n.mayHold[p] = n.durable.Gens.Current
			s.enqueue(n, p, syncEntry(replication.OpSyncDone, n.durable.Gens.Current, n.durable.Gens.History), nil, shipped{kind: shipAnnounce, session: sid}, nil)
		}
	}
}

// startResync sends peer the blocks marked on either side, then the
// source's generations.
func (s *Sim) startResync(n *node, peer string) {
	sid := n.sessions[peer]
	q := s.node(peer)
	copied := map[int]int64{}
	if s.cfg.mutation != mutSkipResyncCopy {
		for b := range n.marks[peer] {
			copied[b] = n.disk.read(b)
		}
		for b := range q.marks[n.name] {
			copied[b] = n.disk.read(b)
		}
	}
	n.resyncing[peer] = map[int]bool{}
	for b := range copied {
		n.resyncing[peer][b] = true
	}
	if s.cfg.mutation == mutSkipResyncCopy {
		// The bug: the marked blocks count as copied.
		for b := range n.marks[peer] {
			n.resyncing[peer][b] = true
		}
	}
	s.tracef("%s: resync %s: %d blocks", n.name, peer, len(copied))
	s.check.copied(s, n.name, peer, slices.Sorted(maps.Keys(copied)), "resync")
	s.enqueue(n, peer, syncEntry(replication.OpSyncStart, n.durable.Gens.Bitmaps[peer], nil), nil, shipped{kind: shipSyncStart}, nil)
	// A block a write in flight holds is read once that write is over
	// (node's resync reads under the range lock the write holds from its
	// admission to its end): it follows when the write finishes.
	late := map[int]bool{}
	for _, w := range n.writes {
		if _, ok := copied[w.block]; ok {
			late[w.block] = true
			delete(copied, w.block)
		}
	}
	if len(late) > 0 {
		n.resyncLate[peer] = resyncLate{session: sid, blocks: late}
	}
	for _, b := range slices.Sorted(maps.Keys(copied)) {
		s.shipCopyOf(n, peer, replication.OpResyncData, b, copied[b])
	}
	// The sync-done entry, with the generation the source holds then,
	// follows the blocks (node enqueues it once the last block is sent).
	n.syncDone[peer] = syncDue{session: sid, at: s.now.Add(2 * tick)}
}

// sendSyncDone sends the sync-done entries that are due.
func (s *Sim) sendSyncDone(n *node) {
	for _, p := range slices.Sorted(maps.Keys(n.syncDone)) {
		due := n.syncDone[p]
		if late, ok := n.resyncLate[p]; ok && late.session == due.session && n.sessions[p] == due.session {
			continue // the blocks writes held go first
		}
		if s.now.Before(due.at) {
			continue
		}
		if n.durable.Gens.Current.IsZero() {
			// node's resync hands over a generation once it holds one:
			// a primary that pulls from another peer, after its pull.
			continue
		}
		delete(n.syncDone, p)
		if n.sessions[p] == due.session {
			// The peer may hold it from here, acknowledged or not
			// (node's peer.syncDone).
			n.mayHold[p] = n.durable.Gens.Current
			s.enqueue(n, p, syncEntry(replication.OpSyncDone, n.durable.Gens.Current, n.durable.Gens.History), nil,
				shipped{kind: shipSyncDone, sync: syncGens{current: n.durable.Gens.Current, history: slices.Clone(n.durable.Gens.History)}}, nil)
		}
	}
}

// startPull begins a pull of newer data from peer on its stream: the
// writes in flight are answered first, and the copy ends a little later
// (progressPulls), unless the stream ends or the node crashes before:
// the pull then starts again at the next connection, from what the
// node's durable state recorded.
func (s *Sim) startPull(n *node, peer string) {
	due := n.pulls[peer]
	due.session, due.at = n.sessions[peer], s.now.Add(s.duration(tick, 6*tick))
	n.pulls[peer] = due
	// The pull is planned first: a write failed here leaves a block it
	// copies to it (revert).
	s.failWrites(n, "pull")
	s.tracef("%s: pull from %s (full %t) until %v", n.name, peer, due.full, due.at.Sub(s.start))
}

// progressPulls completes the pulls that are due, and forgets those
// whose stream ended.
func (s *Sim) progressPulls(n *node) {
	for _, p := range slices.Sorted(maps.Keys(n.pulls)) {
		due := n.pulls[p]
		switch {
		case n.sessions[p] != due.session:
			delete(n.pulls, p)
			s.tracef("%s: pull from %s cut off", n.name, p)
		case due.at.IsZero():
			// Planned at the handshake, not started.
		case n.unacked(p) > 0:
			// The source answers the pull's reads after every write sent
			// it before (node's stream serves them in order).
		case !s.now.Before(due.at):
			delete(n.pulls, p)
			s.pull(n, p)
		case s.pullRng.Float64() < pPullRun:
			s.pullRuns(n, p)
		}
	}
}

// pPullRun is the chance that a pull under way copies some of its runs
// at a step before its end (drawn from pullRng): node's copy goes run
// after run while the stream lasts, and a pull cut off leaves the disk
// with part of the source's data, the rest still missing.
const pPullRun = 0.3

// pullRuns copies the first of the blocks n's disk misses from the
// source, in order (node's copyMissingFromPeer, from the start of the
// map), up to a seeded number, and stops before a block a write in flight
// holds (node's copy takes the run's range lock). Nothing is synced yet:
// the blocks stay in the hot window until the pull's end syncs them.
func (s *Sim) pullRuns(n *node, peer string) {
	var run []int
	limit := 1 + s.pullRng.IntN(blocks)
	for _, b := range slices.Sorted(maps.Keys(n.missing)) {
		if len(run) == limit || slices.ContainsFunc(n.writes, func(w *write) bool { return w.block == b }) {
			break
		}
		run = append(run, b)
	}
	if len(run) == 0 {
		return
	}
	s.copyPulled(n, s.node(peer), run)
	for _, b := range run {
		s.sumAdmit(n, b)
	}
	s.tracef("%s: pull from %s copied blocks %v, %d still missing", n.name, peer, run, len(n.missing))
}

// copyPulled copies blocks from q's disk into n's, which misses them (a
// pull), and passes on what changed.
func (s *Sim) copyPulled(n, q *node, planned []int) {
	s.check.copied(s, q.name, n.name, planned, "pull")
	for _, b := range planned {
		v := q.disk.read(b)
		changed := v != n.disk.read(b)
		if changed {
			s.touch(n, b)
			n.disk.cache[b] = v
		}
		// node's copy stores the sum of each block it writes, outside
		// the activity log, and makes both durable at its end.
		n.sums.set(b, v)
		delete(n.missing, b)
		left := n.leftToPull[b]
		delete(n.leftToPull, b)
		if !changed && !left {
			continue
		}
		// What changes here goes to the other peers too, and a block
		// whose failed write was left to the pull (it may be on them):
		// in their streams, or marked (node's forwardPulled).
		for _, p := range n.peers {
			if p == q.name || s.cfg.mutation == mutPullNotForwarded {
				continue
			}
			if _, ok := n.sessions[p]; ok {
				s.shipCopyOf(n, p, replication.OpWrite, b, v)
			} else {
				n.mark(p, b)
			}
		}
	}
}

// markPull marks the blocks a pull from q copies into primary n, as
// node's decide does BEFORE the rules take the connection: every block
// for a full resync as target, else those marked on either side (what n
// marked for q: q's copy is the one to keep). What an earlier pull left
// stays marked, and this pull copies it too (FindingPullCopiesLeftovers).
func (s *Sim) markPull(n, q *node, full bool) {
	var left []int
	for _, b := range slices.Sorted(maps.Keys(n.missing)) {
		if !full && !n.marks[q.name][b] && !q.marks[n.name][b] {
			left = append(left, b)
		}
	}
	s.check.pullLeftovers(s, q, n, left)
	for b := range blocks {
		if full || n.marks[q.name][b] || q.marks[n.name][b] {
			n.missing[b] = true
		}
	}
	s.tracef("%s: its disk misses %d blocks, to pull from %s (%d of them left by an earlier pull)", n.name, len(n.missing), q.name, len(left))
}

// pull copies to this primary every block its disk misses (node's
// copyMissingFromPeer: the plan markPull marked, and what a pull cut off
// left) and takes the peer's generation.
func (s *Sim) pull(n *node, peer string) {
	q := s.node(peer)
	planned := slices.Sorted(maps.Keys(n.missing))
	s.copyPulled(n, q, planned)
	if !s.syncWithSums(n) {
		// node's copy fails then, and a crash before it synced leaves
		// what it copied to be copied again; the sim's pull goes on, so
		// its blocks stay in the hot window, whose sums a crash
		// computes again.
		for _, b := range planned {
			s.sumAdmit(n, b)
		}
	}
	clear(n.marks[peer])
	clear(q.marks[n.name])
	s.tracef("%s: pulled %d blocks from %s", n.name, len(planned), peer)
	s.stepNode(n, volstate.ResyncFinished{Peer: peer, AsTarget: true, Current: q.durable.Gens.Current, OwnHistory: true})
	// The other peers in sync, which took what it copied in their
	// streams, get the generation after it (node's pull announces it).
	if !n.durable.Gens.Current.IsZero() {
		s.announceGeneration(n, peer)
	}
	// The source gets the sync-done of the generation the pull took, in
	// the stream it copied from (node's pull enqueues it as that
	// generation is installed): it retires its bitmap generation toward
	// this node and what it marked toward it (its SyncFinished). Sent once
	// this node holds a generation (sendSyncDone), on this stream only.
	n.syncDone[peer] = syncDue{session: n.sessions[peer], at: s.now}
}
