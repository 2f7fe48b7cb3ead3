package session

import (
	"time"

	"github.com/replvol/replvol/replication"
)

// The writers' side of a session: what a writer calls to hand an entry to
// the loop and wait for it to be taken (Enqueue, Submit, MarkBehind,
// CompletedLocally), and the loop's side of a writer's messages: the
// blocks a Behind peer misses, and the completion a write sends at its
// end.

// Enqueue hands pd to the loop. It reports false when the session has
// ended: pd was not taken. It does not wait for the loop to take pd: pd
// is taken in the order it was handed over (deliver).
func (s *Session) Enqueue(pd *Pending) bool {
	return s.deliver(inMsg{kind: inSubmit, pd: pd})
}

// Submit hands an application write under protocol A or B to the loop,
// which asks the congestion controller: AdmitSend (queued), AdmitMark (the
// peer is Behind: mark its blocks) or AdmitEnded (pd was not taken). It
// waits while the policy holds the write for room.
func (s *Session) Submit(pd *Pending) Admission {
	answer := s.submit(pd)
	if answer == nil {
		return AdmitEnded
	}
	return <-answer
}

// submit is Submit without its wait: it hands pd to the loop and returns
// where the loop's answer comes, or nil when the session has ended (pd
// was not taken). A test that drives the loop's step on its own goroutine
// takes the answer once a step gave it.
func (s *Session) submit(pd *Pending) <-chan Admission {
	answer := make(chan Admission, 1)
	if !s.deliver(inMsg{kind: inSubmit, admit: true, pd: pd, answer: answer}) {
		return nil
	}
	return answer
}

// MarkBehind has the loop mark e's blocks for its Behind peer
// (markedBehind) and returns once they are marked; false: the session
// ended, nothing was marked.
func (s *Session) MarkBehind(e *replication.Entry) bool {
	ran := make(chan struct{})
	if !s.deliver(inMsg{kind: inBehind, e: e, ran: ran}) {
		return false
	}
	<-ran
	return true
}

// CompletedLocally tells the loop that the write it numbered seq
// (Pending.LagSeq), of bytes, was acknowledged to its client at, under
// protocol A or B, while the peer may not hold it yet: the peer's lag
// counts it from now. It returns once the loop counted it, or at once
// when the session ended (its end marked the write's blocks).
func (s *Session) CompletedLocally(seq uint64, bytes int64, at time.Time) {
	ran := make(chan struct{})
	if s.deliver(inMsg{kind: inCompletion, seq: seq, bytes: bytes, at: at, ran: ran}) {
		<-ran
	}
}

// What a writer tells the loop, as messages; ran is closed once the loop
// has taken the news in, so the writer sees it counted when it goes on.

// behindMark: the Behind peer misses e (Session.MarkBehind).
type behindMark struct {
	e   *replication.Entry
	ran chan struct{}
}

// localCompletion: the write the loop numbered seq (LagSeq), of bytes, was
// acknowledged to its client at, under protocol A or B, while the peer may
// not hold it yet (Session.CompletedLocally).
type localCompletion struct {
	seq   uint64
	bytes int64
	at    time.Time
	ran   chan struct{}
}

// markedBehind marks the blocks of m.e for the peer; blocks under resync
// runs in flight are remembered: those runs carry older data, and their
// acks must leave the marks. It runs on the loop, so marking and clearRun
// exclude each other.
func (s *Session) markedBehind(m behindMark) {
	s.remark(m.e.Off, m.e.Length)
	before := s.bm.Count()
	markEntry(s.bm, m.e)
	// The lag counts blocks newly marked, not a block twice.
	if n := (s.bm.Count() - before) * replication.BlockSize; n > 0 {
		s.lag.Marked(n, s.cfg.Clock.Now())
		s.publishLag()
	}
	close(m.ran)
}

// completedLocally counts, on the loop, a write its client has in the
// peer's lag.
func (s *Session) completedLocally(c localCompletion) {
	s.lag.Completed(c.seq, c.bytes, c.at)
	s.publishLag()
	close(c.ran)
}

func (s *Session) remark(off, length int64) {
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

// ChangesData reports whether an entry of op changes blocks.
func ChangesData(op replication.Op) bool {
	switch op {
	case replication.OpWrite, replication.OpZero, replication.OpTrim:
		return true
	}
	return false
}

func markEntry(bm Bitmap, e *replication.Entry) {
	if ChangesData(e.Op) {
		bm.SetBits(e.Off, e.Length)
	}
}
