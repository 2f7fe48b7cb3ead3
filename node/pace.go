package node

import (
	"context"
	"reflect"
	"slices"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/session"
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
// adjusted), and with at most busyRuns of flight in flight while
// applications write. With no cap set, an idle volume resyncs at full
// speed, unlike DRBD's c-max-rate default. flight nil: the runs are not
// sent through a window (no busy limit).
func (v *Volume) resyncPace(ctx context.Context, pc *resyncPacer, sent int64, flight *runsInFlight) error {
	if due := pc.due(v.settings().resyncRate, sent, v.clock.Now()); !due.IsZero() {
		if d := v.clock.Until(due); d > 0 && !waitOut(ctx, v.clock, d) {
			return ctx.Err()
		}
	}
	// While busy, wait for a run to complete or for the volume to be idle
	// (busyWindow after the last write began), whichever comes first.
	for flight != nil && v.busy() && flight.count() >= busyRuns {
		idle := v.clock.Until(time.Unix(0, v.counters.lastWrite.Load()).Add(busyWindow))
		if err := flight.waitOne(ctx, v.clock, idle); err != nil {
			return err
		}
	}
	return nil
}

// busy reports whether an application write started within busyWindow.
func (v *Volume) busy() bool {
	return v.clock.Since(time.Unix(0, v.counters.lastWrite.Load())) < busyWindow
}

// runsInFlight are the runs a resync sent through its window (count says
// how many hold a slot): its pacer waits for one of them to complete,
// which frees its slot BEFORE its Done is closed. It belongs to the
// resync's goroutine.
type runsInFlight struct {
	count func() int
	runs  []*session.Pending
}

// add records a run sent. The completed runs are dropped now and then:
// no more than a window's worth is kept.
func (f *runsInFlight) add(pd *session.Pending) {
	if len(f.runs) >= 2*resyncWindow {
		f.prune()
	}
	f.runs = append(f.runs, pd)
}

// prune drops the runs that completed.
func (f *runsInFlight) prune() {
	f.runs = slices.DeleteFunc(f.runs, func(pd *session.Pending) bool {
		select {
		case <-pd.Done():
			return true
		default:
			return false
		}
	})
}

// waitOne waits until one of the runs not yet completed completes, or d
// passed on clk; ctx's error if it ended first.
func (f *runsInFlight) waitOne(ctx context.Context, clk clock.Clock, d time.Duration) error {
	f.prune()
	if d <= 0 {
		return ctx.Err()
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	cases := make([]reflect.SelectCase, 0, len(f.runs)+2)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C())})
	for _, pd := range f.runs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(pd.Done())})
	}
	if chosen, _, _ := reflect.Select(cases); chosen == 0 {
		return ctx.Err()
	}
	return nil
}
