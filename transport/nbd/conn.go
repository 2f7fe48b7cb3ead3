package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/lockorder"
)

// serverConn is one client connection. Its goroutine (serve) negotiates and then reads requests;
// up to MaxInFlight worker goroutines execute them and write the replies under writeMu. Every
// request holds bytes of the connection's budget until its reply is written or dropped.
type serverConn struct {
	srv *Server
	// conn is the TCP connection: deadlines are set and a broken connection is closed there,
	// whether or not TLS runs over it.
	conn net.Conn
	// stream carries the protocol: conn, or after NBD_OPT_STARTTLS the TLS connection over
	// it. Set by the serve goroutine during negotiation only.
	stream net.Conn
	// tls is the TLS connection once STARTTLS succeeded, else nil; progress is what it runs
	// over (conn, with StallTimeout applied to its writes in transmission). Set like stream.
	tls      *tls.Conn
	progress *progressConn
	// tlsOut gathers a round of replies into TLS records (see writeRepliesTLS). Writer only.
	tlsOut     *bufio.Writer
	remoteAddr string
	r          *bufio.Reader // used by the serve goroutine only, in both phases
	log        *slog.Logger
	ctx        context.Context // passed to the Export; cancelled by forceClose and when serve returns
	cancel     context.CancelFunc
	done       chan struct{} // closed when the connection is closed and all its workers have returned
	// stopReading is closed when the connection can carry no more replies (a reply write
	// failed or stalled, or forceClose) or is drained while negotiating: a reader waiting for
	// budget drops the request it holds, which no Export call has seen, and stops.
	stopReading chan struct{}
	stopOnce    sync.Once
	budget      connBudget
	timing      drainTiming // the Server's, as the connection was accepted
	// slot is the connection's place in the Server's connection limits: Negotiated once it
	// enters transmission, Released when it is removed.
	slot *connlimit.Slot

	// Guarded by srv.mu.
	attached   bool
	exportName string
	since      time.Time // when it entered transmission

	mu       lockorder.Mutex // guards the fields below and every change of the read deadline
	draining bool
	// transmitting: the export is attached, so the client may send requests. A draining
	// connection in transmission goes on reading until its client is quiet (drainQuiet) or
	// sends NBD_CMD_DISC, answering what it reads with NBD_ESHUTDOWN, but no longer than
	// drainEnd.
	transmitting bool
	// inRequest: the reader is within a request (the read deadline is the request's own).
	inRequest  bool
	quietUntil time.Time // while draining: the client is quiet if no request comes before
	drainEnd   time.Time
	// drainStarted is closed when the drain begins: a reader waiting for the node's budget
	// answers the request it holds NBD_ESHUTDOWN; no Export call has seen it.
	drainStarted chan struct{}
	// drained: the reader stopped because the drain was over; closeConn ends the connection
	// in order. Owned by the serve goroutine.
	drained bool

	generation uint64 // closeGeneration of the name last looked up; owned by the serve goroutine

	// Transmission phase. workers is owned by the serve goroutine.
	export   Export
	readOnly bool
	// size is the export's size this client was told: an export that
	// grows later (an online resize) keeps it for this connection, as
	// NBD has no way to tell a client; a new connection sees the new one.
	size        int64
	work        chan *request
	workers     int
	workerGroup sync.WaitGroup
	executing   atomic.Int32 // requests handed to workers whose reply is not queued yet

	// Replies are combined: a worker queues its reply; if no worker is
	// writing, it becomes the writer and sends everything queued with one
	// writev, until the queue is empty. Under load that is one syscall for
	// many replies: a writer first yields once while other requests are
	// still running (executing), so that their replies join its writev.
	writeMu  lockorder.Mutex // guards the fields below
	writing  bool            // a worker is writing the queue
	queue    []*request      // replies waiting for the writer; their buffers stay valid until written
	spare    []*request
	writeErr error // the first failed reply write
	// Owned by the current writer.
	iov           net.Buffers
	writeDeadline time.Time // the connection's write deadline
}

// request is one request on its way through a worker, from the moment the reader charged its
// cost to the connection's budget until its reply is written or dropped. Pooled.
type request struct {
	header      requestHeader
	cost        int64   // bytes of budget it holds
	fromReserve bool    // cost is charged to the connection's reserve, not the node budget
	payload     *buffer // WRITE: data received; READ: data to send
	reply       [replyHeaderSize]byte
	data        []byte // READ reply data (aliases payload)
}

var requestPool = sync.Pool{New: func() any { return new(request) }}

