package faultpath

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/internal/lockorder"
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
type Op = fault.Kind

// The operations of a path.
const (
	OpRead  = fault.Read
	OpWrite = fault.Write
	OpSync  = fault.Sync
	OpZero  = fault.Zero
)

// Fault is what happens to one operation (package fault's): a path
// carries out its Delay, Hang, Err, and for writes Drop and Tear.
type Fault = fault.Fault

// Injector chooses the fault of each operation; a fault.Rule is one.
type Injector = fault.Injector

// InjectorFunc is an Injector that is told the operation's kind and
// extent.
type InjectorFunc func(op Op, off, length int64) Fault

// Inject implements Injector.
func (f InjectorFunc) Inject(op fault.Op) Fault { return f(op.Kind, op.Off, op.Len) }

// ErrInjected is the error the helpers inject: an EIO-like path error.
var ErrInjected = fault.ErrInjected

// ErrClosed is what a hung or later operation returns once the path is
// closed.
var ErrClosed = fault.ErrClosed

// Always injects f into every operation.
func Always(f Fault) Injector { return fault.Always(f) }

// Ops injects f into the operations of the given kinds only.
func Ops(f Fault, ops ...Op) Injector { return fault.On(ops...).Fault(f) }

// Step is one phase of a Schedule.
type Step = fault.Step

// Schedule injects each step's fault for its duration, counted from
// start, and nothing after the last step; with repeat it starts over.
// It reads the time package's clock, which testing/synctest fakes.
func Schedule(start time.Time, repeat bool, steps ...Step) Injector {
	return fault.Schedule(start, repeat, steps...)
}

// Flapping fails every operation with ErrInjected for down, then lets
// them through for up, over and over from start.
func Flapping(start time.Time, down, up time.Duration) Injector {
	return fault.Flapping(start, down, up)
}

// Path is a path with faults. Its Point (SetInjector, Add, Release,
// Injected, Count) chooses them.
type Path struct {
	fault.Point
	inner Inner
	rate  atomic.Int64 // bytes/s, 0 = unlimited
	// clock times the throttle (the real one; a test may give a fake:
	// WithClock).
	clock clock.Clock

	mu   lockorder.Mutex
	next time.Time // the throttle's pipe is busy until then
}

// New wraps inner; it injects nothing until SetInjector, Add or SetRate.
func New(inner Inner) *Path { return &Path{inner: inner, clock: clock.Real()} }

// WithClock makes the throttle (SetRate) keep time by c; it returns p.
func (p *Path) WithClock(c clock.Clock) *Path {
	p.clock = c
	return p
}

// SetRate limits reads and writes to bytesPerSecond (a token bucket
// without burst: transfers go down one pipe one after another); 0 lifts
// the limit.
func (p *Path) SetRate(bytesPerSecond int64) { p.rate.Store(bytesPerSecond) }

func (p *Path) before(o Op, off, length int64) (Fault, error) {
	return p.Before(context.Background(), o, off, length, false)
}

// throttle waits until the pipe has carried n more bytes.
func (p *Path) throttle(n int) {
	rate := p.rate.Load()
	if rate <= 0 || n == 0 {
		return
	}
	p.mu.Lock()
	now := p.clock.Now()
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
	wake := p.next
	p.mu.Unlock()
	if d := p.clock.Until(wake); d > 0 {
		t := p.clock.NewTimer(d)
		<-t.C()
	}
}

func (p *Path) Name() string { return p.inner.Name() }

func (p *Path) Size() (int64, error) { return p.inner.Size() }

func (p *Path) ReadAt(b []byte, off int64) (int, error) {
	if _, err := p.before(OpRead, off, int64(len(b))); err != nil {
		return 0, err
	}
	p.throttle(len(b))
	return p.inner.ReadAt(b, off)
}

func (p *Path) WriteAt(b []byte, off int64) (int, error) {
	f, err := p.before(OpWrite, off, int64(len(b)))
	return f.Write(b, err, func(kept []byte) error {
		p.throttle(len(kept))
		_, err := p.inner.WriteAt(kept, off)
		return err
	})
}

func (p *Path) Sync() error {
	if _, err := p.before(OpSync, 0, 0); err != nil {
		return err
	}
	return p.inner.Sync()
}

func (p *Path) Zero(off, length int64) error {
	if _, err := p.before(OpZero, off, length); err != nil {
		return err
	}
	return p.inner.Zero(off, length)
}

// Close releases hung operations (they fail with ErrClosed) and closes
// the inner path.
func (p *Path) Close() error {
	p.Point.Close()
	return p.inner.Close()
}
