package clock

import "time"

// Clock reads the time and makes timers and tickers on it.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	Until(t time.Time) time.Duration
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker of a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real returns the clock of the time package.
func Real() Clock { return real{} }

// Or returns c, or Real when c is nil: what a config's unset clock means.
func Or(c Clock) Clock {
	if c == nil {
		return Real()
	}
	return c
}

type real struct{}

func (real) Now() time.Time                  { return time.Now() }
func (real) Since(t time.Time) time.Duration { return time.Since(t) }
func (real) Until(t time.Time) time.Duration { return time.Until(t) }
func (real) NewTimer(d time.Duration) Timer  { return realTimer{time.NewTimer(d)} }
func (real) NewTicker(d time.Duration) Ticker {
	return realTicker{time.NewTicker(d)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }
