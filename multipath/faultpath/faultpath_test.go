package faultpath

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestFaults pins each fault the injector can choose, on the fake clock.
func TestFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemory(1 << 20)
		p := New(mem.Path("p0"))
		buf := make([]byte, 4096)

		p.SetInjector(Ops(Fault{Err: ErrInjected}, OpWrite))
		if _, err := p.WriteAt(buf, 0); !errors.Is(err, ErrInjected) {
			t.Errorf("write = %v, want ErrInjected", err)
		}
		if _, err := p.ReadAt(buf, 0); err != nil {
			t.Errorf("read = %v, want it let through", err)
		}

		p.SetInjector(Always(Fault{Delay: time.Second}))
		start := time.Now()
		p.Sync()
		if d := time.Since(start); d != time.Second {
			t.Errorf("delayed sync took %s", d)
		}

		p.SetInjector(Always(Fault{Hang: true}))
		done := make(chan error)
		go func() { done <- p.Zero(0, 4096) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("hung zero returned before Release")
		default:
		}
		p.Release()
		if err := <-done; err != nil {
			t.Errorf("released zero = %v", err)
		}
		go func() { done <- p.Sync() }()
		synctest.Wait()
		p.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("hung sync after Close = %v, want ErrClosed", err)
		}
		if p.Injected() != 3 {
			t.Errorf("Injected = %d, want 3: one error and two hangs", p.Injected())
		}
	})
}

func TestScheduleAndRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(NewMemory(1 << 20).Path("p0"))
		start := time.Now()
		p.SetInjector(Flapping(start, 2*time.Second, 3*time.Second))
		buf := make([]byte, 1000)
		for _, c := range []struct {
			at   time.Duration
			fail bool
		}{{0, true}, {1999 * time.Millisecond, true}, {2 * time.Second, false}, {4 * time.Second, false}, {5 * time.Second, true}, {7 * time.Second, false}} {
			time.Sleep(time.Until(start.Add(c.at)))
			_, err := p.ReadAt(buf, 0)
			if (err != nil) != c.fail {
				t.Errorf("at %s: %v, want failing %v", c.at, err, c.fail)
			}
		}

		p.SetInjector(nil)
		p.SetRate(1e6) // 1 MB/s: 1000 bytes a millisecond
		start = time.Now()
		for range 10 {
			p.WriteAt(buf, 0)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Errorf("10 kB at 1 MB/s took %s, want 10ms", d)
		}
	})
}
