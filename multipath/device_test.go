package multipath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/replvol/replvol/multipath/faultpath"
)

const block = 4096

// memDevice opens a Device over n fault paths p0..p{n-1} to one labelled
// in-memory LUN of size bytes.
func memDevice(t testing.TB, n int, size int64, cfg Config) (*Device, []*faultpath.Path, *faultpath.Memory) {
	t.Helper()
	mem := faultpath.NewMemory(size)
	fps := make([]*faultpath.Path, n)
	paths := make([]Path, n)
	for i := range fps {
		fps[i] = faultpath.New(mem.Path("p" + string(rune('0'+i))))
		paths[i] = fps[i]
	}
	if err := WriteLabel(paths[0], NewUUID()); err != nil {
		t.Fatal(err)
	}
	d, err := Open(paths, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, fps, mem
}

var failIO = faultpath.Always(faultpath.Fault{Err: syscall.EIO})

// advance lets d of a synctest bubble's virtual time pass, then waits until
// every goroutine of the bubble is durably blocked: what the timers that
// fell due did is done. Call it only inside synctest.Test.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// recorder collects a Device's events for a test to wait on.
type recorder chan Event

func (r recorder) hook(e Event) { r <- e }

// waitFor reads events until path reaches state.
func (r recorder) waitFor(t *testing.T, path string, state PathState) {
	t.Helper()
	for e := range r {
		if e.Path == path && e.State == state {
			return
		}
	}
}

func states(d *Device) string {
	var b strings.Builder
	for _, p := range d.Paths() {
		b.WriteString(p.Name + "=" + p.State.String() + " ")
	}
	return strings.TrimSpace(b.String())
}

func wantStates(t *testing.T, d *Device, want string) {
	t.Helper()
	if got := states(d); got != want {
		t.Errorf("states %q, want %q", got, want)
		for _, p := range d.Paths() {
			t.Logf("%s: %s", p.Name, p.Reason)
		}
	}
}

// fill writes the pattern of (owner, block, version) into b.
func fill(b []byte, owner, blk int, version uint32) {
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(owner)<<48|uint64(blk)<<24|uint64(version)<<4|uint64(i&15))
	}
	if version == 0 {
		clear(b)
	}
}

