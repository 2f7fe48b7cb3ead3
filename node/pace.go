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

// resyncPace holds the resync back, before its next run, as the volume's
// rate controller says: never above resync_rate (when set), and with at
// most busyRuns in flight while applications write. With no cap set, an
// idle volume resyncs at full speed, unlike DRBD's c-max-rate default.
func (v *Volume) resyncPace(ctx context.Context, began time.Time, sent int64, inFlight func() int) error {
	if rate := int64(v.cfg.ResyncRate); rate > 0 {
		due := began.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
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
