package node

import (
	"slices"
	"testing"
	"time"
)

// The rule that puts a detached disk back (reattachState), driven with the
// times a clock would give it: the default policy, 1 s to the first probe,
// failing probes doubling the wait up to 16 s, 3 s of passing probes
// before a re-attach, and a disk that fails again within 5 minutes of its
// re-attach held out twice as long each time.

// probeRun is what a detached disk went through: when it was probed, which
// failures were logged, and when it was put back (zero: not within the
// run).
type probeRun struct {
	probes   []time.Duration // since the detach
	logged   []time.Duration
	attached time.Duration
}

// runProbes drives s from a detach at t0 until it attaches the disk or
// until limit, with works saying whether a probe at a time since t0
// passes.
func runProbes(s *reattachState, t0 time.Time, limit time.Duration, works func(since time.Duration) bool) probeRun {
	var r probeRun
	at := s.Detached(t0)
	for at <= limit {
		r.probes = append(r.probes, at)
		v := s.Probed(t0.Add(at), works(at))
		if v.Attach {
			r.attached = at
			s.Attached(t0.Add(at))
			return r
		}
		if v.Log {
			r.logged = append(r.logged, at)
		}
		at += v.Wait
	}
	return r
}

func worksNever(time.Duration) bool  { return false }
func worksAlways(time.Duration) bool { return true }

// byTurns passes the first probe, fails the second, and so on.
func byTurns() func(time.Duration) bool {
	n := 0
	return func(time.Duration) bool {
		n++
		return n%2 == 1
	}
}

func seconds(ss ...float64) []time.Duration {
	var out []time.Duration
	for _, s := range ss {
		out = append(out, time.Duration(s*float64(time.Second)))
	}
	return out
}

func TestADiskThatKeepsFailingIsProbedLessAndLessOftenAndLoggedOncePerBackoff(t *testing.T) {
	s := newReattachState(reattachPolicy{})
	r := runProbes(s, time.Unix(0, 0), 2*time.Minute, worksNever)
	// 1 s, then waits of 2, 4, 8 and 16 s, then 16 s for good.
	want := seconds(1, 3, 7, 15, 31, 47, 63, 79, 95, 111)
	if !slices.Equal(r.probes, want) {
		t.Fatalf("probes at %v, want %v", r.probes, want)
	}
	// Logged when the back-off grows (2, 4, 8, 16 s), then no more.
	if want := seconds(1, 3, 7, 15); !slices.Equal(r.logged, want) {
		t.Fatalf("failures logged at %v, want %v", r.logged, want)
	}
	if r.attached != 0 {
		t.Fatalf("a disk that fails every probe was put back at %v", r.attached)
	}
	// At the longest back-off a failure is logged again after LogEvery.
	t0 := time.Unix(0, 0)
	if v := s.Probed(t0.Add(15*time.Second+10*time.Minute), false); !v.Log || v.Wait != 16*time.Second {
		t.Fatalf("10 minutes after the last line: %+v, want logged again, 16 s to the next probe", v)
	}
	if v := s.Probed(t0.Add(15*time.Second+10*time.Minute+16*time.Second), false); v.Log {
		t.Fatalf("16 s after that line: logged again")
	}
}

func TestADiskIsPutBackOnlyOnceItsProbesPassForStable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		works    func(time.Duration) bool
		probes   []time.Duration
		attached time.Duration
	}{
		{"works at the first probe: 3 s of probes each second", worksAlways,
			seconds(1, 2, 3, 4), 4 * time.Second},
		{"passes once, then fails: the 3 s start again after the back-off", func(at time.Duration) bool { return at != 2*time.Second },
			// fail at 2 s → wait 2 s; passing from 4 s on.
			seconds(1, 2, 4, 5, 6, 7), 7 * time.Second},
		{"fails for 20 s, then works: back within the longest back-off and 3 s", func(at time.Duration) bool { return at > 20*time.Second },
			seconds(1, 3, 7, 15, 31, 32, 33, 34), 34 * time.Second},
		{"passes and fails by turns: backs off as a disk that fails them all", byTurns(),
			seconds(1, 2, 4, 5, 9, 10, 18, 19, 35, 36, 52, 53), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runProbes(newReattachState(reattachPolicy{}), time.Unix(0, 0), time.Minute, tc.works)
			if !slices.Equal(r.probes, tc.probes) || r.attached != tc.attached {
				t.Fatalf("probes at %v, put back at %v; want %v and %v", r.probes, r.attached, tc.probes, tc.attached)
			}
		})
	}
}

