package faultpath

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Inner is the path a fault path wraps: multipath.Path, restated so that
// multipath's own tests may import this package.
type Inner interface {
	Name() string
	io.ReaderAt
	io.WriterAt
	Sync() error
	Zero(off, length int64) error
	Size() (int64, error)
	Close() error
}

// Op is the kind of operation an Injector is asked about.
type Op uint8

const (
	OpRead Op = iota
	OpWrite
	OpSync
	OpZero
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpZero:
		return "zero"
	}
	return fmt.Sprintf("Op(%d)", o)
}

// Fault is what happens to one operation. The zero Fault lets it through.
type Fault struct {
	Delay time.Duration // wait this long first
	Hang  bool          // then block until Release or Close
	Err   error         // then fail with Err instead of doing the operation
}

// Injector chooses the fault of each operation. It may be called
// concurrently and must not block (a Fault's Delay or Hang does that).
type Injector interface {
	Inject(op Op, off, length int64) Fault
}

// InjectorFunc is an Injector.
type InjectorFunc func(op Op, off, length int64) Fault

func (f InjectorFunc) Inject(op Op, off, length int64) Fault { return f(op, off, length) }

// ErrInjected is the error the helpers inject: an EIO-like path error.
var ErrInjected = errors.New("faultpath: injected IO error")

// ErrClosed is what a hung or later operation returns once the path is
// closed.
var ErrClosed = errors.New("faultpath: path closed")

// Always injects f into every operation.
func Always(f Fault) Injector {
	return InjectorFunc(func(Op, int64, int64) Fault { return f })
}

// Ops injects f into the operations of the given kinds only.
func Ops(f Fault, ops ...Op) Injector {
	var mask uint32
	for _, o := range ops {
		mask |= 1 << o
	}
	return InjectorFunc(func(o Op, _, _ int64) Fault {
		if mask&(1<<o) != 0 {
			return f
		}
		return Fault{}
	})
}

// Step is one phase of a Schedule.
type Step struct {
	For   time.Duration
	Fault Fault
}

// Schedule injects each step's fault for its duration, counted from
// start, and nothing after the last step; with repeat it starts over.
// It reads the time package's clock, which testing/synctest fakes.
func Schedule(start time.Time, repeat bool, steps ...Step) Injector {
	var total time.Duration
	for _, s := range steps {
		total += s.For
	}
	return InjectorFunc(func(Op, int64, int64) Fault {
		at := time.Since(start)
		if at < 0 || total <= 0 {
			return Fault{}
		}
		if repeat {
			at %= total
		}
		for _, s := range steps {
			if at < s.For {
				return s.Fault
			}
			at -= s.For
		}
		return Fault{}
	})
}

// Flapping fails every operation with ErrInjected for down, then lets
// them through for up, over and over from start.
func Flapping(start time.Time, down, up time.Duration) Injector {
	return Schedule(start, true, Step{For: down, Fault: Fault{Err: ErrInjected}}, Step{For: up})
}

// Path is a path with faults.
type Path struct {
	inner    Inner
	injector atomic.Pointer[Injector]
	rate     atomic.Int64 // bytes/s, 0 = unlimited
	injected atomic.Uint64

	mu     sync.Mutex
	gate   chan struct{} // closed by Release
	closed chan struct{}
	done   bool
	next   time.Time // the throttle's pipe is busy until then
}

// New wraps inner; it injects nothing until SetInjector or SetRate.
func New(inner Inner) *Path {
	return &Path{inner: inner, gate: make(chan struct{}), closed: make(chan struct{})}
}

// SetInjector chooses the faults from now on; nil injects none.
func (p *Path) SetInjector(inj Injector) {
	if inj == nil {
		p.injector.Store(nil)
		return
	}
	p.injector.Store(&inj)
}

// SetRate limits reads and writes to bytesPerSecond (a token bucket
// without burst: transfers go down one pipe one after another); 0 lifts
// the limit.
func (p *Path) SetRate(bytesPerSecond int64) { p.rate.Store(bytesPerSecond) }

// Release wakes every operation hung so far.
func (p *Path) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.gate)
	p.gate = make(chan struct{})
}

// Injected counts the operations that got an error or a hang.
func (p *Path) Injected() uint64 { return p.injected.Load() }

func (p *Path) before(o Op, off, length int64) error {
	ip := p.injector.Load()
	if ip == nil {
		return nil
	}
	f := (*ip).Inject(o, off, length)
	if f.Err != nil || f.Hang {
		p.injected.Add(1)
	}
	if f.Delay > 0 {
		time.Sleep(f.Delay)
	}
	if f.Hang {
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		select {
		case <-gate:
		case <-p.closed:
			return ErrClosed
		}
	}
	return f.Err
}

// throttle waits until the pipe has carried n more bytes.
func (p *Path) throttle(n int) {
	rate := p.rate.Load()
	if rate <= 0 || n == 0 {
		return
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
	wake := p.next
	p.mu.Unlock()
	time.Sleep(time.Until(wake))
}

func (p *Path) Name() string { return p.inner.Name() }

func (p *Path) Size() (int64, error) { return p.inner.Size() }

func (p *Path) ReadAt(b []byte, off int64) (int, error) {
	if err := p.before(OpRead, off, int64(len(b))); err != nil {
		return 0, err
	}
	p.throttle(len(b))
	return p.inner.ReadAt(b, off)
}

func (p *Path) WriteAt(b []byte, off int64) (int, error) {
	if err := p.before(OpWrite, off, int64(len(b))); err != nil {
		return 0, err
	}
	p.throttle(len(b))
	return p.inner.WriteAt(b, off)
}

func (p *Path) Sync() error {
	if err := p.before(OpSync, 0, 0); err != nil {
		return err
	}
	return p.inner.Sync()
}

func (p *Path) Zero(off, length int64) error {
	if err := p.before(OpZero, off, length); err != nil {
		return err
	}
	return p.inner.Zero(off, length)
}

// Close releases hung operations (they fail with ErrClosed) and closes
// the inner path.
func (p *Path) Close() error {
	p.mu.Lock()
	if !p.done {
		p.done = true
		close(p.closed)
	}
	p.mu.Unlock()
	return p.inner.Close()
}
