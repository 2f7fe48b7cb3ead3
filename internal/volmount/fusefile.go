package volmount

import (
	"context"
	"errors"
	"io"
	"log"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/replvol/replvol/transport/nbdclient"
)

// Device is the block device a FUSE file serves: the export, through its NBD connections.
// Its methods are called from many goroutines at once.
type Device interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
	// Flush makes every write that returned before it durable.
	Flush() error
	// WriteZeroes makes a range read as zeroes (nbdclient.ErrUnsupported when it cannot).
	WriteZeroes(off, length int64) error
}

// diskFile is the export as one regular file. It is opened with FOPEN_DIRECT_IO, so the page
// cache holds nothing of it: the loop device's writes reach the export when they return, and
// its flushes (an fsync of the file) reach it as NBD flushes.
type diskFile struct {
	fs.Inode
	dev Device
}

var (
	_ fs.NodeOpener    = (*diskFile)(nil)
	_ fs.NodeGetattrer = (*diskFile)(nil)
	_ fs.NodeSetattrer = (*diskFile)(nil)
	_ fs.NodeReader    = (*diskFile)(nil)
	_ fs.NodeWriter    = (*diskFile)(nil)
	_ fs.NodeFsyncer   = (*diskFile)(nil)
	_ fs.NodeFlusher   = (*diskFile)(nil)
	_ fs.NodeAllocater = (*diskFile)(nil)
)

func (d *diskFile) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (d *diskFile) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o600
	out.Size = uint64(d.dev.Size())
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 4096
	out.Nlink = 1
	return 0
}

// Setattr refuses a change of size (the volume's size is the cluster's); it takes the rest
// (times, modes) without keeping them.
func (d *diskFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok && int64(size) != d.dev.Size() {
		return syscall.EPERM
	}
	return d.Getattr(ctx, fh, out)
}

func (d *diskFile) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	size := d.dev.Size()
	if off >= size || off < 0 {
		return fuse.ReadResultData(nil), 0
	}
	n := int(min(int64(len(dest)), size-off))
	if _, err := d.dev.ReadAt(dest[:n], off); err != nil {
		return nil, errno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (d *diskFile) Write(_ context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if off < 0 || int64(len(data)) > d.dev.Size()-off {
		return 0, syscall.ENOSPC
	}
	if _, err := d.dev.WriteAt(data, off); err != nil {
		return 0, errno(err)
	}
	return uint32(len(data)), 0
}

// Fsync is the loop device's flush: an NBD flush.
func (d *diskFile) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno {
	return errno(d.dev.Flush())
}

// Flush is close(2): nothing is buffered here.
func (d *diskFile) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

// Allocate takes the loop device's discards and zeroing (fallocate PUNCH_HOLE or ZERO_RANGE,
// with KEEP_SIZE) as NBD write-zeroes: the range then reads as zeroes, as fallocate
// promises, and the server may deallocate it.
func (d *diskFile) Allocate(_ context.Context, _ fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	const punchHole, zeroRange, keepSize = 0x02, 0x10, 0x01
	if mode&(punchHole|zeroRange) == 0 || mode&^(punchHole|zeroRange|keepSize) != 0 {
		return syscall.EOPNOTSUPP
	}
	end := min(off+size, uint64(d.dev.Size()))
	if off >= end {
		return 0
	}
	return errno(d.dev.WriteZeroes(int64(off), int64(end-off)))
}

// errno is the error a FUSE caller gets: the server's own errno for a refused request, EIO
// for everything else (a broken connection, a timeout).
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e nbdclient.Errno
	if errors.As(err, &e) {
		return e.Syscall()
	}
	if errors.Is(err, nbdclient.ErrUnsupported) {
		return syscall.EOPNOTSUPP
	}
	return syscall.EIO
}

// mountFUSE serves dev as file name in a FUSE file system mounted on dir, until it is
// unmounted (Wait on the server returned). The file's inode is returned too: its
// NotifyContent tells the kernel the file's size changed.
func mountFUSE(dir, name, fsName string, dev Device, logger *log.Logger) (*fuse.Server, *diskFile, error) {
	root := &fs.Inode{}
	file := &diskFile{dev: dev}
	attrTimeout := time.Second
	opts := &fs.Options{
		FirstAutomaticIno: 1,
		AttrTimeout:       &attrTimeout,
		EntryTimeout:      &attrTimeout,
		OnAdd: func(ctx context.Context) {
			ch := root.NewPersistentInode(ctx, file, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
			root.AddChild(name, ch, false)
		},
		Logger: logger,
		MountOptions: fuse.MountOptions{
			DirectMount:   true,
			FsName:        fsName,
			Name:          "replvol",
			MaxWrite:      1 << 20,
			MaxBackground: 64,
			DisableXAttrs: true,
			Logger:        logger,
		},
	}
	srv, err := fs.Mount(dir, root, opts)
	return srv, file, err
}
