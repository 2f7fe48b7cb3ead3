package clock

import (
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fired returns what c holds, without waiting.
func fired(c <-chan time.Time) (time.Time, bool) {
	select {
	case at := <-c:
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestFakeMovesOnlyByAdvance(t *testing.T) {
	f := NewFake(epoch)
	if got := f.Now(); !got.Equal(epoch) {
		t.Fatalf("Now = %v, want %v", got, epoch)
	}
	f.Advance(3 * time.Second)
	if got := f.Since(epoch); got != 3*time.Second {
		t.Fatalf("Since = %v after Advance(3s)", got)
	}
	if got := f.Until(epoch.Add(5 * time.Second)); got != 2*time.Second {
		t.Fatalf("Until = %v, want 2s", got)
	}
}

func TestFakeTimerFiresAtItsDeadline(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(time.Second)
	f.Advance(999 * time.Millisecond)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("the timer fired before its deadline")
	}
	f.Advance(time.Millisecond)
	at, ok := fired(tm.C())
	if !ok || !at.Equal(epoch.Add(time.Second)) {
		t.Fatalf("fired %v at %v, want at %v", ok, at, epoch.Add(time.Second))
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reports it armed")
	}
	if f.Armed() != 0 {
		t.Fatalf("%d armed after the timer fired", f.Armed())
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reports it idle")
	}
	f.Advance(time.Hour)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	tm.Reset(time.Minute)
	f.Advance(time.Minute)
	if at, ok := fired(tm.C()); !ok || !at.Equal(epoch.Add(time.Hour+time.Minute)) {
		t.Fatalf("reset timer: fired %v at %v", ok, at)
	}
	tm.Reset(0)
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("Reset(0) did not fire at once")
	}
}

// TestFakeFiresInDeadlineOrder: one Advance past several deadlines fires
// them in order, each seeing the clock at its own deadline.
func TestFakeFiresInDeadlineOrder(t *testing.T) {
	f := NewFake(epoch)
	var order []time.Duration
	ds := []time.Duration{3 * time.Second, time.Second, 2 * time.Second}
	timers := make([]Timer, len(ds))
	for i, d := range ds {
		timers[i] = f.NewTimer(d)
	}
	f.Advance(5 * time.Second)
	for i, tm := range timers {
		at, ok := fired(tm.C())
		if !ok {
			t.Fatalf("timer %d did not fire", i)
		}
		order = append(order, at.Sub(epoch))
	}
	for i, d := range ds {
		if order[i] != d {
			t.Fatalf("timer %d fired at +%v, want +%v", i, order[i], d)
		}
	}
}

func TestFakeTicker(t *testing.T) {
	f := NewFake(epoch)
	k := f.NewTicker(time.Second)
	defer k.Stop()
	for i := 1; i <= 3; i++ {
		f.Advance(time.Second)
		at, ok := fired(k.C())
		if !ok || !at.Equal(epoch.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("tick %d: %v at %v", i, ok, at)
		}
	}
	// Ticks nobody reads are dropped; the reader sees one, the first.
	f.Advance(3 * time.Second)
	if at, ok := fired(k.C()); !ok || !at.Equal(epoch.Add(4*time.Second)) {
		t.Fatalf("after missed ticks: %v at %v, want the one at +4s", ok, at)
	}
	if _, ok := fired(k.C()); ok {
		t.Fatal("the ticker kept more than one missed tick")
	}
	k.Reset(10 * time.Second)
	f.Advance(9 * time.Second)
	if _, ok := fired(k.C()); ok {
		t.Fatal("ticked before the reset period")
	}
	f.Advance(time.Second)
	if _, ok := fired(k.C()); !ok {
		t.Fatal("no tick at the reset period")
	}
}

// TestFakeWaitArmed: a test learns that the goroutine under test armed its
// timer, and only then advances.
func TestFakeWaitArmed(t *testing.T) {
	f := NewFake(epoch)
	done := make(chan time.Duration)
	go func() {
		start := f.Now()
		tm := f.NewTimer(time.Minute)
		<-tm.C()
		done <- f.Since(start)
	}()
	f.WaitArmed(1)
	f.Advance(time.Minute)
	if waited := <-done; waited != time.Minute {
		t.Fatalf("waited %v of the fake's time, want 1m", waited)
	}
}

func TestRealIsTheTimePackage(t *testing.T) {
	c := Or(nil)
	if d := c.Since(time.Now()); d > time.Second || d < -time.Second {
		t.Fatalf("Real's Since(now) = %v", d)
	}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	k := c.NewTicker(time.Millisecond)
	<-k.C()
	k.Stop()
	f := NewFake(epoch)
	if Or(f) != Clock(f) {
		t.Fatal("Or replaced a clock that was set")
	}
}
