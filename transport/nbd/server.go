package nbd

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/lockorder"
)

// Export is one block device served over NBD. All methods may be called concurrently, and may
// block; ctx is cancelled when the connection is closed by force.
//
// Errors: wrap a syscall.Errno (EPERM, ENOSPC, EINVAL, ESHUTDOWN, EROFS) to choose the NBD error;
// anything else is EIO. The server never calls a method with a range outside [0, Size()) or with
// length 0, and never passes ReadAt or WriteAt more than MaxRequestLength bytes. Size may grow
// (an online resize): each connection keeps the size it was told at its handshake, since NBD
// cannot tell a client of a new one, and a new connection sees the new size.
type Export interface {
	Size() int64
	// ReadAt must not keep p after it returns, even when ctx is cancelled: p is then reused.
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

// Config configures a Server. Only Resolver is required; a zero field takes its default.
//
// Memory: each request holds bytes of a budget from the moment its header is read until its
// reply is written (see budget.go), and a connection reads no further requests while it cannot
// get them, so TCP pushes back on a client that sends faster than it reads. The request buffers
// of a Server therefore never exceed NodeBudget + MaxConnections × ConnectionReserve, and its
// free buffers never exceed MaxPooledBytes. With the defaults: 256 MiB + 256 MiB + 64 MiB.
type Config struct {
	Resolver Resolver
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger
	// MaxInFlight bounds the requests one connection has being executed at once; default 64.
	MaxInFlight int
	// HandshakeTimeout bounds the whole negotiation phase of a connection (STARTTLS and its TLS
	// handshake included); default 5s. A client's negotiation gets PressureHandshakeTimeout
	// instead while half the negotiations strangers may have are in progress.
	HandshakeTimeout time.Duration
	// PressureHandshakeTimeout: see HandshakeTimeout; default 2s, at most HandshakeTimeout.
	PressureHandshakeTimeout time.Duration
	// MaxConnections bounds the connections in transmission. A client selecting an export
	// beyond it is refused with NBD_REP_ERR_POLICY and a message saying so (NBD_OPT_EXPORT_NAME,
	// which cannot carry an error, is closed); default 256.
	MaxConnections int
	// ConnectionBudget bounds the bytes one connection's requests hold; at least
	// MaxRequestLength, default 64 MiB.
	ConnectionBudget int64
	// NodeBudget bounds the bytes the requests of all connections hold beyond their reserves.
	// Connections wait for it in arrival order. At least MaxRequestLength, default 256 MiB.
	NodeBudget int64
	// ConnectionReserve is the part of each connection's budget that does not come from the node
	// budget: a request that fits in its connection's unused reserve is charged there, so a
	// client with small requests is served while others hold the whole node budget. At most
	// ConnectionBudget, default 1 MiB.
	ConnectionReserve int64
	// StallTimeout closes a connection whose client takes no byte of its pending replies, or
	// sends no byte of a WRITE payload it started, for that long; default 30s. A slow client
	// that makes progress is not cut off.
	StallTimeout time.Duration
	// MaxPooledBytes bounds the free buffers the Server keeps for reuse; default 64 MiB.
	MaxPooledBytes int64
	// MaxOpenConnections bounds the connections open at once in every phase, negotiating ones
	// included: a connection accepted beyond it is closed at once (a reset, nothing sent),
	// unless a negotiation can be closed to make room for it (see package connlimit), and a log
	// line per address and interval says so. It bounds the file descriptors and the memory of
	// negotiating connections, whatever a client does; default 4 × MaxConnections. At least
	// MaxConnections. An eighth of it is kept for the Known addresses.
	MaxOpenConnections int
	// MaxOpenPerAddress bounds the connections open at once from one address that is not
	// Known (an IPv6 /64 counts as one address); default MaxConnections +
	// MaxNegotiatingPerAddress.
	MaxOpenPerAddress int
	// MaxNegotiatingPerAddress bounds the negotiations in progress from one address that is
	// not Known; default 16. A client negotiates in milliseconds: only a flood holds many.
	MaxNegotiatingPerAddress int
	// Known is the addresses of the cluster's own nodes: they are held to no per-address
	// limit and may use the part of MaxOpenConnections kept for them; nil: none.
	Known *connlimit.Known

	// TLS is the server side of NBD_OPT_STARTTLS (NBD protocol, "TLS support"). It must
	// authenticate clients by their certificate (ClientAuth tls.RequireAndVerifyClientCert):
	// whom it accepts is whom the server serves. nil: STARTTLS is answered
	// NBD_REP_ERR_UNSUP and every client is plaintext.
	TLS *tls.Config
	// TLSPolicy says whether a client must use TLS; see TLSPolicy.
	TLSPolicy TLSPolicy
	// TLSCertificatesHint completes the message a plaintext client gets when TLS is required:
	// "... e.g. nbds://HOST:PORT/EXPORT?tls-certificates=" + TLSCertificatesHint (libnbd's URI;
	// the directory holds ca-cert.pem, client-cert.pem and client-key.pem); default "DIR".
	TLSCertificatesHint string
}

// TLSPolicy is whether a Server's clients must use TLS.
type TLSPolicy uint8

// TLS policies. The zero value, TLSDefault, is TLSRequired when Config.TLS is set and TLSOff
// otherwise.
const (
	TLSDefault TLSPolicy = iota
	// TLSRequired: every option before NBD_OPT_STARTTLS but NBD_OPT_ABORT is answered
	// NBD_REP_ERR_TLS_REQD, saying how to connect with TLS, and NBD_OPT_EXPORT_NAME closes
	// the connection (proto.md's FORCEDTLS).
	TLSRequired
	// TLSOptional: a client may STARTTLS or stay plaintext (SELECTIVETLS with no TLS-only
	// export).
	TLSOptional
	// TLSOff: STARTTLS is answered NBD_REP_ERR_POLICY; every client is plaintext.
	TLSOff
)

func (p TLSPolicy) String() string {
	switch p {
	case TLSDefault:
		return "default"
	case TLSRequired:
		return "required"
	case TLSOptional:
		return "optional"
	case TLSOff:
		return "off"
	}
	return fmt.Sprintf("TLSPolicy(%d)", uint8(p))
}

// effective is p with TLSDefault resolved for a config whose TLS is set or not.
func (p TLSPolicy) effective(haveTLS bool) TLSPolicy {
	if p != TLSDefault {
		return p
	}
	if haveTLS {
		return TLSRequired
	}
	return TLSOff
}

const (
	defaultMaxInFlight      = 64
	defaultHandshakeTimeout = 5 * time.Second
	defaultPressureTimeout  = 2 * time.Second
	// defaultNegotiatingPerAddress: MaxNegotiatingPerAddress's default.
	defaultNegotiatingPerAddress = 16
	defaultMaxConnections        = 256
	defaultConnectionBudget      = 64 << 20
	defaultNodeBudget            = 256 << 20
	defaultConnectionReserve     = 1 << 20
	defaultStallTimeout          = 30 * time.Second
	defaultMaxPooledBytes        = 64 << 20
	// defaultOpenPerTransmitting: MaxOpenConnections defaults to this many times MaxConnections.
	defaultOpenPerTransmitting = 4
	defaultTLSCertificatesHint = "DIR"
)

// withDefaults returns cfg with every zero field set to its default.
func (cfg Config) withDefaults() Config {
	setDefault(&cfg.MaxInFlight, defaultMaxInFlight)
	setDefault(&cfg.HandshakeTimeout, defaultHandshakeTimeout)
	setDefault(&cfg.MaxConnections, defaultMaxConnections)
	setDefault(&cfg.ConnectionBudget, defaultConnectionBudget)
	setDefault(&cfg.NodeBudget, defaultNodeBudget)
	setDefault(&cfg.ConnectionReserve, defaultConnectionReserve)
	setDefault(&cfg.StallTimeout, defaultStallTimeout)
	setDefault(&cfg.MaxPooledBytes, defaultMaxPooledBytes)
	if cfg.MaxConnections > 0 {
		setDefault(&cfg.MaxOpenConnections, defaultOpenPerTransmitting*cfg.MaxConnections)
	}
	setDefault(&cfg.PressureHandshakeTimeout, min(defaultPressureTimeout, cfg.HandshakeTimeout))
	setDefault(&cfg.MaxNegotiatingPerAddress, defaultNegotiatingPerAddress)
	setDefault(&cfg.MaxOpenPerAddress, cfg.MaxConnections+cfg.MaxNegotiatingPerAddress)
	if cfg.TLSCertificatesHint == "" {
		cfg.TLSCertificatesHint = defaultTLSCertificatesHint
	}
	cfg.TLSPolicy = cfg.TLSPolicy.effective(cfg.TLS != nil)
	return cfg
}

func setDefault[T int | int64 | time.Duration](field *T, value T) {
	if *field == 0 {
		*field = value
	}
}

// admission is the connection limits of cfg (defaults applied): what a client may hold while
// it negotiates, and in all.
func (cfg Config) admission() connlimit.Config {
	lim := connlimit.Config{
		Port:             "nbd",
		MaxOpen:          cfg.MaxOpenConnections,
		HandshakeTimeout: cfg.HandshakeTimeout,
		PressureTimeout:  cfg.PressureHandshakeTimeout,
		Known:            cfg.Known,
		Logger:           cfg.Logger,
		LogInterval:      logInterval,
	}
	if lim.MaxOpen > 0 {
		lim.StrangerOpen = lim.MaxOpen - lim.MaxOpen/8
		lim.StrangerHandshakes = lim.StrangerOpen
		lim.PerSourceOpen = min(cfg.MaxOpenPerAddress, lim.StrangerOpen)
		lim.PerSourceHandshakes = min(cfg.MaxNegotiatingPerAddress, lim.StrangerHandshakes)
	}
	return lim
}

// Validate reports what is wrong with cfg, once defaults are applied.
func (cfg Config) Validate() error {
	cfg = cfg.withDefaults()
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if cfg.Resolver == nil {
		bad("Resolver is nil")
	}
	if cfg.MaxInFlight < 0 || cfg.MaxConnections < 0 || cfg.HandshakeTimeout < 0 || cfg.StallTimeout < 0 || cfg.MaxPooledBytes < 0 {
		bad("MaxInFlight, MaxConnections, HandshakeTimeout, StallTimeout and MaxPooledBytes must not be negative")
	}
	if cfg.MaxOpenConnections < cfg.MaxConnections {
		bad("MaxOpenConnections %d is below MaxConnections %d: transmission could never hold MaxConnections", cfg.MaxOpenConnections, cfg.MaxConnections)
	}
	if cfg.MaxOpenPerAddress < 0 || cfg.MaxNegotiatingPerAddress < 0 || cfg.PressureHandshakeTimeout < 0 {
		bad("MaxOpenPerAddress, MaxNegotiatingPerAddress and PressureHandshakeTimeout must not be negative")
	}
	if err := cfg.admission().Validate(); err != nil && cfg.MaxOpenConnections > 0 {
		bad("%v", err)
	}
	switch cfg.TLSPolicy {
	case TLSRequired, TLSOptional:
		if cfg.TLS == nil {
			bad("TLSPolicy %s needs a TLS config", cfg.TLSPolicy)
		}
	case TLSOff:
	default:
		bad("TLSPolicy %d is not a policy", uint8(cfg.TLSPolicy))
	}
	if t := cfg.TLS; t != nil {
		if len(t.Certificates) == 0 && t.GetCertificate == nil && t.GetConfigForClient == nil {
			bad("TLS has no certificate to present")
		}
		if t.ClientAuth != tls.RequireAndVerifyClientCert && t.GetConfigForClient == nil {
			bad("TLS.ClientAuth is %v: NBD clients are authenticated by their certificate alone, so it must be tls.RequireAndVerifyClientCert", t.ClientAuth)
		}
	}
	if cfg.ConnectionBudget < MaxRequestLength {
		bad("ConnectionBudget %d is below MaxRequestLength %d: a request of the maximum length could never run", cfg.ConnectionBudget, MaxRequestLength)
	}
	if cfg.NodeBudget < MaxRequestLength {
		bad("NodeBudget %d is below MaxRequestLength %d: a request of the maximum length could never run", cfg.NodeBudget, MaxRequestLength)
	}
	if cfg.ConnectionReserve < 0 || cfg.ConnectionReserve > cfg.ConnectionBudget {
		bad("ConnectionReserve %d must not be negative nor exceed ConnectionBudget %d", cfg.ConnectionReserve, cfg.ConnectionBudget)
	}
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("nbd: bad Config: %w", err)
	}
	return nil
}

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

	TransmittingConnections int64  // connections in transmission; at most MaxConnections
	DrainingConnections     int64  // connections winding down (Shutdown, CloseExport): new requests get NBD_ESHUTDOWN
	RefusedConnections      uint64 // handshakes refused because MaxConnections were in transmission
	StalledConnections      uint64 // connections closed because their client stalled for StallTimeout
	MaxOpenConnections      int64  // Config.MaxOpenConnections
	RefusedAtAccept         uint64 // connections closed as accepted: Admission's refusals, for any reason
	// Admission is the connection limits' counts: connections open and negotiating, from
	// addresses that are not Known, refused and closed by reason (package connlimit).
	Admission connlimit.Stats

	TLSConnections       uint64 // connections whose NBD_OPT_STARTTLS handshake succeeded
	TLSHandshakeFailures uint64 // STARTTLS handshakes that failed: no client certificate, one the TLS config refused, a timeout...
	TLSRequiredRefusals  uint64 // options answered NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME closed, before TLS

	InFlightBytes     int64 // bytes the requests of all connections hold now (see Config)
	WaitingRequests   int64 // requests read up to their header and waiting for budget (at most one per connection)
	PeakInFlightBytes int64 // the most InFlightBytes has been since NewServer
	NodeBudgetBytes   int64 // Config.NodeBudget
	NodeBudgetHeld    int64 // the part of InFlightBytes charged to the node budget
	PooledBytes       int64 // free buffers kept for reuse
	MaxPooledBytes    int64 // Config.MaxPooledBytes
}

