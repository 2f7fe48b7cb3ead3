package nbd

import (
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// logInterval is the least time between two lines of one rate-limited kind: what a client can
// cause once per connection (a refused connection, a failed TLS handshake) is logged once, then
// at most once per logInterval with the count of what was not logged.
const logInterval = 10 * time.Second

// logLimiter lets one log line through per interval. Its methods may be called concurrently.
type logLimiter struct {
	interval time.Duration

	mu         lockorder.Mutex
	next       time.Time // no line before this
	suppressed uint64    // events not logged since the last line
}

func newLogLimiter(interval time.Duration) *logLimiter {
	return &logLimiter{interval: interval}
}

// allow reports whether an event at now may be logged and, if so, how many events were not
// logged since the last line.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	suppressed, l.suppressed = l.suppressed, 0
	l.next = now.Add(l.interval)
	return true, suppressed
}
