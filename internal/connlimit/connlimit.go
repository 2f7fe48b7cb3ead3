package connlimit

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/lockorder"
)

// Config is one port's limits. MaxOpen is required; a zero field takes
// its default.
type Config struct {
	// Port names the port in log lines and errors ("nbd", "control").
	Port string
	// MaxOpen bounds the connections open at once, in every phase.
	MaxOpen int
	// MaxHandshakes bounds the connections still in their handshake;
	// default MaxOpen.
	MaxHandshakes int
	// StrangerOpen and StrangerHandshakes bound what addresses that are
	// not Known may hold: the rest of MaxOpen and MaxHandshakes is kept
	// for the cluster's own nodes. Default: all but an eighth of MaxOpen,
	// all but a quarter of MaxHandshakes.
	StrangerOpen, StrangerHandshakes int
	// PerSourceOpen and PerSourceHandshakes bound what one source that is
	// not Known may hold. Default: a quarter of StrangerOpen, a sixteenth
	// of StrangerHandshakes (at least one each).
	PerSourceOpen, PerSourceHandshakes int
	// HandshakeTimeout is how long a handshake may take (Slot.Deadline);
	// default 5 s.
	HandshakeTimeout time.Duration
	// PressureTimeout is how long a stranger's handshake may take while
	// half of StrangerHandshakes are in progress: one older than this is
	// closed at the next connection, and a new one gets this deadline;
	// default 1 s, at most HandshakeTimeout.
	PressureTimeout time.Duration
	// Known is the cluster's own addresses; nil: none (Local connections
	// are known all the same).
	Known *Known
	// Clock is the time of deadlines and log intervals; nil: the real one.
	Clock clock.Clock
	// Logger receives a line per source and LogInterval about the
	// connections refused or closed; nil discards them.
	Logger *slog.Logger
	// LogInterval is the least time between two lines about one source;
	// default 10 s.
	LogInterval time.Duration
}

// Defaults.
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultPressureTimeout  = time.Second
	DefaultLogInterval      = 10 * time.Second
)

// maxLoggedSources bounds the sources whose lines are kept apart: beyond,
// one line speaks for all the others.
const maxLoggedSources = 64

func (cfg Config) withDefaults() Config {
	def := func(field *int, v int) {
		if *field == 0 {
			*field = max(v, 1)
		}
	}
	def(&cfg.MaxHandshakes, cfg.MaxOpen)
	def(&cfg.StrangerOpen, cfg.MaxOpen-cfg.MaxOpen/8)
	def(&cfg.StrangerHandshakes, cfg.MaxHandshakes-cfg.MaxHandshakes/4)
	def(&cfg.PerSourceOpen, cfg.StrangerOpen/4)
	def(&cfg.PerSourceHandshakes, cfg.StrangerHandshakes/16)
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.PressureTimeout == 0 {
		cfg.PressureTimeout = min(DefaultPressureTimeout, cfg.HandshakeTimeout)
	}
	if cfg.LogInterval == 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	if cfg.Port == "" {
		cfg.Port = "a port"
	}
	return cfg
}

// Validate reports what is wrong with cfg, once defaults are applied.
func (cfg Config) Validate() error {
	cfg = cfg.withDefaults()
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if cfg.MaxOpen <= 0 {
		bad("MaxOpen %d: at least one connection must fit", cfg.MaxOpen)
	}
	if cfg.MaxHandshakes > cfg.MaxOpen {
		bad("MaxHandshakes %d exceeds MaxOpen %d", cfg.MaxHandshakes, cfg.MaxOpen)
	}
	if cfg.StrangerOpen > cfg.MaxOpen || cfg.StrangerHandshakes > cfg.MaxHandshakes {
		bad("StrangerOpen %d and StrangerHandshakes %d must not exceed MaxOpen %d and MaxHandshakes %d",
			cfg.StrangerOpen, cfg.StrangerHandshakes, cfg.MaxOpen, cfg.MaxHandshakes)
	}
	if cfg.PerSourceOpen > cfg.StrangerOpen || cfg.PerSourceHandshakes > cfg.StrangerHandshakes {
		bad("PerSourceOpen %d and PerSourceHandshakes %d must not exceed StrangerOpen %d and StrangerHandshakes %d",
			cfg.PerSourceOpen, cfg.PerSourceHandshakes, cfg.StrangerOpen, cfg.StrangerHandshakes)
	}
	if cfg.MaxHandshakes < 0 || cfg.StrangerOpen < 0 || cfg.StrangerHandshakes < 0 || cfg.PerSourceOpen < 0 || cfg.PerSourceHandshakes < 0 {
		bad("no limit may be negative")
	}
	if cfg.HandshakeTimeout < 0 || cfg.PressureTimeout < 0 || cfg.PressureTimeout > cfg.HandshakeTimeout {
		bad("PressureTimeout %v must lie between 0 and HandshakeTimeout %v", cfg.PressureTimeout, cfg.HandshakeTimeout)
	}
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("connlimit: %s: bad Config: %w", cfg.Port, err)
	}
	return nil
}

