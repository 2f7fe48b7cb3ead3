package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport/frame"
)

// The primary's end of a stream is production's peer session
// (node/session), stepped on the sim's goroutine through a Stepper: what
// the primary sends a peer (writes, reverts, pulled blocks, flushes, a
// resync's start, data and sync-done, a new generation announced) goes
// into the session's queue as plain entries, in order; the frames it
// builds travel the link, with its delays and its breaks; the peer's
// applier takes each entry of a frame, as node's applier.Run does, and
// answers with an ack frame, which the session takes (Received). What
// the session completes (acknowledged, or handed back at its end) is
// what the sim's writes, flushes and resyncs wait for. At its end the
// session marks in the peer's bitmap (the sim's marks) what the peer did
// not acknowledge and what it acknowledged from its cache since its last
// acknowledged flush, once the sim tracked the peer, over steps of its
// own (TrackApart: raft may answer only later), as node's
// Peer.StartTracking does.

// stream is a primary's session to a peer.
type stream struct {
	id    uint64
	peer  string
	epoch uint64 // the primary's epoch when it began: its end tracks at it
	st    *session.Stepper
	clock *clock.Fake
	bm    *simBitmap
}

// shipKind says what an entry a primary shipped is, for its completion.
type shipKind uint8

const (
	// shipWrite: a client write (id).
	shipWrite shipKind = iota + 1
	// shipCopy: a block the primary's disk holds (a revert, a pulled
	// block passed on, a resync's block): nothing waits for it.
	shipCopy
	// shipFlush: a client's FLUSH (id).
	shipFlush
	// shipSyncStart: a resync's start.
	shipSyncStart
	// shipSyncDone: a resync's sync-done (sync).
	shipSyncDone
	// shipAnnounce: a new generation announced to a peer in sync.
	shipAnnounce
)

// shipped is what an entry in a session's queue stands for.
type shipped struct {
	kind    shipKind
	peer    string
	session uint64
	id      int64
	block   int
	sync    syncGens
}

// simBitmap is the peer's bitmap as its session marks it: the sim's
// marks, whose marking clears a block from a resync under way (n.mark).
type simBitmap struct {
	n    *node
	peer string
	// marked: the blocks the session marked since the sim last looked.
	marked []int
}

func (b *simBitmap) SetBits(off, length int64) {
	for blk := off / blockBytes; blk*blockBytes < off+length; blk++ {
		b.n.mark(b.peer, int(blk))
		b.marked = append(b.marked, int(blk))
	}
}

func (b *simBitmap) ClearBits(off, length int64) {
	for blk := off / blockBytes; blk*blockBytes < off+length; blk++ {
		delete(b.n.marks[b.peer], int(blk))
	}
}

func (b *simBitmap) Count() int64 { return int64(len(b.n.marks[b.peer])) }
func (b *simBitmap) Bytes() int64 { return b.Count() * blockBytes }

// Flush: the sim's marks are durable as they are made.
func (b *simBitmap) Flush() error { return nil }

// simPeer is the session's Peer: the sim's primary does what it needs
// itself (the tracking at the end, over its steps); the session's entries
// are plain, so it commits no sync-done and starts no catch-up.
type simPeer struct{}

func (simPeer) Stream(volstate.StreamEvent) {}
func (simPeer) SyncDoneAcked(*session.Session, replication.Generation) bool {
	panic("sim: a session's sync-done entry is a plain entry")
}
func (simPeer) Ended(*session.Session) {}
func (simPeer) StartTracking() error {
	panic("sim: the sim tracks a session's peer itself (TrackApart)")
}
func (simPeer) PublishLag()                              {}
func (simPeer) CatchUp(*session.Session) bool            { return false }
func (simPeer) Congestion() replication.CongestionConfig { return replication.CongestionConfig{} }

// simStream is the session's Stream: the sim moves its frames itself.
type simStream struct{}

var errNoSend = errors.New("sim: the sim moves a session's frames")

func (simStream) Send(*frame.Frame) error { return errNoSend }
func (simStream) Recv(*frame.Frame) error { return errNoSend }
func (simStream) Close()                  {}

