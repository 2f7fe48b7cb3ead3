package node

import (
	"bytes"
	"slices"

	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/writepath"
	"github.com/replvol/replvol/replication"
)

// The write-facing side of the peers, stage 2 of a write (write.go): what
// a writer calls to hand an entry to each peer's session, or to mark it
// for the peer when it is not streaming or is Behind, in the order a write
// calls it. Everything here either sends to the session's loop and waits
// for it (Session.Enqueue, Submit, MarkBehind) or, without a stream, marks
// the peer's bitmap. The loop's side of a writer's messages is the
// session's (package session, submit.go).

// submitAll hands e to every peer under protocol proto: the pendings to
// wait for, appended to waits, and the first error of a peer whose missing
// of e could not be tracked durably. Each pending holds held (when not
// nil) until it completes. source has bit i set when the i-th pending
// appended goes to a peer this primary copies newer data from (pulling).
// unstreamed: a flush that declares writes durable (a client's FLUSH, a
// handover's) tracks the peers it never streamed to (submit).
func (v *Volume) submitAll(waits []*session.Pending, e replication.Entry, proto byte, held *countdown, unstreamed bool) (_ []*session.Pending, source uint64, _ error) {
	var first error
	n := len(waits)
	peers := v.streamingPeers()
	if held != nil && proto == 'C' && len(peers) > 1 {
		// The writer waits for every peer's ack: it wakes once, when the
		// last is counted (session.Joint), not once per peer.
		held.acks.Arm()
		defer held.acks.Seal()
	}
	for _, p := range peers {
		w, err := p.submit(e, proto, held, unstreamed)
		if w != nil {
			if p.pulling.Load() && len(waits)-n < 64 {
				source |= 1 << (len(waits) - n)
			}
			waits = append(waits, w)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return waits, source, first
}

// submit hands one write-type entry (or a flush) to the peer, running
// node/writepath's machine of one peer's part of the Ship stage (the
// simulation runs the same). It returns a pending to wait for when the
// entry went into the stream, or nil when the peer misses it: it is not
// streaming, or it is Behind (pull-ahead). The blocks it misses are then
// marked in its bitmap, after the volume durably started tracking the
// peer, BEFORE submit returns. A flush the peer misses waits for the end
// of its last stream, which marks what the peer acknowledged from its
// cache (session.Session.end); with no stream since this node became
// primary, a flush that declares writes durable (unstreamed) has the
// volume track the peer first. err says that tracking could not be made
// durable: the write or flush must not complete.
func (p *peer) submit(e replication.Entry, proto byte, held *countdown, unstreamed bool) (*session.Pending, error) {
	ship := writepath.BeginPeer(session.ChangesData(e.Op))
	pd, err := p.ship(&ship, e, proto, held)
	if ship.Next() != writepath.PeerDone {
		// The steps the machine's order puts after the settling run
		// without holding the write: the write may complete before them.
		p.shipLater(ship, e, proto)
		return pd, err
	}
	if ship.PeerOutcome() == writepath.FlushNotStreamed {
		return nil, p.flushUnreached(unstreamed)
	}
	return pd, err
}

// shipLater runs, on a goroutine of its own, the steps of ship that
// come after its settling; the volume's drain of its IO waits for them.
func (p *peer) shipLater(ship writepath.Peer, e replication.Entry, proto byte) {
	if e.Data != nil {
		e.Data = bytes.Clone(e.Data) // the client's buffer ends with the write
	}
	// So do the sums' room (countdown.Done gives it back): this entry
	// holds none of the write.
	e.Sums = slices.Clone(e.Sums)
	p.v.iopath.io.Add(1)
	go func() {
		defer p.v.iopath.io.Done()
		if _, err := p.ship(&ship, e, proto, nil); err != nil {
			p.v.log.Error("a missed write after its ship stage", "peer", p.name, "off", e.Off, "len", e.Length, "err", err)
		}
	}()
}

// ship runs the peer's part of e's Ship stage until it settled: the
// pending to wait for when the stream took e, and the error of a tracking
// that could not be made durable.
func (p *peer) ship(ship *writepath.Peer, e replication.Entry, proto byte, held *countdown) (pd *session.Pending, err error) {
	for {
		switch ship.Next() {
		case writepath.Offer:
			var a writepath.Admission
			pd, a = p.offer(e, proto, held)
			ship.Offered(a)
		case writepath.Track:
			// Behind: the peer stays connected, and misses the write as a
			// peer that is gone does, once the volume durably tracks it.
			err = p.v.track(p, ship.Behind())
			ship.Tracked(err == nil)
		case writepath.Mark:
			ship.Marked(p.mark(ship.MarkHow(), e))
		case writepath.Settle:
			ship.Settled()
			return pd, err
		case writepath.PeerDone:
			return pd, err
		}
	}
}

// offer hands e to the peer's stream, if it has one: the pending to wait
// for when the stream took it.
func (p *peer) offer(e replication.Entry, proto byte, held *countdown) (*session.Pending, writepath.Admission) {
	s := p.session()
	if s == nil {
		return nil, writepath.NoStream
	}
	changes := session.ChangesData(e.Op)
	pd := session.NewPending(e)
	pd.Session = s
	congestion := proto != 'C' && changes
	if congestion {
		// The send buffer holds what crosses the link: a TRIM or
		// WRITE_ZEROES of any range costs only its header.
		pd.Wire = int64(e.EncodedLen())
	}
	if changes && proto == 'B' {
		pd.Received = make(chan struct{})
	}
	if held != nil {
		held.add()
		pd.Held = held
		if held.acks.Armed() {
			held.acks.Add()
			pd.Joint = &held.acks
		}
	}
	var got session.Admission
	if congestion {
		got = s.Submit(pd)
	} else {
		if changes {
			pd.LagSeq = p.writeSeq.Add(1)
		}
		got = session.AdmitEnded
		if s.Enqueue(pd) {
			got = session.AdmitSend
		}
	}
	if got == session.AdmitSend {
		return pd, writepath.Streamed
	}
	if held != nil {
		held.Done()
		if pd.Joint != nil {
			pd.Joint.Release()
		}
	}
	if got == session.AdmitEnded {
		return nil, writepath.StreamEnded // it just ended: its end marks what it held
	}
	// AdmitMark: the peer is Behind.
	return nil, writepath.Behind
}

// mark marks e's blocks for the peer as how says.
func (p *peer) mark(how writepath.MarkHow, e replication.Entry) writepath.MarkResult {
	switch how {
	case writepath.MarkUnlessStreaming:
		if p.v.markUnlessStreaming(p, &e) {
			return writepath.MarkDone
		}
		return writepath.MarkStreaming // a session started meanwhile: the entry goes to it
	case writepath.MarkByStream:
		// The Behind peer's loop marks the blocks. A copy, so that e
		// stays on the stack on the common path.
		if s, missed := p.session(), e; s != nil && s.MarkBehind(&missed) {
			return writepath.MarkDone
		}
		// The stream ended meanwhile: its end marked what it held; this
		// write is marked here, and its lag is not counted.
		return writepath.MarkEnded
	}
	// The tracking failed, or the Behind stream ended: the blocks are
	// marked without the stream.
	p.bm.SetBits(e.Off, e.Length)
	return writepath.MarkDone
}

// flushUnreached is what a flush owes a peer it has no stream to.
func (p *peer) flushUnreached(unstreamed bool) error {
	// A flush the peer misses marks no block of it, but it declares
	// durable what the peer may hold in its cache only. A stream that
	// ended marks what the peer acknowledged from its cache on it, and
	// tracks the peer: the flush completes only once that is durable,
	// and fails when it could not be.
	if ended := p.snapshot().ending; ended != nil {
		<-ended.Finished()
		return ended.MarkErr()
	}
	// No stream to the peer since this node became primary (its peers
	// are new then): the peer may hold, in its cache only, writes of an
	// earlier primary (or of this node as one) that this flush declares
	// durable, and nothing here knows which. The volume tracks it,
	// durably (raft records it Outdated, the generation moves on),
	// BEFORE the flush completes, so that it is never taken for holding
	// them; its activity log marks what a power loss cost it. A peer
	// tracked already costs the fast path; when the tracking fails, so
	// does the flush. (A stop's own flush declares nothing to a client:
	// it leaves the generation, which a forced primary that only stopped
	// shares with the old one it still follows.)
	if !unstreamed {
		return nil
	}
	return p.v.startTracking(p)
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
