package nbdclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Options shape a connection.
type Options struct {
	// TLS, when set, makes the client STARTTLS and present its certificate.
	TLS *tls.Config
	// Timeout bounds each request, from its sending to its reply; 0 waits for ever. A request
	// not answered in time breaks the connection (its fate on the server is unknown): it and
	// every request after it fail.
	Timeout time.Duration
}

// ErrClosed is a request on a connection the client closed.
var ErrClosed = errors.New("the NBD connection is closed")

// ErrTimeout is a request the server did not answer within Options.Timeout.
var ErrTimeout = errors.New("the NBD server did not answer in time")

// BrokenError is a request on a connection that broke (the server closed it, the network
// failed, a request timed out, or the server broke the protocol): Err says why. Whether the
// requests in flight then were carried out is unknown, but for ErrServerClosed from a server
// that drains (see there).
type BrokenError struct{ Err error }

// ErrServerClosed is why a connection broke when the server ended it in order (an EOF between
// two replies, after every reply it sent) with requests in flight. A server that drains on
// shutdown, as replvol's does, answers every request it read before it ends the connection:
// those requests were then not carried out, and may be sent again, to the server that serves
// the export now. A server that crashed may have carried them out.
var ErrServerClosed = errors.New("the NBD server ended the connection")

// ErrShutdown is the server's answer to a request while it shuts down (NBD_ESHUTDOWN): the
// request was not carried out. The connection then takes no new request (they fail with
// ErrShutdown, unsent); the requests in flight get their answers, and then the client
// disconnects (NBD_CMD_DISC), as the protocol asks. Connect again, to the server that serves
// the export now.
const ErrShutdown = Errno(syscall.ESHUTDOWN)

func (e *BrokenError) Error() string { return "NBD connection lost: " + e.Err.Error() }
func (e *BrokenError) Unwrap() error { return e.Err }

// Conn is one NBD connection in the transmission phase. Requests from many goroutines are in
// flight at once; one goroutine reads the replies and hands each to its request.
type Conn struct {
	conn    net.Conn
	r       *bufio.Reader
	export  Export
	timeout time.Duration

	wmu lockorder.Mutex // one request's header and payload are written together

	mu      lockorder.Mutex
	pending map[uint64]*call
	next    uint64
	err     error // why the connection is no longer usable; nil while it is
	// disconnect: the server answered ErrShutdown; once no request is in flight the reader
	// sends NBD_CMD_DISC.
	disconnect bool

	readerDone chan struct{}
}

type call struct {
	dest []byte // a READ's buffer; the reader fills it before done
	done chan error
}

// Dial connects to addr, negotiates (see Negotiate) and selects export.
func Dial(ctx context.Context, addr, export string, opts Options) (*Conn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	conn, ex, err := Negotiate(ctx, raw, export, opts.TLS)
	if err != nil {
		raw.Close()
		return nil, err
	}
	return NewConn(conn, ex, opts.Timeout), nil
}

// NewConn starts transmission on conn, which Negotiate left there with export ex.
func NewConn(conn net.Conn, ex Export, timeout time.Duration) *Conn {
	c := &Conn{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), export: ex, timeout: timeout,
		pending: make(map[uint64]*call), next: 1, readerDone: make(chan struct{})}
	go c.readReplies()
	return c
}

// Export is what the server told of the export.
func (c *Conn) Export() Export { return c.export }

// Err is nil while the connection is usable, else why not.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// ReadAt reads len(p) bytes at off.
func (c *Conn) ReadAt(p []byte, off int64) (int, error) {
	if err := c.check(off, len(p)); err != nil {
		return 0, err
	}
	max := c.export.maxRequest()
	for done := 0; done < len(p); {
		n := min(len(p)-done, max)
		if err := c.do(cmdRead, uint64(off)+uint64(done), p[done:done+n], nil); err != nil {
			return done, err
		}
		done += n
	}
	return len(p), nil
}