// openStream starts p's session sid to peer, at the handshake.
func (s *Sim) openStream(p *node, peer string, sid uint64) {
	c := clock.NewFake(s.now)
	bm := &simBitmap{n: p, peer: peer}
	cfg := session.Config{Name: peer, ID: sid, Timeout: writeTimeout, Bitmap: bm, Lag: &replication.Lag{}, WriteSeq: new(atomic.Uint64),
		Counters: session.Counters{FramesSent: new(atomic.Uint64), EntriesSent: new(atomic.Uint64),
			ResyncDone: new(atomic.Int64), ChecksumsSkipped: new(atomic.Int64), VerifyDone: new(atomic.Int64), VerifyFound: new(atomic.Int64)},
		Clock: c, FreeBuffer: frame.PutBuffer}
	st := session.NewStepper(context.Background(), simPeer{}, simStream{}, cfg)
	st.TrackApart()
	p.streams[peer] = &stream{id: sid, peer: peer, epoch: p.st.Durable.Epoch, st: st, clock: c, bm: bm}
	delete(p.ending, peer)
}

// enqueue hands e to p's stream to peer as a plain entry, which sh says
// what it is, holding held until it completes, and pumps the session.
func (s *Sim) enqueue(n *node, peer string, e replication.Entry, buf *[]byte, sh shipped, held session.Hold) *session.Pending {
	str := n.streams[peer]
	pd := session.NewPending(e)
	pd.Session, pd.Held, pd.Buf = str.st.Session(), held, buf
	sh.peer, sh.session = peer, str.id
	n.shipped[pd] = sh
	if !str.st.Session().Enqueue(pd) {
		panic("sim: a session that runs refused an entry")
	}
	s.pump(n, str)
	return pd
}

// pump has the session take what was delivered to it, and sends the
// frames it built on the link.
func (s *Sim) pump(n *node, str *stream) {
	if d := s.now.Sub(str.clock.Now()); d > 0 {
		str.clock.Advance(d)
	}
	for str.st.Inbox() {
	}
	for f := str.st.Frame(); f != nil; f = str.st.Frame() {
		buf := frame.GetBuffer(f.Len())
		*buf = f.AppendContents((*buf)[:0])
		f.Release()
		s.link(n.name, str.peer).send(msg{at: s.now.Add(s.duration(tick/2, 3*tick)), from: n.name, to: str.peer, session: str.id, kind: msgFrame, data: *buf, buf: buf})
	}
}

// pumpAll moves every stream's session to now.
func (s *Sim) pumpAll() {
	for _, n := range s.dataNodes() {
		if !n.up {
			continue
		}
		for _, p := range slices.Sorted(maps.Keys(n.streams)) {
			s.pump(n, n.streams[p])
		}
	}
}

// closeStream ends n's session to peer (node's session end): cancelled,
// its last step taken. A primary that crashed drops it unfinished (the
// process is gone). Once the session ended, its end waits for the sim to
// track the peer (settleEnds) when it must.
func (s *Sim) closeStream(n *node, peer string) {
	str := n.streams[peer]
	if str == nil {
		return
	}
	delete(n.streams, peer)
	if !n.up {
		for pd, sh := range n.shipped {
			if sh.peer == peer && sh.session == str.id {
				delete(n.shipped, pd)
			}
		}
		return
	}
	str.st.Session().Cancel()
	str.st.Poll()
	n.ending[peer] = str
	s.completed(n, str.st.Completed())
}

// settleEnds tracks the peers of the sessions whose end waits for it
// (Stepper.Tracking), as node's Peer.StartTracking does: raft records the
// peer Outdated at the stream's epoch, and the generation moves on where
// the rules say (announced to the peers in sync, which a FLUSH waits for:
// cacheAnnounce). The end then marks what the peer misses, and completes
// what it left (with the tracking's error, when it failed).
func (s *Sim) settleEnds(n *node) {
	if !n.up {
		return
	}
	for _, p := range slices.Sorted(maps.Keys(n.ending)) {
		str := n.ending[p]
		if !str.st.Tracking() {
			continue
		}
		var err error
		switch {
		case s.cfg.mutation == mutCacheNotTracked:
			// The bug: the end marks without tracking the peer.
		case str.epoch != n.st.Durable.Epoch || n.st.Role() != replication.Primary:
			// node's end tracks at once, as the primary of the stream's
			// epoch; raft refuses a record from any other.
			err = errNotPrimaryThen
		default:
			err = s.ensureOutdated(n, p)
			if errors.Is(err, errWait) {
				continue
			}
			if err == nil {
				err = s.moveGeneration(n, p)
				n.cacheAnnounce = n.cacheAnnounce || len(n.announcing) > 0
			}
		}
		str.bm.marked = str.bm.marked[:0]
		str.st.Tracked(err)
		done := str.st.Completed()
		// What the peer held in its cache only may differ (invariant 4);
		// what it did not acknowledge was written here (touch).
		left := map[int]bool{}
		for _, pd := range done {
			if !pd.Acked() && session.ChangesData(pd.Entry.Op) {
				left[int(pd.Entry.Off/blockBytes)] = true
			}
		}
		var cached []int
		for _, b := range str.bm.marked {
			if !left[b] {
				s.check.allow(n.name, p, b)
				cached = append(cached, b)
			}
		}
		s.tracef("%s: end of session %d to %s tracked (%v): %d entries left, blocks %v of its cache marked", n.name, str.id, p, err, len(done), cached)
		s.completed(n, done)
	}
	if len(n.announcing) == 0 {
		n.cacheAnnounce = false
	}
}