// TestInjectedFailuresNeverSurface pins the core promise: 1,000 path
// failures, one path at a time, under a concurrent read/write/zero/sync
// verify workload on two handles of one real file, with the policy
// changed online every 100 failures. No error reaches the caller, every
// read returns the last write, and the file holds exactly that at the end.
func TestInjectedFailuresNeverSurface(t *testing.T) {
	const (
		failures = 1000
		workers  = 4
		blocks   = 64 // per worker
	)
	size := int64(workers*blocks*block + LabelSize)
	file := newFile(t, size)
	events := make(recorder, 1<<14)
	var failing atomic.Int32
	failing.Store(-1)
	var paths []Path
	for i := range 2 {
		fp := faultpath.New(openFilePath(t, "p"+string(rune('0'+i)), file))
		fp.SetInjector(faultpath.InjectorFunc(func(faultpath.Op, int64, int64) faultpath.Fault {
			if failing.Load() == int32(i) {
				return faultpath.Fault{Err: syscall.EIO}
			}
			return faultpath.Fault{}
		}))
		paths = append(paths, fp)
	}
	d, err := Open(paths, Config{Label: true, OnChange: events.hook})
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	progress := make(chan struct{}, 1) // a worker finished an IO
	var wg sync.WaitGroup
	var surfaced, reads atomic.Int64
	models := make([][]uint32, workers)
	for w := range workers {
		models[w] = make([]uint32, blocks)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			buf, want := make([]byte, block), make([]byte, block)
			model := models[w]
			for {
				select {
				case <-stop:
					return
				default:
				}
				blk := rng.IntN(blocks)
				off := int64((w*blocks + blk) * block)
				var err error
				switch r := rng.IntN(100); {
				case r < 45:
					model[blk]++
					fill(buf, w, blk, model[blk])
					_, err = d.WriteAt(buf, off)
				case r < 85:
					if _, err = d.ReadAt(buf, off); err == nil {
						reads.Add(1)
						fill(want, w, blk, model[blk])
						if !bytes.Equal(buf, want) {
							t.Errorf("worker %d block %d: read is not version %d", w, blk, model[blk])
						}
					}
				case r < 95:
					model[blk] = 0
					err = d.Zero(off, block)
				default:
					err = d.Sync()
				}
				if err != nil {
					surfaced.Add(1)
					t.Errorf("worker %d: %v", w, err)
				}
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		})
	}

	policies := []Policy{RoundRobin, QueueLength, ServiceTime, ActiveRead, Failover}
	for i := range failures {
		if i%100 == 0 {
			if err := d.SetPolicy(policies[i/100%len(policies)]); err != nil {
				t.Fatal(err)
			}
		}
		k := i % 2
		if p := d.Policy(); p == Failover {
			for j, ps := range d.Paths() {
				if ps.Preferred {
					k = j // only the preferred path carries IO
				}
			}
		}
		name := d.paths[k].name
		failing.Store(int32(k))
		events.waitFor(t, name, Fail)
		failing.Store(-1)
		if err := d.Restore(name); err != nil {
			t.Fatal(err)
		}
		for range 8 { // let IO run on both paths before the next failure
			<-progress
		}
	}
	close(stop)
	wg.Wait()

	var injected uint64
	for _, p := range paths {
		injected += p.(*faultpath.Path).Injected()
	}
	t.Logf("%d path failures, %d injected errors, %d verified reads, %d errors surfaced", failures, injected, reads.Load(), surfaced.Load())
	if injected < failures {
		t.Errorf("%d injected errors, want at least %d", injected, failures)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, block)
	for w, model := range models {
		for blk, version := range model {
			fill(want, w, blk, version)
			off := (w*blocks + blk) * block
			if !bytes.Equal(data[off:off+block], want) {
				t.Fatalf("file: worker %d block %d is not version %d", w, blk, version)
			}
		}
	}
}

// TestTargetErrorsSurface pins the other side: an error the LUN itself
// gives (no space) is the same on every path, so it reaches the caller
// at once and fails no path.
func TestTargetErrorsSurface(t *testing.T) {
	d, fps, _ := memDevice(t, 2, 1<<20, Config{})
	defer d.Close()
	fps[0].SetInjector(faultpath.Ops(faultpath.Fault{Err: syscall.ENOSPC}, faultpath.OpWrite))
	if _, err := d.WriteAt(make([]byte, block), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write = %v, want ENOSPC", err)
	}
	wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
}

// TestHungPathStallsOneTimeout pins that a path that stops answering
// delays an IO by the IO timeout and no more (+100 ms of slack), that
// later IOs do not wait for it, and that an abandoned write lands the
// bytes it was given even when the caller reuses its buffer.
func TestHungPathStallsOneTimeout(t *testing.T) {
	t.Run("default timeout, fake clock", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, fps, mem := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			defer fps[0].Release()
			fps[0].SetInjector(faultpath.Always(faultpath.Fault{Hang: true}))

			buf := make([]byte, block)
			fill(buf, 1, 0, 1)
			start := time.Now()
			if _, err := d.WriteAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if stall := time.Since(start); stall < DefaultIOTimeout || stall > DefaultIOTimeout+100*time.Millisecond {
				t.Errorf("hung path stalled the write %s, want the %s timeout", stall, DefaultIOTimeout)
			}
			wantStates(t, d, "p0=FAIL p1=ACTIVE")
			if r := d.Paths()[0].Reason; !strings.Contains(r, "timed out") {
				t.Errorf("reason %q", r)
			}
			start = time.Now()
			if _, err := d.ReadAt(make([]byte, block), 0); err != nil || time.Since(start) != 0 {
				t.Errorf("next read: %v after %s, want at once", err, time.Since(start))
			}

			// The caller reuses its buffer; then the hung write completes.
			want := bytes.Clone(buf)
			clear(buf)
			fps[0].SetInjector(nil)
			fps[0].Release()
			synctest.Wait()
			got := make([]byte, block)
			mem.ReadAt(got, 0)
			if !bytes.Equal(got, want) {
				t.Error("the abandoned write landed other bytes than it was given")
			}
		})
	})
	t.Run("short timeout, wall clock", func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		d, fps, _ := memDevice(t, 2, 1<<20, Config{IOTimeout: timeout, Policy: RoundRobin, RRMinIO: 1})
		defer d.Close()
		defer fps[1].Release()
		fps[1].SetInjector(faultpath.Always(faultpath.Fault{Hang: true}))
		buf := make([]byte, block)
		for range 2 { // one of two reads goes to p1
			start := time.Now()
			if _, err := d.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if stall := time.Since(start); stall > timeout+100*time.Millisecond {
				t.Errorf("read stalled %s, want at most %s", stall, timeout+100*time.Millisecond)
			}
		}
		wantStates(t, d, "p0=ACTIVE p1=FAIL")
	})
}

