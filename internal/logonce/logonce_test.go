package logonce

import (
	"testing"
	"time"
)

// TestAKeyIsLoggedOncePerQuietSpell: a key repeated at every retry is
// logged the first time only; after a quiet spell without it, once more;
// a Set that is full takes no new key until old ones go quiet.
func TestAKeyIsLoggedOncePerQuietSpell(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(time.Minute, 2, func() time.Time { return now })
	step := func(d time.Duration) { now = now.Add(d) }
	for _, tc := range []struct {
		key  string
		wait time.Duration
		want bool
	}{
		{"beta other-ca", 0, true},
		{"beta other-ca", time.Second, false},
		{"beta other-ca", 59 * time.Second, false}, // seen again: the spell starts over
		{"beta wrong-identity", 0, true},
		{"gamma other-ca", 0, false}, // full
		{"beta wrong-identity", 30 * time.Second, false},
		{"beta other-ca", 30 * time.Second, true},
		{"gamma other-ca", 0, false},               // still full: wrong-identity was seen 30 s ago
		{"gamma other-ca", 30 * time.Second, true}, // it went quiet: its place is free
	} {
		step(tc.wait)
		if got := s.First(tc.key); got != tc.want {
			t.Fatalf("%s after %v: First = %v, want %v", tc.key, tc.wait, got, tc.want)
		}
	}
}
