package node

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
)

// The waits of package node are on events: a state's change wakes its
// waiters, and nothing looks at a state again on a timer of its own. The
// tests run in a synctest bubble: its time moves only when every goroutine
// of the bubble is blocked, so "released with no time passing" means woken
// by the change itself, not found by a later poll.

// released reports what a waiter returned, if it returned yet.
func released[T any](c <-chan T) (T, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		var zero T
		return zero, false
	}
}

// TestWaitUntilLooksAgainOnlyAtAChange: waitUntil looks at its condition
// when it begins and at each notified change, not on a timer: a second of
// waiting with no change costs no look, and the change that makes the
// condition hold ends the wait with no time passing.
func TestWaitUntilLooksAgainOnlyAtAChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c changes
		var looks int
		state := false
		done := make(chan bool, 1)
		go func() {
			done <- waitUntil(t.Context(), clock.Real(), time.Minute, &c, func() bool { looks++; return state })
		}()
		synctest.Wait()
		if looks != 1 {
			t.Fatalf("looked %d times before any change, want once", looks)
		}
		time.Sleep(time.Second) // the bubble's time: no goroutine runs meanwhile but timers'
		synctest.Wait()
		if looks != 1 {
			t.Fatalf("looked %d times in a second without a change, want once: it polls", looks)
		}
		c.notify() // a change that does not make the condition hold
		synctest.Wait()
		if _, ok := released(done); ok || looks != 2 {
			t.Fatalf("after a change: returned %v, looked %d times; want waiting, twice", ok, looks)
		}
		began := time.Now()
		state = true
		c.notify()
		synctest.Wait()
		got, ok := released(done)
		if !ok || !got {
			t.Fatalf("the change that makes the condition hold: returned %v (%v), want true at once", ok, got)
		}
		if d := time.Since(began); d != 0 {
			t.Fatalf("returned %v after the change, want at once", d)
		}
	})
}

// TestWaitUntilGivesUpAtItsTimeoutOrItsContext: with no change, waitUntil
// returns false exactly at its timeout on its clock, or when its context
// ends; a condition already true returns at once.
func TestWaitUntilGivesUpAtItsTimeoutOrItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c changes
		began := time.Now()
		if waitUntil(t.Context(), clock.Real(), 5*time.Second, &c, func() bool { return false }) {
			t.Fatal("a condition that never held was reported held")
		}
		if d := time.Since(began); d != 5*time.Second {
			t.Fatalf("gave up after %v, want the timeout, 5s", d)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		began = time.Now()
		if waitUntil(ctx, clock.Real(), time.Minute, &c, func() bool { return false }) {
			t.Fatal("held after the context ended")
		}
		if d := time.Since(began); d != time.Second {
			t.Fatalf("gave up %v after, want when the context ended (1s)", d)
		}
		began = time.Now()
		if !waitUntil(t.Context(), clock.Real(), time.Minute, &c, func() bool { return true }) || time.Since(began) != 0 {
			t.Fatal("a condition that holds did not return true at once")
		}
	})
}

// TestWaitUntilLooksAgainAtItsWakes: a condition that counts the time
// waited (a switchover's link grace) is looked at again when that time
// comes, with no change notified.
func TestWaitUntilLooksAgainAtItsWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c changes
		began := time.Now()
		var looks int
		ok := waitUntil(t.Context(), clock.Real(), time.Minute, &c, func() bool {
			looks++
			return time.Since(began) >= replication.SwitchoverLinkGrace
		}, replication.SwitchoverLinkGrace)
		if !ok || time.Since(began) != replication.SwitchoverLinkGrace || looks != 2 {
			t.Fatalf("returned %v after %v and %d looks, want true at the grace (%v) on the second look",
				ok, time.Since(began), looks, replication.SwitchoverLinkGrace)
		}
	})
}

// TestWaitUntilOnAFakeClock: the timeout is the injected clock's: a test
// that advances a clock.Fake ends the wait, whatever the real time.
func TestWaitUntilOnAFakeClock(t *testing.T) {
	fc := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var c changes
	done := make(chan bool, 1)
	go func() { done <- waitUntil(t.Context(), fc, time.Hour, &c, func() bool { return false }) }()
	fc.WaitArmed(1)
	fc.Advance(time.Hour)
	if <-done {
		t.Fatal("a condition that never held was reported held at the fake's timeout")
	}
}