// aLongTimeAgo is a read deadline that makes blocked and future reads fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// A connection reads options through a small buffer, and only in transmission through a large
// one: a client holding many connections in negotiation costs little memory each.
const (
	negotiationReadBuffer  = 4 << 10
	transmissionReadBuffer = 64 << 10
)

func newServerConn(s *Server, conn net.Conn, slot *connlimit.Slot) *serverConn {
	ctx, cancel := context.WithCancel(context.Background())
	remote := conn.RemoteAddr().String()
	return &serverConn{
		srv:          s,
		conn:         conn,
		stream:       conn,
		remoteAddr:   remote,
		r:            bufio.NewReaderSize(conn, negotiationReadBuffer),
		log:          s.log.With("remote", remote),
		ctx:          ctx,
		cancel:       cancel,
		done:         make(chan struct{}),
		stopReading:  make(chan struct{}),
		drainStarted: make(chan struct{}),
		budget:       connBudget{limit: s.connectionBudget, reserve: s.reserve},
		timing:       s.drainTiming, // startConn holds s.mu
		slot:         slot,
	}
}

func (c *serverConn) serve() {
	defer close(c.done)
	defer c.srv.removeConn(c)
	defer c.cancel()
	defer c.closeConn()
	export, ok := c.negotiate()
	if !ok {
		c.srv.stats.failed.Add(1)
		return
	}
	c.transmit(export)
}

// Draining a connection in transmission (NBD's soft disconnect): the requests already received
// are carried out and answered; a request that arrives after the drain began is answered with
// NBD_ESHUTDOWN without being carried out, which tells the client that nothing happened and that
// it should disconnect (and may retry elsewhere). The reader stops at a request boundary once
// the client sent NBD_CMD_DISC, or nothing for drainQuiet and no byte waits in the socket, and
// at the latest drainLimit after the drain began; a request the client began to send is read
// to its end. Once every request read is answered, the server ends the connection in order
// (closeInOrder): the client reads every reply, then EOF. A request the client sent after the
// reader's last read gets no reply and was not carried out; the client sees the connection end,
// never a reset.
const (
	drainQuiet = 100 * time.Millisecond
	drainLimit = 2 * time.Second
	// drainLinger bounds how long an ended connection reads what its client still sends.
	drainLinger = 2 * time.Second
)

// drainTiming is how a Server's connections wind down; tests shorten it.
type drainTiming struct {
	quiet, limit, linger time.Duration
	// readerStopped, if set, is called when a draining connection's reader has stopped.
	readerStopped func()
}

var defaultDrainTiming = drainTiming{quiet: drainQuiet, limit: drainLimit, linger: drainLinger}

// errDrained ends transmission: the drain is over and the reader stopped at a request boundary.
var errDrained = errors.New("nbd: drained: the client is quiet")

// beginDrain makes the connection wind down: requests read are answered, new ones get
// NBD_ESHUTDOWN, then the connection ends (see drainQuiet). A request waiting for the node's
// budget is answered NBD_ESHUTDOWN at once, so that a drain does not wait for budget other
// connections hold. Connections still negotiating just close.
func (c *serverConn) beginDrain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return
	}
	c.draining = true
	close(c.drainStarted)
	if !c.transmitting {
		_ = c.conn.SetReadDeadline(aLongTimeAgo)
		c.stopOnce.Do(func() { close(c.stopReading) })
		return
	}
	now := time.Now()
	c.quietUntil, c.drainEnd = now.Add(c.timing.quiet), now.Add(c.timing.limit)
	if !c.inRequest {
		_ = c.conn.SetReadDeadline(c.boundaryDeadlineLocked())
	}
}

// markTransmitting records that the client may send requests from now on (its export was
// attached): a drain from here on answers them instead of closing at once.
func (c *serverConn) markTransmitting() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.transmitting = true
}

// boundaryDeadlineLocked is the read deadline at a request boundary during a drain.
func (c *serverConn) boundaryDeadlineLocked() time.Time {
	return earliest(c.quietUntil, c.drainEnd)
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// drainRequest reports whether the connection is draining; if so, the request just read is
// answered with NBD_ESHUTDOWN, and the client has drainQuiet more to send the next one.
func (c *serverConn) drainRequest() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		c.quietUntil = time.Now().Add(c.timing.quiet)
		if !c.inRequest {
			_ = c.conn.SetReadDeadline(c.boundaryDeadlineLocked())
		}
	}
	return c.draining
}

