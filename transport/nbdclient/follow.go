package nbdclient

import (
	"bufio"
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Target is where the export is served now, as a Locator found it.
type Target struct {
	// Addr and Export are the server's address and the export's name; Opts.TLS how to reach
	// it (Opts.Timeout is not used: FollowOptions.IOTimeout bounds a follower's requests).
	Addr, Export string
	Opts         Options
	// Name says which server it is (the primary node's name), for logs and Current.
	Name string
	// Confirm, when set, is called once the connection is negotiated and BEFORE any request
	// is sent on it; an error drops the connection (one that wraps ErrStopFollowing ends the
	// following).
	Confirm func(ctx context.Context) error
}

// Locator finds the server of the export now. A Follower calls it at its start and whenever
// its connection breaks, again after an error, until FollowOptions.IOTimeout without a
// server has passed; an error that wraps ErrStopFollowing ends the following at once. It must
// name only a server that may take writes (the volume's primary): a Follower never asks
// another.
type Locator func(ctx context.Context) (Target, error)

// ErrStopFollowing, wrapped in a Locator's or a Confirm's error, makes a Follower give up at
// once (another mount took the volume, say), failing every request it holds.
var ErrStopFollowing = errors.New("the export must not be followed any more")

// ErrNoServer is why a Follower gave up: no server of the export was found for its
// IOTimeout.
var ErrNoServer = errors.New("no server of the export was found in time")

// FollowOptions shape a Follower.
type FollowOptions struct {
	// IOTimeout bounds the time without a server: from a connection's break until the next
	// one is made, requests wait; after it the Follower gives up (ErrNoServer). A request not
	// answered for IOTimeout on a connection breaks that connection (the server hangs): the
	// Locator is asked again. 0 waits for ever.
	IOTimeout time.Duration
	// Retry is the pause between two calls of the Locator that failed (default 200 ms).
	Retry time.Duration
	// ProbeAfter: a request not answered for this long makes the Follower ask the Locator
	// whether the export moved (a server whose host died or was cut off leaves its
	// connection open, answering nothing); when it names another server, the connection is
	// broken and the requests go there. Default: a quarter of IOTimeout, at most 5 s.
	ProbeAfter time.Duration
	// Connected, when set, is called after each connection is made, BEFORE the requests held
	// are sent again on it; it must not block for long.
	Connected func(Target)
	// Logf logs breaks and reconnections (nil: nothing is logged).
	Logf func(format string, args ...any)
}

// Follower is an export reached through whichever server serves it now: one connection at a
// time, made again to the server the Locator finds when it breaks. Its methods may be called
// from many goroutines at once; a request returns once a server answered it, whichever.
//
// It keeps every request it sent and that was not answered, in the order they were sent. When
// the connection breaks, whether the server carried those out is unknown. After it connects
// again it sends all of them again, in that order, BEFORE any request that came later. That
// is right for each kind:
//   - a write the old server answered is never sent again: the new server (the new primary)
//     holds every acknowledged write, the volume's invariant;
//   - a write not answered may or may not be there: sending it again, in its place in the
//     order, makes it there, and no later write to its range went before it (those were
//     sent after it, and are sent again after it too, or are not sent yet);
//   - a read not answered is sent again: it reads what the writes answered before it wrote;
//   - a flush not answered is sent again after the writes sent before it: it then covers
//     them on the new server, as the caller asked.
//
// A server that answers NBD_ESHUTDOWN (it drains) did not carry the request out: it is kept,
// nothing more is sent on that connection, and once the server answered the rest the
// Follower disconnects and finds the next server. Any other error the server answers is the
// request's answer.
type Follower struct {
	locate Locator
	opts   FollowOptions
	export Export
	// size is the export's size: the first server's, grown when a later connection was told
	// a larger one (an online resize; see Refresh). It never shrinks.
	size atomic.Int64
	// cycle asks the connection's watcher to drain it and connect again (Refresh).
	cycle chan struct{}

	// Lock order: wmu before mu; the reader of a connection takes mu only.
	wmu lockorder.Mutex // requests are written whole, in the order they were queued

	mu lockorder.Mutex
	// queue holds every request not answered yet (*request), in the order it was submitted.
	queue *list.List
	// onConn are the requests sent on conn, by handle.
	onConn map[uint64]*request
	next   uint64
	// conn is the connection requests are sent on; nil while there is none (the Follower
	// reconnects) or while the server drains.
	conn    net.Conn
	current Target
	// err is why the Follower takes no request any more (ErrClosed, ErrNoServer, ...).
	err error

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

type request struct {
	cmd    uint16
	off    uint64
	length uint32
	dest   []byte // a READ's buffer: filled by the reader of the connection that answered
	data   []byte // a WRITE's payload
	handle uint64 // on the current connection (0: not sent on it)
	sent   time.Time
	elem   *list.Element
	done   chan error // answered once
}

// Follow connects to the server locate finds (waiting through opts.IOTimeout, within ctx)
// and returns the Follower; the export it finds must take writes.
func Follow(ctx context.Context, locate Locator, opts FollowOptions) (*Follower, error) {
	if opts.Retry <= 0 {
		opts.Retry = 200 * time.Millisecond
	}
	if opts.ProbeAfter <= 0 {
		opts.ProbeAfter = 5 * time.Second
		if opts.IOTimeout > 0 {
			opts.ProbeAfter = min(opts.ProbeAfter, opts.IOTimeout/4)
		}
	}
	f := &Follower{locate: locate, opts: opts, queue: list.New(), onConn: map[uint64]*request{}, next: 1,
		stop: make(chan struct{}), done: make(chan struct{}), cycle: make(chan struct{}, 1)}
	conn, r, t, err := f.find(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	f.export = t.export
	f.size.Store(t.export.Size)
	f.current = t.Target // before run installs it: Current and Refresh may be called at once
	go f.run(conn, r, t)
	return f, nil
}

// Export is what the first server told of the export, with the export's size now.
func (f *Follower) Export() Export {
	ex := f.export
	ex.Size = f.size.Load()
	return ex
}

// Size is the export's size in bytes: the size the connection in use was told, which grows
// when the export grew (Refresh) and never shrinks.
func (f *Follower) Size() int64 { return f.size.Load() }

// ErrShrunk: the server tells a smaller export than the Follower serves (a volume is never
// shrunk: something is wrong with the server, and the Follower does not go there).
var ErrShrunk = errors.New("the server's export is smaller than the one followed")

// Refresh asks the server in use what size the export has now (NBD_OPT_INFO on a connection of
// its own: NBD tells no client that an export grew, and a connection keeps the size it was
// told). When it grew, Refresh drains the connection in use (the requests sent on it are
// answered, later ones wait), connects again (the new connection is told the new size: a
// server gone in between is found again as after a break) and returns once Size is the new
// size, or when ctx ends. It returns the size; a smaller export is ErrShrunk, and Size stays.
func (f *Follower) Refresh(ctx context.Context) (int64, error) {
	t := f.Current()
	cur := f.size.Load()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		return cur, fmt.Errorf("%s (%s): %w", t.Name, t.Addr, err)
	}
	ex, err := Info(ctx, raw, t.Export, t.Opts.TLS)
	raw.Close()
	switch {
	case err != nil:
		return cur, fmt.Errorf("%s (%s): %w", t.Name, t.Addr, err)
	case ex.Size < cur:
		return cur, fmt.Errorf("%w: %s (%s) tells %d bytes, %d are served: the size stays", ErrShrunk, t.Name, t.Addr, ex.Size, cur)
	case ex.Size == cur:
		return cur, nil
	}
	f.logf("%s (%s) tells the export grew from %d to %d bytes: connecting again to be told so", t.Name, t.Addr, cur, ex.Size)
	select {
	case f.cycle <- struct{}{}:
	default: // one is asked for already
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if size := f.size.Load(); size >= ex.Size {
			return size, nil
		}
		if err := f.Err(); err != nil {
			return f.size.Load(), err
		}
		select {
		case <-ctx.Done():
			return f.size.Load(), fmt.Errorf("the export grew to %d bytes, and no connection told so yet: %w", ex.Size, ctx.Err())
		case <-tick.C:
		}
	}
}

// Current is the server requests go to now (the last one connected to).
func (f *Follower) Current() Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current
}

// Err is nil while the Follower takes requests, else why not.
func (f *Follower) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// ReadAt reads len(p) bytes at off.
func (f *Follower) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	max := f.export.maxRequest()
	for done := 0; done < len(p); {
		n := min(len(p)-done, max)
		if err := f.do(&request{cmd: cmdRead, off: uint64(off) + uint64(done), length: uint32(n), dest: p[done : done+n]}); err != nil {
			return done, err
		}
		done += n
	}
	return len(p), nil
}

