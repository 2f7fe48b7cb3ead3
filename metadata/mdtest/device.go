package mdtest

import (
	"context"
	"fmt"
	"io"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/internal/lockorder"
)

// SectorSize is the unit a torn write keeps or loses.
const SectorSize = fault.SectorSize

// chunk is the sparse storage unit.
const chunk = 4096

// ErrInjected is the error an Injector returns by default.
var ErrInjected = fault.ErrInjected

// OpKind is the kind of a device operation: OpRead, OpWrite or OpSync.
type OpKind = fault.Kind

// Operation kinds.
const (
	OpRead  = fault.Read
	OpWrite = fault.Write
	OpSync  = fault.Sync
)

// Op is one operation, numbered from 1 per kind in the order issued.
type Op = fault.Op

// Fault is what an Injector decides for an operation. A device carries
// out its Err (nothing is read, written or synced), Drop (a write reports
// success and changes nothing: a lost write) and Tear (a write keeps only
// its first Tear sectors, as if power failed in the middle, and reports
// success).
type Fault = fault.Fault

// Injector chooses the fault for each operation; nil means none.
type Injector = fault.InjectorFunc

// Device is an in-memory, sparse device. Reads see every write; Crash
// returns what a power loss would leave: only what was synced. Its Point
// chooses the faults (SetInjector, or Add a fault.Rule) and counts the
// operations. It is safe for concurrent use.
type Device struct {
	fault.Point
	mu      lockorder.Mutex
	size    int64
	current map[int64]*[chunk]byte
	durable map[int64]*[chunk]byte
	// pending writes since the last sync, in order, for torn crashes.
	pending []write
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
	if inj == nil {
		d.Point.SetInjector(nil)
		return
	}
	d.Point.SetInjector(inj)
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

func (d *Device) before(k OpKind, off int64, n int) (Fault, error) {
	return d.Before(context.Background(), k, off, int64(n), false)
}

// ReadAt implements io.ReaderAt.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off >= d.size {
		return 0, io.EOF
	}
	if _, err := d.before(OpRead, off, len(p)); err != nil {
		return 0, err
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
	f, err := d.before(OpWrite, off, len(p))
	return f.Write(p, err, func(data []byte) error {
		copyIn(d.current, data, off)
		d.pending = append(d.pending, write{off, append([]byte(nil), data...)})
		return nil
	})
}

// Sync makes every write so far durable.
func (d *Device) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.before(OpSync, 0, 0); err != nil {
		return err
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