// drainOver is asked when a read at a request boundary hit its deadline. The drain is over
// when the client sent no request for drainQuiet and no byte of one waits in the socket, or
// drainLimit passed. A request that arrived as the quiet time ran out, or before a reader that
// came late (a busy machine) got to it, is read and answered: closing with it unread would
// reset the connection. Otherwise the deadline is renewed: the drain's, or when bytes wait,
// StallTimeout's, as for a request begun (an expired deadline fails a read before it looks
// at the socket).
func (c *serverConn) drainOver() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.draining {
		_ = c.conn.SetReadDeadline(time.Time{}) // a request's deadline left over
		return false
	}
	now := time.Now()
	if !now.Before(c.drainEnd) {
		return true
	}
	if now.Before(c.quietUntil) {
		_ = c.conn.SetReadDeadline(c.boundaryDeadlineLocked())
		return false
	}
	if !socketHasInput(c.conn) {
		return true
	}
	_ = c.conn.SetReadDeadline(now.Add(c.srv.stallTimeout))
	return false
}

// setReadDeadline sets the read deadline of the negotiation, unless the connection drains.
func (c *serverConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return
	}
	_ = c.conn.SetReadDeadline(t)
}

// setRequestDeadline sets the read deadline within a request: a drain does not cut it short.
func (c *serverConn) setRequestDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inRequest = true
	_ = c.conn.SetReadDeadline(t)
}

// atBoundary is called when the reader has read a request to its end: the read deadline is
// the drain's, or none.
func (c *serverConn) atBoundary() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inRequest = false
	if c.draining {
		_ = c.conn.SetReadDeadline(c.boundaryDeadlineLocked())
	} else {
		_ = c.conn.SetReadDeadline(time.Time{})
	}
}

func (c *serverConn) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

// closeInOrder ends a connection whose drain is over; every request read is answered by now.
// The server says it is done (TLS close_notify, then a TCP FIN after the last reply), then
// reads and throws away what the client still sends, until the client closes too or sends
// nothing for drainQuiet, for at most drainLinger; then it closes. Closing with bytes unread
// would reset the connection instead, and a reset makes the server's kernel throw away the
// replies it has not sent yet, and the client read "connection reset" where it should read its
// replies and then EOF. A client that sends after the FIN reached it reads EOF all the same.
func (c *serverConn) closeInOrder() {
	end := time.Now().Add(c.timing.linger)
	if c.tls != nil {
		c.progress.watch(0)
		_ = c.conn.SetWriteDeadline(end)
		_ = c.tls.CloseWrite()
	}
	if tcp, ok := c.conn.(interface{ CloseWrite() error }); ok && tcp.CloseWrite() == nil {
		var discard [4096]byte
		quiet := time.Now().Add(c.timing.quiet)
		for time.Now().Before(end) {
			c.mu.Lock()
			_ = c.conn.SetReadDeadline(earliest(quiet, end))
			c.mu.Unlock()
			_, err := c.conn.Read(discard[:])
			switch {
			case err == nil:
				quiet = time.Now().Add(c.timing.quiet)
			case !errors.Is(err, os.ErrDeadlineExceeded) || !socketHasInput(c.conn):
				end = time.Time{} // the client closed, or is quiet
			default:
				quiet = end // bytes wait (a late reader): read them
			}
		}
	}
	_ = c.conn.Close()
}

func (c *serverConn) forceClose() {
	c.srv.forcedClose.Store(true)
	// The connection closes BEFORE the Export calls see their context
	// end: a call that returns at once must not get its reply out.
	c.breakConn()
	c.cancel()
}

// breakConn closes the connection and wakes a reader waiting for budget.
func (c *serverConn) breakConn() {
	c.stopOnce.Do(func() { close(c.stopReading) })
	_ = c.conn.Close()
}

// logReadError logs why the connection stopped reading, quietly if that was expected.
func (c *serverConn) logReadError(phase string, err error) {
	expected := errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, errStalled) ||
		(errors.Is(err, os.ErrDeadlineExceeded) && c.isDraining())
	if expected {
		c.log.Debug("nbd: connection ended", "phase", phase, "err", err)
		return
	}
	c.log.Info("nbd: connection failed", "phase", phase, "err", err)
}

// ---- negotiation ----

