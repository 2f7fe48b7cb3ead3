package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
)

// Congestion under protocols A and B (replication.Congestion decides):
// the application's writes queued for a peer and not yet acknowledged
// fill its send buffer. block holds the next write until there is room;
// disconnect drops the link (what it held is marked and resynced);
// pull-ahead (A only) stops shipping: the peer is Behind, its blocks are
// marked instead (after the generation moved on, durably, as for a peer
// that is gone), and once the link has had room for a while a catch-up
// resync of the marked blocks brings it back (the peer is Inconsistent
// during the catch-up, as a SyncTarget is).

// errCongested: the congestion policy disconnect dropped the link.
var errCongested = errors.New("the peer's send buffer is full (on_congestion: disconnect)")

// admission is what a session does with a write under congestion.
type admission int

const (
	admitSend admission = iota // queue it for the peer
	admitMark                  // the peer is Behind: mark its blocks instead
)

// admit decides, under protocol A or B, whether a write of n bytes is
// shipped or marked, waiting for room when the policy says so.
func (s *session) admit(n int64, set *settings) admission {
	for {
		s.mu.Lock()
		if s.cong == nil || s.congPolicy != set.congestion.Policy {
			s.cong, _ = replication.NewCongestion(set.congestion, time.Now())
			s.congPolicy = set.congestion.Policy
		}
		if s.ahead {
			s.mu.Unlock()
			return admitMark
		}
		_, acts := s.stepLocked(n)
		switch {
		case acts.Has(replication.StartMarking), acts.Has(replication.MarkOne):
			s.mu.Unlock()
			return admitMark
		case acts.Has(replication.WaitForRoom) && s.appBytes > 0:
			room := s.room
			s.mu.Unlock()
			select {
			case <-room:
			case <-s.ctx.Done():
				return admitSend // the dying session's end marks it
			}
			continue
		}
		s.appBytes += n
		s.mu.Unlock()
		return admitSend
	}
}

// stepLocked runs the controller with n more bytes queued and performs its
// actions; callers hold s.mu.
func (s *session) stepLocked(n int64) (replication.ReplState, replication.CongestionActions) {
	p := s.p
	st, acts := s.cong.Step(replication.CongestionInput{
		Now: time.Now(), Queued: s.appBytes + n,
		CatchUpRunning: s.catchingUp, CatchUpLeft: p.bm.Bytes(),
	})
	if acts.Has(replication.Disconnect) {
		go s.fail(fmt.Errorf("%w: %s", errCongested, p.name))
	}
	if acts.Has(replication.StartMarking) {
		s.ahead = true
		s.catchUpPaused.Store(true)
		go p.setState(s, replication.Ahead)
		p.v.log.Warn("peer congested: Ahead, marking its blocks instead of shipping them", "peer", p.name, "queued", s.appBytes+n)
	}
	if acts.Has(replication.ResumeStreaming) {
		s.ahead = false
		s.catchUpPaused.Store(false)
		if st == replication.Connected {
			go p.setState(s, replication.Connected)
		}
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

// resyncRun registers a resync run [off, off+length) read and queued, not
// yet acknowledged; its ack clears its bits through clearRun.
func (s *session) resyncRun(off, length int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[int64]int64{}
	}
	s.runs[off] = length
}

// markBehind marks e's blocks for the peer; blocks under resync runs in
// flight are remembered: those runs carry older data, and their acks must
// leave the marks. Marking and clearRun exclude each other (s.mu).
func (s *session) markBehind(e *replication.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remarkLocked(e.Off, e.Length)
	markEntry(s.p.bm, e)
}

func (s *session) remarkLocked(off, length int64) {
	for roff, rlen := range s.runs {
		lo, hi := max(off, roff), min(off+length, roff+rlen)
		for b := lo / replication.BlockSize; b*replication.BlockSize < hi; b++ {
			if s.remarked == nil {
				s.remarked = map[int64]bool{}
			}
			s.remarked[b] = true
		}
	}
}

// clearRun clears, once the peer acknowledged the run [off, off+length),
// the bits of its blocks that were not marked again while it was in
// flight; it reports the bytes cleared.
func (s *session) clearRun(off, length int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.runs, off)
	var keep []int64
	for b := off / replication.BlockSize; b*replication.BlockSize < off+length; b++ {
		if s.remarked[b] {
			keep = append(keep, b)
			delete(s.remarked, b)
		}
	}
	bm := s.p.bm
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
// peer acknowledged it, or the session ended).
func (s *session) released(n int64) {
	s.mu.Lock()
	s.appBytes -= n
	close(s.room)
	s.room = make(chan struct{})
	s.mu.Unlock()
}

// congestionTick lets time-based exits happen on an idle link.
func (s *session) congestionTick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cong != nil {
		s.stepLocked(0)
	}
}

// catchUp resyncs what was marked while Ahead: the peer is Inconsistent,
// durably, BEFORE the first block (OpSyncStart), and UpToDate again at the
// end (the resync's OpSyncDone).
func (s *session) catchUp() {
	p := s.p
	defer func() {
		s.mu.Lock()
		s.catchingUp = false
		s.mu.Unlock()
	}()
	v := p.v
	v.mu.Lock()
	from, ok := v.d.gens.Bitmaps[p.name]
	v.mu.Unlock()
	if !ok {
		return // nothing was marked under a generation of its own
	}
	p.setState(s, replication.SyncSource)
	p.mu.Lock()
	p.resyncTotal.Store(p.bm.Bytes())
	p.resyncDone.Store(0)
	p.resyncStart.Store(time.Now().UnixNano())
	p.mu.Unlock()
	if !s.enqueue(newPending(replication.Entry{Op: replication.OpSyncStart, Data: from[:]})) {
		return
	}
	v.log.Info("catching up a peer that was Behind", "peer", p.name, "bytes", p.bm.Bytes())
	if err := p.resync(s); err != nil {
		s.fail(err)
		return
	}
	p.lagMu.Lock()
	p.lag.CaughtUp()
	p.lagMu.Unlock()
}

// setState sets the peer's replication state while s is its session.
func (p *peer) setState(s *session, st replication.ReplState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == s {
		p.state = st
	}
}
