package multipath

import (
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/multipath/faultpath"
)

// TestPathRulesKeepTheInjectedClock: the checker's interval, failback and
// flap damping run on the Device's clock. With a clock.Fake, a failed path
// comes back at the first check interval of the fake's time and, failed
// again, not before ReinstateHoldoff of it has passed since it came back;
// the test waits on the Device's events, and no real time need pass.
func TestPathRulesKeepTheInjectedClock(t *testing.T) {
	const tick = DefaultCheckInterval
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	events := make(recorder, 64)
	d, fps, _ := memDevice(t, 2, 1<<20, Config{Clock: fake, OnChange: events.hook})
	defer d.Close()
	fake.WaitArmed(1) // the checker's ticker
	failP0 := func() {
		t.Helper()
		fps[0].SetInjector(failIO)
		if _, err := d.ReadAt(make([]byte, block), 0); err != nil {
			t.Fatal(err)
		}
		wantStates(t, d, "p0=FAIL p1=ACTIVE")
		events.waitFor(t, "p0", Fail) // and every event before it
		fps[0].SetInjector(nil)
	}

	// The first failure comes back at the checker's next tick, the second
	// (a flap) only after the reinstate holdoff: each exactly then.
	for _, back := range []time.Duration{tick, DefaultReinstateHoldoff} {
		failP0()
		fake.Advance(back - time.Nanosecond)
		wantStates(t, d, "p0=FAIL p1=ACTIVE")
		fake.Advance(time.Nanosecond)
		events.waitFor(t, "p0", Active)
		wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
	}
}

// TestAHungPathTimesOutOnTheInjectedClock: a request's IO timeout runs on
// the Device's clock. With a clock.Fake, a write to a path that hangs
// waits until the fake moves IOTimeout on, then fails the path and
// completes on the other.
func TestAHungPathTimesOutOnTheInjectedClock(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, fps, _ := memDevice(t, 2, 1<<20, Config{Clock: fake, IOTimeout: time.Second, CheckInterval: time.Hour})
	defer d.Close()
	defer fps[0].Release()
	fake.WaitArmed(1) // the checker's ticker
	fps[0].SetInjector(faultpath.Always(faultpath.Fault{Hang: true}))
	wrote := make(chan error, 1)
	go func() {
		_, err := d.WriteAt(make([]byte, block), 0)
		wrote <- err
	}()
	armed := make(chan struct{})
	go func() { fake.WaitArmed(2); close(armed) }()
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		t.Fatal("the write armed no IO timeout on the injected clock")
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write to a hung path returned (%v) before its IO timeout", err)
	default:
	}
	fake.Advance(time.Second)
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write outlived its IO timeout on the injected clock")
	}
	wantStates(t, d, "p0=FAIL p1=ACTIVE")
}
