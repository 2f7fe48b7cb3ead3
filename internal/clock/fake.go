package clock

import (
	"sort"
	"sync"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Fake is a Clock for tests: its time moves only by Advance. A timer or
// ticker of a Fake fires when Advance reaches its deadline, in the order
// of the deadlines (timers made first first among equal ones), each with
// the Fake's time set to its deadline; like the time package's, a fired
// timer's channel holds one value and a ticker drops the ticks its reader
// missed. A Fake is safe for concurrent use.
type Fake struct {
	mu      lockorder.Mutex
	now     time.Time
	seq     uint64
	waiters []*fakeTimer // armed, in no order
	armed   *sync.Cond   // broadcast when a timer is armed
}

// NewFake returns a Fake whose time is start.
func NewFake(start time.Time) *Fake {
	f := &Fake{now: start}
	f.armed = sync.NewCond(&f.mu)
	return f
}

// Now returns the Fake's time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since returns the Fake's time since t.
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// Until returns the Fake's time until t.
func (f *Fake) Until(t time.Time) time.Duration { return t.Sub(f.Now()) }

// NewTimer returns a timer that fires once the Fake reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// NewTicker returns a ticker that fires each d of the Fake's time. d must
// be positive, as for time.NewTicker.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), period: d}
	t.Reset(d)
	return fakeTicker{t}
}

// Advance moves the Fake's time on by d, firing on the way, in order, every
// timer and tick that falls due; a ticker fires at each of its periods
// within d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := f.now.Add(d)
	for {
		t := f.next()
		if t == nil || t.when.After(end) {
			break
		}
		f.now = t.when
		t.fire()
	}
	f.now = end
}

// Armed returns how many timers and tickers wait to fire.
func (f *Fake) Armed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// WaitArmed blocks until at least n timers and tickers wait to fire: a test
// advances the Fake once the code under test has armed the timers it waits
// on, an event rather than a guess of how long that takes.
func (f *Fake) WaitArmed(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.waiters) < n {
		f.armed.Wait()
	}
}

// next returns the armed timer of the earliest deadline (of the earliest
// arming among equal ones), nil if none. f.mu is held.
func (f *Fake) next() *fakeTimer {
	if len(f.waiters) == 0 {
		return nil
	}
	sort.Slice(f.waiters, func(i, j int) bool {
		a, b := f.waiters[i], f.waiters[j]
		if !a.when.Equal(b.when) {
			return a.when.Before(b.when)
		}
		return a.seq < b.seq
	})
	return f.waiters[0]
}

// remove disarms t; it reports whether t was armed. f.mu is held.
func (f *Fake) remove(t *fakeTimer) bool {
	for i, w := range f.waiters {
		if w == t {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// arm arms t to fire at when. f.mu is held.
func (f *Fake) arm(t *fakeTimer, when time.Time) {
	f.seq++
	t.when, t.seq = when, f.seq
	f.waiters = append(f.waiters, t)
	f.armed.Broadcast()
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time
	when   time.Time
	seq    uint64
	period time.Duration // a ticker's; 0 for a timer
}

// fire delivers a tick at t.when (dropped if the last one is unread, as
// time's tickers drop them) and re-arms a ticker. f.mu is held.
func (t *fakeTimer) fire() {
	t.f.remove(t)
	select {
	case t.c <- t.when:
	default:
	}
	if t.period > 0 {
		t.f.arm(t, t.when.Add(t.period))
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.remove(t)
}

// Reset re-arms the timer to fire d from now, dropping a tick it fired that
// nobody read (time.Timer's behaviour since Go 1.23).
func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.f.remove(t)
	select {
	case <-t.c:
	default:
	}
	if t.period > 0 {
		t.period = d
	}
	if d <= 0 && t.period == 0 {
		// Due now: fire at once, as time.NewTimer(0) does at once.
		t.when = t.f.now
		select {
		case t.c <- t.f.now:
		default:
		}
		return was
	}
	t.f.arm(t, t.f.now.Add(d))
	return was
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.c }
func (k fakeTicker) Stop()               { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	k.t.Reset(d)
}
