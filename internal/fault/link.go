package fault

import (
	"net"
	"os"
	"sync"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Link is the network between nodes, as far as the connections it wraps
// go: it can drop them (close every open one, as a reset would), delay
// what they send, and partition them (both directions held, new
// connections too, until Heal; what was sent arrives after the heal, as
// TCP retransmits it, unless a timeout closed the connection first).
//
// It does not reorder: a connection is a byte stream, and the replication
// protocol's order rules apply to the messages of one stream, which TCP
// delivers in order. Reordering bytes would only corrupt the stream;
// reordering messages belongs in a stream wrapper (node's WrapStream).
//
// Wrap the listeners of the nodes a partition should cut off (Listen),
// or a dialer's connections (Conn): a connection held on one side is
// enough, as the other side's writes only reach the kernel's buffers.
type Link struct {
	mu      lockorder.Mutex
	conns   map[*Conn]struct{}
	cut     chan struct{} // non-nil while partitioned; closed by Heal
	refuse  bool          // Cut: listeners close what they accept
	delay   time.Duration
	dropped int
}

// NewLink returns a healthy link.
func NewLink() *Link { return &Link{conns: map[*Conn]struct{}{}} }

// Partition holds every byte sent on the link's connections, both ways,
// now and on later connections, until Heal.
func (l *Link) Partition() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut == nil {
		l.cut = make(chan struct{})
	}
}

// Cut is a partition that resets instead of holding: every open
// connection closes (Drop), and the link's listeners close what they
// accept, until Heal.
func (l *Link) Cut() {
	l.mu.Lock()
	l.refuse = true
	l.mu.Unlock()
	l.Drop()
}

// Heal ends a partition or a cut: held bytes go on, connections are
// accepted again.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refuse = false
	if l.cut != nil {
		close(l.cut)
		l.cut = nil
	}
}

// Partitioned reports whether the link is partitioned or cut.
func (l *Link) Partitioned() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut != nil || l.refuse
}

// SetDelay makes every write on the link wait d first (0: none).
func (l *Link) SetDelay(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delay = d
}

// Drop closes every open connection of the link and returns how many.
// Later connections work (unless the link is Cut).
func (l *Link) Drop() int {
	l.mu.Lock()
	conns := make([]*Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.dropped += len(conns)
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns)
}

// Open is how many of the link's connections are open.
func (l *Link) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Dropped is how many connections Drop closed.
func (l *Link) Dropped() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// Listen wraps every connection ln accepts.
func (l *Link) Listen(ln net.Listener) net.Listener { return &listener{Listener: ln, link: l} }

type listener struct {
	net.Listener
	link *Link
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ln.link.mu.Lock()
		refuse := ln.link.refuse
		ln.link.mu.Unlock()
		if !refuse {
			return ln.link.Conn(c), nil
		}
		c.Close()
	}
}

// Conn wraps c.
func (l *Link) Conn(c net.Conn) net.Conn {
	fc := &Conn{Conn: c, link: l, closed: make(chan struct{})}
	l.mu.Lock()
	l.conns[fc] = struct{}{}
	l.mu.Unlock()
	return fc
}

// Conn is one connection of a Link.
type Conn struct {
	net.Conn
	link *Link

	mu            lockorder.Mutex
	readDeadline  time.Time
	writeDeadline time.Time
	held          []byte // read, but cut off by a deadline
	heldErr       error
	closed        chan struct{}
	closeOnce     sync.Once
}

// wait holds the caller while the link is cut: nil once healed,
// net.ErrClosed when the connection closes, os.ErrDeadlineExceeded at
// the deadline.
func (c *Conn) wait(deadline time.Time) error {
	c.link.mu.Lock()
	cut := c.link.cut
	c.link.mu.Unlock()
	if cut == nil {
		return nil
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-cut:
		return nil
	case <-c.closed:
		return net.ErrClosed
	case <-expired:
		return os.ErrDeadlineExceeded
	}
}

// Read reads from the connection, and holds what it read while the link
// is cut. What a deadline cut off is kept for the next Read.
func (c *Conn) Read(b []byte) (int, error) {
	c.mu.Lock()
	deadline, held, heldErr := c.readDeadline, c.held, c.heldErr
	c.held, c.heldErr = nil, nil
	c.mu.Unlock()
	n, err := 0, heldErr
	if held != nil || heldErr != nil {
		n = copy(b, held)
		held = held[n:]
	} else {
		n, err = c.Conn.Read(b)
		held = nil
	}
	if werr := c.wait(deadline); werr != nil {
		c.mu.Lock()
		c.held, c.heldErr = append(append([]byte(nil), b[:n]...), held...), err
		c.mu.Unlock()
		return 0, werr
	}
	if len(held) > 0 {
		c.mu.Lock()
		c.held, c.heldErr = held, err
		c.mu.Unlock()
		return n, nil
	}
	return n, err
}

// Write waits while the link is cut, and the link's delay, then writes.
func (c *Conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	deadline := c.writeDeadline
	c.mu.Unlock()
	if err := c.wait(deadline); err != nil {
		return 0, err
	}
	c.link.mu.Lock()
	delay := c.link.delay
	c.link.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.closed:
			t.Stop()
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Write(b)
}

// Close closes the connection and lets its held calls return.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.link.mu.Lock()
		delete(c.link.conns, c)
		c.link.mu.Unlock()
	})
	return c.Conn.Close()
}

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline, c.writeDeadline = t, t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline implements net.Conn.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDeadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}
