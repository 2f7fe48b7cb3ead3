package backing

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/replvol/replvol/internal/lockorder"
)

// Disk is a node's backing store for one volume: io.ReaderAt + io.WriterAt
// with a durable Sync. Implementations must allow concurrent calls.
type Disk interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes every completed write durable.
	Sync() error
	// Zero makes [off, off+length) read as zeroes, without writing them
	// where the device can (punching a hole in a file).
	Zero(off, length int64) error
	// Size is the device's size in bytes (data and internal metadata).
	Size() int64
	Close() error
}

// fileDisk is a regular file or a block device opened with O_RDWR.
type fileDisk struct {
	// wmu serialises writes. The kernel serialises buffered writes to one
	// file on its inode lock anyway, but contending writers spin there and
	// burn CPU; parked goroutines do not.
	wmu     lockorder.Mutex
	f       *os.File
	size    atomic.Int64
	noPunch atomic.Bool
}

// zeroes is the source of Zero's writes where a hole cannot be punched.
// It is only ever read: shared by every disk, it costs no memory until
// used (and then the kernel's zero page).
var zeroes [1 << 20]byte

// OpenDisk opens the backing file or device at path and checks that it
// holds at least size bytes.
func OpenDisk(path string, size int64) (Disk, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("backing disk %s does not exist: create it (for a file: truncate -s %d %s) or fix the path in the config", path, size, path)
		}
		return nil, fmt.Errorf("open backing disk: %w", err)
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("size of backing disk %s: %w", path, err)
	}
	if end < size {
		f.Close()
		return nil, fmt.Errorf("backing disk %s holds %d bytes but the volume needs %d: grow it (truncate -s %d %s) or shrink the volume", path, end, size, size, path)
	}
	// No readahead: a block device's client does its own, and pages read
	// ahead land in large folios that make every later small write into
	// them expensive (see maxWriteChunk). Reads still fetch what they ask
	// for in one go.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		f.Close()
		return nil, fmt.Errorf("backing disk %s: fadvise: %w", path, err)
	}
	d := &fileDisk{f: f}
	d.size.Store(end)
	return d, nil
}

func (d *fileDisk) Size() int64 { return d.size.Load() }

// Remeasurer is a Disk whose device may grow under it (a file made
// larger, a LUN grown by its storage): Remeasure reads its size again.
type Remeasurer interface {
	Remeasure() (int64, error)
}

// Remeasure reads the size of the file or device again; Size reports it
// from then on. A device never shrinks under a volume: a smaller size is
// refused and Size stays.
func (d *fileDisk) Remeasure() (int64, error) {
	end, err := d.f.Seek(0, io.SeekEnd)
	if err != nil {
		return d.Size(), err
	}
	if end < d.Size() {
		return d.Size(), fmt.Errorf("%s shrank from %d to %d bytes under the volume", d.f.Name(), d.Size(), end)
	}
	d.size.Store(end)
	return end, nil
}

func (d *fileDisk) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.f.ReadAt(p, off)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	return n, err
}

// maxWriteChunk caps one write syscall. The page cache sizes a folio by the
// write that creates it; ext4 then walks every block of a folio on each
// later write into it, so a 4 KiB overwrite of a page that a 1 MiB write
// cached costs as much as 256 small ones. Large writes (sequential client
// writes, resync runs) are issued in pieces of this size, which keeps the
// volume's small random writes cheap.
const maxWriteChunk = 64 << 10

func (d *fileDisk) WriteAt(p []byte, off int64) (int, error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	done := 0
	for done < len(p) {
		n, err := d.f.WriteAt(p[done:done+min(len(p)-done, maxWriteChunk)], off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (d *fileDisk) Sync() error { return unix.Fdatasync(int(d.f.Fd())) }

func (d *fileDisk) Zero(off, length int64) error {
	if !d.noPunch.Load() {
		err := unix.Fallocate(int(d.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENODEV) {
			return err
		}
		d.noPunch.Store(true)
	}
	for length > 0 {
		n := min(length, int64(len(zeroes)))
		if _, err := d.f.WriteAt(zeroes[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

func (d *fileDisk) Close() error { return d.f.Close() }

// syncWriter is a Disk that can write one range durably without flushing
// everything else (pwritev2 with RWF_DSYNC).
type syncWriter interface {
	WriteAtSync(p []byte, off int64) error
}

// WriteSync writes p at off and makes it durable BEFORE it returns.
func WriteSync(d Disk, p []byte, off int64) error {
	if sw, ok := d.(syncWriter); ok {
		return sw.WriteAtSync(p, off)
	}
	if _, err := d.WriteAt(p, off); err != nil {
		return err
	}
	return d.Sync()
}

func (d *fileDisk) WriteAtSync(p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwritev2(int(d.f.Fd()), [][]byte{p}, off, unix.RWF_DSYNC)
		if err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
				if _, err := d.f.WriteAt(p, off); err != nil {
					return err
				}
				return d.Sync()
			}
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// HoleFinder is a Disk that can tell unallocated ranges (which read as
// zeroes) without reading them: resync skips them, which keeps a sparse
// volume's first sync cheap and keeps the page cache free of zero pages.
type HoleFinder interface {
	IsHole(off, length int64) bool
}

// IsHole reports whether [off, off+length) holds no data (SEEK_DATA).
func (d *fileDisk) IsHole(off, length int64) bool {
	next, err := unix.Seek(int(d.f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true // no data at or after off
	}
	return err == nil && next >= off+length
}
