package nbd

import (
	"container/list"
	"fmt"

	"github.com/replvol/replvol/internal/lockorder"
)

// Every request holds bytes of a budget from the moment the reader takes its header until its
// reply is written or dropped: the buffer it needs (a WRITE's payload, a READ's reply data,
// counted at the buffer's size class) or minRequestCost for a request that moves no data. A
// connection charges a request to its own reserve when that has room, and otherwise to the
// Server's node budget; it never holds more than its connection budget in all. So the request
// buffers of a Server never exceed NodeBudget + MaxConnections × ConnectionReserve.

// minRequestCost is what a request without a buffer holds (FLUSH, TRIM, WRITE_ZEROES, error
// replies): more than its request struct and queue slot, so a flood of them is bounded too.
const minRequestCost = 1 << minBufferShift

// requestCost is the budget a valid request holds.
func requestCost(h requestHeader) int64 {
	if h.cmd == cmdRead || h.cmd == cmdWrite {
		return int64(bufferSize(int(h.length)))
	}
	return minRequestCost
}

// nodeBudget is a weighted semaphore over bytes, shared by every connection of a Server. Waiters
// are served in arrival order: a waiting large request is not overtaken by small ones, so it
// cannot starve. Its methods may be called concurrently.
type nodeBudget struct {
	size int64

	mu      lockorder.Mutex
	held    int64
	waiters list.List // of *budgetWaiter, oldest first
}

// budgetWaiter is a request for n bytes queued in a nodeBudget.
type budgetWaiter struct {
	n       int64
	ready   chan struct{} // closed when the bytes are granted
	element *list.Element
}

// enqueue takes n bytes at once and returns nil if they are free and nobody waits; otherwise it
// queues a waiter, whose ready channel closes when the bytes are granted. The caller then either
// holds them or withdraws with cancel.
func (b *nodeBudget) enqueue(n int64) *budgetWaiter {
	if n <= 0 || n > b.size {
		panic(fmt.Sprintf("nbd: %d bytes asked of a node budget of %d", n, b.size))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiters.Len() == 0 && b.held+n <= b.size {
		b.held += n
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	w.element = b.waiters.PushBack(w)
	return w
}

// cancel withdraws w. It returns false if w's bytes were granted meanwhile: the caller holds them.
func (b *nodeBudget) cancel(w *budgetWaiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready:
		return false
	default:
	}
	first := b.waiters.Front() == w.element
	b.waiters.Remove(w.element)
	if first {
		b.grantLocked() // the waiters behind w may fit now
	}
	return true
}

// release returns n bytes and grants them to the oldest waiters that fit.
func (b *nodeBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if b.held < 0 {
		panic(fmt.Sprintf("nbd: node budget released %d bytes more than it lent", -b.held))
	}
	b.grantLocked()
}

func (b *nodeBudget) grantLocked() {
	for e := b.waiters.Front(); e != nil; e = b.waiters.Front() {
		w := e.Value.(*budgetWaiter)
		if b.held+w.n > b.size {
			return
		}
		b.held += w.n
		b.waiters.Remove(e)
		close(w.ready)
	}
}

func (b *nodeBudget) heldBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// connBudget is what one connection's requests hold. Only the connection's reader acquires;
// whoever writes or drops replies releases.
type connBudget struct {
	limit, reserve int64

	mu          lockorder.Mutex
	held        int64         // all the connection holds, <= limit
	reserveHeld int64         // the part of held charged to the reserve, <= reserve
	released    chan struct{} // closed at the next release; nil unless the reader waits for one
}

// nextReleaseLocked returns a channel closed at the next release.
func (b *connBudget) nextReleaseLocked() <-chan struct{} {
	if b.released == nil {
		b.released = make(chan struct{})
	}
	return b.released
}

// acquire charges cost to the connection: to its reserve if that has room, else to the node
// budget. It waits while the connection holds its whole budget or the node budget is used; the
// reader reads nothing meanwhile, so TCP pushes back on the client. A request waiting for the
// node budget takes the reserve instead if that frees up first. It returns false, holding
// nothing, once the connection is broken or draining.
func (c *serverConn) acquire(cost int64) (fromReserve, ok bool) {
	b, node := &c.budget, c.srv.nodeBudget
	waiting := false
	defer func() {
		if waiting {
			c.srv.stats.waiting.Add(-1)
		}
	}()
	b.mu.Lock()
	for b.held+cost > b.limit {
		if !waiting {
			waiting = true
			c.srv.stats.waiting.Add(1)
		}
		released := b.nextReleaseLocked()
		b.mu.Unlock()
		select {
		case <-released:
		case <-c.stopReading:
			return false, false
		}
		b.mu.Lock()
	}
	// From here on held+cost <= limit stays true: only this goroutine adds to held.
	if b.reserveHeld+cost <= b.reserve {
		c.chargeLocked(cost, true)
		b.mu.Unlock()
		return true, true
	}
	w := node.enqueue(cost)
	if w == nil {
		c.chargeLocked(cost, false)
		b.mu.Unlock()
		return false, true
	}
	var released <-chan struct{} // nil (never ready) when cost cannot fit the reserve at all
	if cost <= b.reserve {
		released = b.nextReleaseLocked()
	}
	b.mu.Unlock()
	if !waiting {
		waiting = true
		c.srv.stats.waiting.Add(1)
	}
	for {
		select {
		case <-w.ready:
			b.mu.Lock()
			c.chargeLocked(cost, false)
			b.mu.Unlock()
			return false, true
		case <-released:
			b.mu.Lock()
			if b.reserveHeld+cost <= b.reserve {
				fromReserve = node.cancel(w) // false: the node granted it meanwhile
				c.chargeLocked(cost, fromReserve)
				b.mu.Unlock()
				return fromReserve, true
			}
			released = b.nextReleaseLocked()
			b.mu.Unlock()
		case <-c.stopReading:
			if !node.cancel(w) {
				node.release(cost)
			}
			return false, false
		case <-c.drainStarted:
			if !node.cancel(w) {
				node.release(cost)
			}
			return false, false
		}
	}
}

// chargeLocked records cost as held; the caller holds c.budget.mu. The Server's statistics
// follow the budgets (counted after taking, before giving back), so they never overstate them.
func (c *serverConn) chargeLocked(cost int64, fromReserve bool) {
	c.budget.held += cost
	if fromReserve {
		c.budget.reserveHeld += cost
	}
	c.srv.stats.chargeInFlight(cost)
}

// releaseBudget gives back bytes the connection held: reserveBytes to its reserve and nodeBytes
// to the node budget.
func (c *serverConn) releaseBudget(reserveBytes, nodeBytes int64) {
	if reserveBytes == 0 && nodeBytes == 0 {
		return
	}
	c.srv.stats.inFlight.Add(-(reserveBytes + nodeBytes))
	b := &c.budget
	b.mu.Lock()
	b.held -= reserveBytes + nodeBytes
	b.reserveHeld -= reserveBytes
	if b.held < 0 || b.reserveHeld < 0 {
		panic(fmt.Sprintf("nbd: connection budget below zero (held %d, reserve %d)", b.held, b.reserveHeld))
	}
	if b.released != nil {
		close(b.released)
		b.released = nil
	}
	b.mu.Unlock()
	if nodeBytes > 0 {
		c.srv.nodeBudget.release(nodeBytes)
	}
}

func (c *serverConn) heldBytes() int64 {
	c.budget.mu.Lock()
	defer c.budget.mu.Unlock()
	return c.budget.held
}
