package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport/frame"
)

// The replication stream's framing, under the replication wire format
// (package replication encodes what a frame says; this file only carries
// it). One TCP connection carries one stream, mutual TLS 1.3 over it when
// the cluster has a tls: section, as DRBD's stream is one TCP connection
// per resource and direction:
//
//	client → server: streamPreamble (8 bytes)
//	server → client: streamPreamble (the server took the stream)
//	then, both ways, until one end closes:
//	    kind (1 byte) | length (4 bytes, big endian) | length bytes
//
// A kindFrame carries one Frame. A kindEnd says why its sender ends the
// stream (endCode, then the reason in words) and is the last thing it
// sends; a clean end (endClean without words) reads as io.EOF. A length
// over MaxFrameSize ends the stream before a byte of the frame is
// buffered: the receiver answers with endTooLarge.
//
// A frame goes out in one write from the buffer it was built in: NewFrame
// keeps room for the header in front of the bytes, so neither end copies
// a frame on its own (the kernel and TLS do; a frame without that room,
// one received and sent on, goes as a writev of header and bytes). The
// receiver reads each frame into a pooled buffer of its size.
const (
	frameHeaderLen = frame.HeaderLen
	kindFrame      = 0
	kindEnd        = 1
	// maxEndLen bounds an end's words.
	maxEndLen = 4 << 10
)

// streamPreamble opens a replication stream both ways: "RVREPL", then the
// framing's version, 2 (1 was the stream over gRPC, which spoke HTTP/2
// here instead).
var streamPreamble = [8]byte{'R', 'V', 'R', 'E', 'P', 'L', 0, 2}

// endCode says why a stream ended, in its kindEnd.
type endCode byte

const (
	// endClean: the sender is done (a handler that returned nil, a
	// client that closed); words, if any, say why.
	endClean endCode = 0
	// endError: the server's handler failed; the words are its error.
	endError endCode = 1
	// endTooLarge: the receiver refused a frame over MaxFrameSize.
	endTooLarge endCode = 2
)

// ErrFrameTooLarge is a frame over MaxFrameSize: Send refuses to send it,
// and a receiver ends the stream with it rather than buffer it.
var ErrFrameTooLarge = errors.New("frame over the replication frame limit")

// Liveness of an idle or stuck connection, as the kernel checks it: a peer
// that answers no keepalive probe for about 4 s, or leaves sent bytes
// unacknowledged that long (its host gone, the network cut), ends the
// stream. A peer that is alive but slow keeps it: its kernel acknowledges.
const (
	keepaliveIdle     = 2 * time.Second
	keepaliveInterval = time.Second
	keepaliveCount    = 2
	userTimeout       = 4 * time.Second
)

// tuneConn sets a replication connection's liveness checks and disables
// Nagle (a frame is written whole, and an ack must not wait).
func tuneConn(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepaliveIdle, Interval: keepaliveInterval, Count: keepaliveCount})
	if raw, err := tc.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout/time.Millisecond))
		})
	}
}

// frameConn is one replication stream over a connection: a MsgStream
// whose SendMsg takes and RecvMsg fills a *Frame. One goroutine may send
// while another receives.
type frameConn struct {
	conn net.Conn
	// tcp: the connection is a plain TCP one, so a header and the
	// frame's bytes go out in one writev.
	tcp   bool
	r     *bufio.Reader
	state *tls.ConnectionState

	ctx    context.Context
	cancel context.CancelFunc
	stop   func() bool // context.AfterFunc's: closes conn when ctx ends

	hdr  [frameHeaderLen]byte // the sender's, for frames without room
	rhdr [frameHeaderLen]byte // the receiver's
	// iov is the sender's writev of a frame with references (writeRefs),
	// kept between frames; guarded by wmu.
	iov net.Buffers

	// wmu serialises the sender and the end (close, a refused frame):
	// an end never lands inside a frame. One sender takes it uncontended.
	wmu     lockorder.Mutex
	endOnce sync.Once

	// The receiver's word on long frames (Arrivals): longs gets a wake as
	// one begins to arrive, arriving is set while it does, and arrived
	// counts the bytes read from the connection so far (counted).
	longs    chan struct{}
	arriving atomic.Bool
	arrived  atomic.Int64
}

// LongFrame is the size from which a frame counts as long (Arrivals).
const LongFrame = 64 << 10

// counted is a connection's reader that counts the bytes it reads: one
// atomic add per read, whatever its size.
type counted struct {
	r io.Reader
	n *atomic.Int64
}

func (c counted) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Arrivals is what a MsgStream may say of the frames arriving, so that a
// receiver can tell its peer it is alive while a long frame crosses a
// slow link (a megabyte at a few megabits a second takes longer than a
// peer's timeout): the stream's framing says it; a test double may.
type Arrivals interface {
	// LongFrames gets a wake (buffered: the receiver never waits on it)
	// when a frame of LongFrame bytes or more begins to arrive.
	LongFrames() <-chan struct{}
	// Arriving reports whether such a frame is arriving now, and how
	// many bytes arrived so far (it only grows).
	Arriving() (now bool, bytes int64)
}

