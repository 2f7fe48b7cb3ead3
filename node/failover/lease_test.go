package failover

import (
	"testing"
	"time"
)

// TestLeaseFence pins the lease fence's decision: a promotion waits until
// Hold has passed since both the leader's office and its last grant, and
// while a grant runs it waits for that grant's end whatever the time.
func TestLeaseFence(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	const hold = 2 * time.Second
	cases := []struct {
		name  string
		fence LeaseFence
		now   time.Time
		free  bool
		wait  time.Duration
	}{
		{"a new leader waits a lease from its office", LeaseFence{Office: at(0), Hold: hold}, at(0.5), false, 1500 * time.Millisecond},
		{"a new leader that led a lease and granted none is free", LeaseFence{Office: at(0), Hold: hold}, at(2), true, 0},
		{"a grant after the office counts from the grant", LeaseFence{Office: at(0), Renewal: Renewal{Last: at(3)}, Hold: hold}, at(4), false, time.Second},
		{"a grant older than the office counts from the office", LeaseFence{Office: at(5), Renewal: Renewal{Last: at(3)}, Hold: hold}, at(6), false, time.Second},
		{"the last grant a lease ago is free", LeaseFence{Office: at(0), Renewal: Renewal{Last: at(3)}, Hold: hold}, at(5), true, 0},
		{"a grant in progress is never free", LeaseFence{Office: at(0), Renewal: Renewal{Last: at(1), Renewing: true}, Hold: hold}, at(60), false, 0},
		{"a grant in progress waits for its end, not the time", LeaseFence{Office: at(0), Renewal: Renewal{Renewing: true}, Hold: hold}, at(1), false, 0},
	}
	for _, c := range cases {
		free, wait := c.fence.Wait(c.now)
		if free != c.free || wait != c.wait {
			t.Errorf("%s: Wait = %t, %v; want %t, %v", c.name, free, wait, c.free, c.wait)
		}
	}
}