func TestARepairedDiskIsBackWithinTheLongestBackoffAndStableHoweverLongItFailed(t *testing.T) {
	p := defaultReattachPolicy
	for _, failedFor := range []time.Duration{0, 500 * time.Millisecond, 10 * time.Second, time.Hour, 24 * time.Hour} {
		r := runProbes(newReattachState(reattachPolicy{}), time.Unix(0, 0), 48*time.Hour, func(at time.Duration) bool { return at >= failedFor })
		if r.attached == 0 {
			t.Fatalf("repaired after %v: worksNever put back", failedFor)
		}
		if late := r.attached - failedFor; late > p.MaxBackoff+p.Stable+p.Probe {
			t.Errorf("repaired after %v: put back %v later, want at most %v", failedFor, late, p.MaxBackoff+p.Stable+p.Probe)
		}
		if r.attached-failedFor < p.Stable {
			t.Errorf("repaired after %v: put back after %v of health, want at least %v", failedFor, r.attached-failedFor, p.Stable)
		}
	}
}

func TestADiskThatFlapsIsHeldOutLongerEachTime(t *testing.T) {
	s := newReattachState(reattachPolicy{})
	t0 := time.Unix(0, 0)
	r := runProbes(s, t0, time.Hour, worksAlways)
	if r.attached != 4*time.Second {
		t.Fatalf("first detach: put back at %v, want 4s", r.attached)
	}
	// Fails again 10 s after it was put back: a flap. The first probe
	// waits 2 s, and it must pass for 6 s.
	t1 := t0.Add(14 * time.Second)
	r = runProbes(s, t1, time.Hour, worksAlways)
	if want := seconds(2, 3, 4, 5, 6, 7, 8); !slices.Equal(r.probes, want) || r.attached != 8*time.Second {
		t.Fatalf("after one flap: probes at %v, put back at %v; want %v and 8s", r.probes, r.attached, want)
	}
	// Again 10 s later: 4 s to the first probe, 12 s of passing probes.
	t2 := t1.Add(18 * time.Second)
	r = runProbes(s, t2, time.Hour, worksAlways)
	if r.probes[0] != 4*time.Second || r.attached != 16*time.Second || s.Flaps() != 2 {
		t.Fatalf("after two flaps: first probe at %v, put back at %v, %d flaps; want 4s, 16s, 2", r.probes[0], r.attached, s.Flaps())
	}
	// A failure long after the last re-attach is no flap: the hold stays
	// what the flaps so far made it, and grows no more.
	t3 := t2.Add(16*time.Second + time.Hour)
	r = runProbes(s, t3, time.Hour, worksAlways)
	if s.Flaps() != 2 || r.probes[0] != 4*time.Second {
		t.Fatalf("a detach an hour later: %d flaps, first probe at %v; want 2 and 4s", s.Flaps(), r.probes[0])
	}
}

func TestAReattachThatFailsBacksOffAsAFlap(t *testing.T) {
	s := newReattachState(reattachPolicy{})
	t0 := time.Unix(0, 0)
	s.Detached(t0)
	for _, at := range seconds(1, 2, 3) {
		if v := s.Probed(t0.Add(at), true); v.Attach {
			t.Fatalf("put back at %v, before 3 s of passing probes", at)
		}
	}
	if v := s.Probed(t0.Add(4*time.Second), true); !v.Attach {
		t.Fatalf("not put back after 3 s of passing probes: %+v", v)
	}
	// The copy back fails: the next probe waits as after a failure of a
	// disk that flapped once (1 s, doubled for the failure and the flap).
	v := s.AttachFailed(t0.Add(5 * time.Second))
	if v.Attach || v.Wait != 4*time.Second || !v.Log || s.StableFor() != 6*time.Second {
		t.Fatalf("after a failed re-attach: %+v, stable for %v; want a wait of 4s, logged, 6s of passing probes", v, s.StableFor())
	}
}