// negotiate runs the fixed newstyle handshake. It returns the export selected by NBD_OPT_GO or
// NBD_OPT_EXPORT_NAME, or ok=false if the connection must close. Each option is handled on its
// own: nothing an option looked up survives into the next one.
func (c *serverConn) negotiate() (export Export, ok bool) {
	// HandshakeTimeout, or less while the port is under pressure (Config).
	deadline := c.slot.Deadline()
	c.setReadDeadline(deadline)
	_ = c.conn.SetWriteDeadline(deadline)
	defer func() {
		if ok {
			c.setReadDeadline(time.Time{})
			_ = c.conn.SetWriteDeadline(time.Time{})
		}
	}()

	var greeting [18]byte
	binary.BigEndian.PutUint64(greeting[0:], magicInit)
	binary.BigEndian.PutUint64(greeting[8:], magicOption)
	binary.BigEndian.PutUint16(greeting[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.stream.Write(greeting[:]); err != nil {
		c.logReadError("handshake", err)
		return nil, false
	}
	var flagBytes [4]byte
	if _, err := io.ReadFull(c.r, flagBytes[:]); err != nil {
		c.logReadError("handshake", err)
		return nil, false
	}
	clientFlags := binary.BigEndian.Uint32(flagBytes[:])
	if clientFlags&^knownClientFlags != 0 {
		c.log.Info("nbd: unknown client flags; closing", "flags", clientFlags)
		return nil, false
	}
	noZeroes := clientFlags&clientNoZeroes != 0
	if clientFlags&clientFixedNewstyle == 0 && c.srv.tlsPolicy == TLSRequired {
		// proto.md: without fixed newstyle there is no TLS, and this server serves none without.
		c.tlsRequiredRefusal(optExportName, nil)
		return nil, false
	}

	for {
		option, data, err := c.readOption()
		if errors.Is(err, errOptionTooBig) {
			if err := c.sendOptionReply(option, repErrTooBig, []byte("option data too long")); err != nil {
				return nil, false
			}
			continue
		}
		if err != nil {
			c.logReadError("handshake", err)
			return nil, false
		}
		if option != optAbort && c.srv.isShutdown() {
			if err := c.sendOptionReply(option, repErrShutdown, []byte("server is shutting down")); err != nil {
				return nil, false
			}
			continue
		}
		if c.tls == nil && c.srv.tlsPolicy == TLSRequired && option != optStartTLS && option != optAbort {
			if option == optExportName {
				// It cannot carry an error: proto.md has the server close.
				c.tlsRequiredRefusal(option, data)
				return nil, false
			}
			if err := c.sendOptionReply(option, repErrTLSReqd, []byte(c.tlsRequiredRefusal(option, data))); err != nil {
				c.logReadError("handshake", err)
				return nil, false
			}
			continue
		}
		switch option {
		case optExportName:
			return c.exportNameOption(data, noZeroes)
		case optAbort:
			_ = c.sendOptionReply(option, repAck, nil)
			return nil, false
		case optStartTLS:
			if ok := c.startTLSOption(data, clientFlags); !ok {
				return nil, false
			}
		case optList:
			err = c.listOption(data)
		case optInfo, optGo:
			export, err = c.infoOption(option, data)
			if export != nil && err == nil {
				return export, true
			}
		default:
			err = c.sendOptionReply(option, repErrUnsup, fmt.Appendf(nil, "option %d is not supported", option))
		}
		if err != nil {
			c.logReadError("handshake", err)
			return nil, false
		}
	}
}

var errOptionTooBig = errors.New("nbd: option data too long")

// readOption reads one option. Data longer than maxOptionLength is discarded and errOptionTooBig
// returned with the option ID, so the caller can reply and go on.
func (c *serverConn) readOption() (option uint32, data []byte, err error) {
	var header [optionHeaderSize]byte
	if _, err := io.ReadFull(c.r, header[:]); err != nil {
		return 0, nil, err
	}
	if magic := binary.BigEndian.Uint64(header[0:8]); magic != magicOption {
		return 0, nil, fmt.Errorf("nbd: bad option magic %#x", magic)
	}
	option = binary.BigEndian.Uint32(header[8:12])
	length := binary.BigEndian.Uint32(header[12:16])
	if length > maxOptionLength {
		if _, err := io.CopyN(io.Discard, c.r, int64(length)); err != nil {
			return option, nil, err
		}
		return option, nil, errOptionTooBig
	}
	data = make([]byte, length)
	if _, err := io.ReadFull(c.r, data); err != nil {
		return option, nil, err
	}
	return option, data, nil
}

// sendOptionReply writes one option reply in a single write.
func (c *serverConn) sendOptionReply(option, replyType uint32, data []byte) error {
	b := make([]byte, 20, 20+len(data))
	binary.BigEndian.PutUint64(b[0:], magicOptionReply)
	binary.BigEndian.PutUint32(b[8:], option)
	binary.BigEndian.PutUint32(b[12:], replyType)
	binary.BigEndian.PutUint32(b[16:], uint32(len(data)))
	_, err := c.stream.Write(append(b, data...))
	return err
}

// exportNameOption answers NBD_OPT_EXPORT_NAME. It has no error reply: refusal closes.
func (c *serverConn) exportNameOption(data []byte, noZeroes bool) (Export, bool) {
	name := string(data)
	export, flags, err := c.lookup(name)
	if err == nil {
		if replyType, ok := c.srv.attach(c, name, c.generation); !ok {
			err = errors.New(c.attachRefusal(name, replyType))
		} else {
			c.markTransmitting()
		}
	}
	if err != nil {
		c.log.Info("nbd: NBD_OPT_EXPORT_NAME refused; closing (this option cannot carry an error)",
			"export", name, "err", err)
		return nil, false
	}
	size := max(export.Size(), 0)
	b := make([]byte, 10, 10+reservedZeroesSize)
	binary.BigEndian.PutUint64(b[0:], uint64(size))
	binary.BigEndian.PutUint16(b[8:], flags)
	if !noZeroes {
		b = b[:10+reservedZeroesSize]
	}
	if _, err := c.stream.Write(b); err != nil {
		c.logReadError("handshake", err)
		return nil, false
	}
	c.enter(export, name, flags, size)
	return export, true
}

// listOption answers NBD_OPT_LIST: one NBD_REP_SERVER per name, then NBD_REP_ACK.
func (c *serverConn) listOption(data []byte) error {
	if len(data) != 0 {
		return c.sendOptionReply(optList, repErrInvalid, []byte("NBD_OPT_LIST carries no data"))
	}
	for _, name := range c.srv.resolver.List() {
		b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(name)), uint32(len(name)))
		if err := c.sendOptionReply(optList, repServer, append(b, name...)); err != nil {
			return err
		}
	}
	return c.sendOptionReply(optList, repAck, nil)
}

