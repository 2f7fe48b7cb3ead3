package nbdtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/internal/lockorder"
)

// Device is the method set of nbd.Export, repeated here so that this package does not import the
// server it tests.
type Device interface {
	Size() int64
	ReadAt(ctx context.Context, p []byte, off int64) error
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	WriteZeroes(ctx context.Context, off, length int64, fua bool) error
	Trim(ctx context.Context, off, length int64) error
	Flush(ctx context.Context) error
}

// Op names a Device method.
type Op int

// Device operations.
const (
	OpRead Op = iota
	OpWrite
	OpWriteZeroes
	OpTrim
	OpFlush
	numOps
)

func (o Op) String() string {
	return [...]string{"read", "write", "write-zeroes", "trim", "flush"}[o]
}

// Kind is the fault.Kind of o: a flush is a Sync, a write-zeroes a Zero.
func (o Op) Kind() fault.Kind {
	return [...]fault.Kind{fault.Read, fault.Write, fault.Zero, fault.Trim, fault.Sync}[o]
}

// MemExport is a memory-backed Device that also checks its callers: a call with a range outside
// the device or a zero length fails with EINVAL and is counted in OutOfRange, which tests
// assert stays zero. Trim zeroes the range.
type MemExport struct {
	mu   lockorder.RWMutex
	data []byte

	calls      [numOps]atomic.Int64
	fuaCalls   atomic.Int64
	outOfRange atomic.Int64
	// Desc, if set before use, is returned by Description.
	Desc string
}

// NewMemExport returns a zero-filled MemExport of size bytes.
func NewMemExport(size int64) *MemExport {
	return &MemExport{data: make([]byte, size)}
}

// Size implements Device.
func (m *MemExport) Size() int64 { return int64(len(m.data)) }

// Description implements nbd.Describer.
func (m *MemExport) Description() string { return m.Desc }

func (m *MemExport) check(op Op, off, length int64) error {
	m.calls[op].Add(1)
	if off < 0 || length <= 0 || off > int64(len(m.data)) || length > int64(len(m.data))-off {
		m.outOfRange.Add(1)
		return fmt.Errorf("memexport: %v [%d, +%d) outside [0, %d): %w", op, off, length, len(m.data), syscall.EINVAL)
	}
	return nil
}

// ReadAt implements Device.
func (m *MemExport) ReadAt(_ context.Context, p []byte, off int64) error {
	if err := m.check(OpRead, off, int64(len(p))); err != nil {
		return err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	copy(p, m.data[off:])
	return nil
}

// WriteAt implements Device.
func (m *MemExport) WriteAt(_ context.Context, p []byte, off int64, fua bool) error {
	if err := m.check(OpWrite, off, int64(len(p))); err != nil {
		return err
	}
	if fua {
		m.fuaCalls.Add(1)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.data[off:], p)
	return nil
}

// WriteZeroes implements Device.
func (m *MemExport) WriteZeroes(_ context.Context, off, length int64, fua bool) error {
	if err := m.check(OpWriteZeroes, off, length); err != nil {
		return err
	}
	if fua {
		m.fuaCalls.Add(1)
	}
	m.zero(off, length)
	return nil
}

// Trim implements Device.
func (m *MemExport) Trim(_ context.Context, off, length int64) error {
	if err := m.check(OpTrim, off, length); err != nil {
		return err
	}
	m.zero(off, length)
	return nil
}

func (m *MemExport) zero(off, length int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+length])
}

// Flush implements Device.
func (m *MemExport) Flush(context.Context) error {
	m.calls[OpFlush].Add(1)
	return nil
}

// Bytes returns a copy of [off, off+length).
func (m *MemExport) Bytes(off, length int64) []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]byte(nil), m.data[off:off+length]...)
}

// Fill sets [off, off+length) to b.
func (m *MemExport) Fill(off, length int64, b byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := off; i < off+length; i++ {
		m.data[i] = b
	}
}

// Calls is the number of calls of op so far (including rejected ones).
func (m *MemExport) Calls(op Op) int64 { return m.calls[op].Load() }

// FUACalls is the number of WriteAt and WriteZeroes calls with fua set.
func (m *MemExport) FUACalls() int64 { return m.fuaCalls.Load() }

// OutOfRange is the number of calls that had a range outside the device or a zero length.
func (m *MemExport) OutOfRange() int64 { return m.outOfRange.Load() }

// Injector decides the fate of one operation on a FaultyExport: a non-nil error fails it
// without reaching the inner Device. Inject may block (to add latency or hold a request in
// flight); it should return when ctx ends.
type Injector interface {
	Inject(ctx context.Context, op Op, off, length int64) error
}

// InjectorFunc adapts a function to Injector.
type InjectorFunc func(ctx context.Context, op Op, off, length int64) error

// Inject implements Injector.
func (f InjectorFunc) Inject(ctx context.Context, op Op, off, length int64) error {
	return f(ctx, op, off, length)
}

// Rule makes an Injector of a fault.Injector (a fault.Rule, told in
// fault.Kind: a flush is a Sync, a write-zeroes a Zero): the call waits out
// the fault's Delay and holds, until ctx ends, and fails with its Err.
func Rule(inj fault.Injector) Injector {
	var p fault.Point
	p.Add(inj)
	return InjectorFunc(func(ctx context.Context, op Op, off, length int64) error {
		_, err := p.Before(ctx, op.Kind(), off, length, false)
		return err
	})
}

// kinds is the fault.Kind of each op.
func kinds(ops []Op) []fault.Kind {
	out := make([]fault.Kind, len(ops))
	for i, o := range ops {
		out[i] = o.Kind()
	}
	return out
}

// FailOn returns an Injector that fails every op in ops with err.
func FailOn(err error, ops ...Op) Injector { return Rule(fault.On(kinds(ops)...).Err(err)) }

// FaultyExport runs Injector before every call of the inner Device.
type FaultyExport struct {
	Device
	Injector Injector
}

// ReadAt implements Device.
func (f *FaultyExport) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := f.Injector.Inject(ctx, OpRead, off, int64(len(p))); err != nil {
		return err
	}
	return f.Device.ReadAt(ctx, p, off)
}

// WriteAt implements Device.
func (f *FaultyExport) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	if err := f.Injector.Inject(ctx, OpWrite, off, int64(len(p))); err != nil {
		return err
	}
	return f.Device.WriteAt(ctx, p, off, fua)
}

// WriteZeroes implements Device.
func (f *FaultyExport) WriteZeroes(ctx context.Context, off, length int64, fua bool) error {
	if err := f.Injector.Inject(ctx, OpWriteZeroes, off, length); err != nil {
		return err
	}
	return f.Device.WriteZeroes(ctx, off, length, fua)
}

// Trim implements Device.
func (f *FaultyExport) Trim(ctx context.Context, off, length int64) error {
	if err := f.Injector.Inject(ctx, OpTrim, off, length); err != nil {
		return err
	}
	return f.Device.Trim(ctx, off, length)
}

// Flush implements Device.
func (f *FaultyExport) Flush(ctx context.Context) error {
	if err := f.Injector.Inject(ctx, OpFlush, 0, 0); err != nil {
		return err
	}
	return f.Device.Flush(ctx)
}

// Gate is an Injector that holds the chosen operations until Open: the
// slow export. Each held operation is announced on Entered first, so a
// test knows it is in flight without sleeping.
type Gate struct {
	*fault.Gate
	Injector
}

// NewGate returns a shut Gate holding ops.
func NewGate(ops ...Op) *Gate {
	g := fault.NewGate()
	return &Gate{Gate: g, Injector: Rule(fault.On(kinds(ops)...).Hold(g))}
}