// WriteAt writes p at off. It returns once the server answered, which for replvol means the
// write is where the volume's protocol promises; Flush makes it durable.
func (c *Conn) WriteAt(p []byte, off int64) (int, error) {
	if err := c.check(off, len(p)); err != nil {
		return 0, err
	}
	max := c.export.maxRequest()
	for done := 0; done < len(p); {
		n := min(len(p)-done, max)
		if err := c.do(cmdWrite, uint64(off)+uint64(done), nil, p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return len(p), nil
}

// Flush returns once every write answered before it is on stable storage (NBD_CMD_FLUSH); on
// a server that does not take flushes it does nothing.
func (c *Conn) Flush() error {
	if !c.export.CanFlush() {
		return nil
	}
	return c.send(cmdFlush, 0, 0, nil, nil)
}

// Trim tells the server that length bytes at off are no longer needed (NBD_CMD_TRIM); on a
// server that does not take trims it does nothing.
func (c *Conn) Trim(off, length int64) error {
	if !c.export.CanTrim() {
		return nil
	}
	return c.ranged(cmdTrim, off, length)
}

// ErrUnsupported is a request the server did not say it takes.
var ErrUnsupported = errors.New("the NBD server does not take this request")

// WriteZeroes makes length bytes at off read as zeroes, letting the server deallocate them
// (NBD_CMD_WRITE_ZEROES); ErrUnsupported when the server does not take it.
func (c *Conn) WriteZeroes(off, length int64) error {
	if !c.export.CanWriteZeroes() {
		return ErrUnsupported
	}
	return c.ranged(cmdWriteZeroes, off, length)
}

// ranged sends cmd for length bytes at off, in requests of at most the export's maximum.
func (c *Conn) ranged(cmd uint16, off, length int64) error {
	if off < 0 || length < 0 || length > c.export.Size-off {
		return fmt.Errorf("%d bytes at %d: outside the %d-byte export", length, off, c.export.Size)
	}
	for length > 0 {
		n := min(length, int64(c.export.maxRequest()))
		if err := c.send(cmd, uint64(off), uint32(n), nil, nil); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

func (c *Conn) check(off int64, n int) error {
	if off < 0 || int64(n) > c.export.Size-off {
		return fmt.Errorf("%d bytes at %d: outside the %d-byte export", n, off, c.export.Size)
	}
	return nil
}

func (c *Conn) do(cmd uint16, off uint64, dest, payload []byte) error {
	length := len(dest) + len(payload)
	return c.send(cmd, off, uint32(length), dest, payload)
}

// send sends one request and waits for its reply.
func (c *Conn) send(cmd uint16, off uint64, length uint32, dest, payload []byte) error {
	cl := &call{dest: dest, done: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	handle := c.next
	c.next++
	c.pending[handle] = cl
	c.mu.Unlock()

	var hdr [28]byte
	binary.BigEndian.PutUint32(hdr[0:], magicRequest)
	binary.BigEndian.PutUint16(hdr[6:], cmd)
	binary.BigEndian.PutUint64(hdr[8:], handle)
	binary.BigEndian.PutUint64(hdr[16:], off)
	binary.BigEndian.PutUint32(hdr[24:], length)
	c.wmu.Lock()
	if c.timeout > 0 {
		_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	}
	var err error
	if len(payload) == 0 {
		_, err = c.conn.Write(hdr[:])
	} else {
		bufs := net.Buffers{hdr[:], payload}
		_, err = bufs.WriteTo(c.conn)
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
		return <-cl.done
	}

	var expired <-chan time.Time
	if c.timeout > 0 {
		t := time.NewTimer(c.timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case err := <-cl.done:
		return err
	case <-expired:
		// The reply may still come, into dest: break the connection and wait until its
		// reader has stopped and failed every request in flight.
		c.fail(ErrTimeout)
		return <-cl.done
	}
}

// fail breaks the connection because of err (the first cause is kept) and closes it; the
// reader then fails every request in flight.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = &BrokenError{Err: err}
	}
	c.mu.Unlock()
	c.conn.Close()
}

// readReplies reads replies until the connection breaks, then fails every request left.
func (c *Conn) readReplies() {
	defer close(c.readerDone)
	var hdr [16]byte
	for {
		if n, err := io.ReadFull(c.r, hdr[:]); err != nil {
			if n == 0 && errors.Is(err, io.EOF) {
				err = ErrServerClosed
			}
			c.fail(err)
			break
		}
		magic := binary.BigEndian.Uint32(hdr[0:])
		if magic != magicSimpleReply {
			c.fail(fmt.Errorf("%w: reply magic %#x (structured replies were not asked for)", ErrProtocol, magic))
			break
		}
		errno := binary.BigEndian.Uint32(hdr[4:])
		handle := binary.BigEndian.Uint64(hdr[8:])
		c.mu.Lock()
		cl := c.pending[handle]
		delete(c.pending, handle)
		c.mu.Unlock()
		if cl == nil {
			c.fail(fmt.Errorf("%w: a reply to request %d, which is not in flight", ErrProtocol, handle))
			break
		}
		if errno != 0 {
			if Errno(errno) == ErrShutdown {
				c.shutDown()
			}
			cl.done <- Errno(errno)
			c.disconnectWhenIdle()
			continue
		}
		if len(cl.dest) > 0 {
			if _, err := io.ReadFull(c.r, cl.dest); err != nil {
				c.fail(err)
				cl.done <- c.Err()
				break
			}
		}
		cl.done <- nil
		c.disconnectWhenIdle()
	}
	c.mu.Lock()
	err := c.err
	left := c.pending
	c.pending = map[uint64]*call{}
	c.mu.Unlock()
	for _, cl := range left {
		cl.done <- err
	}
}

// shutDown makes the connection take no new request: the server is shutting down.
func (c *Conn) shutDown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = ErrShutdown
		c.disconnect = true
	}
}

// disconnectWhenIdle sends NBD_CMD_DISC once the server answered ErrShutdown and no request
// is in flight; the server then closes the connection, and the reader stops.
func (c *Conn) disconnectWhenIdle() {
	c.mu.Lock()
	send := c.disconnect && len(c.pending) == 0
	if send {
		c.disconnect = false
	}
	c.mu.Unlock()
	if send {
		c.sendDisconnect()
	}
}

// sendDisconnect writes NBD_CMD_DISC.
func (c *Conn) sendDisconnect() error {
	var hdr [28]byte
	binary.BigEndian.PutUint32(hdr[0:], magicRequest)
	binary.BigEndian.PutUint16(hdr[6:], cmdDisc)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.conn.Write(hdr[:])
	return err
}

// Close ends the connection: NBD_CMD_DISC when it is sound (the server answers the requests
// in flight first), then it waits up to 5 s for the server to close it. Requests after Close
// fail with ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	sound := c.err == nil
	if sound {
		c.err = ErrClosed
	}
	c.mu.Unlock()
	if sound {
		if err := c.sendDisconnect(); err == nil {
			select {
			case <-c.readerDone:
			case <-time.After(5 * time.Second):
			}
		}
	}
	err := c.conn.Close()
	<-c.readerDone
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