// infoOption answers NBD_OPT_INFO and NBD_OPT_GO. For GO it returns the export to serve.
func (c *serverConn) infoOption(option uint32, data []byte) (Export, error) {
	req, err := parseInfoRequest(data)
	if err != nil {
		return nil, c.sendOptionReply(option, repErrInvalid, []byte(err.Error()))
	}
	export, flags, err := c.lookup(req.name)
	if err != nil {
		return nil, c.sendOptionReply(option, repErrUnknown, []byte(clientMessage(err)))
	}
	if option == optGo {
		if replyType, ok := c.srv.attach(c, req.name, c.generation); !ok {
			return nil, c.sendOptionReply(option, replyType, []byte(c.attachRefusal(req.name, replyType)))
		}
		c.markTransmitting()
	}

	size := max(export.Size(), 0)
	info := make([]byte, 0, 14)
	info = binary.BigEndian.AppendUint16(info, infoExport)
	info = binary.BigEndian.AppendUint64(info, uint64(size))
	info = binary.BigEndian.AppendUint16(info, flags)
	if err := c.sendOptionReply(option, repInfo, info); err != nil {
		return nil, err
	}
	info = binary.BigEndian.AppendUint16(info[:0], infoBlockSize)
	info = binary.BigEndian.AppendUint32(info, MinBlockSize)
	info = binary.BigEndian.AppendUint32(info, PreferredBlockSize)
	info = binary.BigEndian.AppendUint32(info, MaxRequestLength)
	if err := c.sendOptionReply(option, repInfo, info); err != nil {
		return nil, err
	}
	if req.wants(infoName) {
		b := binary.BigEndian.AppendUint16(nil, infoName)
		if err := c.sendOptionReply(option, repInfo, append(b, req.name...)); err != nil {
			return nil, err
		}
	}
	if d, ok := export.(Describer); ok && req.wants(infoDescription) {
		if text := truncateString(d.Description()); text != "" {
			b := binary.BigEndian.AppendUint16(nil, infoDescription)
			if err := c.sendOptionReply(option, repInfo, append(b, text...)); err != nil {
				return nil, err
			}
		}
	}
	if err := c.sendOptionReply(option, repAck, nil); err != nil {
		return nil, err
	}
	if option != optGo {
		return nil, nil
	}
	c.enter(export, req.name, flags, size)
	return export, nil
}

