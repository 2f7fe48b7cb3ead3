package writepath

// One peer's part of a write's Ship stage: the entry goes to the peer's
// stream; or the stream just ended as it was offered, and it is offered
// again; or the peer misses it: the volume TRACKS THE PEER DURABLY (raft
// records it Outdated, the generation moves on where the rules say), THEN
// MARKS THE WRITE'S BLOCKS IN ITS BITMAP, and only then is the peer's part
// settled, so that the write, which completes after its Ship stage, never
// completes with a peer that misses it unmarked. Node's submit
// (node/submit.go) runs it for each peer on the writer's goroutine; the
// simulation runs it over its model of streams and bitmaps.

// PeerStep is what the runner of one peer's part of the Ship stage does
// next.
type PeerStep uint8

const (
	// Offer: the entry goes to the peer's stream, if it has one.
	// Reported with Offered.
	Offer PeerStep = iota + 1
	// Track: the peer misses a write: the volume tracks it, durably (raft
	// records it Outdated; the generation moves on where the rules say;
	// Behind says the peer is connected but Behind). Reported with
	// Tracked.
	Track
	// Mark: the write's blocks are marked in the peer's bitmap, as
	// MarkHow says. Reported with Marked.
	Mark
	// Settle: the peer's part of the Ship stage is over: the Ship stage
	// may be reported once every peer's is. Reported with Settled. A step
	// the order puts after it is run without holding the write (node: on
	// a goroutine of its own; the simulation: at a later step).
	Settle
	// PeerDone: nothing is left to do; PeerOutcome says how it ended.
	PeerDone
)

func (s PeerStep) String() string {
	switch s {
	case Offer:
		return "offer"
	case Track:
		return "track"
	case Mark:
		return "mark"
	case Settle:
		return "settle"
	case PeerDone:
		return "peer-done"
	}
	return "peer-step(?)"
}

// Admission is what became of an entry offered to a peer's stream.
type Admission uint8

const (
	// NoStream: the peer has no stream.
	NoStream Admission = iota + 1
	// Streamed: the stream took the entry; the write waits for it as the
	// protocol says (Wait).
	Streamed
	// StreamEnded: the stream ended as the entry was offered, and did not
	// take it (its end marks what it held): the entry is offered again.
	StreamEnded
	// Behind: the stream's peer is Behind (pull-ahead): it misses the
	// write as a peer without a stream does.
	Behind
)

// MarkHow is how the Mark step marks the blocks.
type MarkHow uint8

const (
	// MarkUnlessStreaming: marked only when no stream to the peer started
	// since the entry was offered, checked ATOMICALLY WITH THE MARK (a
	// handshake switches writes to the stream under the same lock, so
	// that each write is marked before the switch or streamed after it).
	// Reported with MarkDone, or MarkStreaming when a stream started.
	MarkUnlessStreaming MarkHow = iota + 1
	// MarkByStream: the Behind peer's stream marks them on its loop (it
	// orders the mark with its resync runs). Reported with MarkDone, or
	// MarkEnded when the stream ended first.
	MarkByStream
	// MarkAlways: the bitmap is marked, whatever streams. Reported with
	// MarkDone.
	MarkAlways
)

// MarkResult is what the Mark step did.
type MarkResult uint8

const (
	// MarkDone: the blocks are marked.
	MarkDone MarkResult = iota + 1
	// MarkStreaming: a stream to the peer started: nothing was marked;
	// the entry is offered to it.
	MarkStreaming
	// MarkEnded: the Behind peer's stream ended before it marked: nothing
	// was marked; the bitmap is marked whatever streams.
	MarkEnded
)

// PeerOutcome is how one peer's part of the Ship stage ended.
type PeerOutcome uint8

const (
	// PeerPending: not over yet.
	PeerPending PeerOutcome = iota
	// InStream: the entry is in the peer's stream.
	InStream
	// Missed: the peer misses the write, tracked durably and marked.
	Missed
	// MissNotTracked: the peer misses the write and the volume could not
	// track that durably (its blocks are marked all the same): the write
	// must fail.
	MissNotTracked
	// FlushNotStreamed: a flush the peer has no stream for (it marks no
	// block): the runner applies what a flush owes a peer it does not
	// reach.
	FlushNotStreamed
)

func (o PeerOutcome) String() string {
	switch o {
	case PeerPending:
		return "pending"
	case InStream:
		return "in-stream"
	case Missed:
		return "missed"
	case MissNotTracked:
		return "miss-not-tracked"
	case FlushNotStreamed:
		return "flush-not-streamed"
	}
	return "peer-outcome(?)"
}

