package sim

import "time"

// msgKind says what a replication message carries.
type msgKind uint8

const (
	// msgWrite: a client write the primary ships (protocol C).
	msgWrite msgKind = iota + 1
	// msgAck: the secondary holds write id durably.
	msgAck
	// msgSyncStart: the resync begins; the target is Inconsistent from
	// here, resuming from gen.
	msgSyncStart
	// msgSyncData: the marked blocks.
	msgSyncData
	// msgSyncGen: the source's sync-done entry, its generations: the
	// target holds them once it has flushed (also a primary's new
	// generation announced to a peer in sync).
	msgSyncGen
	// msgSyncDone: the target holds the source's data.
	msgSyncDone
	// msgGenAck: the peer took the generation a primary announced.
	msgGenAck
	// msgFlush: a client's FLUSH, in order after the writes before it:
	// the secondary syncs its disk, then acknowledges.
	msgFlush
	// msgFlushAck: the secondary's disk holds durably every entry before
	// flush id.
	msgFlushAck
)

func (k msgKind) String() string {
	switch k {
	case msgWrite:
		return "write"
	case msgAck:
		return "ack"
	case msgSyncStart:
		return "sync-start"
	case msgSyncData:
		return "sync-data"
	case msgSyncGen:
		return "sync-gen"
	case msgSyncDone:
		return "sync-done"
	case msgGenAck:
		return "gen-ack"
	case msgFlush:
		return "flush"
	case msgFlushAck:
		return "flush-ack"
	}
	return "msg(?)"
}

// msg is one message on a connection.
type msg struct {
	at       time.Time
	from, to string
	session  uint64
	kind     msgKind
	id       int64 // write number (msgWrite, msgAck); flush number (msgFlush, msgFlushAck)
	block    int
	value    int64
	fua      bool // msgWrite: written through to stable storage
	// seq is the entry's place in its stream (msgWrite, msgSyncData: that
	// of its last block), as the checker recorded it at the send.
	seq      int
	blocks   map[int]int64 // msgSyncData
	announce bool          // msgSyncGen: only a new generation, no resync
	sync     syncGens      // msgSyncStart, msgSyncGen
}

// link is the network between two nodes: it is cut (a partition) or not,
// and carries one connection's messages each way, delivered in order,
// each after a delay. A connection that breaks loses what it carried.
type link struct {
	cut    bool
	healAt time.Time
	queues map[string][]msg // by receiver
	last   map[string]time.Time
}

func newLink() *link {
	return &link{queues: map[string][]msg{}, last: map[string]time.Time{}}
}

// send queues m for delivery at m.at or after the message before it.
func (l *link) send(m msg) {
	m.at = later(m.at, l.last[m.to])
	l.last[m.to] = m.at
	l.queues[m.to] = append(l.queues[m.to], m)
}

// due removes and returns the messages to to that are due at now.
func (l *link) due(to string, now time.Time) []msg {
	q := l.queues[to]
	n := 0
	for n < len(q) && !q[n].at.After(now) {
		n++
	}
	if n == 0 {
		return nil
	}
	out := q[:n:n]
	l.queues[to] = q[n:]
	return out
}

// reset drops what the connection carried.
func (l *link) reset() {
	clear(l.queues)
}

func (l *link) idle() bool {
	for _, q := range l.queues {
		if len(q) > 0 {
			return false
		}
	}
	return true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
