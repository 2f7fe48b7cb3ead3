package node

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// Waiting on events, on the node's clock: production code never polls a
// condition with sleeps. The code that changes a state notifies its
// changes; a waiter looks at the state again at each notification, and
// gives up at a timer of the injected clock or when its context ends.

// changes broadcasts that a state changed. A waiter takes wait() BEFORE it
// looks at the state; the channel is closed by the first notify after
// that, so that no change between the look and the wait is missed. Its
// zero value is ready. It takes no lock (notify is one atomic swap): it may
// be notified from any goroutine, under any lock, on the IO path.
type changes struct {
	ch atomic.Pointer[chan struct{}]
}

// wait returns a channel closed at the next notify.
func (c *changes) wait() <-chan struct{} {
	for {
		if p := c.ch.Load(); p != nil {
			return *p
		}
		next := make(chan struct{})
		if c.ch.CompareAndSwap(nil, &next) {
			return next
		}
	}
}

// notify wakes every waiter.
func (c *changes) notify() {
	if p := c.ch.Swap(nil); p != nil {
		close(*p)
	}
}

// waitUntil waits until cond holds, looking at it when it begins, at each
// change notified on changed, and at each of the times after it began
// that wakes lists (for a cond that counts the time waited). It reports
// whether cond held: false when timeout passed on clk, or ctx ended,
// first.
func waitUntil(ctx context.Context, clk clock.Clock, timeout time.Duration, changed *changes, cond func() bool, wakes ...time.Duration) bool {
	if ctx.Err() != nil {
		return cond()
	}
	deadline := clk.NewTimer(timeout)
	defer deadline.Stop()
	// One timer for the wakes, armed for the next that falls before the
	// deadline.
	wakes = slices.Sorted(slices.Values(wakes))
	began := clk.Now()
	var wake clock.Timer
	var wakeC <-chan time.Time
	armWake := func() {
		for len(wakes) > 0 {
			d := wakes[0] - clk.Since(began)
			wakes = wakes[1:]
			if d <= 0 {
				continue // passed: the look about to be made covers it
			}
			if wake == nil {
				wake = clk.NewTimer(d)
			} else {
				wake.Reset(d)
			}
			wakeC = wake.C()
			return
		}
		wakeC = nil
	}
	armWake()
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	for {
		next := changed.wait()
		if cond() {
			return true
		}
		select {
		case <-next:
		case <-wakeC:
			armWake()
		case <-deadline.C():
			return cond()
		case <-ctx.Done():
			return false
		}
	}
}

// afterFunc runs f in its own goroutine once d passed on clk, unless stop
// is called first (time.AfterFunc on an injected clock).
func afterFunc(clk clock.Clock, d time.Duration, f func()) (stop func()) {
	t := clk.NewTimer(d)
	done := make(chan struct{})
	go func() {
		select {
		case <-t.C():
			f()
		case <-done:
		}
	}()
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			t.Stop()
			close(done)
		}
	}
}

// waitOut waits d out on clk (a back-off, a settling time: no state to wait
// on); false when ctx ended first.
func waitOut(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}
