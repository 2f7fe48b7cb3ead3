package nbd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Export is one block device served over NBD. All methods may be called concurrently, and may
// block; ctx is cancelled when the connection is closed by force.
//
// Errors: wrap a syscall.Errno (EPERM, ENOSPC, EINVAL, ESHUTDOWN, EROFS) to choose the NBD error;
// anything else is EIO. The server never calls a method with a range outside [0, Size()) or with
// length 0, and never passes ReadAt or WriteAt more than MaxRequestLength bytes.
type Export interface {
	Size() int64
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt must not keep p after it returns. With fua, the data is on stable storage BEFORE
	// WriteAt returns.
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	WriteZeroes(ctx context.Context, off, length int64, fua bool) error
	Trim(ctx context.Context, off, length int64) error
	// Flush returns after every write that returned before Flush was called is on stable storage.
	Flush(ctx context.Context) error
}

// Describer is optionally implemented by an Export to answer NBD_INFO_DESCRIPTION.
type Describer interface {
	Description() string
}

// ReadOnlyReporter is optionally implemented by an Export. If ReadOnly returns true when a client
// selects the export, NBD_FLAG_READ_ONLY is advertised and the server answers WRITE, TRIM and
// WRITE_ZEROES with EPERM itself for the life of that connection.
type ReadOnlyReporter interface {
	ReadOnly() bool
}

// Resolver finds exports by name. Lookup's error text is sent to the client in the option error
// reply (e.g. "vol0: this node (beta) is Secondary; the primary is alpha at
// nbd://127.0.0.1:7802/vol0"). Both methods may be called concurrently and should not block long:
// they run inside the client's handshake deadline.
type Resolver interface {
	Lookup(name string) (Export, error)
	List() []string
}

// Config configures a Server. Only Resolver is required.
type Config struct {
	Resolver Resolver
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger
	// MaxInFlight bounds the requests one connection has being executed at once; default 64.
	MaxInFlight int
	// HandshakeTimeout bounds the whole negotiation phase of a connection; default 10s.
	HandshakeTimeout time.Duration
}

const (
	defaultMaxInFlight      = 64
	defaultHandshakeTimeout = 10 * time.Second
)

// CommandCounts counts something per NBD command. Other is every command the server does not
// implement.
type CommandCounts struct {
	Read, Write, Flush, Trim, WriteZeroes, Disconnect, Other uint64
}

// Stats is a snapshot of a Server's counters.
type Stats struct {
	OpenConnections     int64  // connections accepted and not yet closed, in either phase
	AcceptedConnections uint64 // connections accepted since NewServer
	FailedHandshakes    uint64 // connections closed before entering transmission (includes NBD_OPT_ABORT)
	Requests            CommandCounts
	Errors              CommandCounts // error replies sent
	BytesRead           uint64        // READ payload sent to clients
	BytesWritten        uint64        // WRITE payload received from clients and passed to an Export
}

// Server serves NBD connections. Its methods may be called concurrently.
type Server struct {
	resolver         Resolver
	log              *slog.Logger
	maxInFlight      int
	handshakeTimeout time.Duration

	mu        sync.Mutex
	shutdown  bool
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	// closeGeneration[name] is bumped by CloseExport, so that a handshake whose Lookup raced
	// with CloseExport does not enter transmission on a closed export.
	closeGeneration map[string]uint64

	stats counters
}

// NewServer returns a Server. It panics if cfg.Resolver is nil.
func NewServer(cfg Config) *Server {
	if cfg.Resolver == nil {
		panic("nbd: Config.Resolver is nil")
	}
	s := &Server{
		resolver:         cfg.Resolver,
		log:              cfg.Logger,
		maxInFlight:      cfg.MaxInFlight,
		handshakeTimeout: cfg.HandshakeTimeout,
		listeners:        make(map[net.Listener]struct{}),
		conns:            make(map[*serverConn]struct{}),
		closeGeneration:  make(map[string]uint64),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.maxInFlight <= 0 {
		s.maxInFlight = defaultMaxInFlight
	}
	if s.handshakeTimeout <= 0 {
		s.handshakeTimeout = defaultHandshakeTimeout
	}
	return s
}

// Serve accepts connections on l until Shutdown, then returns nil. It closes l when it returns.
// Any other accept error that is not transient is returned.
func (s *Server) Serve(l net.Listener) error {
	if !s.trackListener(l) {
		l.Close()
		return nil
	}
	defer s.untrackListener(l)
	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.isShutdown() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// EMFILE, ECONNABORTED and the like: wait and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("nbd: accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.startConn(conn)
	}
}