// TestCheckerRestoresPaths pins the checker: a failed path whose label
// reads again is restored per failback, and a flapping path comes back
// at most once a minute.
func TestCheckerRestoresPaths(t *testing.T) {
	const tick = DefaultCheckInterval
	// failP0 fails p0 by one read and lets it work again.
	failP0 := func(t *testing.T, d *Device, fps []*faultpath.Path) {
		t.Helper()
		fps[0].SetInjector(failIO)
		if _, err := d.ReadAt(make([]byte, block), 0); err != nil {
			t.Fatal(err)
		}
		wantStates(t, d, "p0=FAIL p1=ACTIVE")
		fps[0].SetInjector(nil)
	}
	// at lets the bubble's time run until just after the tick at offset
	// from start.
	at := func(start time.Time, offset time.Duration) {
		advance(time.Until(start.Add(offset)))
	}

	t.Run("failback immediate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, _ := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			failP0(t, d, fps)
			at(start, tick)
			wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
		})
	})
	t.Run("failback manual", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, _ := memDevice(t, 2, 1<<20, Config{Failback: FailbackManual})
			defer d.Close()
			failP0(t, d, fps)
			at(start, 10*tick)
			wantStates(t, d, "p0=PASSIVE p1=ACTIVE")
			ios := d.Paths()[0].IOs
			d.ReadAt(make([]byte, block), 0)
			if d.Paths()[0].IOs != ios {
				t.Error("a path waiting for manual failback carried IO")
			}
			if err := d.Restore("p0"); err != nil {
				t.Fatal(err)
			}
			wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
		})
	})
	t.Run("failback after 30s of health", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, _ := memDevice(t, 2, 1<<20, Config{Failback: Failback(30 * time.Second)})
			defer d.Close()
			failP0(t, d, fps)
			at(start, tick) // healthy from here
			wantStates(t, d, "p0=PASSIVE p1=ACTIVE")
			at(start, tick+30*time.Second-time.Millisecond)
			wantStates(t, d, "p0=PASSIVE p1=ACTIVE")
			at(start, tick+30*time.Second)
			wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
		})
	})
	t.Run("a path failing while it waits for failback fails again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, _ := memDevice(t, 2, 1<<20, Config{Failback: Failback(30 * time.Second)})
			defer d.Close()
			failP0(t, d, fps)
			at(start, tick)
			fps[0].SetInjector(failIO)
			at(start, 2*tick)
			wantStates(t, d, "p0=FAIL p1=ACTIVE")
		})
	})
	t.Run("flap damping: one reinstatement a minute", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, _ := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			failP0(t, d, fps)
			at(start, tick) // first reinstatement, at 5 s
			wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
			failP0(t, d, fps)
			at(start, tick+time.Minute-time.Millisecond)
			wantStates(t, d, "p0=FAIL p1=ACTIVE")
			if r := d.Paths()[0].Reason; !strings.Contains(r, "flap damping") {
				t.Errorf("reason %q, want it to say flap damping", r)
			}
			at(start, tick+time.Minute)
			wantStates(t, d, "p0=ACTIVE p1=PASSIVE")
		})
	})
	t.Run("an operator-failed path stays failed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, _, _ := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			if err := d.Fail("p0"); err != nil {
				t.Fatal(err)
			}
			at(start, 10*tick)
			wantStates(t, d, "p0=FAIL p1=ACTIVE")
		})
	})
	t.Run("a path that now reaches another LUN stays failed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			d, fps, mem := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			failP0(t, d, fps)
			mem.WriteAt(EncodeLabel(NewUUID()), d.labelOff) // the LUN behind the paths was remapped
			at(start, tick)
			wantStates(t, d, "p0=FAIL p1=ACTIVE")
			if r := d.Paths()[0].Reason; !strings.Contains(r, "another LUN") {
				t.Errorf("reason %q", r)
			}
		})
	})
}

