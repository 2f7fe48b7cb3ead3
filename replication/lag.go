package replication

// Lag accounting for one peer: how far the peer's copy is behind what the
// primary acknowledged to its clients, in bytes and in seconds (status
// lag_bytes and lag_seconds; under protocol A, a failover to the peer
// loses at most that). node's per-peer sender feeds it the write
// completions, the peer's acks, the marks made while Ahead or
// disconnected and the catch-up's progress; status reads it; the write
// path asks ThrottleForLag before it admits a write.

import "time"

// Lag is one peer's lag. The zero value is a peer with no lag. It is for
// a single goroutine.
//
// Bytes is an upper bound: two writes to one block both count while
// neither is acknowledged, and a block marked twice counts twice until
// CaughtUp. The age of marked blocks is that of the oldest mark since the
// peer last had none: a partial catch-up does not make it younger.
type Lag struct {
	queue    []lagWrite // writes acknowledged locally, not by the peer, by seq
	head     int        // queue[head:] is live
	inFlight int64      // their bytes
	acked    uint64     // the peer acknowledged every write up to this seq
	marked   int64      // bytes marked for the peer, not yet resynced
	markedAt time.Time  // the oldest of those marks
}

// lagWrite is one write not yet acknowledged by the peer. oldest is the
// earliest local acknowledgement among it and every later write in the
// queue, so the head's oldest is the age of the whole queue.
type lagWrite struct {
	seq    uint64
	bytes  int64
	oldest time.Time
}

// Completed records that the write seq of bytes, shipped to the peer, was
// acknowledged to the client at (a write marked instead of shipped goes to
// Marked). A write the peer already acknowledged (under protocol A the
// peer may be faster than the local disk) adds nothing. Writes that
// complete out of seq order are placed in order; that costs the distance
// from the end of the queue, so it stays O(1) when writes complete near
// seq order.
func (l *Lag) Completed(seq uint64, bytes int64, at time.Time) {
	if seq <= l.acked {
		return
	}
	w := lagWrite{seq: seq, bytes: bytes, oldest: at}
	i := len(l.queue)
	for i > l.head && l.queue[i-1].seq > seq {
		i--
	}
	if i < len(l.queue) && l.queue[i].oldest.Before(w.oldest) {
		w.oldest = l.queue[i].oldest
	}
	l.queue = append(l.queue, lagWrite{})
	copy(l.queue[i+1:], l.queue[i:])
	l.queue[i] = w
	for j := i - 1; j >= l.head && w.oldest.Before(l.queue[j].oldest); j-- {
		l.queue[j].oldest = w.oldest
	}
	l.inFlight += bytes
}

// PeerAcked records that the peer acknowledged every write up to and
// including seq.
func (l *Lag) PeerAcked(seq uint64) {
	if seq <= l.acked {
		return
	}
	l.acked = seq
	for l.head < len(l.queue) && l.queue[l.head].seq <= seq {
		l.inFlight -= l.queue[l.head].bytes
		l.head++
	}
	switch {
	case l.head == len(l.queue):
		l.queue, l.head = l.queue[:0], 0
	case l.head > len(l.queue)/2:
		n := copy(l.queue, l.queue[l.head:])
		l.queue, l.head = l.queue[:n], 0
	}
}

// Marked records bytes of blocks marked for the peer at, instead of
// shipped (Ahead). Pass only the blocks newly marked when it is known.
func (l *Lag) Marked(bytes int64, at time.Time) {
	if bytes <= 0 {
		return
	}
	if l.marked == 0 || at.Before(l.markedAt) {
		l.markedAt = at
	}
	l.marked += bytes
}

// Resynced records that the catch-up cleared bytes of marked blocks.
func (l *Lag) Resynced(bytes int64) {
	l.marked = max(0, l.marked-bytes)
}

// CaughtUp records that the catch-up finished: nothing is marked for the
// peer any more. It corrects any overcount of Marked.
func (l *Lag) CaughtUp() {
	l.marked = 0
}

// Disconnected records that the connection dropped: every write the peer
// did not acknowledge becomes marked (the sender marks its blocks), and
// the peer's next connection starts its acks afresh.
func (l *Lag) Disconnected() {
	if l.head < len(l.queue) {
		l.Marked(l.inFlight, l.queue[l.head].oldest)
	}
	l.queue, l.head, l.inFlight, l.acked = l.queue[:0], 0, 0, 0
}

// Bytes is lag_bytes: acknowledged to clients and not on the peer.
func (l *Lag) Bytes() int64 {
	return l.inFlight + l.marked
}

// Age is lag_seconds: how long ago the oldest write counted in Bytes was
// acknowledged to its client (or marked); 0 without lag.
func (l *Lag) Age(now time.Time) time.Duration {
	return AgeSince(l.Oldest(), now)
}

// Oldest is when the oldest write counted in Bytes was acknowledged to its
// client (or marked); zero without lag.
func (l *Lag) Oldest() time.Time {
	var oldest time.Time
	if l.head < len(l.queue) {
		oldest = l.queue[l.head].oldest
	}
	if l.marked > 0 && (oldest.IsZero() || l.markedAt.Before(oldest)) {
		oldest = l.markedAt
	}
	return oldest
}

// AgeSince is the age at now of a lag whose oldest write is oldest (Age,
// from a copy of Oldest).
func AgeSince(oldest, now time.Time) time.Duration {
	if oldest.IsZero() || now.Before(oldest) {
		return 0
	}
	return now.Sub(oldest)
}

// ThrottleForLag is the max_lag rule: while the peer is connected and its
// lag has reached maxLag bytes (0 is off), a new write waits (the sender
// re-asks on every ack and resync progress). A write is admitted whenever
// the lag is below maxLag, so one write may overshoot it and a write
// larger than maxLag still goes. A disconnected peer throttles nothing:
// waiting would not shrink its lag, it would only stop the primary.
func ThrottleForLag(maxLag, lagBytes int64, peerConnected bool) bool {
	return maxLag > 0 && peerConnected && lagBytes >= maxLag
}