// Reason says why a Limiter refused a connection or closed one in its
// handshake.
type Reason uint8

// Reasons. The first four are refusals, as a connection is accepted; the
// last two close a connection still in its handshake.
const (
	// SourceOpen: its source holds PerSourceOpen connections.
	SourceOpen Reason = iota + 1
	// SourceHandshakes: its source has PerSourceHandshakes in progress.
	SourceHandshakes
	// PortFull: MaxOpen connections are open (StrangerOpen, for a
	// stranger), and none could be closed for it.
	PortFull
	// HandshakesFull: MaxHandshakes are in progress (StrangerHandshakes,
	// for a stranger), and none could be closed for it.
	HandshakesFull
	// Evicted: the oldest unfinished handshake of the source holding the
	// most, closed to make room for a new connection.
	Evicted
	// SlowHandshake: a handshake past its deadline, or past
	// PressureTimeout while the port is under pressure.
	SlowHandshake
	numReasons
)

// Reasons lists every Reason.
func Reasons() []Reason {
	return []Reason{SourceOpen, SourceHandshakes, PortFull, HandshakesFull, Evicted, SlowHandshake}
}

// Refusal reports whether r is a refusal (the connection was never
// admitted) rather than a close.
func (r Reason) Refusal() bool { return r >= SourceOpen && r <= HandshakesFull }

