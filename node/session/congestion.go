package session

import (
	"errors"
	"fmt"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Congestion under protocols A and B (replication.Congestion decides):
// the application's writes queued for a peer and not yet acknowledged
// fill its send buffer. block holds the next write until there is room;
// disconnect drops the link (what it held is marked and resynced);
// pull-ahead (A only) stops shipping once the fill has stayed high for a
// while (a shorter burst holds a write while the buffer is full, as block
// does): the peer is Behind, its blocks are marked instead (after the
// generation moved on, durably, as for a peer that is gone), and once the
// link has had room for a while a catch-up resync of the marked blocks
// brings it back (the peer is Inconsistent during the catch-up, as a
// SyncTarget is).

// errCongested: the congestion policy disconnect dropped the link.
var errCongested = errors.New("the peer's send buffer is full (on_congestion: disconnect)")

// Admission is what a session does with a write under congestion.
type Admission int

const (
	AdmitSend  Admission = iota // queued for the peer
	AdmitMark                   // the peer is Behind: mark its blocks instead
	AdmitEnded                  // the session ended: the write was not taken
)

// admit decides, on the loop, whether an application write under protocol
// A or B is shipped or marked; while the policy says to wait for room it
// holds the write until an ack frees some (released).
func (s *Session) admit(sub submission) {
	set := s.peer.Congestion()
	if s.cong == nil || s.congPolicy != set.Policy {
		s.cong, _ = replication.NewCongestion(set, s.cfg.Clock.Now())
		s.congPolicy = set.Policy
	}
	if s.ahead {
		sub.answer <- AdmitMark
		return
	}
	n := sub.pd.Wire
	_, acts := s.step(n)
	switch {
	case acts.Has(replication.StartMarking), acts.Has(replication.MarkOne):
		sub.answer <- AdmitMark
		return
	case acts.Has(replication.WaitForRoom) && s.appBytes > 0:
		s.waiting = append(s.waiting, sub)
		return
	}
	s.appBytes += n
	s.publish()
	sub.pd.LagSeq = s.cfg.WriteSeq.Add(1)
	s.accept(sub.pd)
	sub.answer <- AdmitSend
}

// step runs the controller with n more bytes queued and performs its
// actions, in order, on the loop: the peer's state changes here.
func (s *Session) step(n int64) (replication.ReplState, replication.CongestionActions) {
	st, acts := s.cong.Step(replication.CongestionInput{
		Now: s.cfg.Clock.Now(), Queued: s.appBytes + n,
		CatchUpRunning: s.catchingUp, CatchUpLeft: s.bm.Bytes(),
	})
	if acts.Has(replication.Disconnect) {
		s.Fail(fmt.Errorf("%w: %s", errCongested, s.name))
	}
	if acts.Has(replication.StartMarking) {
		s.ahead = true
		s.publish()
		s.catchUpPaused.Store(true)
		s.peer.Stream(volstate.PeerCongested{Peer: s.name, Session: s.cfg.ID})
		s.cfg.Log.Warn("peer congested: Ahead, marking its blocks instead of shipping them", "peer", s.name, "queued", s.appBytes+n)
		s.readmit() // the writes held while the burst lasted are marked now
	}
	if acts.Has(replication.ResumeStreaming) {
		s.ahead = false
		s.publish()
		s.catchUpPaused.Store(false)
		// Back to the resync Ahead paused, or to the catch-up starting
		// now (replication.SyncSource), else Connected.
		s.peer.Stream(volstate.PeerDrained{Peer: s.name, Session: s.cfg.ID, Resyncing: st == replication.SyncSource || s.catchingUp})
	}
	if acts.Has(replication.StartCatchUp) && !s.catchingUp {
		s.catchingUp = true
		s.extra.Add(1)
		go func() {
			defer s.extra.Done()
			s.catchUp()
		}()
	}
	return st, acts
}

// publish makes the congestion state readable outside the loop.
func (s *Session) publish() {
	s.pubAppBytes.Store(s.appBytes)
	s.pubAhead.Store(s.ahead)
}

// clearRun clears, once the peer acknowledged the run [off, off+length),
// the bits of its blocks that were not marked again while it was in
// flight; it reports the bytes cleared. It runs on the loop.
func (s *Session) clearRun(off, length int64) int64 {
	delete(s.runs, off)
	var keep []int64
	for b := off / replication.BlockSize; b*replication.BlockSize < off+length; b++ {
		if s.remarked[b] {
			keep = append(keep, b)
			delete(s.remarked, b)
		}
	}
	bm := s.bm
	if len(keep) == 0 {
		bm.ClearBits(off, length)
		return length
	}
	cleared, from := int64(0), off
	for _, b := range append(keep, (off+length+replication.BlockSize-1)/replication.BlockSize) {
		to := min(b*replication.BlockSize, off+length)
		if to > from {
			bm.ClearBits(from, to-from)
			cleared += to - from
		}
		from = (b + 1) * replication.BlockSize
	}
	return cleared
}

// released: n bytes of an application write left the send buffer (the
// peer acknowledged it, or the session ended); the writes held for room
// are admitted again, in order, until one is held again.
func (s *Session) released(n int64) {
	s.appBytes -= n
	s.publish()
	s.readmit()
}

// readmit admits the writes held for room again, in order, until one is
// held again.
func (s *Session) readmit() {
	waiting := s.waiting
	s.waiting = nil
	for i, w := range waiting {
		s.admit(w)
		if len(s.waiting) > 0 {
			s.waiting = append(s.waiting, waiting[i+1:]...)
			return
		}
	}
}

// congestionTick lets time-based exits happen on an idle link.
func (s *Session) congestionTick() {
	if s.cong != nil {
		s.step(0)
	}
}

// Queued is the bytes of application writes queued for the peer and not
// yet acknowledged by it: the send buffer's fill.
func (s *Session) Queued() int64 { return s.pubAppBytes.Load() }

// Congested reports whether the session's send buffer is past its high
// water mark (reads then stay away from the peer when-congested-remote).
func (s *Session) Congested() bool {
	return s.pubAhead.Load() || s.pubAppBytes.Load() > s.peer.Congestion().SendBuffer/2
}

// CatchUpPaused reports whether a catch-up resync should wait: the peer
// is Behind again.
func (s *Session) CatchUpPaused() bool { return s.catchUpPaused.Load() }

// SetCatchingUp tells the loop whether a resync of the peer runs: the
// congestion controller starts no catch-up meanwhile.
func (s *Session) SetCatchingUp(running bool) {
	s.Do(func() { s.catchingUp = running })
}

// catchUp resyncs what was marked while Ahead (Peer.CatchUp), then
// counts the peer caught up in its lag.
func (s *Session) catchUp() {
	defer s.SetCatchingUp(false)
	if !s.peer.CatchUp(s) {
		return
	}
	s.Do(func() {
		s.lag.CaughtUp()
		s.publishLag()
	})
}