// errNotPrimaryThen: the end of a stream found its node no longer the
// primary of the stream's epoch.
var errNotPrimaryThen = errors.New("no longer primary at the stream's epoch")

// tracking reports whether n's last session to peer ended and its end
// waits for the peer's tracking: no new stream starts before it is done
// (node's peer waits for its last session's end).
func (n *node) tracking(peer string) bool {
	str := n.ending[peer]
	return str != nil && str.st.Tracking()
}

// trackingAny reports whether any session's end waits for its tracking.
func (n *node) trackingAny() bool {
	for p := range n.ending {
		if n.tracking(p) {
			return true
		}
	}
	return false
}

// unacked counts the writes n's stream to peer holds unacknowledged.
func (n *node) unacked(peer string) int {
	k := 0
	for pd, sh := range n.shipped {
		if sh.peer == peer && session.ChangesData(pd.Entry.Op) {
			k++
		}
	}
	return k
}

// completed takes the entries n's sessions completed: acknowledged, or
// handed back at a session's end (marked for the peer, once tracked).
func (s *Sim) completed(n *node, pds []*session.Pending) {
	for _, pd := range pds {
		sh, ok := n.shipped[pd]
		if !ok {
			continue
		}
		delete(n.shipped, pd)
		p := sh.peer
		switch sh.kind {
		case shipWrite:
			for _, w := range n.writes {
				if w.id != sh.id || !w.waiting[p] {
					continue
				}
				delete(w.waiting, p)
				switch {
				case pd.Acked():
					w.acked = true
					if w.ackedBy == nil {
						w.ackedBy = map[string]bool{}
					}
					w.ackedBy[p] = true
				case pd.Err() != nil && w.peerErr == nil:
					// The end could not track the peer: the write fails.
					w.peerErr = pd.Err()
				}
			}
		case shipFlush:
			for _, f := range n.flushes {
				if f.id != sh.id {
					continue
				}
				delete(f.waiting, p)
				if !pd.Acked() && pd.Err() != nil && f.failed == nil {
					f.failed = pd.Err()
				}
			}
		case shipAnnounce:
			if pd.Acked() {
				delete(n.announcing, p)
			} else if n.announcing[p] {
				// A write that waited for the peer's taking the new
				// generation misses it.
				delete(n.announcing, p)
				for _, w := range n.writes {
					delete(w.waiting, p)
					w.missed[p] = true
				}
			}
		case shipSyncDone:
			if pd.Acked() {
				s.syncDoneAcked(n, p, sh)
			}
		}
	}
}

// syncDoneAcked: the peer holds the resync's data and the source's
// generation (node's SyncDoneAcked).
func (s *Sim) syncDoneAcked(n *node, p string, sh shipped) {
	if sh.sync.current != n.durable.Gens.Current {
		// The generation moved on since: not in sync yet; the current
		// one follows.
		n.syncDone[p] = syncDue{session: sh.session, at: s.now}
		return
	}
	// The blocks the resync copied are in (a block marked again since
	// stays marked).
	for b := range n.resyncing[p] {
		delete(n.marks[p], b)
	}
	delete(n.resyncing, p)
	_ = s.drive(n, volstate.ResyncFinished{Peer: p, Session: sh.session, Current: sh.sync.current})
}

// alHold is a write's extent in n's activity log, held by its entry in a
// peer's session until it completes (node's Pending.Held): a write that
// fails before its peer acknowledged it leaves the log only once the
// session's end marked its block for the peer, so a crash meanwhile
// leaves the block to the log's marks at the restart.
type alHold struct {
	n     *node
	block int
}

func (h alHold) Done() {
	if h.n.al[h.block]--; h.n.al[h.block] <= 0 {
		delete(h.n.al, h.block)
	}
}

