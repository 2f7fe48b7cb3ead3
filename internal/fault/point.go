package fault

import (
	"context"
	"slices"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Point is where a wrapper asks for faults: it numbers and counts the
// operations, asks its injectors in the order they were added (the first
// that returns a non-zero Fault decides), and waits out delays and holds.
// Injectors may be added and removed while operations run. The zero Point
// injects nothing and is ready to use.
type Point struct {
	mu        lockorder.Mutex
	injectors []*Injector // pointers, so that one injector added twice is removed once
	n, bytes  [numKinds]int64
	injected  int64
	hang      *Gate
	closed    chan struct{}
}

func (p *Point) init() {
	if p.closed == nil {
		p.closed = make(chan struct{})
		p.hang = NewGate()
	}
}

// Add asks inj from now on, after the injectors added before it, until
// the returned function removes it.
func (p *Point) Add(inj Injector) (remove func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip := &inj
	p.injectors = append(p.injectors, ip)
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.injectors = slices.DeleteFunc(p.injectors, func(x *Injector) bool { return x == ip })
	}
}

// SetInjector replaces every injector with inj; nil removes them all.
func (p *Point) SetInjector(inj Injector) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.injectors = nil
	if inj != nil {
		p.injectors = []*Injector{&inj}
	}
}

// Count returns how many operations of kind k reached the point, and
// their bytes.
func (p *Point) Count(k Kind) (ops, bytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[k], p.bytes[k]
}

// Injected counts the operations that got a fault other than a delay.
func (p *Point) Injected() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return uint64(p.injected)
}

// Release lets through every operation a Hang holds now.
func (p *Point) Release() {
	p.mu.Lock()
	p.init()
	g := p.hang
	p.mu.Unlock()
	g.Release()
}

// Close fails every held operation, and every later one that a Hang or
// Hold would hold, with ErrClosed.
func (p *Point) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	select {
	case <-p.closed:
	default:
		close(p.closed)
	}
}

// Decide numbers and counts an operation and returns its fault, without
// waiting.
func (p *Point) Decide(k Kind, off, length int64, fua bool) (Op, Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n[k]++
	p.bytes[k] += length
	op := Op{Kind: k, Off: off, Len: length, FUA: fua, N: p.n[k]}
	for _, ip := range p.injectors {
		if f := (*ip).Inject(op); !f.IsZero() {
			if f.injects() {
				p.injected++
			}
			return op, f
		}
	}
	return op, Fault{}
}

// Wait waits out f's Delay, Hang and Hold for op, then returns f.Err; it
// returns early with ctx.Err() when ctx ends and with ErrClosed when the
// point is closed.
func (p *Point) Wait(ctx context.Context, op Op, f Fault) error {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if f.Hang || f.Hold != nil {
		p.mu.Lock()
		p.init()
		hang, closed := p.hang, p.closed
		p.mu.Unlock()
		if f.Hang {
			if err := hang.Wait(ctx, op, closed); err != nil {
				return err
			}
		}
		if f.Hold != nil {
			if err := f.Hold.Wait(ctx, op, closed); err != nil {
				return err
			}
		}
	}
	return f.Err
}

// Before is Decide then Wait: the fault of the operation, once its delay
// and holds are over, and the error it fails with (nil: go on and apply
// the fault's Drop, Tear or Lose).
func (p *Point) Before(ctx context.Context, k Kind, off, length int64, fua bool) (Fault, error) {
	op, f := p.Decide(k, off, length, fua)
	if f.IsZero() {
		return f, nil
	}
	return f, p.Wait(ctx, op, f)
}
