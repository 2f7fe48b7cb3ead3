package multipath

import (
	"fmt"
	"sync"
	"time"
)

// checker reads the label of every path that is not Healthy each
// CheckInterval, reinstates the paths that answer with the LUN's UUID,
// and ends no-path queueing when it has lasted NoPathRetry intervals.
func (d *Device) checker() {
	defer close(d.checked)
	t := d.cfg.Clock.NewTicker(d.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-d.quit:
			return
		case <-t.C():
			d.check()
		}
	}
}

func (d *Device) check() {
	d.mu.Lock()
	var targets []*pathState
	for i, ps := range d.paths {
		// A probe still stuck on a hung path is not doubled.
		if d.views[i].Health != Healthy && !ps.operatorFailed && !ps.probing {
			ps.probing = true
			targets = append(targets, ps)
		}
	}
	d.mu.Unlock()

	results := make([]error, len(targets))
	var wg sync.WaitGroup
	for k, ps := range targets {
		wg.Go(func() { results[k] = d.probeLabel(ps) })
	}
	wg.Wait()

	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.cfg.Clock.Now()
	for k, ps := range targets {
		d.applyProbe(ps, results[k], now)
	}
	d.settle(now)
	queued := time.Duration(d.cfg.NoPathRetry) * d.cfg.CheckInterval
	if d.queueing && !d.noPathSince.IsZero() && now.Sub(d.noPathSince) >= queued {
		d.queueing = false // queued IO now fails with ErrNoPath
		d.broadcast()
	}
}

// probe reads ps's label, within IOTimeout.
func (d *Device) probe(ps *pathState) (UUID, error) {
	r := d.getRequest(opProbe, ps, d.labelOff, LabelSize)
	r.bufPtr = getBuffer(LabelSize)
	r.buf = *r.bufPtr
	if !d.attempt(r) {
		return UUID{}, fmt.Errorf("label read timed out after %s", d.cfg.IOTimeout)
	}
	u, err := r.uuid, r.err
	d.putRequest(r)
	return u, err
}

func (d *Device) probeDone(ps *pathState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ps.probing = false
}

// probeLabel checks that ps answers and still reaches this LUN (a LUN
// remapped behind a path must not come back: multipath-tools'
// recheck_wwid lesson).
func (d *Device) probeLabel(ps *pathState) error {
	u, err := d.probe(ps)
	if err != nil {
		return err
	}
	if u != d.uuid {
		return fmt.Errorf("%w: it now carries LUN %s, not %s", ErrLabelMismatch, u, d.uuid)
	}
	return nil
}

// applyProbe acts on one probe's result: failback, and flap damping.
func (d *Device) applyProbe(ps *pathState, err error, now time.Time) {
	if ps.operatorFailed {
		return // failed by the operator while the probe ran
	}
	switch d.views[ps.index].Health {
	case Standby:
		if err != nil {
			d.setHealth(ps, Failed, "label probe: "+err.Error(), now)
			return
		}
		if fb := time.Duration(d.cfg.Failback); fb > 0 && now.Sub(ps.healthySince) >= fb {
			d.setHealth(ps, Healthy, fmt.Sprintf("failed back after %s of health", fb), now)
		}
	case Failed:
		if err != nil {
			ps.reason = "label probe: " + err.Error()
			return
		}
		alone := !d.anyUsable() // then a flapping path beats no path
		if since := now.Sub(ps.reinstatedAt); !alone && !ps.reinstatedAt.IsZero() && since < d.cfg.ReinstateHoldoff {
			ps.reason = fmt.Sprintf("working again; flap damping holds it back for %s more (one reinstatement per %s)",
				d.cfg.ReinstateHoldoff-since, d.cfg.ReinstateHoldoff)
			return
		}
		switch {
		case alone || d.cfg.Failback == FailbackImmediate:
			d.setHealth(ps, Healthy, "label probe succeeded", now)
		case d.cfg.Failback < 0:
			d.setHealth(ps, Standby, "working again; waits for a manual restore (failback manual)", now)
		default:
			d.setHealth(ps, Standby, fmt.Sprintf("working again; fails back after %s of health", time.Duration(d.cfg.Failback)), now)
		}
	}
}