// peerOrder is the steps of one peer's part, in this order; a step that
// does not apply is passed over (Track and Mark unless the peer misses
// the write). A mark that finds a stream started goes back to Offer.
//
// THE PEER IS TRACKED DURABLY, THEN ITS BLOCKS ARE MARKED, BEFORE ITS
// PART IS SETTLED: a write completes only after its Ship stage, and a
// write that completed with its peer's bit not yet set is lost for that
// peer when this node crashes before the bit is (a resync copies only
// what the bitmap holds).
var peerOrder = [...]PeerStep{Offer, Track, Mark, Settle}

// Peer is one peer's part of a write-type entry's Ship stage (or a
// flush's). A value, not safe for concurrent use.
type Peer struct {
	next int // index in peerOrder of the next step to consider
	// changes: the entry changes data (a write, TRIM, WRITE_ZEROES), not
	// a flush.
	changes bool
	// missing: the peer misses the entry (no stream, or Behind); behind:
	// it is Behind; offered: Offer ran since the last Mark sent it back;
	// unreached: a flush found no stream.
	missing, behind, offered, unreached bool
	// tracked: Track ran; trackFailed: it could not track durably.
	tracked, trackFailed bool
	// marked: Mark marked the blocks; streamEnded: the Behind stream
	// ended before it marked.
	marked, streamEnded bool
	settled             bool
	outcome             PeerOutcome
}

// BeginPeer starts one peer's part of an entry's Ship stage; changes
// says the entry changes data (false: a flush).
func BeginPeer(changes bool) Peer { return Peer{changes: changes} }

// Next returns the step to run now; PeerDone once the part is over.
func (p *Peer) Next() PeerStep {
	if p.outcome != PeerPending {
		return PeerDone
	}
	for p.next < len(peerOrder) {
		s := peerOrder[p.next]
		if p.applies(s) {
			return s
		}
		p.next++
	}
	p.outcome = p.decide()
	return PeerDone
}

// applies says whether step s runs now.
func (p *Peer) applies(s PeerStep) bool {
	switch s {
	case Offer:
		return !p.offered
	case Track:
		return p.missing && !p.tracked
	case Mark:
		return p.missing && !p.marked
	case Settle:
		return !p.settled
	}
	return false
}

// advance moves past step s, which must be the current one.
func (p *Peer) advance(s PeerStep) {
	if p.next >= len(peerOrder) || peerOrder[p.next] != s || p.outcome != PeerPending || !p.applies(s) {
		panic("writepath: peer step " + s.String() + " reported out of order")
	}
	p.next++
}

// Offered reports the Offer step.
func (p *Peer) Offered(a Admission) {
	p.advance(Offer)
	switch a {
	case StreamEnded:
		p.next-- // offered again
		return
	case NoStream:
		if !p.changes {
			// A flush marks no block.
			p.unreached = true
			break
		}
		p.missing = true
	case Behind:
		if !p.changes {
			panic("writepath: a flush reported Behind")
		}
		p.missing, p.behind = true, true
	case Streamed:
	default:
		panic("writepath: offered with no admission")
	}
	p.offered = true
}

// Behind says the peer that misses the write is Behind (its stream stays
// connected): Track tracks it so.
func (p *Peer) Behind() bool { return p.behind }

// Tracked reports the Track step: ok when the volume tracks the peer
// durably.
func (p *Peer) Tracked(ok bool) {
	p.advance(Track)
	p.tracked, p.trackFailed = true, !ok
}

// MarkHow says how the Mark step marks: through a Behind peer's stream
// while it lasts; unless a stream started, when the peer is tracked; and
// whatever streams once the tracking failed (the write fails, and what
// the peer misses stays marked) or the Behind stream ended.
func (p *Peer) MarkHow() MarkHow {
	switch {
	case p.behind && !p.streamEnded:
		return MarkByStream
	case p.trackFailed || p.streamEnded:
		return MarkAlways
	}
	return MarkUnlessStreaming
}

// Marked reports the Mark step.
func (p *Peer) Marked(r MarkResult) {
	how := p.MarkHow()
	p.advance(Mark)
	switch {
	case r == MarkDone:
		p.marked = true
	case r == MarkStreaming && how == MarkUnlessStreaming:
		// Offered again, from the start: the stream takes it.
		p.next, p.offered, p.missing, p.tracked = 0, false, false, false
	case r == MarkEnded && how == MarkByStream:
		p.next-- // marked again, whatever streams
		p.streamEnded = true
	default:
		panic("writepath: a mark reported a result its way cannot have")
	}
}

// Settled reports the Settle step.
func (p *Peer) Settled() {
	p.advance(Settle)
	p.settled = true
}

// decide is the outcome once every step that applies ran.
func (p *Peer) decide() PeerOutcome {
	switch {
	case p.unreached:
		return FlushNotStreamed
	case !p.missing:
		return InStream
	case p.trackFailed:
		return MissNotTracked
	}
	return Missed
}

// PeerOutcome is how the peer's part ended (PeerPending until Next
// returned PeerDone).
func (p *Peer) PeerOutcome() PeerOutcome { return p.outcome }
