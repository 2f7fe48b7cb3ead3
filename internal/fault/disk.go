package fault

import (
	"context"
	"io"
	"maps"
	"slices"

	"github.com/replvol/replvol/internal/lockorder"
)

// Inner is the disk a Disk wraps: backing.Disk, restated so that this
// package imports nothing of replvol.
type Inner interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Zero(off, length int64) error
	Size() int64
	Close() error
}

// Disk is a disk with faults. It keeps the optional abilities of the disk
// it wraps that the node asks for (WriteAtSync, IsHole, Remeasure), and
// keeps the old content of what Lose'd writes overwrote until a Sync, so
// that LoseUnsynced can put it back as a power loss would.
type Disk struct {
	Point
	inner Inner

	mu  lockorder.Mutex
	pre map[int64][]byte // sector → its content at the last Sync
}

// NewDisk wraps inner; it injects nothing until rules are added.
func NewDisk(inner Inner) *Disk { return &Disk{inner: inner} }

// Inner returns the wrapped disk.
func (d *Disk) Inner() Inner { return d.inner }

// ReadAt implements io.ReaderAt.
func (d *Disk) ReadAt(p []byte, off int64) (int, error) {
	if _, err := d.Before(context.Background(), Read, off, int64(len(p)), false); err != nil {
		return 0, err
	}
	return d.inner.ReadAt(p, off)
}

// WriteAt implements io.WriterAt.
func (d *Disk) WriteAt(p []byte, off int64) (int, error) {
	return d.write(p, off, false)
}

// WriteAtSync writes p durably (with the wrapped disk's WriteAtSync
// where it has one), unless a fault says otherwise.
func (d *Disk) WriteAtSync(p []byte, off int64) error {
	_, err := d.write(p, off, true)
	return err
}

func (d *Disk) write(p []byte, off int64, fua bool) (int, error) {
	f, err := d.Before(context.Background(), Write, off, int64(len(p)), fua)
	return f.Write(p, err, func(kept []byte) (err error) {
		switch {
		case fua && len(kept) == len(p):
			return d.writeSync(kept, off)
		case f.Lose && !fua:
			d.keep(off, int64(len(kept)))
		}
		_, err = d.inner.WriteAt(kept, off)
		return err
	})
}

type syncWriter interface {
	WriteAtSync(p []byte, off int64) error
}

func (d *Disk) writeSync(p []byte, off int64) error {
	var err error
	if sw, ok := d.inner.(syncWriter); ok {
		err = sw.WriteAtSync(p, off)
	} else if _, err = d.inner.WriteAt(p, off); err == nil {
		err = d.inner.Sync()
	}
	if err == nil {
		d.forget(off, int64(len(p)))
	}
	return err
}

// Zero implements the disk's Zero.
func (d *Disk) Zero(off, length int64) error {
	f, err := d.Before(context.Background(), Zero, off, length, false)
	if err != nil {
		return err
	}
	if f.Drop {
		return nil
	}
	if f.Lose {
		d.keep(off, length)
	}
	return d.inner.Zero(off, length)
}

// Sync makes every write so far durable, unless a fault fails it.
func (d *Disk) Sync() error {
	if _, err := d.Before(context.Background(), Sync, 0, 0, false); err != nil {
		return err
	}
	if err := d.inner.Sync(); err != nil {
		return err
	}
	d.mu.Lock()
	d.pre = nil
	d.mu.Unlock()
	return nil
}

// Size implements the disk's Size.
func (d *Disk) Size() int64 { return d.inner.Size() }

// Close fails held operations with ErrClosed and closes the wrapped disk.
func (d *Disk) Close() error {
	d.Point.Close()
	return d.inner.Close()
}

// IsHole is the wrapped disk's IsHole; a disk that cannot tell holds no
// holes.
func (d *Disk) IsHole(off, length int64) bool {
	hf, ok := d.inner.(interface{ IsHole(off, length int64) bool })
	return ok && hf.IsHole(off, length)
}

// Remeasure is the wrapped disk's Remeasure; a disk that cannot grow keeps
// its size.
func (d *Disk) Remeasure() (int64, error) {
	if r, ok := d.inner.(interface{ Remeasure() (int64, error) }); ok {
		return r.Remeasure()
	}
	return d.inner.Size(), nil
}

// keep saves the content of every sector of [off, off+length) not saved
// since the last Sync.
func (d *Disk) keep(off, length int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pre == nil {
		d.pre = map[int64][]byte{}
	}
	for s := off / SectorSize; s*SectorSize < off+length; s++ {
		if _, ok := d.pre[s]; ok {
			continue
		}
		old := make([]byte, SectorSize)
		if _, err := d.inner.ReadAt(old, s*SectorSize); err == nil || err == io.EOF {
			d.pre[s] = old
		}
	}
}

// forget drops the saved content of [off, off+length): it is durable.
func (d *Disk) forget(off, length int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for s := off / SectorSize; s*SectorSize < off+length; s++ {
		delete(d.pre, s)
	}
}

// Unsynced is how many sectors a power loss now would take back.
func (d *Disk) Unsynced() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pre)
}

// LoseUnsynced is a power loss: it writes the content every Lose'd write
// overwrote since the last Sync back, into to (the wrapped disk when to
// is nil; a file of the same device once the disk is closed), and returns
// how many sectors went back.
func (d *Disk) LoseUnsynced(to io.WriterAt) (int, error) {
	return d.LoseUnsyncedTorn(to, nil)
}

// LoseUnsyncedTorn is a power loss of a disk whose volatile cache had
// written part of what it held back, in no order, before the power went:
// each sector a Lose'd write changed since the last Sync goes back to its
// old content when lose says so (every one when lose is nil) and keeps
// its new content otherwise, so that an unsynced write is lost whole,
// kept whole, or torn at any sector. lose is called once per sector, in
// the order of the sectors, so that a seeded lose tears the same way in
// every run. It writes into to as LoseUnsynced does and returns how many
// sectors went back.
func (d *Disk) LoseUnsyncedTorn(to io.WriterAt, lose func(sector int64) bool) (int, error) {
	if to == nil {
		to = d.inner
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, s := range slices.Sorted(maps.Keys(d.pre)) {
		if lose != nil && !lose(s) {
			continue
		}
		if _, err := to.WriteAt(d.pre[s], s*SectorSize); err != nil {
			return 0, err
		}
		n++
	}
	d.pre = nil
	return n, nil
}
