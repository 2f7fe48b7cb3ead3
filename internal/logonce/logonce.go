package logonce

import (
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Set is the keys logged recently. A key names a peer and a cause ("raft
// 127.0.0.1 other-ca serial 5A…").
type Set struct {
	quiet time.Duration
	max   int
	now   func() time.Time

	mu   lockorder.Mutex
	seen map[string]time.Time
}

// New returns a Set that takes a key again once it has not been seen for
// quiet, and remembers at most max keys: beyond them (many peers, or a
// peer that changes certificate at every try) a new key counts as seen,
// so that nobody can fill the log or the memory. now is the clock (nil:
// time.Now).
func New(quiet time.Duration, max int, now func() time.Time) *Set {
	if now == nil {
		now = time.Now
	}
	return &Set{quiet: quiet, max: max, now: now, seen: map[string]time.Time{}}
}

// First reports whether key is to be logged: never seen, or not seen for
// the quiet spell. Either way it is seen now.
func (s *Set) First(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	last, ok := s.seen[key]
	if ok {
		s.seen[key] = now
		return now.Sub(last) >= s.quiet
	}
	if len(s.seen) >= s.max {
		for k, t := range s.seen {
			if now.Sub(t) >= s.quiet {
				delete(s.seen, k)
			}
		}
		if len(s.seen) >= s.max {
			return false
		}
	}
	s.seen[key] = now
	return true
}
