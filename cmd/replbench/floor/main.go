package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/replvol/replvol/internal/lockorder"
)

// NBD wire values (NetworkBlockDevice/nbd doc/proto.md).
const (
	nbdMagic         = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic         = 0x49484156454f5054 // "IHAVEOPT"
	optReplyMagic    = 0x3e889045565a9
	requestMagic     = 0x25609513
	simpleReplyMagic = 0x67446698

	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1

	optExportName = 1
	optAbort      = 2
	optInfo       = 6
	optGo         = 7

	repAck      = 1
	repInfo     = 3
	repErrUnsup = 1<<31 | 1
	infoExport  = 0

	transmitHasFlags  = 1 << 0
	transmitSendFlush = 1 << 2

	cmdRead  = 0
	cmdWrite = 1
	cmdDisc  = 2
	cmdFlush = 3

	errIO    = 5
	errInval = 22

	maxOptionLength  = 64 << 10
	maxRequestLength = 32 << 20
)

// The replica's frames: a header (kind, length, offset, handle) and, for a
// write, the data; its acknowledgement: the handle and an errno (0: done).
const (
	frameWrite      = 0
	frameFlush      = 1
	frameHeaderSize = 24
	ackSize         = 12
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: floor serve|replica [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	file := fs.String("file", "", "the backing file")
	size := fs.Int64("size", 0, "serve: the export's size (0: the file's)")
	peer := fs.String("peer", "", "serve: the replica's address")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*listen, *file, *size, *peer)
	case "replica":
		err = replica(*listen, *file)
	default:
		err = fmt.Errorf("unknown mode %q: want serve or replica", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

// listenReady listens on addr and says "ready" on stdout.
func listenReady(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	fmt.Printf("ready %s\n", l.Addr())
	return l, nil
}

func serve(addr, path string, size int64, peer string) error {
	if path == "" || peer == "" {
		return errors.New("serve needs -file and -peer")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if size == 0 {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		size = st.Size()
	}
	l, err := listenReady(addr)
	if err != nil {
		return err
	}
	err = serveOn(l, int(f.Fd()), size, peer)
	runtime.KeepAlive(f) // its finalizer would close the fd serveOn uses
	return err
}

// serveOn serves the file open at fd as an NBD export of size bytes on
// l, each connection replicated to peer, until l is closed and every
// session has ended.
func serveOn(l net.Listener, fd int, size int64, peer string) error {
	var sessions sync.WaitGroup
	defer sessions.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		sessions.Go(func() {
			if err := serveConn(c, fd, size, peer); err != nil {
				fmt.Fprintln(os.Stderr, "floor: connection:", err)
			}
		})
	}
}

// serveConn is one NBD client's session.
func serveConn(c net.Conn, fd int, size int64, peer string) error {
	defer c.Close()
	r := bufio.NewReaderSize(c, 256<<10)
	w := bufio.NewWriterSize(c, 256<<10)
	ok, err := handshake(r, w, size)
	if err != nil || !ok {
		return err
	}
	pc, err := net.Dial("tcp", peer)
	if err != nil {
		return fmt.Errorf("dial the replica: %w", err)
	}
	defer pc.Close()
	s := &session{fd: fd, size: size, w: w, peer: bufio.NewWriterSize(pc, 256<<10)}
	acked := make(chan error, 1)
	go func() { acked <- s.replyAcks(bufio.NewReaderSize(pc, 64<<10)) }()
	err = s.requests(r)
	if ferr := s.peer.Flush(); err == nil {
		err = ferr
	}
	_ = pc.(*net.TCPConn).CloseWrite() // the replica answers what it got, then closes
	if aerr := <-acked; err == nil {
		err = aerr
	}
	return err
}

// handshake negotiates an export (fixed newstyle); false when the client
// went away or aborted.
func handshake(r *bufio.Reader, w *bufio.Writer, size int64) (bool, error) {
	var hdr [18]byte
	binary.BigEndian.PutUint64(hdr[0:], nbdMagic)
	binary.BigEndian.PutUint64(hdr[8:], optMagic)
	binary.BigEndian.PutUint16(hdr[16:], flagFixedNewstyle|flagNoZeroes)
	w.Write(hdr[:])
	if err := w.Flush(); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(r, cf[:]); err != nil {
		return false, err
	}
	noZeroes := binary.BigEndian.Uint32(cf[:])&flagNoZeroes != 0
	const tflags = transmitHasFlags | transmitSendFlush
	for {
		var oh [16]byte
		if _, err := io.ReadFull(r, oh[:]); err != nil {
			return false, err
		}
		if binary.BigEndian.Uint64(oh[0:]) != optMagic {
			return false, errors.New("bad option magic")
		}
		opt, n := binary.BigEndian.Uint32(oh[8:]), binary.BigEndian.Uint32(oh[12:])
		if n > maxOptionLength {
			return false, fmt.Errorf("option %d of %d bytes", opt, n)
		}
		if _, err := r.Discard(int(n)); err != nil {
			return false, err
		}
		switch opt {
		case optExportName:
			var b [10 + 124]byte
			binary.BigEndian.PutUint64(b[0:], uint64(size))
			binary.BigEndian.PutUint16(b[8:], tflags)
			if noZeroes {
				w.Write(b[:10])
			} else {
				w.Write(b[:])
			}
			return true, w.Flush()
		case optInfo, optGo:
			var info [12]byte
			binary.BigEndian.PutUint16(info[0:], infoExport)
			binary.BigEndian.PutUint64(info[2:], uint64(size))
			binary.BigEndian.PutUint16(info[10:], tflags)
			optReply(w, opt, repInfo, info[:])
			optReply(w, opt, repAck, nil)
			if err := w.Flush(); err != nil {
				return false, err
			}
			if opt == optGo {
				return true, nil
			}
		case optAbort:
			optReply(w, opt, repAck, nil)
			return false, w.Flush()
		default:
			optReply(w, opt, repErrUnsup, nil)
			if err := w.Flush(); err != nil {
				return false, err
			}
		}
	}
}

func optReply(w *bufio.Writer, opt, typ uint32, data []byte) {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], optReplyMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], typ)
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	w.Write(h[:])
	w.Write(data)
}