// lookup asks the Resolver for name and computes its transmission flags. It records the export's
// close generation first, for attach.
func (c *serverConn) lookup(name string) (Export, uint16, error) {
	c.generation = c.srv.exportGeneration(name)
	export, err := c.srv.resolver.Lookup(name)
	if err != nil {
		return nil, 0, err
	}
	if export == nil {
		return nil, 0, fmt.Errorf("%s: no such export", name)
	}
	flags := transmitHasFlags | transmitSendFlush | transmitSendFUA | transmitSendTrim |
		transmitSendWriteZeroes | transmitCanMultiConn
	if r, ok := export.(ReadOnlyReporter); ok && r.ReadOnly() {
		flags |= transmitReadOnly
	}
	return export, flags, nil
}

// attachRefusal is the message for a client that attach refused with replyType.
func (c *serverConn) attachRefusal(name string, replyType uint32) string {
	switch replyType {
	case repErrUnknown:
		return name + ": export was closed during the handshake; retry"
	case repErrPolicy:
		c.log.Info("nbd: too many connections in transmission; client refused", "export", name, "max_connections", c.srv.maxConnections)
		return fmt.Sprintf("too many NBD clients: this server serves at most %d connections at once; retry after one disconnects", c.srv.maxConnections)
	}
	return "server is shutting down"
}

func (c *serverConn) enter(export Export, name string, flags uint16, size int64) {
	c.export = export
	c.readOnly = flags&transmitReadOnly != 0
	c.size = size
	c.log = c.log.With("export", name)
	c.log.Debug("nbd: transmission started", "size", size, "flags", flags)
}

// clientMessage is err's text made fit for an option error reply.
func clientMessage(err error) string {
	if msg := truncateString(err.Error()); msg != "" {
		return msg
	}
	return "export not available"
}

func truncateString(s string) string {
	if len(s) > maxStringLength {
		s = s[:maxStringLength]
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "")
}

// ---- transmission ----

// transmit reads requests until DISC, a read error or a drain, handing valid ones to workers,
// then waits for every request it handed over to be answered. Before it allocates or reads
// anything for a request it charges the request's cost to the connection's budget, waiting if
// that is used: the client's requests then wait in TCP buffers.
func (c *serverConn) transmit(export Export) {
	c.work = make(chan *request)
	defer func() {
		close(c.work)
		c.workerGroup.Wait()
		if held := c.heldBytes(); held != 0 {
			panic(fmt.Sprintf("nbd: connection ended with every reply sent or dropped, yet holding %d bytes of budget", held))
		}
	}()
	c.growReadBuffer()
	if c.progress != nil {
		c.progress.watch(c.srv.stallTimeout)
	}
	stats := &c.srv.stats
	var headerBytes [requestHeaderSize]byte
	for {
		if err := c.readHeader(headerBytes[:]); err != nil {
			if errors.Is(err, errDrained) {
				c.drained = true
				if c.timing.readerStopped != nil {
					c.timing.readerStopped()
				}
				c.log.Debug("nbd: drained: the client is quiet; ending the connection once every request read is answered")
			} else {
				c.logReadError("transmission", err)
			}
			return
		}
		header, err := parseRequestHeader(&headerBytes)
		if err != nil {
			c.log.Warn("nbd: bad request magic; closing")
			return
		}
		kind := commandKind(header.cmd)
		stats.requests[kind].Add(1)
		if header.cmd == cmdDisc {
			c.log.Debug("nbd: client disconnected")
			return
		}
		errno := header.check(c.size, c.readOnly)
		cost := int64(minRequestCost)
		if c.drainRequest() {
			// Nothing is carried out: the reply costs no budget.
			errno, cost = errnoShutdown, 0
		}
		if errno == 0 {
			if req := c.newRequest(header, requestCost(header)); req != nil {
				if header.hasPayload() {
					req.payload = c.srv.buffers.get(int(header.length))
					if err := c.readPayload(req.payload.b); err != nil {
						c.release(req)
						c.logReadError("transmission", err)
						return
					}
				}
				c.dispatch(req)
				continue
			}
			if c.broken() {
				return
			}
			// The drain began while it waited for the node's budget. The server read it, so
			// it is answered, and not carried out.
			errno, cost = errnoShutdown, 0
		}
		if header.hasPayload() {
			if err := c.skipPayload(int64(header.length)); err != nil {
				c.logReadError("transmission", err)
				return
			}
		}
		stats.errors[kind].Add(1)
		req := c.newRequest(header, cost)
		if req == nil && !c.broken() {
			req = c.newRequest(header, 0) // the drain began while it waited: answered all the same
		}
		if req == nil {
			return
		}
		c.sendReply(req, header.handle, errno, nil)
	}
}

