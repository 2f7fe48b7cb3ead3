package node

import (
	"context"
	"time"
)

const (
	// busyWindow: a write this recent makes the volume busy.
	busyWindow = 50 * time.Millisecond
	// busyRuns is how many resync runs may be in flight while the volume
	// is busy (resyncWindow otherwise): application writes keep most of
	// the link and the disks.
	busyRuns = 2
)

// resyncPacer spaces one resync's runs to the volume's resync rate. The
// rate may change while it runs (replctl adjust --resync-rate): the pace
// starts again from that moment, so a cap set late does not stall the
// resync to make up for what went out uncapped, and a cap lifted goes
// at once.
type resyncPacer struct {
	rate   int64
	origin time.Time
	base   int64 // bytes sent at origin
}

// due is when sent bytes may have gone out at rate (zero: now).
func (pc *resyncPacer) due(rate, sent int64, now time.Time) time.Time {
	if pc.origin.IsZero() || rate != pc.rate {
		pc.rate, pc.origin, pc.base = rate, now, sent
	}
	if rate <= 0 {
		return time.Time{}
	}
	return pc.origin.Add(time.Duration(float64(sent-pc.base) / float64(rate) * float64(time.Second)))
}

// resyncPace holds the resync back, before its next run, as the volume's
// rate controller says: never above the resync rate (resync_rate, or as
// adjusted), and with at most busyRuns in flight while applications
// write. With no cap set, an idle volume resyncs at full speed, unlike
// DRBD's c-max-rate default.
func (v *Volume) resyncPace(ctx context.Context, pc *resyncPacer, sent int64, inFlight func() int) error {
	if due := pc.due(v.settings().resyncRate, sent, time.Now()); !due.IsZero() {
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	for inFlight != nil && v.busy() && inFlight() >= busyRuns {
		t := time.NewTimer(time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return nil
}

// busy reports whether an application write started within busyWindow.
func (v *Volume) busy() bool {
	return time.Since(time.Unix(0, v.lastWrite.Load())) < busyWindow
}