// session is one NBD connection in transmission.
type session struct {
	fd   int
	size int64
	peer *bufio.Writer // owned by requests

	mu lockorder.Mutex // guards w: replies come from requests and replyAcks (a leaf)
	w  *bufio.Writer
}

// reply sends a simple reply; flush says to send it now.
func (s *session) reply(handle uint64, errno uint32, data []byte, flush bool) error {
	var h [16]byte
	binary.BigEndian.PutUint32(h[0:], simpleReplyMagic)
	binary.BigEndian.PutUint32(h[4:], errno)
	binary.BigEndian.PutUint64(h[8:], handle)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w.Write(h[:])
	s.w.Write(data)
	if flush {
		return s.w.Flush()
	}
	return nil
}

// requests reads the client's requests until NBD_CMD_DISC or EOF. A write
// is pwritten, then framed to the replica; the frames queued while more
// requests are already buffered go out in one write.
func (s *session) requests(r *bufio.Reader) error {
	var buf []byte
	for {
		if r.Buffered() < 28 {
			if err := s.peer.Flush(); err != nil {
				return err
			}
		}
		var h [28]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if binary.BigEndian.Uint32(h[0:]) != requestMagic {
			return errors.New("bad request magic")
		}
		typ := binary.BigEndian.Uint16(h[6:])
		handle := binary.BigEndian.Uint64(h[8:])
		off := binary.BigEndian.Uint64(h[16:])
		n := binary.BigEndian.Uint32(h[24:])
		if n > maxRequestLength {
			return fmt.Errorf("request of %d bytes", n)
		}
		inRange := off <= uint64(s.size) && uint64(n) <= uint64(s.size)-off
		switch typ {
		case cmdWrite:
			if cap(buf) < frameHeaderSize+int(n) {
				buf = make([]byte, frameHeaderSize+int(n))
			}
			frame := buf[:frameHeaderSize+int(n)]
			if _, err := io.ReadFull(r, frame[frameHeaderSize:]); err != nil {
				return err
			}
			if !inRange {
				if err := s.reply(handle, errInval, nil, true); err != nil {
					return err
				}
				continue
			}
			if _, err := unix.Pwrite(s.fd, frame[frameHeaderSize:], int64(off)); err != nil {
				if err := s.reply(handle, errIO, nil, true); err != nil {
					return err
				}
				continue
			}
			putFrameHeader(frame, frameWrite, n, off, handle)
			if _, err := s.peer.Write(frame); err != nil {
				return err
			}
		case cmdFlush:
			if err := unix.Fdatasync(s.fd); err != nil {
				if err := s.reply(handle, errIO, nil, true); err != nil {
					return err
				}
				continue
			}
			var fh [frameHeaderSize]byte
			putFrameHeader(fh[:], frameFlush, 0, 0, handle)
			if _, err := s.peer.Write(fh[:]); err != nil {
				return err
			}
		case cmdRead:
			if !inRange {
				if err := s.reply(handle, errInval, nil, true); err != nil {
					return err
				}
				continue
			}
			if cap(buf) < int(n) {
				buf = make([]byte, n)
			}
			data := buf[:n]
			errno := uint32(0)
			if _, err := unix.Pread(s.fd, data, int64(off)); err != nil {
				errno, data = errIO, nil
			}
			if err := s.reply(handle, errno, data, true); err != nil {
				return err
			}
		case cmdDisc:
			return nil
		default:
			if err := s.reply(handle, errInval, nil, true); err != nil {
				return err
			}
		}
	}
}