// WriteAt writes p at off; it returns once a server answered.
func (f *Follower) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	max := f.export.maxRequest()
	for done := 0; done < len(p); {
		n := min(len(p)-done, max)
		if err := f.do(&request{cmd: cmdWrite, off: uint64(off) + uint64(done), length: uint32(n), data: p[done : done+n]}); err != nil {
			return done, err
		}
		done += n
	}
	return len(p), nil
}

// Flush makes every write answered before it durable (NBD_CMD_FLUSH); nothing on a server
// that does not take flushes.
func (f *Follower) Flush() error {
	if !f.export.CanFlush() {
		return nil
	}
	return f.do(&request{cmd: cmdFlush})
}

// WriteZeroes makes length bytes at off read as zeroes; ErrUnsupported when the server does
// not take it.
func (f *Follower) WriteZeroes(off, length int64) error {
	if !f.export.CanWriteZeroes() {
		return ErrUnsupported
	}
	if err := f.check(off, length); err != nil {
		return err
	}
	for length > 0 {
		n := min(length, int64(f.export.maxRequest()))
		if err := f.do(&request{cmd: cmdWriteZeroes, off: uint64(off), length: uint32(n)}); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

func (f *Follower) check(off, n int64) error {
	if size := f.size.Load(); off < 0 || n < 0 || n > size-off {
		return fmt.Errorf("%d bytes at %d: outside the %d-byte export", n, off, size)
	}
	return nil
}

// do queues r, sends it when a connection is up, and waits for its answer.
func (f *Follower) do(r *request) error {
	r.done = make(chan error, 1)
	f.wmu.Lock()
	f.mu.Lock()
	if f.err != nil {
		err := f.err
		f.mu.Unlock()
		f.wmu.Unlock()
		return err
	}
	r.elem = f.queue.PushBack(r)
	conn := f.conn
	if conn != nil {
		f.assignLocked(r)
	}
	f.mu.Unlock()
	if conn != nil {
		f.write(conn, r)
	}
	f.wmu.Unlock()
	return <-r.done
}

// assignLocked gives r the next handle on the current connection. Call with mu held.
func (f *Follower) assignLocked(r *request) {
	r.handle = f.next
	f.next++
	r.sent = time.Now()
	f.onConn[r.handle] = r
}

// write sends r on conn; a failure closes conn, whose reader then ends it (r stays queued).
// Call with wmu held.
func (f *Follower) write(conn net.Conn, r *request) bool {
	var hdr [28]byte
	binary.BigEndian.PutUint32(hdr[0:], magicRequest)
	binary.BigEndian.PutUint16(hdr[6:], r.cmd)
	binary.BigEndian.PutUint64(hdr[8:], r.handle)
	binary.BigEndian.PutUint64(hdr[16:], r.off)
	binary.BigEndian.PutUint32(hdr[24:], r.length)
	if f.opts.IOTimeout > 0 {
		_ = conn.SetWriteDeadline(time.Now().Add(f.opts.IOTimeout))
	}
	var err error
	if len(r.data) == 0 {
		_, err = conn.Write(hdr[:])
	} else {
		bufs := net.Buffers{hdr[:], r.data}
		_, err = bufs.WriteTo(conn)
	}
	if err != nil {
		conn.Close()
		return false
	}
	return true
}

// found is a connection a Locator's target gave.
type found struct {
	Target
	export Export
}

// find asks the Locator for the server until one is connected, within ctx and IOTimeout
// from since.
func (f *Follower) find(ctx context.Context, since time.Time) (net.Conn, *bufio.Reader, found, error) {
	if f.opts.IOTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, since.Add(f.opts.IOTimeout))
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var last error
	for {
		conn, t, err := f.connect(ctx)
		if err == nil {
			return conn, bufio.NewReaderSize(conn, 64<<10), t, nil
		}
		last = err
		if errors.Is(err, ErrStopFollowing) {
			return nil, nil, found{}, err
		}
		f.logf("no server of the export yet: %v", err)
		select {
		case <-ctx.Done():
			select {
			case <-f.stop:
				return nil, nil, found{}, ErrClosed
			default:
			}
			return nil, nil, found{}, fmt.Errorf("%w: none for %s (the last try: %v)", ErrNoServer, f.opts.IOTimeout, last)
		case <-time.After(f.opts.Retry):
		}
	}
}

// connect asks the Locator once and connects to what it names.
func (f *Follower) connect(ctx context.Context) (net.Conn, found, error) {
	t, err := f.locate(ctx)
	if err != nil {
		return nil, found{}, err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		return nil, found{}, fmt.Errorf("%s (%s): %w", t.Name, t.Addr, err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	conn, ex, err := Negotiate(ctx, raw, t.Export, t.Opts.TLS)
	if err != nil {
		raw.Close()
		return nil, found{}, fmt.Errorf("%s (%s): %w", t.Name, t.Addr, err)
	}
	switch {
	case ex.ReadOnly():
		err = fmt.Errorf("%s (%s) serves %s read-only: it is not the primary", t.Name, t.Addr, t.Export)
	case ex.Size < f.size.Load():
		err = fmt.Errorf("%w: %s (%s) serves a %d-byte export, %d bytes are served", ErrShrunk, t.Name, t.Addr, ex.Size, f.size.Load())
	case t.Confirm != nil:
		err = t.Confirm(ctx)
	}
	if err != nil {
		conn.Close()
		return nil, found{}, err
	}
	return conn, found{Target: t, export: ex}, nil
}

// run owns the connections: it installs one, sends the requests held again on it, watches
// it until it breaks, and finds the next, until Close or until it gives up.
func (f *Follower) run(conn net.Conn, r *bufio.Reader, ft found) {
	defer close(f.done)
	for {
		t := ft.Target
		readerDone := make(chan error, 1)
		go func() { readerDone <- f.readReplies(conn, r) }()
		f.install(conn, t, ft.export.Size)
		err := f.watch(conn, t, readerDone)
		conn.Close()
		broke := time.Now()
		f.wmu.Lock()
		f.mu.Lock()
		f.conn = nil
		for h, req := range f.onConn {
			req.handle = 0
			delete(f.onConn, h)
		}
		held := f.queue.Len()
		stopped := f.err != nil
		f.mu.Unlock()
		f.wmu.Unlock()
		if stopped {
			f.failAll(ErrClosed)
			return
		}
		f.logf("the connection to %s (%s) ended (%v) with %d requests not answered: finding the export's server", t.Name, t.Addr, err, held)
		conn, r, ft, err = f.find(context.Background(), broke)
		if err != nil {
			f.logf("giving up: %v", err)
			f.failAll(err)
			return
		}
		t = ft.Target
		f.logf("connected to %s (%s): sending the %d requests not answered again, in order", t.Name, t.Addr, f.Waiting())
	}
}

// Waiting is how many requests wait for their answer (sent or held while there is no server).
func (f *Follower) Waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queue.Len()
}

// install makes conn the connection requests go to and sends every request held on it, in
// the order they were submitted, BEFORE any new one (wmu is held throughout); size is the
// export's size conn was told, the Follower's size from now on when it is larger.
func (f *Follower) install(conn net.Conn, t Target, size int64) {
	if f.opts.Connected != nil {
		f.opts.Connected(t)
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.mu.Lock()
	f.conn, f.current = conn, t
	if old := f.size.Load(); size > old {
		f.size.Store(size)
		f.logf("the export is %d bytes now (it was %d)", size, old)
	}
	resend := make([]*request, 0, f.queue.Len())
	for e := f.queue.Front(); e != nil; e = e.Next() {
		req := e.Value.(*request)
		f.assignLocked(req)
		resend = append(resend, req)
	}
	f.mu.Unlock()
	for _, req := range resend {
		if !f.write(conn, req) {
			return
		}
	}
}

// watch waits until conn's reader ends; it breaks conn when a request on it was not
// answered for IOTimeout, when the Locator names another server while a request waits for
// ProbeAfter, or when Close asks.
func (f *Follower) watch(conn net.Conn, t Target, readerDone <-chan error) error {
	every := min(max(f.opts.ProbeAfter/2, 5*time.Millisecond), time.Second)
	if f.opts.IOTimeout > 0 {
		every = min(every, max(f.opts.IOTimeout/4, 5*time.Millisecond))
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var probe chan Target
	for {
		select {
		case err := <-readerDone:
			if errors.Is(err, errDrained) {
				f.disconnect(conn)
			}
			return err
		case <-f.stop:
			f.disconnect(conn)
			conn.Close()
			return <-readerDone
		case <-f.cycle:
			// As when the server drains: nothing more is sent here, and once every request
			// sent was answered the connection ends (the reader says so, or, when none
			// waits, the disconnect below makes the server close it).
			f.wmu.Lock()
			f.mu.Lock()
			if f.conn == conn {
				f.conn = nil
			}
			idle := len(f.onConn) == 0
			f.mu.Unlock()
			f.wmu.Unlock()
			if idle {
				f.disconnect(conn)
			}
		case <-tick.C:
			oldest := f.oldest()
			if f.opts.IOTimeout > 0 && oldest > f.opts.IOTimeout {
				conn.Close()
				return fmt.Errorf("%w (%s)", ErrTimeout, f.opts.IOTimeout)
			}
			if probe == nil && oldest > f.opts.ProbeAfter {
				probe = make(chan Target, 1)
				go func(out chan<- Target) {
					found, err := f.locate(ctx)
					if err != nil {
						found = Target{}
					}
					out <- found
				}(probe)
			}
		case found := <-probe:
			probe = nil
			if found.Addr != "" && (found.Addr != t.Addr || found.Name != t.Name) {
				f.logf("a request waits for %s on %s (%s) while the export's server is %s (%s) now: leaving", f.opts.ProbeAfter, t.Name, t.Addr, found.Name, found.Addr)
				conn.Close()
				return fmt.Errorf("the export moved to %s (%s)", found.Name, found.Addr)
			}
		}
	}
}

// oldest is how long the oldest request on the connection has waited for its answer.
func (f *Follower) oldest() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	for _, r := range f.onConn {
		d = max(d, time.Since(r.sent))
	}
	return d
}

// errDrained: the server drains and answered every request sent on the connection.
var errDrained = errors.New("the server shuts down and answered every request sent to it")

// readReplies reads conn's replies until it breaks, handing each answer to its request.
func (f *Follower) readReplies(conn net.Conn, r *bufio.Reader) error {
	var hdr [16]byte
	for {
		if n, err := io.ReadFull(r, hdr[:]); err != nil {
			if n == 0 && errors.Is(err, io.EOF) {
				err = ErrServerClosed
			}
			return err
		}
		if magic := binary.BigEndian.Uint32(hdr[0:]); magic != magicSimpleReply {
			return fmt.Errorf("%w: reply magic %#x", ErrProtocol, magic)
		}
		errno := Errno(binary.BigEndian.Uint32(hdr[4:]))
		handle := binary.BigEndian.Uint64(hdr[8:])
		f.mu.Lock()
		req := f.onConn[handle]
		f.mu.Unlock()
		if req == nil {
			return fmt.Errorf("%w: a reply to request %d, which is not in flight", ErrProtocol, handle)
		}
		if errno == 0 && req.cmd == cmdRead {
			// Only this reader touches dest: the request is sent again only after it ended.
			if _, err := io.ReadFull(r, req.dest); err != nil {
				return err
			}
		}
		f.mu.Lock()
		delete(f.onConn, handle)
		if errno == ErrShutdown {
			// Not carried out: kept, to be sent to the next server; nothing more goes here.
			req.handle = 0
			f.conn = nil
			idle := len(f.onConn) == 0
			f.mu.Unlock()
			if idle {
				return errDrained
			}
			continue
		}
		f.queue.Remove(req.elem)
		draining := f.conn == nil
		idle := len(f.onConn) == 0
		f.mu.Unlock()
		if errno != 0 {
			req.done <- errno
		} else {
			req.done <- nil
		}
		if draining && idle {
			return errDrained
		}
	}
}

// disconnect writes NBD_CMD_DISC on conn, after any request being written.
func (f *Follower) disconnect(conn net.Conn) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	var hdr [28]byte
	binary.BigEndian.PutUint32(hdr[0:], magicRequest)
	binary.BigEndian.PutUint16(hdr[6:], cmdDisc)
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Write(hdr[:])
}

// failAll answers every request held with err, and every later one.
func (f *Follower) failAll(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	var left []*request
	for e := f.queue.Front(); e != nil; e = e.Next() {
		left = append(left, e.Value.(*request))
	}
	f.queue.Init()
	f.mu.Unlock()
	for _, r := range left {
		r.done <- err
	}
}

// Close ends the following: NBD_CMD_DISC on the connection, and every request not answered
// fails with ErrClosed. Unmount what uses the Follower first.
func (f *Follower) Close() error {
	f.mu.Lock()
	if f.err == nil {
		f.err = ErrClosed
	}
	f.mu.Unlock()
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}

func (f *Follower) logf(format string, args ...any) {
	if f.opts.Logf != nil {
		f.opts.Logf(format, args...)
	}
}
