package multipath

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// Defaults of Config.
const (
	DefaultRRMinIO          = 100
	DefaultCheckInterval    = 5 * time.Second
	DefaultIOTimeout        = 5 * time.Second
	DefaultNoPathQueue      = 30 * time.Second
	DefaultReinstateHoldoff = time.Minute
	// NoPathFail as Config.NoPathRetry fails IO at once when no path is left.
	NoPathFail = -1
	// MaxPaths is the most paths a Device takes.
	MaxPaths = 64
)

// Failback says when a path the checker finds working again carries IO
// again: FailbackImmediate, FailbackManual (after Restore), or a positive
// duration of continuous health.
type Failback time.Duration

const (
	FailbackImmediate Failback = 0
	FailbackManual    Failback = -1
)

// ParseFailback reads "immediate", "manual", or a delay ("30s", or "30"
// seconds as in multipath.conf).
func ParseFailback(s string) (Failback, error) {
	switch s {
	case "immediate", "":
		return FailbackImmediate, nil
	case "manual":
		return FailbackManual, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return Failback(time.Duration(n) * time.Second), nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return Failback(d), nil
	}
	return 0, fmt.Errorf("failback %q: want immediate, manual, or a positive delay such as 30s", s)
}

func (f Failback) String() string {
	switch {
	case f == FailbackImmediate:
		return "immediate"
	case f < 0:
		return "manual"
	}
	return time.Duration(f).String()
}

// Config tunes a Device. The zero value takes every default.
type Config struct {
	// Policy chooses the path of each IO (default Failover). SetPolicy
	// changes it online.
	Policy Policy
	// RRMinIO is how many IOs RoundRobin sends down a path before it
	// switches (default 100).
	RRMinIO int
	// Groups[i], when given, is the group (controller or HBA) of path i.
	Groups []string
	// Preferred is the index of the preferred path: the path Failover uses,
	// writes take under ActiveRead, and whose group the other policies
	// stay in (see BalanceByGroup). Failback returns to it.
	Preferred int
	// Failback says when a recovered path carries IO again (default
	// FailbackImmediate).
	Failback Failback
	// CheckInterval is how often the checker reads the label of each path
	// that is not Healthy (default 5 s).
	CheckInterval time.Duration
	// IOTimeout bounds one IO on one path (default 5 s): a path that does
	// not answer in time is failed and the IO retried on another.
	IOTimeout time.Duration
	// NoPathRetry is how many check intervals IO queues when no path is
	// left, before it fails with ErrNoPath. 0 queues for 30 s; NoPathFail
	// fails at once.
	NoPathRetry int
	// ReinstateHoldoff is the least time between two reinstatements of a
	// path by the checker (flap damping; default 1 minute). It does not
	// hold back a path when no other path works.
	ReinstateHoldoff time.Duration
	// UUID is the LUN every path must carry; zero takes the labels' UUID.
	UUID UUID
	// Label writes a label (UUID, or a new one) through the first path
	// when no path carries one. Without it such a device is refused.
	Label bool
	// OnChange, when set, is called with each path's state at Open and at
	// every change of it. It is called with the device's lock held: it
	// must return quickly and must not call the Device.
	OnChange func(Event)

	// Clock keeps the time of the path rules: the checker's interval,
	// failback, flap damping, the no-path queue, the statistics and each
	// request's IO timeout. Nil is clock.Real(); a test sets a clock.Fake
	// (or runs in a testing/synctest bubble, which fakes the real one).
	Clock clock.Clock
}

// Event is a change of one path's state.
type Event struct {
	Path   string
	State  PathState
	Reason string
	Time   time.Time
}

func (c Config) withDefaults() Config {
	c.Clock = clock.Or(c.Clock)
	if c.RRMinIO == 0 {
		c.RRMinIO = DefaultRRMinIO
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = DefaultIOTimeout
	}
	if c.NoPathRetry == 0 && c.CheckInterval > 0 {
		c.NoPathRetry = int((DefaultNoPathQueue + c.CheckInterval - 1) / c.CheckInterval)
	}
	if c.ReinstateHoldoff == 0 {
		c.ReinstateHoldoff = DefaultReinstateHoldoff
	}
	return c
}

func (c Config) validate(paths int) error {
	var errs []string
	if paths < 1 || paths > MaxPaths {
		errs = append(errs, fmt.Sprintf("a multipath device needs 1 to %d paths, got %d", MaxPaths, paths))
	}
	if int(c.Policy) >= len(policyNames) {
		errs = append(errs, fmt.Sprintf("unknown policy %d", c.Policy))
	}
	if c.RRMinIO < 1 {
		errs = append(errs, fmt.Sprintf("rr_min_io %d: want at least 1", c.RRMinIO))
	}
	if c.Groups != nil && len(c.Groups) != paths {
		errs = append(errs, fmt.Sprintf("%d groups for %d paths: give one group per path, or none", len(c.Groups), paths))
	}
	if c.Preferred < 0 || c.Preferred >= max(paths, 1) {
		errs = append(errs, fmt.Sprintf("preferred path %d: want 0 to %d", c.Preferred, paths-1))
	}
	if c.CheckInterval <= 0 {
		errs = append(errs, fmt.Sprintf("check-interval %s: want a positive duration", c.CheckInterval))
	}
	if c.IOTimeout <= 0 {
		errs = append(errs, fmt.Sprintf("IO timeout %s: want a positive duration", c.IOTimeout))
	}
	if c.NoPathRetry < NoPathFail {
		errs = append(errs, fmt.Sprintf("no-path-retry %d: want a count of check intervals, or NoPathFail", c.NoPathRetry))
	}
	if c.ReinstateHoldoff < 0 {
		errs = append(errs, fmt.Sprintf("reinstate holdoff %s: want 0 or more", c.ReinstateHoldoff))
	}
	if len(errs) > 0 {
		return errors.New("multipath config: " + strings.Join(errs, "; "))
	}
	return nil
}
