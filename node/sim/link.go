package sim

import "time"

// msgKind says what a replication message carries.
type msgKind uint8

const (
	// msgFrame: a frame of the primary's session (wire.go), a batch of
	// entries: writes, reverts, pulled blocks, flushes, a resync's start,
	// data and sync-done, a generation announced.
	msgFrame msgKind = iota + 1
	// msgFrameAck: the peer's ack frame: it applied every entry up to a
	// sequence number.
	msgFrameAck
)

func (k msgKind) String() string {
	switch k {
	case msgFrame:
		return "frame"
	case msgFrameAck:
		return "ack"
	}
	return "msg(?)"
}

// msg is one message on a connection.
type msg struct {
	at       time.Time
	from, to string
	session  uint64
	kind     msgKind
	data     []byte  // the frame's contents
	buf      *[]byte // msgFrame: data's pooled buffer, the receiver's to free
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
