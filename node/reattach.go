package node

import (
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// reattachPolicy says when a detached disk is probed and when probes that
// pass may put it back in service. It is the rule of reattachState, a pure
// function of the times it is given; reattachLoop (detach.go) drives it
// on a clock.
//
// The disk is held out as md holds a faulty member and ZFS a faulted
// vdev: until it is shown to work where it failed, and it must go on
// working for a while (Stable), as dm-multipath's path checker holds a
// path back with delay_watch_checks. Probes that keep failing back off
// exponentially, so that a dead disk costs a probe now and then, not a
// flood of IO and log lines. A disk that fails again soon after it was put
// back (within FlapWindow) flapped: like dm-multipath's marginal paths, it
// is held out longer each time (its first wait and Stable double per
// flap).
type reattachPolicy struct {
	// Probe is the wait before the first probe after a detach, and between
	// the probes of a disk that passes them.
	Probe time.Duration
	// MaxBackoff caps the wait between failing probes (each doubles it).
	MaxBackoff time.Duration
	// Stable is how long probes must pass in a row before the disk is put
	// back.
	Stable time.Duration
	// MaxStable caps Stable as it grows with flaps.
	MaxStable time.Duration
	// FlapWindow: a disk that fails again within this long after it was
	// put back flapped.
	FlapWindow time.Duration
	// LogEvery: once the back-off is at MaxBackoff, a failing probe is
	// logged again at most this often (each lower level is logged once).
	LogEvery time.Duration
	// clock is the loop's (nil: the volume's); the rule itself is given
	// the times.
	clock clock.Clock
}

// defaultReattachPolicy: a repaired disk is back within MaxBackoff plus
// Stable (19 s) however long it failed; one that fails costs a probe every
// 16 s once the back-off is at its longest, and a line in the log every
// 10 minutes.
var defaultReattachPolicy = reattachPolicy{
	Probe:      time.Second,
	MaxBackoff: 16 * time.Second,
	Stable:     3 * time.Second,
	MaxStable:  5 * time.Minute,
	FlapWindow: 5 * time.Minute,
	LogEvery:   10 * time.Minute,
}

// orDefault fills the zero fields of p from defaultReattachPolicy.
func (p reattachPolicy) orDefault() reattachPolicy {
	d := defaultReattachPolicy
	set := func(x *time.Duration, def time.Duration) {
		if *x <= 0 {
			*x = def
		}
	}
	set(&p.Probe, d.Probe)
	set(&p.MaxBackoff, d.MaxBackoff)
	set(&p.Stable, d.Stable)
	set(&p.MaxStable, d.MaxStable)
	set(&p.FlapWindow, d.FlapWindow)
	set(&p.LogEvery, d.LogEvery)
	return p
}

// reattachState is one volume's probing of its detached disk. Its owner
// (reattachLoop) calls Detached when the disk leaves service, Probed
// after each probe, AttachFailed when the copy back of a disk being put
// back fails, and Attached once it is back.
type reattachState struct {
	p reattachPolicy
	// failures: probes failed since the detach. A probe that passes does
	// not forget them: a disk whose probes pass and fail by turns backs
	// off as one that fails them all.
	failures int
	// passingSince: when the probes that pass in a row began (zero when
	// the last one failed).
	passingSince time.Time
	// flaps: the times the disk failed again within FlapWindow of being
	// put back.
	flaps int
	// attachedAt: when the disk was last put back (zero: never).
	attachedAt time.Time
	// loggedWait is the longest back-off logged in this detach (zero:
	// none), loggedAt when it was last logged.
	loggedWait time.Duration
	loggedAt   time.Time
}

// reattachVerdict is what to do after a probe.
type reattachVerdict struct {
	// Attach: the disk has passed its probes for long enough; put it back.
	Attach bool
	// Wait is how long until the next probe (when not Attach).
	Wait time.Duration
	// Log: say in the log that the probe failed: the first failure with
	// this back-off, or LogEvery once it is at MaxBackoff.
	Log bool
}

func newReattachState(p reattachPolicy) *reattachState {
	return &reattachState{p: p.orDefault()}
}

// Detached starts a detach at now and returns the wait before the first
// probe. A disk that was put back less than FlapWindow ago flapped.
func (s *reattachState) Detached(now time.Time) time.Duration {
	if !s.attachedAt.IsZero() && now.Sub(s.attachedAt) < s.p.FlapWindow {
		s.flaps++
	}
	s.failures, s.passingSince, s.loggedWait, s.loggedAt = 0, time.Time{}, 0, time.Time{}
	return s.backoff(0)
}

// Probed takes the result of a probe made at now.
func (s *reattachState) Probed(now time.Time, ok bool) reattachVerdict {
	if !ok {
		s.passingSince = time.Time{}
		s.failures++
		v := reattachVerdict{Wait: s.backoff(s.failures)}
		switch {
		case v.Wait > s.loggedWait:
			v.Log = true
		case v.Wait >= s.p.MaxBackoff && now.Sub(s.loggedAt) >= s.p.LogEvery:
			v.Log = true
		}
		if v.Log {
			s.loggedWait, s.loggedAt = v.Wait, now
		}
		return v
	}
	if s.passingSince.IsZero() {
		s.passingSince = now
	}
	stable := s.stable()
	good := now.Sub(s.passingSince)
	if good >= stable {
		return reattachVerdict{Attach: true}
	}
	return reattachVerdict{Wait: min(s.p.Probe, stable-good)}
}

// AttachFailed: the disk passed its probes but failed while it was being
// put back (the copy back of what it missed, or an IO then). It flapped;
// the verdict is a failed probe's.
func (s *reattachState) AttachFailed(now time.Time) reattachVerdict {
	s.flaps++
	return s.Probed(now, false)
}

// Attached: the disk is back in service since now.
func (s *reattachState) Attached(now time.Time) { s.attachedAt = now }

// Flaps is how many times the disk failed again soon after being put
// back.
func (s *reattachState) Flaps() int { return s.flaps }

// StableFor is how long probes must now pass in a row.
func (s *reattachState) StableFor() time.Duration { return s.stable() }

// backoff is the wait after n failures in a row: Probe, doubled for each
// failure and each flap, at most MaxBackoff.
func (s *reattachState) backoff(n int) time.Duration {
	return doubled(s.p.Probe, n+s.flaps, s.p.MaxBackoff)
}

func (s *reattachState) stable() time.Duration {
	return doubled(s.p.Stable, s.flaps, s.p.MaxStable)
}

// doubled is d doubled n times, at most limit.
func doubled(d time.Duration, n int, limit time.Duration) time.Duration {
	for range n {
		if d >= limit {
			break
		}
		d *= 2
	}
	return min(d, limit)
}