func (r Reason) String() string {
	switch r {
	case SourceOpen:
		return "source-open"
	case SourceHandshakes:
		return "source-handshakes"
	case PortFull:
		return "port-full"
	case HandshakesFull:
		return "handshakes-full"
	case Evicted:
		return "evicted"
	case SlowHandshake:
		return "slow-handshake"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Refused is Admit's error: the connection was refused, and closed.
type Refused struct {
	Port   string
	Source Source
	Reason Reason
}

func (e *Refused) Error() string {
	return fmt.Sprintf("%s: refused a connection from %s: %s", e.Port, e.Source, e.Reason)
}

// Stats is a snapshot of a Limiter's counts.
type Stats struct {
	Open, Handshakes                 int // connections open now, and those of them in their handshake
	StrangerOpen, StrangerHandshakes int // the part of them from addresses that are not Known
	Sources                          int // sources with a connection open
	Admitted                         uint64
	counts                           [numReasons]uint64
}

// Count is how many connections were refused or closed for r.
func (s Stats) Count(r Reason) uint64 {
	if r >= numReasons {
		return 0
	}
	return s.counts[r]
}

// Refused is how many connections were refused, for any reason.
func (s Stats) Refused() uint64 {
	var n uint64
	for _, r := range Reasons() {
		if r.Refusal() {
			n += s.counts[r]
		}
	}
	return n
}

// Limiter admits a port's connections within its Config. Its methods and
// those of its Slots may be called concurrently.
type Limiter struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger

	mu                               lockorder.Mutex // a leaf: nothing is called under it
	open, handshakes                 int
	strangerOpen, strangerHandshakes int
	sources                          map[Source]*source
	shaking                          list.List // of *Slot in their handshake, oldest first
	admitted                         uint64
	counts                           [numReasons]uint64
	logs                             sourceLog
}

// source is what one source holds.
type source struct {
	open, handshakes int
	// evictable is its strangers' slots in their handshake, oldest first.
	evictable list.List
}

// New returns a Limiter. It panics if cfg is not valid (Config.Validate).
func New(cfg Config) *Limiter {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	l := &Limiter{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Logger, sources: map[Source]*source{}}
	if l.log == nil {
		l.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l.logs = sourceLog{interval: cfg.LogInterval, entries: map[Source]*logEntry{}}
	return l
}

// Config is the Limiter's config, defaults applied.
func (l *Limiter) Config() Config { return l.cfg }

// phase is where a Slot is.
type phase uint8

const (
	handshaking phase = iota
	negotiated
	ended // released, or closed by the Limiter
)

// Slot is one admitted connection's place. Its owner calls Negotiated
// when the handshake is done and Release when the connection is closed;
// the Limiter may close the connection before the handshake is done
// (ClosedBy then says why), and its owner then sees it fail.
type Slot struct {
	l        *Limiter
	conn     net.Conn
	source   Source
	known    bool
	began    time.Time
	deadline time.Time

	// Guarded by l.mu.
	phase    phase
	closedBy Reason
	inAll    *list.Element // in l.shaking
	inSource *list.Element // in its source's evictable
}

// Admit counts conn, a connection just accepted, or refuses it: a
// refused connection is closed at once, with a reset where it can be
// (nothing is sent), and the error is a *Refused. To make room, Admit may
// close other connections still in their handshake.
func (l *Limiter) Admit(conn net.Conn) (*Slot, error) {
	src, addr := SourceOf(conn.RemoteAddr())
	known := src.IsLocal() || l.cfg.Known.Contains(addr)
	now := l.clock.Now()
	var closing []*Slot
	var lines []logLine

	l.mu.Lock()
	closing, lines = l.sweepLocked(now, closing, lines)
	refused := l.refusalLocked(src, known)
	for refused == 0 {
		full := l.fullLocked(known)
		if full == 0 {
			break
		}
		victim := l.victimLocked(src, known)
		if victim == nil {
			refused = full
			break
		}
		lines = l.endLocked(victim, Evicted, now, lines)
		closing = append(closing, victim)
	}
	var slot *Slot
	if refused != 0 {
		l.counts[refused]++
		lines = l.logs.note(src, refused, now, lines)
	} else {
		slot = l.addLocked(conn, src, known, now)
	}
	l.mu.Unlock()

	for _, s := range closing {
		reset(s.conn)
	}
	for _, line := range lines {
		l.emit(line)
	}
	if refused != 0 {
		reset(conn)
		return nil, &Refused{Port: l.cfg.Port, Source: src, Reason: refused}
	}
	return slot, nil
}

// refusalLocked is why a stranger's source may take no more, or 0.
func (l *Limiter) refusalLocked(src Source, known bool) Reason {
	s := l.sources[src]
	switch {
	case known || s == nil:
		return 0
	case s.open >= l.cfg.PerSourceOpen:
		return SourceOpen
	case s.handshakes >= l.cfg.PerSourceHandshakes:
		return SourceHandshakes
	}
	return 0
}

// fullLocked is which of the port's limits a new connection would pass,
// or 0.
func (l *Limiter) fullLocked(known bool) Reason {
	switch {
	case l.open >= l.cfg.MaxOpen, !known && l.strangerOpen >= l.cfg.StrangerOpen:
		return PortFull
	case l.handshakes >= l.cfg.MaxHandshakes, !known && l.strangerHandshakes >= l.cfg.StrangerHandshakes:
		return HandshakesFull
	}
	return 0
}

// victimLocked is the handshake to close for a new connection from src:
// the oldest unfinished handshake of a stranger's source, the one holding
// the most (the oldest such handshake among equals). A stranger takes it
// only from a source that would still hold more than its own after: a
// flood makes room for others, not for more of itself. nil: none.
func (l *Limiter) victimLocked(src Source, known bool) *Slot {
	var best *source
	for _, s := range l.sources {
		n := s.evictable.Len()
		if n == 0 {
			continue
		}
		if best == nil || n > best.evictable.Len() ||
			n == best.evictable.Len() && s.evictable.Front().Value.(*Slot).began.Before(best.evictable.Front().Value.(*Slot).began) {
			best = s
		}
	}
	if best == nil {
		return nil
	}
	if !known {
		own := 0
		if s := l.sources[src]; s != nil {
			own = s.open
		}
		if best.evictable.Len() < own+2 {
			return nil
		}
	}
	return best.evictable.Front().Value.(*Slot)
}

// underPressureLocked: half of the strangers' handshakes are taken.
func (l *Limiter) underPressureLocked() bool {
	return l.strangerHandshakes >= max(l.cfg.StrangerHandshakes/2, 1)
}

// sweepLocked closes the handshakes that ran past their deadline, and,
// under pressure, strangers' past PressureTimeout.
func (l *Limiter) sweepLocked(now time.Time, closing []*Slot, lines []logLine) ([]*Slot, []logLine) {
	pressure := l.underPressureLocked()
	for e := l.shaking.Front(); e != nil; {
		s, next := e.Value.(*Slot), e.Next()
		age := now.Sub(s.began)
		if age < l.cfg.PressureTimeout {
			break // the rest are younger
		}
		if age >= l.cfg.HandshakeTimeout || pressure && !s.known {
			lines = l.endLocked(s, SlowHandshake, now, lines)
			closing = append(closing, s)
		}
		e = next
	}
	return closing, lines
}

func (l *Limiter) addLocked(conn net.Conn, src Source, known bool, now time.Time) *Slot {
	s := l.sources[src]
	if s == nil {
		s = &source{}
		l.sources[src] = s
	}
	timeout := l.cfg.HandshakeTimeout
	if !known && l.underPressureLocked() {
		timeout = l.cfg.PressureTimeout
	}
	slot := &Slot{l: l, conn: conn, source: src, known: known, began: now, deadline: now.Add(timeout)}
	slot.inAll = l.shaking.PushBack(slot)
	if !known {
		slot.inSource = s.evictable.PushBack(slot)
		l.strangerOpen++
		l.strangerHandshakes++
	}
	s.open++
	s.handshakes++
	l.open++
	l.handshakes++
	l.admitted++
	return slot
}

// finishHandshakeLocked takes s out of the handshakes.
func (l *Limiter) finishHandshakeLocked(s *Slot) {
	src := l.sources[s.source]
	l.shaking.Remove(s.inAll)
	if s.inSource != nil {
		src.evictable.Remove(s.inSource)
		l.strangerHandshakes--
	}
	s.inAll, s.inSource = nil, nil
	src.handshakes--
	l.handshakes--
}

// dropLocked takes s out of every count.
func (l *Limiter) dropLocked(s *Slot) {
	if s.phase == handshaking {
		l.finishHandshakeLocked(s)
	}
	src := l.sources[s.source]
	if src.open--; src.open == 0 {
		delete(l.sources, s.source)
	}
	if !s.known {
		l.strangerOpen--
	}
	l.open--
	s.phase = ended
}

// endLocked closes s for r: it is dropped now, its connection is closed
// by the caller once the lock is released.
func (l *Limiter) endLocked(s *Slot, r Reason, now time.Time, lines []logLine) []logLine {
	l.dropLocked(s)
	s.closedBy = r
	l.counts[r]++
	return l.logs.note(s.source, r, now, lines)
}

// Deadline is when the handshake must be done: the owner sets it on the
// connection.
func (s *Slot) Deadline() time.Time { return s.deadline }

// Source is where the connection comes from.
func (s *Slot) Source() Source { return s.source }

// Known reports whether the connection comes from a known address.
func (s *Slot) Known() bool { return s.known }

// Negotiated records that the handshake is done: the connection is no
// longer counted as one, and the Limiter will not close it. It reports
// false if the Limiter closed the connection already (ClosedBy says why).
func (s *Slot) Negotiated() bool {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s.phase {
	case handshaking:
		l.finishHandshakeLocked(s)
		s.phase = negotiated
		return true
	case negotiated:
		return true
	}
	return false
}

// Release gives the slot back: the connection is closed. It may be
// called more than once, and after the Limiter closed the connection. A
// connection released in its handshake at or past its deadline is counted
// (and logged) as a SlowHandshake: its owner closed it for the deadline.
func (s *Slot) Release() {
	l := s.l
	now := l.clock.Now()
	var lines []logLine
	l.mu.Lock()
	if s.phase == handshaking && !now.Before(s.deadline) {
		lines = l.endLocked(s, SlowHandshake, now, lines)
	} else if s.phase != ended {
		l.dropLocked(s)
	}
	l.mu.Unlock()
	for _, line := range lines {
		l.emit(line)
	}
}

// ClosedBy is why the Limiter closed the connection, or 0 if it did not.
func (s *Slot) ClosedBy() Reason {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	return s.closedBy
}

// Stats returns the Limiter's counts.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Open: l.open, Handshakes: l.handshakes, StrangerOpen: l.strangerOpen, StrangerHandshakes: l.strangerHandshakes,
		Sources: len(l.sources), Admitted: l.admitted, counts: l.counts}
}

// reset closes c with a reset where it can: nothing more is sent, and no
// TIME_WAIT is left behind.
func reset(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = c.Close()
}

// Wrap returns c (the connection Admit counted, or one over it) with a
// Close that also releases the slot.
func (s *Slot) Wrap(c net.Conn) net.Conn { return &slotConn{Conn: c, slot: s} }

type slotConn struct {
	net.Conn
	slot *Slot
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.slot.Release()
	return err
}
