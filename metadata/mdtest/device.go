package mdtest

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// SectorSize is the unit a torn write keeps or loses.
const SectorSize = 512

// chunk is the sparse storage unit.
const chunk = 4096

// ErrInjected is the error an Injector returns by default.
var ErrInjected = errors.New("mdtest: injected I/O error")

// OpKind is the kind of a device operation.
type OpKind int

// Operation kinds.
const (
	OpRead OpKind = iota
	OpWrite
	OpSync
)

func (k OpKind) String() string {
	return [...]string{"read", "write", "sync"}[k]
}

// Op is one operation, numbered from 1 per kind in the order issued.
type Op struct {
	Kind OpKind
	Off  int64
	Len  int
	N    int64
}

// Fault is what an Injector decides for an operation.
type Fault struct {
	// Err fails the operation (nothing is read, written or synced).
	Err error
	// Drop makes a write report success but change nothing: a lost write.
	Drop bool
	// Tear, for a write, keeps only the first Tear sectors of it on the
	// device, as if power failed in the middle; the write reports success.
	// Zero means no tear.
	Tear int
}

// Injector chooses the fault for each operation; nil means none.
type Injector func(Op) Fault

// Device is an in-memory, sparse device. Reads see every write; Crash
// returns what a power loss would leave: only what was synced. It is safe
// for concurrent use.
type Device struct {
	mu      sync.Mutex
	size    int64
	current map[int64]*[chunk]byte
	durable map[int64]*[chunk]byte
	// pending writes since the last sync, in order, for torn crashes.
	pending []write
	inject  Injector
	n       [3]int64
	bytes   [3]int64
}

type write struct {
	off  int64
	data []byte
}

// NewDevice returns a zeroed device of size bytes.
func NewDevice(size int64) *Device {
	return &Device{size: size, current: map[int64]*[chunk]byte{}, durable: map[int64]*[chunk]byte{}}
}

// SetInjector installs inj (nil removes it).
func (d *Device) SetInjector(inj Injector) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inject = inj
}

// Size returns the device size.
func (d *Device) Size() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.size
}

// Grow makes the device size bytes long, as a LUN grown by its storage
// (or a file by truncate): the bytes gained read as zeroes. A size below
// the current one is ignored. The change is durable at once.
func (d *Device) Grow(size int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.size = max(d.size, size)
}

// Count returns how many operations of a kind ran, and their bytes.
func (d *Device) Count(k OpKind) (ops, bytes int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[k], d.bytes[k]
}

func (d *Device) fault(k OpKind, off int64, n int) Fault {
	d.n[k]++
	d.bytes[k] += int64(n)
	if d.inject == nil {
		return Fault{}
	}
	return d.inject(Op{Kind: k, Off: off, Len: n, N: d.n[k]})
}

// ReadAt implements io.ReaderAt.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off >= d.size {
		return 0, io.EOF
	}
	if f := d.fault(OpRead, off, len(p)); f.Err != nil {
		return 0, f.Err
	}
	n := len(p)
	if rest := d.size - off; int64(n) > rest {
		n = int(rest)
	}
	copyOut(d.current, p[:n], off)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt implements io.WriterAt.
func (d *Device) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off+int64(len(p)) > d.size {
		return 0, fmt.Errorf("mdtest: write [%d,+%d) beyond device size %d", off, len(p), d.size)
	}
	f := d.fault(OpWrite, off, len(p))
	switch {
	case f.Err != nil:
		return 0, f.Err
	case f.Drop:
		return len(p), nil
	}
	data := p
	if f.Tear > 0 && f.Tear*SectorSize < len(p) {
		data = p[:f.Tear*SectorSize]
	}
	copyIn(d.current, data, off)
	d.pending = append(d.pending, write{off, append([]byte(nil), data...)})
	return len(p), nil
}

// Sync makes every write so far durable.
func (d *Device) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.fault(OpSync, 0, 0); f.Err != nil {
		return f.Err
	}
	for _, w := range d.pending {
		copyIn(d.durable, w.data, w.off)
	}
	d.pending = nil
	return nil
}

// Crash returns the device a power loss now would leave: the synced bytes
// only. The receiver is unchanged.
func (d *Device) Crash() *Device { return d.CrashKeeping(nil) }

// CrashKeeping is Crash, but keep decides, for each unsynced write in the
// order issued, how many of its leading sectors reached the media anyway
// (0: none; a negative number: all of it). A disk may reorder unsynced
// writes, so keep may keep a later write and lose an earlier one.
func (d *Device) CrashKeeping(keep func(i int, off int64, length int) (sectors int)) *Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := NewDevice(d.size)
	for k, v := range d.durable {
		b := *v
		c.current[k] = &b
	}
	if keep != nil {
		for i, w := range d.pending {
			s := keep(i, w.off, len(w.data))
			data := w.data
			if s >= 0 && s*SectorSize < len(data) {
				data = data[:s*SectorSize]
			}
			copyIn(c.current, data, w.off)
		}
	}
	for k, v := range c.current {
		b := *v
		c.durable[k] = &b
	}
	return c
}

// Snapshot returns a copy of the bytes reads now see in [off, off+n).
func (d *Device) Snapshot(off int64, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := make([]byte, n)
	copyOut(d.current, p, off)
	return p
}

// Allocated returns how many bytes of storage the sparse image holds.
func (d *Device) Allocated() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return int64(len(d.current)) * chunk
}

func copyIn(m map[int64]*[chunk]byte, p []byte, off int64) {
	for len(p) > 0 {
		k, o := off/chunk, off%chunk
		c := m[k]
		if c == nil {
			c = new([chunk]byte)
			m[k] = c
		}
		n := copy(c[o:], p)
		p, off = p[n:], off+int64(n)
	}
}

func copyOut(m map[int64]*[chunk]byte, p []byte, off int64) {
	for len(p) > 0 {
		k, o := off/chunk, off%chunk
		var n int
		if c := m[k]; c != nil {
			n = copy(p, c[o:])
		} else {
			n = min(len(p), int(chunk-o))
			clear(p[:n])
		}
		p, off = p[n:], off+int64(n)
	}
}