// dataEntry is the entry of a write of v to block, its data in a pooled
// buffer (the session frees it: Config.FreeBuffer).
func dataEntry(op replication.Op, block int, v int64, fua bool) (replication.Entry, *[]byte) {
	buf := frame.GetBuffer(blockBytes)
	data := *buf
	clear(data)
	binary.LittleEndian.PutUint64(data, uint64(v))
	e := replication.Entry{Op: op, Off: int64(block) * blockBytes, Length: blockBytes, Data: data}
	if fua {
		e.Flags |= replication.EntryFUA
	}
	return e, buf
}

// syncEntry is a sync-start or sync-done entry, its data its own.
func syncEntry(op replication.Op, g replication.Generation, history []replication.Generation) replication.Entry {
	data := make([]byte, len(g)*(1+len(history)))
	copy(data, g[:])
	for i, h := range history {
		copy(data[len(g)*(i+1):], h[:])
	}
	return replication.Entry{Op: op, Data: data}
}

// shipCopyOf sends peer n's block holding v (a revert, a pulled block, a
// resync's block), as op.
func (s *Sim) shipCopyOf(n *node, peer string, op replication.Op, block int, v int64) {
	s.shipHeld(n, peer, op, block, v, nil)
}

// shipHeld is shipCopyOf with held released once the entry completes.
func (s *Sim) shipHeld(n *node, peer string, op replication.Op, block int, v int64, held session.Hold) {
	s.check.sent(n.sessions[peer], block, v)
	e, buf := dataEntry(op, block, v, false)
	s.enqueue(n, peer, e, buf, shipped{kind: shipCopy, block: block}, held)
}

// receiveFrame is the peer's applier taking a frame of its primary's
// stream (node's applier.Run): each entry through apply.Stream as its
// own batch, then the frame's ack.
func (s *Sim) receiveFrame(n *node, m msg) {
	defer frame.PutBuffer(m.buf)
	entries, err := replication.DecodeBatch(m.data, s.frameBuf[:0])
	s.frameBuf = entries[:0]
	if err != nil {
		panic("sim: a frame that does not decode: " + err.Error())
	}
	if len(entries) == 0 {
		return
	}
	for _, e := range entries {
		switch e.Op {
		case replication.OpSyncStart:
			// The applier makes the disk Inconsistent, durably, with the
			// generation the resync resumes from (State.SyncStarted),
			// BEFORE any resync data is written: when that fails, no
			// data moves and the stream ends.
			s.tracef("%s: sync-start from %s", n.name, m.from)
		case replication.OpWrite, replication.OpResyncData:
			// The replica indicator and the activity log BEFORE the
			// write; the write to the cache (a FUA entry through it);
			// the sum in memory; the ack: durable at the primary's next
			// FLUSH. A resync's block through the activity log too: a
			// later change of primary marks it toward the third node.
		case replication.OpFlush:
			// The applier syncs the disk, THEN writes the checksum pages,
			// BEFORE it acknowledges the flush.
		case replication.OpSyncDone:
			// The resynced data is durable BEFORE the generation says so
			// (State.SyncFinished); a generation the rules refuse fails
			// the entry, as a write that failed.
		}
		if !s.applyBatch(n, m, e) {
			return
		}
		if e.Op == replication.OpWrite || e.Op == replication.OpResyncData {
			s.check.appliedEntry(s, n, m.from, m.session, int(e.Off/blockBytes), int64(binary.LittleEndian.Uint64(e.Data)), e.Op == replication.OpResyncData)
		}
	}
	ack := replication.AppendAck(nil, replication.Ack{Seq: entries[len(entries)-1].Seq, Status: replication.AckOK})
	s.link(n.name, m.from).send(msg{at: s.now.Add(s.duration(tick/2, 3*tick)), from: n.name, to: m.from, session: m.session, kind: msgFrameAck, data: ack})
}

// receiveAck is the primary's session taking its peer's ack frame.
func (s *Sim) receiveAck(n *node, m msg) {
	str := n.streams[m.from]
	if str == nil || str.id != m.session {
		return
	}
	s.pump(n, str)
	f := &frame.Frame{}
	f.SetBytes(m.data)
	if err := str.st.Received(f); err != nil {
		s.tracef("%s: session %d to %s: %v", n.name, str.id, m.from, err)
	}
	s.completed(n, str.st.Completed())
	if str.st.Poll() {
		s.endStream(n, m.from)
		return
	}
	s.pump(n, str)
}