// newRequest charges cost to the connection's budget, waiting for it, and returns a request
// holding it; nil if the connection broke or began draining meanwhile.
func (c *serverConn) newRequest(header requestHeader, cost int64) *request {
	fromReserve, ok := c.acquire(cost)
	if !ok {
		c.log.Debug("nbd: request not started: the connection broke or began draining while it waited for budget",
			"cmd", header.cmd, "length", header.length)
		return nil
	}
	req := requestPool.Get().(*request)
	req.header, req.cost, req.fromReserve = header, cost, fromReserve
	return req
}

var errStalled = errors.New("nbd: client stalled")

// readHeader reads the next request's header into p. At a request boundary the read deadline
// is only a drain's: it returns errDrained once the drain is over (drainOver). A header begun
// is read to its end, as a payload is.
func (c *serverConn) readHeader(p []byte) error {
	for {
		n, err := io.ReadFull(c.r, p)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n > 0 {
			return c.readRest(p[n:])
		}
		if c.drainOver() {
			return errDrained
		}
	}
}

// readPayload reads a WRITE payload.
func (c *serverConn) readPayload(p []byte) error {
	if c.r.Buffered() >= len(p) {
		_, err := io.ReadFull(c.r, p)
		return err
	}
	return c.readRest(p)
}

// readRest reads p, the rest of a request the client began to send.
func (c *serverConn) readRest(p []byte) error {
	return c.readWithin(func() (progress, left int64, err error) {
		n, err := io.ReadFull(c.r, p)
		p = p[n:]
		return int64(n), int64(len(p)), err
	})
}

// skipPayload reads and throws away the payload of a request that is not carried out.
func (c *serverConn) skipPayload(n int64) error {
	if int64(c.r.Buffered()) >= n {
		_, err := c.r.Discard(int(n))
		return err
	}
	return c.readWithin(func() (progress, left int64, err error) {
		m, err := io.CopyN(io.Discard, c.r, n)
		n -= m
		return m, n, err
	})
}

// readWithin runs read, which reads what is left of a request, until it is done. A read
// deadline of StallTimeout, renewed while bytes arrive, keeps a client that stops in the middle
// from holding the connection and the request's budget for ever. A drain does not cut a request
// short: a request the server began to read is answered.
func (c *serverConn) readWithin(read func() (progress, left int64, err error)) error {
	defer c.atBoundary()
	for {
		c.setRequestDeadline(time.Now().Add(c.srv.stallTimeout))
		progress, left, err := read()
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if progress == 0 {
			c.srv.stats.stalled.Add(1)
			c.log.Warn("nbd: client sends no more of a request it began; closing the connection",
				"stall_timeout", c.srv.stallTimeout, "missing_bytes", left)
			return errStalled
		}
	}
}

// dispatch hands req to an idle worker, starts a new one if fewer than MaxInFlight exist, or
// else waits for one to become idle.
func (c *serverConn) dispatch(req *request) {
	c.executing.Add(1)
	select {
	case c.work <- req:
		return
	default:
	}
	if c.workers < c.srv.maxInFlight {
		c.workers++
		c.workerGroup.Add(1)
		go c.worker(req)
		return
	}
	c.work <- req
}

func (c *serverConn) worker(req *request) {
	defer c.workerGroup.Done()
	for ok := true; ok; req, ok = <-c.work {
		c.execute(req)
	}
}

// execute calls the Export and replies. A READ reply header is only sent once the data is in hand.
func (c *serverConn) execute(req *request) {
	h := req.header
	off, length := int64(h.offset), int64(h.length)
	fua := h.flags&cmdFlagFUA != 0
	var err error
	var data []byte
	switch h.cmd {
	case cmdRead:
		req.payload = c.srv.buffers.get(int(length))
		if err = c.export.ReadAt(c.ctx, req.payload.b, off); err == nil {
			data = req.payload.b
		}
	case cmdWrite:
		err = c.export.WriteAt(c.ctx, req.payload.b, off, fua)
	case cmdFlush:
		err = c.export.Flush(c.ctx)
	case cmdTrim:
		err = c.export.Trim(c.ctx, off, length)
		if err == nil && fua {
			err = c.export.Flush(c.ctx)
		}
	case cmdWriteZeroes:
		err = c.export.WriteZeroes(c.ctx, off, length, fua)
	default:
		panic(fmt.Sprintf("nbd: command %d passed check", h.cmd))
	}
	stats := &c.srv.stats
	var errno uint32
	if err != nil {
		errno = errnoFor(err)
		stats.errors[commandKind(h.cmd)].Add(1)
		c.log.Debug("nbd: export error", "cmd", h.cmd, "offset", off, "length", length, "err", err, "errno", errno)
	} else if h.cmd == cmdWrite {
		stats.bytesWritten.Add(uint64(length))
	}
	if data != nil {
		stats.bytesRead.Add(uint64(len(data)))
	}
	c.executing.Add(-1)
	c.sendReply(req, h.handle, errno, data)
}