// ClientInfo describes a connection in transmission.
type ClientInfo struct {
	RemoteAddr    string    // the client's address, host:port
	Export        string    // the export it selected
	Since         time.Time // when it entered transmission
	InFlightBytes int64     // bytes its requests hold now
}

// Server serves NBD connections. Its methods may be called concurrently.
type Server struct {
	resolver         Resolver
	log              *slog.Logger
	maxInFlight      int
	maxConnections   int
	connectionBudget int64
	reserve          int64
	stallTimeout     time.Duration
	maxOpen          int
	admission        *connlimit.Limiter
	nodeBudget       *nodeBudget
	buffers          *bufferPool
	tlsConfig        *tls.Config // nil: STARTTLS is not supported
	tlsPolicy        TLSPolicy   // never TLSDefault; TLSOff refuses STARTTLS even with a tlsConfig
	tlsHint          string
	// Rate-limited log lines for what a client can make happen once per connection (refused
	// connections are admission's).
	tlsFailedLog, tlsRequiredLog *logLimiter
	// forcedClose is set once a connection is closed by force, its Export calls cancelled: an
	// Export might then still write into a buffer, so the buffers' mappings are kept.
	forcedClose atomic.Bool

	mu           lockorder.Mutex
	shutdown     bool
	listeners    map[net.Listener]struct{}
	conns        map[*serverConn]struct{}
	transmitting int // conns with attached set
	// closeGeneration[name] is bumped by CloseExport, so that a handshake whose Lookup raced
	// with CloseExport does not enter transmission on a closed export.
	closeGeneration map[string]uint64
	// drainTiming is how connections wind down (see drainQuiet); each copies it as it is accepted.
	drainTiming drainTiming

	stats counters
}

