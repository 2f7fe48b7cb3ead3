package failover

import "time"

// LeaseFence is what the raft leader knows of one volume's lease when a
// promotion that changes its primary waits for the old primary's lease
// to run out (the lease fence): since when it leads (Office: a new leader
// cannot know what the one before it granted), its own renewals of the
// lease (Renewal: its last grant, zero when none, and whether one runs),
// and how long a lease granted at a moment may still be held there (Hold:
// the lease's duration stretched by the clocks' drift).
type LeaseFence struct {
	Office  time.Time
	Renewal Renewal
	Hold    time.Duration
}

// FreeAt is when no lease this leader or one before it granted can still
// be valid, a grant in progress aside: Hold after the later of the office
// and the last grant.
func (f LeaseFence) FreeAt() time.Time {
	at := f.Office.Add(f.Hold)
	if g := f.Renewal.Last.Add(f.Hold); g.After(at) {
		at = g
	}
	return at
}

// Wait is the fence's decision at now: free, the promotion may proceed
// (no grant runs and FreeAt has passed); else how long to wait before
// deciding again, 0 when only the end of the grant in progress can tell
// (the caller waits for it).
func (f LeaseFence) Wait(now time.Time) (free bool, wait time.Duration) {
	at := f.FreeAt()
	free = !f.Renewal.Renewing && !now.Before(at)
	if free || f.Renewal.Renewing {
		return free, 0
	}
	return false, at.Sub(now)
}
