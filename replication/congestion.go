package replication

// The congestion rule for one peer under protocol A or B: what the primary
// does when the data queued for a slow peer fills the send buffer. node's
// per-peer sender calls Congestion.Step on every write it queues and every
// ack it receives (and on a tick, so that time-based exits happen on an
// idle link), and performs the actions Step returns.
//
// The pull-ahead policy has hysteresis, so that it does not flap between
// Ahead and the catch-up resync as DRBD's does (LINBIT/drbd#46: a loop of
// PausedSyncS -> Ahead -> PausedSyncS several times a second, each round
// restarting the resync of the whole bitmap), and so that a burst is not
// taken for a link that cannot carry the write rate:
//
//   - enter Ahead when the fill is at or above high water (default 90% of
//     send_buffer) and has been so for Sustain (default 500 ms) longer than
//     it has been below: a congestion clock runs forward while the fill is
//     at or above high water and back, to zero at most, while it is below.
//     A link that cannot carry the rate keeps the buffer full most of the
//     time (an ack of a large frame drains it for a moment, and the writes
//     waiting fill it again); a burst the link carries (the peer's disk, or
//     a busy machine, paused the stream for a moment) fills it for a
//     moment. Until the clock reaches Sustain writes are shipped, and once
//     the buffer is full a write waits for room (WaitForRoom). A link that
//     went Ahead in the last minute has shown that it cannot carry the
//     rate: it goes Ahead again at high water, as soon as the dwell and
//     the cap allow;
//   - leave Ahead only after the fill has stayed below low water (default
//     25%) for Hold (default 1 s) without a break;
//   - every change into or out of Ahead waits MinDwell (default 2 s) after
//     the previous state change;
//   - Ahead is entered at most MaxAheadPerMinute times (default 10) in any
//     60 s;
//   - when the fill has been high for Sustain but a dwell or the cap
//     forbids Ahead, a write that would overfill the buffer is marked
//     instead of shipped (MarkOne), without a state change: the primary
//     waits for the link no longer than Sustain, and never ships more
//     than send_buffer.
//
// The catch-up after Ahead resyncs only the blocks still marked: pausing
// it keeps what it already cleared. Queued counts the application's writes
// only; the resync's own traffic is paced by the resync controller and
// must not be counted, or the catch-up itself sends the peer back Ahead
// (the other half of drbd#46).

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Replication states of a congested link (DRBD's names): the primary is
// Ahead of the peer, which is Behind. The catch-up after Ahead is
// SyncSource on the primary (SyncTarget on the peer), and streaming is
// Connected.
const (
	Ahead  ReplState = "Ahead"
	Behind ReplState = "Behind"
)

// OnCongestion is a volume's policy when a peer's send buffer fills
// (config on_congestion).
type OnCongestion string

// Congestion policies.
const (
	// CongestionBlock: a write waits until the buffer has room; the
	// primary runs at the link's speed.
	CongestionBlock OnCongestion = "block"
	// CongestionPullAhead: the primary goes Ahead, marks the peer's blocks
	// instead of shipping them and catches up with a resync once the link
	// has room again. Protocol A only.
	CongestionPullAhead OnCongestion = "pull-ahead"
	// CongestionDisconnect: the primary drops the connection; the unacked
	// writes become marked blocks and the reconnection resyncs them.
	CongestionDisconnect OnCongestion = "disconnect"
)

// ParseOnCongestion checks a policy name.
func ParseOnCongestion(s string) (OnCongestion, error) {
	return parseName("on_congestion", s, CongestionBlock, CongestionPullAhead, CongestionDisconnect)
}

// parseName returns s if it is one of names (at least two); the error of a
// setting with another value lists them.
func parseName[T ~string](setting, s string, names ...T) (T, error) {
	if i := slices.Index(names, T(s)); i >= 0 {
		return names[i], nil
	}
	list := make([]string, len(names))
	for i, n := range names {
		list[i] = string(n)
	}
	last := len(list) - 1
	return "", fmt.Errorf("%s %q: want %s or %s", setting, s, strings.Join(list[:last], ", "), list[last])
}

// DefaultOnCongestion is the policy of a volume that sets none: pull-ahead
// under protocol A, block otherwise.
func DefaultOnCongestion(protocol string) OnCongestion {
	if protocol == "A" {
		return CongestionPullAhead
	}
	return CongestionBlock
}

// CheckOnCongestion refuses pull-ahead under any protocol but A, as DRBD
// does: under B a write completes only once the peer holds it, and under C
// once the peer wrote it, so marking instead of shipping would break the
// promise of the protocol.
func CheckOnCongestion(protocol string, p OnCongestion) error {
	if p == CongestionPullAhead && protocol != "A" {
		return fmt.Errorf("on_congestion pull-ahead needs protocol A (the volume has %q): use block or disconnect", protocol)
	}
	return nil
}

// Congestion defaults.
const (
	DefaultSendBuffer        = 64 << 20
	DefaultHighWaterPercent  = 90
	DefaultLowWaterPercent   = 25
	DefaultCongestionHold    = time.Second
	DefaultCongestionSustain = 500 * time.Millisecond
	DefaultCongestionDwell   = 2 * time.Second
	DefaultMaxAheadPerMinute = 10
)

// CongestionConfig configures one peer's controller. A zero field takes
// its default (WithDefaults).
type CongestionConfig struct {
	Policy OnCongestion
	// SendBuffer is the most bytes queued for the peer and not yet
	// acknowledged (config send_buffer).
	SendBuffer int64
	// HighWaterPercent of SendBuffer: at or above it the link is
	// congested (pull-ahead goes Ahead, disconnect drops).
	HighWaterPercent int
	// LowWaterPercent of SendBuffer: below it for Hold, Ahead ends.
	LowWaterPercent int
	Hold            time.Duration
	// Sustain: under pull-ahead, Ahead begins once the fill has been at or
	// above high water this much longer than below it (the congestion
	// clock); a burst is absorbed.
	Sustain time.Duration
	// MinDwell is the least time between a state change and a change into
	// or out of Ahead.
	MinDwell time.Duration
	// MaxAheadPerMinute caps the entries into Ahead in any 60 s.
	MaxAheadPerMinute int
}

// WithDefaults fills the zero fields.
func (c CongestionConfig) WithDefaults() CongestionConfig {
	setDefault(&c.SendBuffer, DefaultSendBuffer)
	setDefault(&c.HighWaterPercent, DefaultHighWaterPercent)
	setDefault(&c.LowWaterPercent, DefaultLowWaterPercent)
	setDefault(&c.Hold, DefaultCongestionHold)
	setDefault(&c.Sustain, DefaultCongestionSustain)
	setDefault(&c.MinDwell, DefaultCongestionDwell)
	setDefault(&c.MaxAheadPerMinute, DefaultMaxAheadPerMinute)
	return c
}

// setDefault sets *v to d if it is zero.
func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Validate checks a config after WithDefaults.
func (c CongestionConfig) Validate() error {
	var errs []string
	if _, err := ParseOnCongestion(string(c.Policy)); err != nil {
		errs = append(errs, err.Error())
	}
	if c.SendBuffer <= 0 {
		errs = append(errs, fmt.Sprintf("send_buffer %d: want a positive size", c.SendBuffer))
	}
	if c.LowWaterPercent <= 0 || c.LowWaterPercent >= c.HighWaterPercent || c.HighWaterPercent > 100 {
		errs = append(errs, fmt.Sprintf("water marks %d%% and %d%%: want 0 < low < high <= 100", c.LowWaterPercent, c.HighWaterPercent))
	}
	if c.Hold < 0 || c.MinDwell < 0 || c.Sustain < 0 {
		errs = append(errs, fmt.Sprintf("hold %v, dwell %v and sustain %v: want no negative time", c.Hold, c.MinDwell, c.Sustain))
	}
	if c.MaxAheadPerMinute < 1 {
		errs = append(errs, fmt.Sprintf("max Ahead per minute %d: want at least 1", c.MaxAheadPerMinute))
	}
	if len(errs) > 0 {
		return fmt.Errorf("congestion: %s", strings.Join(errs, "; "))
	}
	return nil
}

// CongestionInput is what the sender knows at one step.
type CongestionInput struct {
	Now time.Time
	// Queued is the bytes of application writes queued for the peer and
	// not yet acknowledged by it: the send buffer's fill.
	Queued int64
	// CatchUpRunning: the resync of the blocks marked while Ahead runs.
	CatchUpRunning bool
	// CatchUpLeft is the bytes still marked for the peer.
	CatchUpLeft int64
}

// CongestionActions is a set of things the sender must do.
type CongestionActions uint8

// Congestion actions.
const (
	// WaitForRoom: hold the next write until an ack brings Queued below
	// SendBuffer (one write may then overshoot it). Under pull-ahead only
	// while a burst lasts: once Ahead begins, the writes held are marked.
	WaitForRoom CongestionActions = 1 << iota
	// StartMarking: stop shipping writes to the peer; mark their blocks in
	// its bitmap (durably, BEFORE the write is acknowledged) instead.
	StartMarking
	// PauseCatchUp: stop the catch-up resync; its cleared blocks stay
	// clear.
	PauseCatchUp
	// StartCatchUp: resync the blocks still marked for the peer.
	StartCatchUp
	// ResumeStreaming: ship new writes to the peer again.
	ResumeStreaming
	// Disconnect: drop the connection; mark what the peer has not
	// acknowledged, and reconnect.
	Disconnect
	// MarkOne: under pull-ahead, the buffer is full but a dwell or the cap
	// forbids a change into Ahead: mark this write's blocks instead of
	// shipping it, without changing state (the catch-up resyncs them).
	// pull-ahead never holds the primary back.
	MarkOne
)

var congestionActionNames = [...]string{"wait-for-room", "start-marking", "pause-catch-up", "start-catch-up", "resume-streaming", "disconnect", "mark-one"}

// Has reports whether every action of b is in a.
func (a CongestionActions) Has(b CongestionActions) bool { return a&b == b }

func (a CongestionActions) String() string {
	var names []string
	for i, name := range congestionActionNames {
		if a&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// Congestion is the congestion controller of one connection to one peer,
// on the primary. Make a new one for every connection. It does no I/O and
// reads no clock (time comes in with each step), so the same steps give
// the same answers; it is for a single goroutine.
type Congestion struct {
	cfg     CongestionConfig
	high    int64 // bytes: congested at or above
	low     int64 // bytes: drained below
	state   ReplState
	since   time.Time // when the current state began
	changed bool      // a state change happened (since counts for MinDwell)
	lowFrom time.Time // since when Queued is below low; zero when it is not
	// congested is the congestion clock: it runs forward while the fill is
	// at or above high and back, to zero at most, while it is below. last
	// is the previous step, lastHigh whether its fill was at or above high.
	congested time.Duration
	last      time.Time
	lastHigh  bool
	aheads    []time.Time
	next      int // the oldest entry of aheads, overwritten next
}

// NewCongestion returns the controller of a connection established at
// now, Connected. cfg gets its defaults and must be valid.
func NewCongestion(cfg CongestionConfig, now time.Time) (*Congestion, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Congestion{
		cfg:    cfg,
		high:   cfg.SendBuffer * int64(cfg.HighWaterPercent) / 100,
		low:    cfg.SendBuffer * int64(cfg.LowWaterPercent) / 100,
		state:  Connected,
		since:  now,
		last:   now,
		aheads: make([]time.Time, cfg.MaxAheadPerMinute),
	}, nil
}

// State is the replication state towards the peer: Connected, Ahead,
// SyncSource (catching up) or, after Disconnect, Connecting.
func (c *Congestion) State() ReplState { return c.state }

// Since is when the current state began.
func (c *Congestion) Since() time.Time { return c.since }

// PeerState is the state the peer reports for the primary's state s:
// Behind for Ahead, SyncTarget for SyncSource, else s.
func PeerState(s ReplState) ReplState {
	switch s {
	case Ahead:
		return Behind
	case SyncSource:
		return SyncTarget
	}
	return s
}

// Step applies one observation and returns the state after it and what
// the sender must do.
func (c *Congestion) Step(in CongestionInput) (ReplState, CongestionActions) {
	if in.Queued < c.low {
		if c.lowFrom.IsZero() {
			c.lowFrom = in.Now
		}
	} else {
		c.lowFrom = time.Time{}
	}
	if dt := in.Now.Sub(c.last); dt > 0 {
		if c.lastHigh {
			c.congested += dt
		} else {
			c.congested = max(0, c.congested-dt)
		}
	}
	c.last, c.lastHigh = in.Now, in.Queued >= c.high
	if c.state == Connecting {
		return c.state, 0
	}
	switch c.cfg.Policy {
	case CongestionBlock:
		return c.state, c.waitIfFull(in)
	case CongestionDisconnect:
		if in.Queued >= c.high {
			c.become(Connecting, in.Now)
			return c.state, Disconnect
		}
		return c.state, 0
	}
	return c.pullAhead(in)
}

func (c *Congestion) pullAhead(in CongestionInput) (ReplState, CongestionActions) {
	switch c.state {
	case Connected, SyncSource:
		if c.state == SyncSource && !in.CatchUpRunning && in.CatchUpLeft == 0 {
			c.become(Connected, in.Now)
			return c.state, 0
		}
		if c.state == Connected && !in.CatchUpRunning && in.CatchUpLeft > 0 && in.Queued < c.high &&
			!c.lowFrom.IsZero() && in.Now.Sub(c.lowFrom) >= c.cfg.Hold {
			// Blocks marked without going Ahead (MarkOne): catch them up
			// once the link has had room for a while.
			c.become(SyncSource, in.Now)
			return c.state, StartCatchUp
		}
		if in.Queued < c.high {
			return c.state, 0
		}
		if c.congested < c.cfg.Sustain && !c.aheadWithin(in.Now, time.Minute) {
			// A burst so far: shipped, or held while the buffer is full.
			return c.state, c.waitIfFull(in)
		}
		if !c.dwelt(in.Now) || !c.aheadAllowed(in.Now) {
			if c.waitIfFull(in) != 0 {
				return c.state, MarkOne
			}
			return c.state, 0
		}
		acts := StartMarking
		if c.state == SyncSource {
			acts |= PauseCatchUp
		}
		c.aheads[c.next] = in.Now
		c.next = (c.next + 1) % len(c.aheads)
		c.congested = 0 // the next entry takes a congestion of its own
		c.become(Ahead, in.Now)
		return c.state, acts
	case Ahead:
		if c.lowFrom.IsZero() || in.Now.Sub(c.lowFrom) < c.cfg.Hold || !c.dwelt(in.Now) {
			return c.state, 0
		}
		if !in.CatchUpRunning && in.CatchUpLeft == 0 {
			c.become(Connected, in.Now)
			return c.state, ResumeStreaming
		}
		c.become(SyncSource, in.Now)
		return c.state, ResumeStreaming | StartCatchUp
	}
	panic(fmt.Sprintf("replication: congestion controller in state %s", c.state))
}

func (c *Congestion) waitIfFull(in CongestionInput) CongestionActions {
	if in.Queued >= c.cfg.SendBuffer {
		return WaitForRoom
	}
	return 0
}

// dwelt reports whether MinDwell has passed since the last state change.
func (c *Congestion) dwelt(now time.Time) bool {
	return !c.changed || now.Sub(c.since) >= c.cfg.MinDwell
}

// aheadWithin reports whether the last entry into Ahead happened in the
// span before now.
func (c *Congestion) aheadWithin(now time.Time, span time.Duration) bool {
	last := c.aheads[(c.next+len(c.aheads)-1)%len(c.aheads)]
	return !last.IsZero() && now.Sub(last) < span
}

// aheadAllowed reports whether fewer than MaxAheadPerMinute entries into
// Ahead happened in the minute before now.
func (c *Congestion) aheadAllowed(now time.Time) bool {
	oldest := c.aheads[c.next]
	return oldest.IsZero() || now.Sub(oldest) >= time.Minute
}

func (c *Congestion) become(s ReplState, now time.Time) {
	c.state, c.since, c.changed = s, now, true
}
