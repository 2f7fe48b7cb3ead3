package node

import (
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// The write-facing side of a peer: what a writer (Volume.replicate,
// through submitAll) calls to hand an entry to the peer's session, or to
// mark it for the peer when it is not streaming or is Behind. Everything
// here either sends to the session's loop and waits for it (enqueue,
// submit, do) or, without a stream, marks the peer's bitmap.

// submitAll hands e to every peer under protocol proto: the pendings to
// wait for, and the first error of a peer whose missing of e could not be
// tracked durably. Each pending holds held (when not nil) until it
// completes.
func (v *Volume) submitAll(e replication.Entry, proto byte, held *countdown) ([]*pending, error) {
	var waits []*pending
	var first error
	for _, p := range v.streamingPeers() {
		w, err := p.submit(e, proto, held)
		if w != nil {
			waits = append(waits, w)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return waits, first
}

// submit hands one write-type entry (or a flush) to the peer. It returns a
// pending to wait for when the entry went into the stream, or nil when the
// peer is not streaming: the blocks are then marked in its bitmap, after
// the volume durably started tracking the peer. err says that tracking
// could not be made durable: the write must not complete.
func (p *peer) submit(e replication.Entry, proto byte, held *countdown) (*pending, error) {
	for {
		if s := p.session(); s != nil {
			pd := newPending(e)
			pd.sess = s
			congestion := proto != 'C' && changesData(e.Op)
			if congestion {
				// The send buffer holds what crosses the link: a TRIM or
				// WRITE_ZEROES of any range costs only its header.
				pd.wire = int64(e.EncodedLen())
			}
			if changesData(e.Op) && proto == 'B' {
				pd.received = make(chan struct{})
			}
			if held != nil {
				held.add()
				pd.held = held
			}
			var got admission
			if congestion {
				got = s.submit(pd)
			} else {
				if changesData(e.Op) {
					pd.lagSeq = p.writeSeq.Add(1)
				}
				got = admitEnded
				if s.enqueue(pd) {
					got = admitSend
				}
			}
			if got == admitSend {
				return pd, nil
			}
			if held != nil {
				held.done()
			}
			if got == admitMark {
				return nil, p.markBehind(&e)
			}
			continue // it just ended: its end marks what it held
		}
		if !changesData(e.Op) {
			// A flush the peer misses changes no block of it: nothing to
			// mark, and no reason to leave the generation it shares.
			return nil, nil
		}
		if err := p.v.startTracking(p); err != nil {
			markEntry(p.bm, &e)
			return nil, err
		}
		if p.v.markUnlessStreaming(p, &e) {
			return nil, nil
		}
		// a session started meanwhile: the entry goes to it
	}
}

// markUnlessStreaming marks e for p unless a stream to p started: the
// handshake switches writes to the stream under v.stateMu, so each write
// is marked before the switch or queued after it. It reports whether e
// was marked.
func (v *Volume) markUnlessStreaming(p *peer, e *replication.Entry) bool {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	if p.session() != nil {
		return false
	}
	markEntry(p.bm, e)
	return true
}

// markBehind marks e for a peer that is Behind (pull-ahead), after the
// volume durably started tracking it, as for a peer that is gone.
func (p *peer) markBehind(e *replication.Entry) error {
	err := p.v.track(p, true)
	if s := p.session(); s == nil || !s.markBehind(e) {
		// The stream ended meanwhile: its end marked what it held; the
		// lag of this write is not counted.
		markEntry(p.bm, e)
	}
	return err
}

// enqueue hands pd to the loop. It reports false when the session has
// ended: pd was not taken.
func (s *session) enqueue(pd *pending) bool {
	select {
	case s.submits <- submission{pd: pd}:
		return true
	case <-s.ended:
		return false
	}
}

// submit hands an application write under protocol A or B to the loop,
// which asks the congestion controller: admitSend (queued), admitMark (the
// peer is Behind: mark its blocks) or admitEnded (pd was not taken). It
// waits while the policy holds the write for room.
func (s *session) submit(pd *pending) admission {
	answer := make(chan admission, 1)
	select {
	case s.submits <- submission{pd: pd, admit: true, answer: answer}:
		return <-answer
	case <-s.ended:
		return admitEnded
	}
}

// do runs f on the loop and returns once it ran; false: the loop ended,
// f did not run.
func (s *session) do(f func()) bool {
	ran := make(chan struct{})
	select {
	case s.calls <- func() { f(); close(ran) }:
		<-ran
		return true
	case <-s.ended:
		return false
	}
}

// completedLocally tells the loop that the write it numbered seq was
// acknowledged to its client at (protocols A and B), for the peer's lag;
// the lag counts it when this returns. A write whose session ended is not
// counted: its blocks are marked.
func (s *session) completedLocally(seq uint64, bytes int64, at time.Time) {
	s.do(func() {
		s.p.lag.Completed(seq, bytes, at)
		s.publishLag()
	})
}

// markBehind marks e's blocks for the peer; blocks under resync runs in
// flight are remembered: those runs carry older data, and their acks must
// leave the marks. It runs on the loop, so marking and clearRun exclude
// each other; false: the session ended, nothing was marked.
func (s *session) markBehind(e *replication.Entry) bool {
	return s.do(func() {
		s.remark(e.Off, e.Length)
		before := s.p.bm.Count()
		markEntry(s.p.bm, e)
		// The lag counts blocks newly marked, not a block twice.
		if n := (s.p.bm.Count() - before) * replication.BlockSize; n > 0 {
			s.p.lag.Marked(n, time.Now())
			s.publishLag()
		}
	})
}

func (s *session) remark(off, length int64) {
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

// changesData reports whether an entry of op changes blocks.
func changesData(op replication.Op) bool {
	switch op {
	case replication.OpWrite, replication.OpZero, replication.OpTrim:
		return true
	}
	return false
}

func markEntry(bm *metadata.PeerBitmap, e *replication.Entry) {
	if changesData(e.Op) {
		bm.SetBits(e.Off, e.Length)
	}
}
