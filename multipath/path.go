package multipath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/replvol/replvol/internal/lockorder"
)

// Path is one route to the LUN. Implementations must allow concurrent
// calls, and must keep no private write-back cache: Sync through any path
// makes durable every write completed through every path to the LUN (see
// doc.go), and a read through any path sees every completed write.
type Path interface {
	Name() string
	io.ReaderAt
	io.WriterAt
	// Sync makes every completed write to the LUN durable.
	Sync() error
	// Zero makes [off, off+length) read as zeroes.
	Zero(off, length int64) error
	// Size is the LUN's size in bytes, label included.
	Size() (int64, error)
	Close() error
}

// syncWriter is a Path that can write one range durably (FUA) without
// flushing everything else.
type syncWriter interface {
	WriteAtSync(p []byte, off int64) error
}

const memAlign = 4096

// alignedBuffer returns n bytes starting on a 4 KiB boundary, as O_DIRECT
// needs.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+memAlign)
	skip := (memAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))&(memAlign-1))) & (memAlign - 1)
	return b[skip : skip+n : skip+n]
}

func isAligned(b []byte, off int64, sector int64) bool {
	return off%sector == 0 && int64(len(b))%sector == 0 &&
		uintptr(unsafe.Pointer(unsafe.SliceData(b)))&(memAlign-1) == 0
}

// filePath is a regular file (buffered IO: the page cache is the file's,
// shared by every handle) or a block device (O_DIRECT: each device node
// has its own page cache, so buffered IO through two nodes of one LUN
// would read stale data and lose writes when a path dies).
type filePath struct {
	name    string
	f       *os.File
	fd      int
	direct  bool
	sector  int64           // O_DIRECT alignment of offsets and lengths
	rmw     lockorder.Mutex // serialises unaligned O_DIRECT writes
	noPunch atomic.Bool
}

// OpenFilePath opens a regular file or a block device as a path named
// name. A block device is opened with O_DIRECT.
func OpenFilePath(name, devicePath string) (Path, error) {
	st, err := os.Stat(devicePath)
	if err != nil {
		return nil, fmt.Errorf("multipath path %s: %w", name, err)
	}
	block := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	if !block && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("multipath path %s: %s is neither a regular file nor a block device", name, devicePath)
	}
	flags := os.O_RDWR
	if block {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(devicePath, flags, 0)
	if err != nil {
		return nil, fmt.Errorf("multipath path %s: %w", name, err)
	}
	p := &filePath{name: name, f: f, fd: int(f.Fd()), direct: block, sector: 1}
	if block {
		ss, err := unix.IoctlGetInt(p.fd, unix.BLKSSZGET)
		if err != nil || ss <= 0 {
			ss = 512
		}
		p.sector = int64(ss)
	}
	return p, nil
}

func (p *filePath) Name() string { return p.name }

func (p *filePath) Size() (int64, error) {
	if p.direct {
		var size uint64
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(p.fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size)))
		if errno != 0 {
			return 0, errno
		}
		return int64(size), nil
	}
	st, err := p.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (p *filePath) ReadAt(b []byte, off int64) (int, error) {
	if !p.direct || isAligned(b, off, p.sector) {
		n, err := p.f.ReadAt(b, off)
		if err == io.EOF && n == len(b) {
			err = nil
		}
		return n, err
	}
	start, buf := p.spanning(off, int64(len(b)))
	if _, err := p.f.ReadAt(buf, start); err != nil {
		return 0, err
	}
	return copy(b, buf[off-start:]), nil
}

// spanning returns the aligned range around [off, off+n) and a buffer for it.
func (p *filePath) spanning(off, n int64) (int64, []byte) {
	start := off / p.sector * p.sector
	end := (off + n + p.sector - 1) / p.sector * p.sector
	return start, alignedBuffer(int(end - start))
}

func (p *filePath) WriteAt(b []byte, off int64) (int, error) {
	if !p.direct || isAligned(b, off, p.sector) {
		return p.f.WriteAt(b, off)
	}
	if off%p.sector == 0 && int64(len(b))%p.sector == 0 {
		buf := alignedBuffer(len(b)) // aligned range, unaligned memory
		copy(buf, b)
		return p.f.WriteAt(buf, off)
	}
	// Read-modify-write of the partial sectors. It is atomic only against
	// other unaligned writes through this path; NBD and the node write
	// whole sectors.
	p.rmw.Lock()
	defer p.rmw.Unlock()
	start, buf := p.spanning(off, int64(len(b)))
	if _, err := p.f.ReadAt(buf, start); err != nil {
		return 0, err
	}
	copy(buf[off-start:], b)
	if _, err := p.f.WriteAt(buf, start); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteAtSync writes b durably (RWF_DSYNC) BEFORE it returns.
func (p *filePath) WriteAtSync(b []byte, off int64) error {
	if p.direct && !isAligned(b, off, p.sector) {
		if _, err := p.WriteAt(b, off); err != nil {
			return err
		}
		return p.Sync()
	}
	for len(b) > 0 {
		n, err := unix.Pwritev2(p.fd, [][]byte{b}, off, unix.RWF_DSYNC)
		if err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
				if _, err := p.WriteAt(b, off); err != nil {
					return err
				}
				return p.Sync()
			}
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func (p *filePath) Sync() error { return unix.Fdatasync(p.fd) }

func (p *filePath) Zero(off, length int64) error {
	// A block device punches whole sectors only; write the partial ones.
	if p.direct {
		if head := off % p.sector; head != 0 {
			n := min(p.sector-head, length)
			if _, err := p.WriteAt(make([]byte, n), off); err != nil {
				return err
			}
			off, length = off+n, length-n
		}
		if tail := length % p.sector; tail != 0 {
			if _, err := p.WriteAt(make([]byte, tail), off+length-tail); err != nil {
				return err
			}
			length -= tail
		}
		if length == 0 {
			return nil
		}
	}
	if !p.noPunch.Load() {
		err := unix.Fallocate(p.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			return err
		}
		p.noPunch.Store(true)
	}
	zeroes := alignedBuffer(int(min(length, 1<<20)))
	for length > 0 {
		n := min(length, int64(len(zeroes)))
		if _, err := p.WriteAt(zeroes[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

func (p *filePath) Close() error { return p.f.Close() }