// release frees req's buffer and gives back its budget.
func (c *serverConn) release(req *request) {
	reserveBytes, nodeBytes := c.freeRequest(req)
	c.releaseBudget(reserveBytes, nodeBytes)
}

// releaseAll is release for many requests, with one budget release.
func (c *serverConn) releaseAll(reqs []*request) {
	var reserveBytes, nodeBytes int64
	for i, req := range reqs {
		r, n := c.freeRequest(req)
		reserveBytes += r
		nodeBytes += n
		reqs[i] = nil
	}
	c.releaseBudget(reserveBytes, nodeBytes)
}

// freeRequest returns req's buffer to the pool and req to its pool, and says what budget req held.
func (c *serverConn) freeRequest(req *request) (reserveBytes, nodeBytes int64) {
	if req.fromReserve {
		reserveBytes = req.cost
	} else {
		nodeBytes = req.cost
	}
	if req.payload != nil {
		c.srv.buffers.put(req.payload)
	}
	*req = request{}
	requestPool.Put(req)
	return reserveBytes, nodeBytes
}

// sendReply queues a simple reply (header, then data if any) and takes
// ownership of req: it is released once the reply is written. If no other
// worker is writing, this one writes every queued reply, with one writev
// per round. After a failed or stalled write the connection is closed, so
// the reader stops too, and queued replies are dropped.
func (c *serverConn) sendReply(req *request, handle uint64, errno uint32, data []byte) {
	binary.BigEndian.PutUint32(req.reply[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(req.reply[4:], errno)
	binary.BigEndian.PutUint64(req.reply[8:], handle)
	req.data = data
	c.writeMu.Lock()
	if c.writeErr != nil {
		c.writeMu.Unlock()
		c.release(req)
		return
	}
	c.queue = append(c.queue, req)
	if c.writing {
		c.writeMu.Unlock()
		return
	}
	c.writing = true
	if c.executing.Load() > 0 {
		// Other requests are running: let them finish and queue
		// their replies, so that one writev (one wakeup of the
		// client) carries several. Under load this saves a syscall
		// per request; with nothing else running nobody waits.
		c.writeMu.Unlock()
		runtime.Gosched()
		c.writeMu.Lock()
	}
	for len(c.queue) > 0 {
		batch := c.queue
		c.queue = c.spare[:0]
		c.writeMu.Unlock()

		bufs := c.iov[:0]
		for _, r := range batch {
			bufs = append(bufs, r.reply[:])
			if len(r.data) > 0 {
				bufs = append(bufs, r.data)
			}
		}
		c.iov = bufs[:0]
		err := c.writeReplies(bufs)
		clear(c.iov[:cap(c.iov)])
		c.releaseAll(batch)

		c.writeMu.Lock()
		c.spare = batch[:0]
		if err != nil {
			c.writeErr = err
			if errors.Is(err, errStalled) {
				c.srv.stats.stalled.Add(1)
				c.log.Warn("nbd: client reads none of its replies; closing the connection",
					"stall_timeout", c.srv.stallTimeout, "held_bytes", c.heldBytes())
			} else {
				c.logReadError("reply", err)
			}
			c.breakConn()
			c.releaseAll(c.queue)
			c.queue = nil
		}
	}
	c.writing = false
	c.writeMu.Unlock()
}

// writeReplies writes w, a round of replies. Each write has a deadline at least StallTimeout
// away, renewed after any progress, so a slow client that reads is never cut off; errStalled
// means the client took no byte for a whole StallTimeout. In plaintext the round is one writev
// of the reply headers and the READ buffers as they are.
func (c *serverConn) writeReplies(w net.Buffers) error {
	if c.tls != nil {
		return c.writeRepliesTLS(w)
	}
	for {
		// Renewing costs a timer update: do it only when less than StallTimeout is left.
		if now := time.Now(); c.writeDeadline.Sub(now) < c.srv.stallTimeout {
			c.writeDeadline = now.Add(c.srv.stallTimeout + c.srv.stallTimeout/8)
			_ = c.conn.SetWriteDeadline(c.writeDeadline)
		}
		n, err := w.WriteTo(c.conn) // on a partial write, w keeps what is left
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n == 0 {
			return errStalled
		}
		c.writeDeadline = time.Time{}
	}
}