// TestNoPathQueues pins no-path-retry: with every path failed, IO waits
// NoPathRetry check intervals and then fails with ErrNoPath; a path that
// returns while IO waits lets it through.
func TestNoPathQueues(t *testing.T) {
	const tick = DefaultCheckInterval
	t.Run("queue for no-path-retry intervals, then ErrNoPath", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, fps, _ := memDevice(t, 2, 1<<20, Config{NoPathRetry: 3})
			defer d.Close()
			for _, fp := range fps {
				fp.SetInjector(failIO)
			}
			start := time.Now()
			_, err := d.ReadAt(make([]byte, block), 0)
			if !errors.Is(err, ErrNoPath) {
				t.Fatalf("read = %v, want ErrNoPath", err)
			}
			if waited := time.Since(start); waited < 3*tick || waited >= 4*tick {
				t.Errorf("queued %s, want 3 check intervals (%s)", waited, 3*tick)
			}
			start = time.Now()
			if _, err := d.WriteAt(make([]byte, block), 0); !errors.Is(err, ErrNoPath) || time.Since(start) != 0 {
				t.Errorf("next write: %v after %s, want ErrNoPath at once", err, time.Since(start))
			}
			fps[1].SetInjector(nil)
			advance(tick)
			if _, err := d.WriteAt(make([]byte, block), 0); err != nil {
				t.Errorf("write after a path returned: %v", err)
			}
		})
	})
	t.Run("the default queue is 30 s", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _ := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			d.Fail("p0")
			d.Fail("p1")
			start := time.Now()
			err := d.Sync()
			if waited := time.Since(start); !errors.Is(err, ErrNoPath) || waited < DefaultNoPathQueue || waited >= DefaultNoPathQueue+tick {
				t.Errorf("sync = %v after %s, want ErrNoPath after %s", err, waited, DefaultNoPathQueue)
			}
		})
	})
	t.Run("a path the checker restores while IO waits lets it through", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, fps, mem := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			for _, fp := range fps {
				fp.SetInjector(failIO)
			}
			buf := make([]byte, block)
			fill(buf, 2, 3, 4)
			done := make(chan error)
			start := time.Now()
			go func() {
				_, err := d.WriteAt(buf, 3*block)
				done <- err
			}()
			advance(2*tick + time.Second)
			select {
			case err := <-done:
				t.Fatalf("write returned %v while no path worked", err)
			default:
			}
			fps[1].SetInjector(nil)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(start); waited != 3*tick {
				t.Errorf("write waited %s, want until the next check at %s", waited, 3*tick)
			}
			got := make([]byte, block)
			mem.ReadAt(got, 3*block)
			if !bytes.Equal(got, buf) {
				t.Error("the queued write did not land")
			}
		})
	})
	t.Run("an operator restore lets waiting IO through at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _ := memDevice(t, 2, 1<<20, Config{})
			defer d.Close()
			d.Fail("p0")
			d.Fail("p1")
			done := make(chan error)
			go func() {
				_, err := d.ReadAt(make([]byte, block), 0)
				done <- err
			}()
			synctest.Wait()
			start := time.Now()
			d.Restore("p1")
			if err := <-done; err != nil || time.Since(start) != 0 {
				t.Errorf("read = %v after %s, want success at once", err, time.Since(start))
			}
		})
	})
	t.Run("no-path-retry fail fails at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _ := memDevice(t, 2, 1<<20, Config{NoPathRetry: NoPathFail})
			defer d.Close()
			d.Fail("p0")
			d.Fail("p1")
			if _, err := d.ReadAt(make([]byte, block), 0); !errors.Is(err, ErrNoPath) {
				t.Errorf("read = %v, want ErrNoPath", err)
			}
		})
	})
	t.Run("Close fails waiting IO", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _ := memDevice(t, 1, 1<<20, Config{})
			d.Fail("p0")
			done := make(chan error)
			go func() {
				_, err := d.ReadAt(make([]byte, block), 0)
				done <- err
			}()
			synctest.Wait()
			d.Close()
			if err := <-done; !errors.Is(err, ErrClosed) {
				t.Errorf("read = %v, want ErrClosed", err)
			}
		})
	})
}