func (fc *frameConn) LongFrames() <-chan struct{} { return fc.longs }

func (fc *frameConn) Arriving() (bool, int64) { return fc.arriving.Load(), fc.arrived.Load() }

// A stream's read buffer: acks and small frames come out of it several to
// a read; a larger frame is read straight into its own buffer past it.
// The served side (acceptedReadBuffer) reads the primary's writes; the
// dialled side (dialledReadBuffer), a primary's sender, reads acks and
// read replies, small but for those a larger frame carries anyway, so it
// holds less: a primary of a thousand volumes holds a thousand of them.
const (
	acceptedReadBuffer = 16 << 10
	dialledReadBuffer  = 4 << 10
)

func newFrameConn(parent context.Context, conn net.Conn, state *tls.ConnectionState, readBuffer int) *frameConn {
	ctx, cancel := context.WithCancel(parent)
	_, tcp := conn.(*net.TCPConn)
	fc := &frameConn{conn: conn, tcp: tcp, state: state, ctx: ctx, cancel: cancel, longs: make(chan struct{}, 1)}
	fc.r = bufio.NewReaderSize(counted{r: conn, n: &fc.arrived}, readBuffer)
	fc.stop = context.AfterFunc(ctx, func() { conn.Close() })
	return fc
}

func (fc *frameConn) Context() context.Context { return fc.ctx }

// SendMsg sends m, a *Frame, and releases its buffer.
func (fc *frameConn) SendMsg(m any) error {
	f, ok := m.(*Frame)
	if !ok {
		return fmt.Errorf("replication stream: cannot send %T", m)
	}
	defer f.Release()
	if f.Released() {
		return errors.New("replication stream: cannot send a released frame")
	}
	n := f.Len()
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	if n > MaxFrameSize {
		return &StreamError{words: fmt.Sprintf("frame too large for the peer: %d bytes, the limit is %d", n, MaxFrameSize), err: ErrFrameTooLarge}
	}
	var err error
	switch b := f.Headed(); {
	case len(f.Refs()) > 0:
		err = fc.writeRefs(f, n)
	case b != nil:
		putHeader(b, kindFrame, n)
		_, err = fc.conn.Write(b)
	default:
		putHeader(fc.hdr[:], kindFrame, n)
		err = fc.writeTwo(fc.hdr[:], f.Bytes())
	}
	if err != nil {
		return fc.fail(err)
	}
	return nil
}

// writeRefs writes a frame of n bytes that holds some by reference: its
// header, its own bytes and the references in order, with one writev on
// TCP; on TLS they are copied into one buffer first, so that the frame
// is one record, not one per piece. Callers hold fc.wmu.
func (fc *frameConn) writeRefs(f *Frame, n int) error {
	own, refs := f.Bytes(), f.Refs()
	if last := refs[len(refs)-1].At; last > len(own) {
		return fmt.Errorf("replication stream: a reference at %d of a frame of %d bytes", last, len(own))
	}
	var hdr []byte
	if b := f.Headed(); b != nil {
		hdr = b[:frameHeaderLen]
	} else {
		hdr = fc.hdr[:]
	}
	putHeader(hdr, kindFrame, n)
	if !fc.tcp {
		b := frame.GetBuffer(frameHeaderLen + n)
		defer frame.PutBuffer(b)
		_, err := fc.conn.Write(f.AppendContents(append((*b)[:0], hdr...)))
		return err
	}
	bufs := append(fc.iov[:0], hdr)
	prev := 0
	for _, r := range refs {
		if r.At > prev {
			bufs = append(bufs, own[prev:r.At])
		}
		bufs = append(bufs, r.B)
		prev = r.At
	}
	if prev < len(own) {
		bufs = append(bufs, own[prev:])
	}
	fc.iov = bufs
	_, err := bufs.WriteTo(fc.conn)
	// No reference to a client's buffer outlives the frame.
	clear(fc.iov[:cap(fc.iov)])
	return err
}

// writeTwo writes a header and the bytes after it: one writev on TCP.
func (fc *frameConn) writeTwo(hdr, b []byte) error {
	if fc.tcp {
		bufs := net.Buffers{hdr, b}
		_, err := bufs.WriteTo(fc.conn)
		return err
	}
	if _, err := fc.conn.Write(hdr); err != nil {
		return err
	}
	_, err := fc.conn.Write(b)
	return err
}

func putHeader(b []byte, kind byte, n int) {
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:frameHeaderLen], uint32(n))
}