// Shutdown stops accepting connections, closes connections still negotiating, answers every
// request already received on connections in transmission, and then closes them. If ctx ends
// first, the remaining connections are closed at once (their Export calls see a cancelled ctx)
// and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown = true
	for l := range s.listeners {
		l.Close()
	}
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	return drain(ctx, conns)
}

// CloseExport answers the requests already received on the connections using the named export
// and then closes those connections; it returns when they are closed. Handshakes that looked
// the export up before CloseExport get NBD_REP_ERR_UNKNOWN instead of entering transmission.
// It is what a node calls when it stops being primary. The Resolver must refuse the name by
// the time CloseExport is called, or new clients will simply connect again. It must not be
// called from an Export method (it would wait for itself).
func (s *Server) CloseExport(name string) {
	_ = s.CloseExportContext(context.Background(), name)
}

// CloseExportContext is CloseExport with a bound on the wait: when ctx ends, the remaining
// connections are closed at once and ctx's error is returned.
func (s *Server) CloseExportContext(ctx context.Context, name string) error {
	s.mu.Lock()
	s.closeGeneration[name]++
	var conns []*serverConn
	for c := range s.conns {
		if c.attached && c.exportName == name {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	return drain(ctx, conns)
}

// drain asks each connection to stop reading requests and waits until all are closed.
func drain(ctx context.Context, conns []*serverConn) error {
	for _, c := range conns {
		c.beginDrain()
	}
	for _, c := range conns {
		select {
		case <-c.done:
		case <-ctx.Done():
			for _, c := range conns {
				c.forceClose()
			}
			return ctx.Err()
		}
	}
	return nil
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	return s.stats.snapshot()
}

func (s *Server) isShutdown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shutdown
}

func (s *Server) trackListener(l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return false
	}
	s.listeners[l] = struct{}{}
	return true
}

func (s *Server) untrackListener(l net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.listeners, l)
	l.Close()
}

func (s *Server) startConn(conn net.Conn) {
	c := newServerConn(s, conn)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		conn.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.stats.accepted.Add(1)
	s.stats.open.Add(1)
	go c.serve()
}

func (s *Server) removeConn(c *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	s.stats.open.Add(-1)
}

// exportGeneration is read before Lookup and passed to attach after it.
func (s *Server) exportGeneration(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeGeneration[name]
}

// attach records that c is entering transmission on the named export. It fails with
// NBD_REP_ERR_SHUTDOWN during Shutdown, or NBD_REP_ERR_UNKNOWN if CloseExport ran since generation
// was read.
func (s *Server) attach(c *serverConn, name string, generation uint64) (replyType uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.shutdown:
		return repErrShutdown, false
	case s.closeGeneration[name] != generation:
		return repErrUnknown, false
	}
	c.attached = true
	c.exportName = name
	return 0, true
}

// counters are the Server's statistics, updated atomically on the request path.
type counters struct {
	open         atomic.Int64
	accepted     atomic.Uint64
	failed       atomic.Uint64
	requests     [numCommandKinds]atomic.Uint64
	errors       [numCommandKinds]atomic.Uint64
	bytesRead    atomic.Uint64
	bytesWritten atomic.Uint64
}

const (
	kindRead = iota
	kindWrite
	kindFlush
	kindTrim
	kindWriteZeroes
	kindDisconnect
	kindOther
	numCommandKinds
)

func commandKind(cmd uint16) int {
	switch cmd {
	case cmdRead:
		return kindRead
	case cmdWrite:
		return kindWrite
	case cmdFlush:
		return kindFlush
	case cmdTrim:
		return kindTrim
	case cmdWriteZeroes:
		return kindWriteZeroes
	case cmdDisc:
		return kindDisconnect
	}
	return kindOther
}

func (c *counters) snapshot() Stats {
	counts := func(a *[numCommandKinds]atomic.Uint64) CommandCounts {
		return CommandCounts{
			Read: a[kindRead].Load(), Write: a[kindWrite].Load(), Flush: a[kindFlush].Load(),
			Trim: a[kindTrim].Load(), WriteZeroes: a[kindWriteZeroes].Load(),
			Disconnect: a[kindDisconnect].Load(), Other: a[kindOther].Load(),
		}
	}
	return Stats{
		OpenConnections:     c.open.Load(),
		AcceptedConnections: c.accepted.Load(),
		FailedHandshakes:    c.failed.Load(),
		Requests:            counts(&c.requests),
		Errors:              counts(&c.errors),
		BytesRead:           c.bytesRead.Load(),
		BytesWritten:        c.bytesWritten.Load(),
	}
}
