package node

import (
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// The write-facing side of the peers, stage 2 of a write (write.go): what
// a writer calls to hand an entry to each peer's session, or to mark it
// for the peer when it is not streaming or is Behind, in the order a write
// calls it. Everything here either sends to the session's loop and waits
// for it (enqueue, submit, markBehind) or, without a stream, marks the
// peer's bitmap. The loop's side of a writer's messages follows: the
// blocks a Behind peer misses, and the completion a write sends at its end
// (stage 5).

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
// peer misses it: it is not streaming, or it is Behind (pull-ahead). The
// blocks it misses are then marked in its bitmap, after the volume durably
// started tracking the peer. err says that tracking could not be made
// durable: the write must not complete.
func (p *peer) submit(e replication.Entry, proto byte, held *countdown) (*pending, error) {
	changes := changesData(e.Op)
	for {
		var err error
		if s := p.session(); s != nil {
			pd := newPending(e)
			pd.sess = s
			congestion := proto != 'C' && changes
			if congestion {
				// The send buffer holds what crosses the link: a TRIM or
				// WRITE_ZEROES of any range costs only its header.
				pd.wire = int64(e.EncodedLen())
			}
			if changes && proto == 'B' {
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
				if changes {
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
			if got == admitEnded {
				continue // it just ended: its end marks what it held
			}
			// admitMark: the peer is Behind. It misses the write as a peer
			// that is gone does, once the volume durably tracks it; its
			// loop marks the blocks.
			err = p.v.track(p, true)
			if s := p.session(); s != nil && s.markBehind(&e) {
				return nil, err
			}
			// The stream ended meanwhile: its end marked what it held;
			// this write is marked here, and its lag is not counted.
		} else {
			if !changes {
				// A flush the peer misses changes no block of it: nothing
				// to mark, and no reason to leave the generation it shares.
				return nil, nil
			}
			if err = p.v.startTracking(p); err == nil {
				if p.v.markUnlessStreaming(p, &e) {
					return nil, nil
				}
				continue // a session started meanwhile: the entry goes to it
			}
		}
		// Both ways here e changes blocks: they are marked without the
		// stream.
		p.bm.SetBits(e.Off, e.Length)
		return nil, err
	}
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

// markBehind has the loop mark e's blocks for its Behind peer
// (markedBehind) and returns once they are marked; false: the session
// ended, nothing was marked.
func (s *session) markBehind(e *replication.Entry) bool {
	ran := make(chan struct{})
	select {
	case s.behind <- behindMark{e: e, ran: ran}:
		<-ran
		return true
	case <-s.ended:
		return false
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
	p.bm.SetBits(e.Off, e.Length)
	return true
}

// What a writer tells the loop, as messages; ran is closed once the loop
// has taken the news in, so the writer sees it counted when it goes on.

// behindMark: the Behind peer misses e (session.markBehind).
type behindMark struct {
	e   *replication.Entry
	ran chan struct{}
}

// localCompletion: the write the loop numbered seq (lagSeq), of bytes, was
// acknowledged to its client at, under protocol A or B, while the peer may
// not hold it yet (Volume.replicate).
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
func (s *session) markedBehind(m behindMark) {
	s.remark(m.e.Off, m.e.Length)
	before := s.p.bm.Count()
	markEntry(s.p.bm, m.e)
	// The lag counts blocks newly marked, not a block twice.
	if n := (s.p.bm.Count() - before) * replication.BlockSize; n > 0 {
		s.p.lag.Marked(n, time.Now())
		s.publishLag()
	}
	close(m.ran)
}

// completedLocally counts, on the loop, a write its client has in the
// peer's lag.
func (s *session) completedLocally(c localCompletion) {
	s.p.lag.Completed(c.seq, c.bytes, c.at)
	s.publishLag()
	close(c.ran)
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