// NewServer returns a Server. It panics if cfg is not valid (see Config.Validate), e.g. if
// cfg.Resolver is nil.
func NewServer(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	s := &Server{
		resolver:         cfg.Resolver,
		log:              cfg.Logger,
		maxInFlight:      cfg.MaxInFlight,
		maxConnections:   cfg.MaxConnections,
		connectionBudget: cfg.ConnectionBudget,
		reserve:          cfg.ConnectionReserve,
		stallTimeout:     cfg.StallTimeout,
		maxOpen:          cfg.MaxOpenConnections,
		admission:        connlimit.New(cfg.admission()),
		nodeBudget:       &nodeBudget{size: cfg.NodeBudget},
		buffers:          newBufferPool(cfg.MaxPooledBytes),
		tlsPolicy:        cfg.TLSPolicy,
		tlsHint:          cfg.TLSCertificatesHint,
		tlsFailedLog:     newLogLimiter(logInterval),
		tlsRequiredLog:   newLogLimiter(logInterval),
		drainTiming:      defaultDrainTiming,
		listeners:        make(map[net.Listener]struct{}),
		conns:            make(map[*serverConn]struct{}),
		closeGeneration:  make(map[string]uint64),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.TLS != nil {
		s.tlsConfig = cfg.TLS.Clone()
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
// request read on connections in transmission (carried out, or NBD_ESHUTDOWN for those that
// arrive during the drain), and then ends them in order: the client reads every reply, then
// EOF (see drainQuiet). If ctx ends first, the remaining connections are closed at once (their
// Export calls see a cancelled ctx) and ctx's error is returned.
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
	err := drain(ctx, conns)
	if err == nil && !s.forcedClose.Load() {
		s.buffers.unmapAll() // every Export call has returned, none was cancelled
	} else {
		s.buffers.freeAll() // buffers still in use come back later and are trimmed
	}
	return err
}

// CloseExport answers the requests already received on the connections using the named export
// (as Shutdown does) and then closes those connections; it returns when they are closed. Handshakes that looked
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
	st := s.stats.snapshot()
	s.mu.Lock()
	st.TransmittingConnections = int64(s.transmitting)
	for c := range s.conns {
		if c.isDraining() {
			st.DrainingConnections++
		}
	}
	s.mu.Unlock()
	st.MaxOpenConnections = int64(s.maxOpen)
	st.Admission = s.admission.Stats()
	st.RefusedAtAccept = st.Admission.Refused()
	st.NodeBudgetBytes = s.nodeBudget.size
	st.NodeBudgetHeld = s.nodeBudget.heldBytes()
	st.PooledBytes = s.buffers.pooled.Load()
	st.MaxPooledBytes = s.buffers.limit
	return st
}

// Clients returns the connections in transmission on the named export, or on every export when
// export is "", oldest first. A connection that CloseExport or Shutdown is draining is listed
// until it is closed.
func (s *Server) Clients(export string) []ClientInfo {
	s.mu.Lock()
	var conns []*serverConn
	for c := range s.conns {
		if c.attached && (export == "" || c.exportName == export) {
			conns = append(conns, c)
		}
	}
	clients := make([]ClientInfo, 0, len(conns))
	for _, c := range conns {
		clients = append(clients, ClientInfo{RemoteAddr: c.remoteAddr, Export: c.exportName, Since: c.since})
	}
	s.mu.Unlock()
	for i, c := range conns {
		clients[i].InFlightBytes = c.heldBytes()
	}
	slices.SortStableFunc(clients, func(a, b ClientInfo) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.RemoteAddr, b.RemoteAddr))
	})
	return clients
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

