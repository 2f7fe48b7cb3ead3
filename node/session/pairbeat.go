package session

import (
	"sync/atomic"
	"time"
)

// A node probes each peer node once, not once per volume: the streams of
// all volumes between two nodes share a PairBeat. While a stream is idle
// it owes nothing, and the pair's probe says whether the peer node
// answers: one stream at a time, the carrier, sends the heartbeats, and
// any idle stream sends one too when nothing was heard from the peer
// node for two heartbeat intervals (the carrier busy or gone). An idle
// stream that is not the carrier rests without a ticker until the carrier
// leaves (rest). A stream that waits for acks is judged by what it
// received itself, as before; one that goes from idle to busy starts its
// clock then. A thousand idle volumes on two nodes thus cost one probe
// per interval, where they cost a thousand. The zero PairBeat is ready:
// a node keeps one per peer node and hands it to each session
// (Config.Beat). It is atomics only: every session's goroutines use it at
// once.
type PairBeat struct {
	// lastHeard is when a frame last arrived from the peer node on any
	// stream (unix ns).
	lastHeard atomic.Int64
	// carrier is the stream that probes the peer node (nil: none yet).
	carrier atomic.Pointer[Session]
	// wake is closed when the carrier leaves: the resting streams look
	// again (nil: none rests since the last carrier left).
	wake atomic.Pointer[chan struct{}]
}

// heard notes a frame from the peer node at now.
func (b *PairBeat) heard(now int64) {
	if b != nil {
		b.lastHeard.Store(now)
	}
}

// carries reports whether s probes the pair, taking the carrier's place
// when it is free. Without a pair (a test's bare peer), every stream
// probes for itself.
func (b *PairBeat) carries(s *Session) bool {
	if b == nil {
		return true
	}
	c := b.carrier.Load()
	return c == s || c == nil && b.carrier.CompareAndSwap(nil, s)
}

// leave gives up s's place as the carrier, if it holds it, and wakes
// the streams that rested on it.
func (b *PairBeat) leave(s *Session) {
	if b != nil && b.carrier.CompareAndSwap(s, nil) {
		if w := b.wake.Swap(nil); w != nil {
			close(*w)
		}
	}
}

// rest returns a channel closed when the carrier leaves, for s, an idle
// stream that another stream carries for; nil when s must tick itself:
// it carries, no stream does, or there is no pair.
func (b *PairBeat) rest(s *Session) <-chan struct{} {
	if b == nil {
		return nil
	}
	if c := b.carrier.Load(); c == nil || c == s {
		return nil
	}
	w := b.wake.Load()
	if w == nil {
		ch := make(chan struct{})
		if b.wake.CompareAndSwap(nil, &ch) {
			w = &ch
		} else if w = b.wake.Load(); w == nil {
			return nil // the carrier left meanwhile
		}
	}
	// A carrier that left before w was taken did not close it: look
	// again. One that leaves from now on closes it.
	if c := b.carrier.Load(); c == nil || c == s {
		return nil
	}
	return *w
}

// quietSince is how long nothing was heard from the peer node, at now
// (unix ns); a stream's own time when there is no pair.
func (b *PairBeat) quietSince(now, own int64) time.Duration {
	last := own
	if b != nil {
		last = max(last, b.lastHeard.Load())
	}
	return time.Duration(now - last)
}