// TestOperatorCommands pins gmultipath's fail, restore and rotate, online
// policy changes, and the figures Paths reports.
func TestOperatorCommands(t *testing.T) {
	d, _, _ := memDevice(t, 3, 1<<20, Config{Groups: []string{"A", "B", "A"}})
	defer d.Close()
	buf := make([]byte, block)
	read := func(n int) {
		for range n {
			if _, err := d.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantStates(t, d, "p0=ACTIVE p1=PASSIVE p2=PASSIVE")
	if err := d.Fail("p0"); err != nil {
		t.Fatal(err)
	}
	wantStates(t, d, "p0=FAIL p1=PASSIVE p2=ACTIVE") // the same group first
	if err := d.Restore("p0"); err != nil {
		t.Fatal(err)
	}
	wantStates(t, d, "p0=ACTIVE p1=PASSIVE p2=PASSIVE") // failback to the preferred path
	d.Rotate()
	wantStates(t, d, "p0=PASSIVE p1=ACTIVE p2=PASSIVE")
	d.Rotate()
	wantStates(t, d, "p0=PASSIVE p1=PASSIVE p2=ACTIVE")
	d.Rotate()
	if err := d.Fail("p9"); !errors.Is(err, ErrUnknownPath) {
		t.Errorf("Fail(p9) = %v, want ErrUnknownPath", err)
	}

	// Round-robin stays in the preferred path's group (A: p0 and p2).
	if err := d.SetPolicy(RoundRobin); err != nil {
		t.Fatal(err)
	}
	wantStates(t, d, "p0=ACTIVE p1=PASSIVE p2=ACTIVE")
	before := d.Paths()
	read(4 * DefaultRRMinIO)
	after := d.Paths()
	for i, want := range []uint64{2 * DefaultRRMinIO, 0, 2 * DefaultRRMinIO} {
		if got := after[i].IOs - before[i].IOs; got != want {
			t.Errorf("round-robin: %s took %d of %d reads, want %d", after[i].Name, got, 4*DefaultRRMinIO, want)
		}
	}
	p := after[0]
	if p.Bytes-before[0].Bytes != 2*DefaultRRMinIO*block || p.LatencyP50 <= 0 || p.LatencyP99 < p.LatencyP50 || p.Errors != 0 {
		t.Errorf("p0 figures: %+v", p)
	}

	// Active-read: writes on the preferred path only.
	if err := d.SetPolicy(ActiveRead); err != nil {
		t.Fatal(err)
	}
	before = d.Paths()
	for range 10 {
		if _, err := d.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	after = d.Paths()
	if after[0].IOs-before[0].IOs != 10 || after[2].IOs != before[2].IOs {
		t.Errorf("active-read wrote %d times on p0 and %d on p2, want 10 and 0",
			after[0].IOs-before[0].IOs, after[2].IOs-before[2].IOs)
	}
	if err := d.SetPolicy(Policy(42)); err == nil {
		t.Error("SetPolicy took policy 42")
	}
}

// The node's Disk, restated: a Device must be one.
var _ interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Sync() error
	Zero(off, length int64) error
	Close() error
	WriteAtSync(p []byte, off int64) error
} = (*Device)(nil)

var _ Path = (*faultpath.Path)(nil)