// startConn admits conn within the connection limits (a refused one is closed at once, with a
// reset where it can: a client holding its share gets nothing more from this server, and its
// next connection costs a file descriptor only for a moment) and serves it.
func (s *Server) startConn(conn net.Conn) {
	if s.isShutdown() {
		conn.Close()
		return
	}
	slot, err := s.admission.Admit(conn)
	if err != nil {
		return // closed, counted and logged by admission
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		slot.Release()
		conn.Close()
		return
	}
	c := newServerConn(s, conn, slot)
	s.conns[c] = struct{}{}
	s.stats.accepted.Add(1)
	s.stats.open.Add(1)
	go c.serve()
}

func (s *Server) removeConn(c *serverConn) {
	c.slot.Release() // outside s.mu: it may log
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if c.attached {
		s.transmitting--
	}
	s.stats.open.Add(-1)
}

// exportGeneration is read before Lookup and passed to attach after it.
func (s *Server) exportGeneration(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeGeneration[name]
}

// attach records that c is entering transmission on the named export. It fails with
// NBD_REP_ERR_SHUTDOWN during Shutdown, NBD_REP_ERR_UNKNOWN if CloseExport ran since generation
// was read, or NBD_REP_ERR_POLICY if MaxConnections are in transmission.
func (s *Server) attach(c *serverConn, name string, generation uint64) (replyType uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.shutdown:
		return repErrShutdown, false
	case s.closeGeneration[name] != generation:
		return repErrUnknown, false
	case s.transmitting >= s.maxConnections:
		s.stats.refused.Add(1)
		return repErrPolicy, false
	case !c.slot.Negotiated():
		return repErrShutdown, false // the connection limits closed it meanwhile
	}
	c.attached = true
	c.exportName = name
	c.since = time.Now()
	s.transmitting++
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
	refused      atomic.Uint64
	stalled      atomic.Uint64
	tlsDone      atomic.Uint64
	tlsFailed    atomic.Uint64
	tlsRequired  atomic.Uint64
	inFlight     atomic.Int64
	peakInFlight atomic.Int64
	waiting      atomic.Int64
}

// chargeInFlight adds n bytes to inFlight and raises the peak.
func (c *counters) chargeInFlight(n int64) {
	now := c.inFlight.Add(n)
	for peak := c.peakInFlight.Load(); now > peak && !c.peakInFlight.CompareAndSwap(peak, now); peak = c.peakInFlight.Load() {
	}
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
		OpenConnections:      c.open.Load(),
		AcceptedConnections:  c.accepted.Load(),
		FailedHandshakes:     c.failed.Load(),
		Requests:             counts(&c.requests),
		Errors:               counts(&c.errors),
		BytesRead:            c.bytesRead.Load(),
		BytesWritten:         c.bytesWritten.Load(),
		RefusedConnections:   c.refused.Load(),
		StalledConnections:   c.stalled.Load(),
		TLSConnections:       c.tlsDone.Load(),
		TLSHandshakeFailures: c.tlsFailed.Load(),
		TLSRequiredRefusals:  c.tlsRequired.Load(),
		InFlightBytes:        c.inFlight.Load(),
		WaitingRequests:      c.waiting.Load(),
		PeakInFlightBytes:    c.peakInFlight.Load(),
	}
}