func putFrameHeader(b []byte, kind, n uint32, off, handle uint64) {
	binary.BigEndian.PutUint32(b[0:], kind)
	binary.BigEndian.PutUint32(b[4:], n)
	binary.BigEndian.PutUint64(b[8:], off)
	binary.BigEndian.PutUint64(b[16:], handle)
}

// replyAcks answers the client as the replica acknowledges, until the
// replica closes; the replies to the acknowledgements already buffered go
// out in one write.
func (s *session) replyAcks(r *bufio.Reader) error {
	for {
		var a [ackSize]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := s.reply(binary.BigEndian.Uint64(a[0:]), binary.BigEndian.Uint32(a[8:]), nil, r.Buffered() < ackSize); err != nil {
			return err
		}
	}
}

func replica(addr, path string) error {
	if path == "" {
		return errors.New("replica needs -file")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	l, err := listenReady(addr)
	if err != nil {
		return err
	}
	err = replicaOn(l, int(f.Fd()))
	runtime.KeepAlive(f) // its finalizer would close the fd replicaOn uses
	return err
}

// replicaOn applies what the primaries connected on l send to the file
// open at fd, until l is closed and every connection has ended.
func replicaOn(l net.Listener, fd int) error {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		conns.Go(func() {
			if err := replicaConn(c, fd); err != nil {
				fmt.Fprintln(os.Stderr, "floor replica: connection:", err)
			}
		})
	}
}

// replicaConn applies one primary connection's frames in order and
// acknowledges each; the acknowledgements of the frames already buffered
// go out in one write.
func replicaConn(c net.Conn, fd int) error {
	defer c.Close()
	r := bufio.NewReaderSize(c, 256<<10)
	w := bufio.NewWriterSize(c, 16<<10)
	var buf []byte
	for {
		if r.Buffered() < frameHeaderSize {
			if err := w.Flush(); err != nil {
				return err
			}
		}
		var h [frameHeaderSize]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return w.Flush()
			}
			return err
		}
		kind, n := binary.BigEndian.Uint32(h[0:]), binary.BigEndian.Uint32(h[4:])
		off, handle := binary.BigEndian.Uint64(h[8:]), binary.BigEndian.Uint64(h[16:])
		if n > maxRequestLength {
			return fmt.Errorf("frame of %d bytes", n)
		}
		errno := uint32(0)
		switch kind {
		case frameWrite:
			if cap(buf) < int(n) {
				buf = make([]byte, n)
			}
			if _, err := io.ReadFull(r, buf[:n]); err != nil {
				return err
			}
			if _, err := unix.Pwrite(fd, buf[:n], int64(off)); err != nil {
				errno = errIO
			}
		case frameFlush:
			if err := unix.Fdatasync(fd); err != nil {
				errno = errIO
			}
		default:
			return fmt.Errorf("frame kind %d", kind)
		}
		var a [ackSize]byte
		binary.BigEndian.PutUint64(a[0:], handle)
		binary.BigEndian.PutUint32(a[8:], errno)
		if _, err := w.Write(a[:]); err != nil {
			return err
		}
	}
}