// RecvMsg reads the next frame into m, a *Frame, reusing its buffer when
// it is large enough. The peer's end reads as io.EOF when clean, else as
// a *StreamError in its words.
func (fc *frameConn) RecvMsg(m any) error {
	f, ok := m.(*Frame)
	if !ok {
		return fmt.Errorf("replication stream: cannot receive into %T", m)
	}
	if _, err := io.ReadFull(fc.r, fc.rhdr[:]); err != nil {
		return fc.fail(err)
	}
	kind, n := fc.rhdr[0], int(binary.BigEndian.Uint32(fc.rhdr[1:]))
	switch {
	case kind == kindEnd:
		return fc.peerEnded(n)
	case kind != kindFrame:
		fc.end(endError, fmt.Sprintf("unknown frame kind %d", kind))
		return fc.fail(fmt.Errorf("%w: the peer sent a frame of unknown kind %d", errMalformed, kind))
	case n > MaxFrameSize:
		fc.end(endTooLarge, fmt.Sprintf("a frame of %d bytes, the limit is %d", n, MaxFrameSize))
		fc.linger()
		return &StreamError{words: fmt.Sprintf("the peer sent a frame of %d bytes, over the limit of %d", n, MaxFrameSize), err: ErrFrameTooLarge}
	}
	b := f.Fill(n)
	if n >= LongFrame {
		return fc.readLong(b)
	}
	if _, err := io.ReadFull(fc.r, b); err != nil {
		return fc.fail(err)
	}
	return nil
}

// readLong reads a long frame's bytes into b, and says so (Arrivals)
// while they come.
func (fc *frameConn) readLong(b []byte) error {
	fc.arriving.Store(true)
	defer fc.arriving.Store(false)
	select {
	case fc.longs <- struct{}{}:
	default: // a wake is pending already
	}
	if _, err := io.ReadFull(fc.r, b); err != nil {
		return fc.fail(err)
	}
	return nil
}

// errMalformed is a stream whose bytes are not the framing.
var errMalformed = errors.New("malformed replication stream")

// peerEnded reads the peer's end of n bytes and returns what it says.
func (fc *frameConn) peerEnded(n int) error {
	if n < 1 || n > maxEndLen+1 {
		return fc.fail(fmt.Errorf("%w: an end of %d bytes", errMalformed, n))
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(fc.r, b); err != nil {
		return fc.fail(err)
	}
	fc.cancel()
	code, words := endCode(b[0]), string(b[1:])
	switch code {
	case endClean:
		if words == "" {
			return io.EOF
		}
		return &StreamError{words: "the peer ended the stream: " + words, err: io.EOF}
	case endTooLarge:
		return &StreamError{words: "frame too large for the peer: " + words, err: ErrFrameTooLarge}
	}
	return &StreamError{words: "the peer ended the stream: " + words, err: errPeerEnded}
}

// errPeerEnded is a stream the peer ended with an error of its own.
var errPeerEnded = errors.New("the peer ended the stream")

// fail ends the stream after a read or write failed, and says why in
// words: closed here, or lost.
func (fc *frameConn) fail(err error) error {
	local := fc.ctx.Err() != nil
	fc.cancel()
	switch {
	case local:
		return &StreamError{words: "stream closed here", err: context.Canceled}
	case errors.Is(err, errMalformed):
		return &StreamError{words: err.Error(), err: err}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &StreamError{words: "connection lost: the peer closed the connection", err: io.ErrUnexpectedEOF}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &StreamError{words: "connection lost: no answer from the peer in time", err: err}
	}
	return &StreamError{words: "connection lost: " + DialWords(err), err: err}
}

// close ends a client's stream: a clean end, unless a Send is under way
// (stuck on a peer that does not read), then the connection goes.
func (fc *frameConn) close() {
	if fc.ctx.Err() == nil {
		fc.end(endClean, "")
	}
	fc.cancel()
}

// end sends the stream's last word, once, and stops sending: a half
// close, so that what was sent before it arrives before the connection
// goes (closing with unread bytes would reset it and lose them). It is
// not sent while a Send is under way.
func (fc *frameConn) end(code endCode, words string) {
	if !fc.wmu.TryLock() {
		return
	}
	defer fc.wmu.Unlock()
	fc.endOnce.Do(func() {
		if len(words) > maxEndLen {
			words = words[:maxEndLen]
		}
		b := make([]byte, frameHeaderLen+1+len(words))
		putHeader(b, kindEnd, 1+len(words))
		b[frameHeaderLen] = byte(code)
		copy(b[frameHeaderLen+1:], words)
		fc.conn.SetWriteDeadline(time.Now().Add(time.Second))
		fc.conn.Write(b)
		switch c := fc.conn.(type) {
		case *net.TCPConn:
			c.CloseWrite()
		case *tls.Conn:
			c.CloseWrite()
		}
	})
}

// linger ends the stream and closes its connection once the peer closed
// its side, or after a short while: the bytes sent last then reach it.
func (fc *frameConn) linger() {
	if !fc.stop() {
		return // closed already
	}
	fc.cancel()
	go func() {
		fc.conn.SetReadDeadline(time.Now().Add(lingerTime))
		io.Copy(io.Discard, fc.conn)
		fc.conn.Close()
	}()
}

// lingerTime bounds how long a stream that ended waits for its peer to
// take its last bytes.
const lingerTime = 2 * time.Second
