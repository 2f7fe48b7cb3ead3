package multipath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/replvol/replvol/internal/lockorder"
)

var (
	// ErrNoPath: no path to the LUN works, and IO stopped queueing for one
	// (Config.NoPathRetry).
	ErrNoPath = errors.New("multipath: no working path to the LUN")
	// ErrClosed: the Device is closed.
	ErrClosed = errors.New("multipath: device closed")
	// ErrUnknownPath: an operator call named no path of the Device.
	ErrUnknownPath = errors.New("multipath: no such path")
	// ErrOutOfRange: a write or zero reaches past the LUN's usable size
	// (into the label, or beyond).
	ErrOutOfRange = errors.New("multipath: IO past the end of the LUN")
)

// targetErrors are what the LUN itself answers, the same on every path:
// they reach the caller and fail no path (dm-multipath's noretry_error).
// Every other error is the path's.
var targetErrors = []error{
	unix.ENOSPC, unix.EDQUOT, unix.EILSEQ, unix.ENODATA, unix.EREMOTEIO,
	unix.EROFS, unix.EINVAL, unix.EFBIG, unix.EOPNOTSUPP, os.ErrClosed,
}

func isPathError(err error) bool {
	for _, t := range targetErrors {
		if errors.Is(err, t) {
			return false
		}
	}
	return true
}

// Throughput estimate: bytes completed over the time the path was busy,
// sampled every throughputWindow of busy time into an EWMA.
const (
	throughputWindow = 20 * time.Millisecond
	throughputWeight = 0.3
)

// Device is one LUN seen through N paths. It implements the node's Disk
// (io.ReaderAt, io.WriterAt, Sync, Zero, Close) and WriteAtSync. All
// methods are safe for concurrent use.
type Device struct {
	cfg      Config
	size     int64 // usable bytes
	labelOff int64
	uuid     UUID
	paths    []*pathState
	reqs     sync.Pool // *request; per Device, as requests hold timers and channels
	quit     chan struct{}
	checked  chan struct{} // closed when the checker has stopped

	mu          lockorder.Mutex
	views       []PathView // what the selector sees, index-aligned with paths
	choice      Choice     // the selector's state; Preferred is the preferred path
	home        int        // the path failback returns to
	noPathSince time.Time  // when the last usable path went; zero while one works
	queueing    bool       // IO waits for a path; false once no-path-retry expired
	changed     chan struct{}
	closed      bool
}

type pathState struct {
	d     *Device
	path  Path
	name  string
	group string
	index int
	queue chan *request // idle workers receive here

	ios, bytes, errs atomic.Uint64
	hist             histogram

	// Guarded by d.mu.
	gen            uint64 // +1 at each reinstatement: older IOs' errors are stale
	operatorFailed bool
	reason         string
	state          PathState // last published
	changedAt      time.Time
	reinstatedAt   time.Time
	healthySince   time.Time
	probing        bool
	busyStart      time.Time
	busyAccum      time.Duration
	winBytes       int64
}

// PathStats is one path as `replctl path list` shows it.
type PathStats struct {
	Name      string
	Group     string
	State     PathState
	Health    Health
	Preferred bool   // the failover and write path
	Reason    string // why it is in its state
	IOs       uint64 // completed operations, failed ones included
	Bytes     uint64 // bytes read and written
	Errors    uint64
	InFlight  int
	// Throughput is the observed bytes per second while busy (EWMA).
	Throughput  float64
	LatencyP50  time.Duration // upper bounds, over the device's life
	LatencyP99  time.Duration
	SinceChange time.Duration // since the last change of State
}

// Open assembles a Device from paths to one LUN. It reads every path's
// label: a path that carries another LUN's label, or none while others
// carry one, is refused with ErrLabelMismatch naming both; a path that
// does not answer starts FAIL. The Device owns the paths from then on:
// Close closes them. If Open fails, it closes none.
func Open(paths []Path, cfg Config) (*Device, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(len(paths)); err != nil {
		return nil, err
	}
	d := &Device{
		cfg:      cfg,
		quit:     make(chan struct{}),
		checked:  make(chan struct{}),
		queueing: true,
		changed:  make(chan struct{}),
		views:    make([]PathView, len(paths)),
		choice:   Choice{Policy: cfg.Policy, Preferred: cfg.Preferred, Last: cfg.Preferred, RRMinIO: cfg.RRMinIO},
		home:     cfg.Preferred,
	}
	d.reqs.New = func() any { return newRequest(d.cfg.Clock) }
	groups := map[string]int{}
	names := map[string]bool{}
	for i, p := range paths {
		name := p.Name()
		if names[name] {
			return nil, fmt.Errorf("multipath: two paths are named %q", name)
		}
		names[name] = true
		var g string
		if cfg.Groups != nil {
			g = cfg.Groups[i]
		}
		gi, ok := groups[g]
		if !ok {
			gi = len(groups)
			groups[g] = gi
		}
		d.paths = append(d.paths, &pathState{d: d, path: p, name: name, group: g, index: i,
			queue: make(chan *request), state: PathState(255)})
		d.views[i] = PathView{Health: Healthy, Group: gi}
	}
	if err := d.identify(); err != nil {
		close(d.quit)
		return nil, err
	}
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	for _, ps := range d.paths {
		ps.changedAt = now
	}
	d.settle(now)
	d.mu.Unlock()
	go d.checker()
	return d, nil
}

// identify checks that every path reaches one LUN of one size, labelling
// it when asked, and fails the paths that do not answer.
func (d *Device) identify() error {
	size, sizeFrom := int64(-1), ""
	for _, ps := range d.paths {
		s, err := ps.path.Size()
		switch {
		case err != nil:
			d.views[ps.index].Health = Failed
			ps.reason = "size: " + err.Error()
		case size < 0:
			size, sizeFrom = s, ps.name
		case s != size:
			return fmt.Errorf("%w: path %s holds %d bytes but path %s holds %d: they cannot be one LUN",
				ErrLabelMismatch, ps.name, s, sizeFrom, size)
		}
	}
	if size < 0 {
		return fmt.Errorf("%w: no path answers (%s)", ErrNoPath, d.reasons())
	}
	off, err := LabelOffset(size)
	if err != nil {
		return err
	}
	d.size, d.labelOff = off, off

	uuids, errs := d.readLabels()
	want, wantFrom := d.cfg.UUID, "the configuration"
	if want.IsZero() {
		for i, u := range uuids {
			if errs[i] == nil {
				want, wantFrom = u, "path "+d.paths[i].name
				break
			}
		}
	}
	if want.IsZero() || (!d.cfg.UUID.IsZero() && !anyLabel(errs)) {
		// No path carries a label.
		first := -1
		for i, err := range errs {
			if errors.Is(err, ErrCorruptLabel) {
				return fmt.Errorf("path %s: %w", d.paths[i].name, err)
			}
			if first < 0 && errors.Is(err, ErrNoLabel) {
				first = i
			}
		}
		if first < 0 {
			return fmt.Errorf("%w: no path could read the label (%s)", ErrNoPath, d.reasons())
		}
		if !d.cfg.Label {
			return fmt.Errorf("%w on any of paths %s: label the LUN first (multipath.WriteLabel) or open it with Config.Label",
				ErrNoLabel, d.names())
		}
		if want.IsZero() {
			want = NewUUID()
		}
		if err := WriteLabel(d.paths[first].path, want); err != nil {
			return err
		}
		wantFrom = "path " + d.paths[first].name
		uuids, errs = d.readLabels()
	}
	var refusals []error
	for i, ps := range d.paths {
		err := errs[i]
		switch {
		case d.views[i].Health == Failed:
		case err == nil && uuids[i] == want:
		case err == nil:
			refusals = append(refusals, fmt.Errorf("%w: path %s carries LUN %s but %s carries LUN %s",
				ErrLabelMismatch, ps.name, uuids[i], wantFrom, want))
		case errors.Is(err, ErrNoLabel):
			refusals = append(refusals, fmt.Errorf("%w: path %s carries no label (%w) but %s carries LUN %s: it is another LUN, or was never labelled",
				ErrLabelMismatch, ps.name, ErrNoLabel, wantFrom, want))
		case errors.Is(err, ErrCorruptLabel):
			refusals = append(refusals, fmt.Errorf("path %s: %w", ps.name, err))
		default:
			d.views[i].Health = Failed
			ps.reason = "label read: " + err.Error()
		}
	}
	if len(refusals) > 0 {
		return errors.Join(refusals...)
	}
	if !d.anyUsable() {
		return fmt.Errorf("%w: no path could read the label (%s)", ErrNoPath, d.reasons())
	}
	d.uuid = want
	return nil
}

func anyLabel(errs []error) bool {
	for _, err := range errs {
		if err == nil {
			return true
		}
	}
	return false
}

// readLabels probes every path that has not failed, in parallel.
func (d *Device) readLabels() ([]UUID, []error) {
	uuids := make([]UUID, len(d.paths))
	errs := make([]error, len(d.paths))
	var wg sync.WaitGroup
	for i, ps := range d.paths {
		if d.views[i].Health == Failed {
			errs[i] = errors.New(ps.reason)
			continue
		}
		wg.Go(func() { uuids[i], errs[i] = d.probe(ps) })
	}
	wg.Wait()
	return uuids, errs
}

func (d *Device) names() string {
	var b strings.Builder
	for i, ps := range d.paths {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ps.name)
	}
	return b.String()
}

// reasons says why each path is not Healthy.
func (d *Device) reasons() string {
	var b strings.Builder
	for i, ps := range d.paths {
		if d.views[i].Health == Healthy {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", ps.name, ps.reason)
	}
	return b.String()
}

// Size is the LUN's usable size: the device's size less the label.
func (d *Device) Size() int64 { return d.size }

// UUID is the LUN's label.
func (d *Device) UUID() UUID { return d.uuid }

// ReadAt reads from the LUN through a working path.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: read at offset %d", ErrOutOfRange, off)
	}
	if off >= d.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := min(int64(len(p)), d.size-off)
	if n > 0 {
		if err := d.do(opRead, p[:n], off, n); err != nil {
			return 0, err
		}
	}
	if int(n) < len(p) {
		return int(n), io.EOF
	}
	return int(n), nil
}

func (d *Device) checkRange(what string, off, length int64) error {
	if off < 0 || length < 0 || off+length > d.size {
		return fmt.Errorf("%w: %s [%d, %d) but the LUN holds %d bytes (its label follows them)",
			ErrOutOfRange, what, off, off+length, d.size)
	}
	return nil
}

// WriteAt writes to the LUN through a working path. It writes all of p
// or returns an error.
func (d *Device) WriteAt(p []byte, off int64) (int, error) {
	if err := d.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := d.do(opWrite, p, off, int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAtSync writes p at off and makes it durable BEFORE it returns
// (RWF_DSYNC on a path that has it, else write then sync on that path).
func (d *Device) WriteAtSync(p []byte, off int64) error {
	if err := d.checkRange("write", off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return d.Sync()
	}
	return d.do(opWriteSync, p, off, int64(len(p)))
}

// Zero makes [off, off+length) read as zeroes.
func (d *Device) Zero(off, length int64) error {
	if err := d.checkRange("zero", off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	return d.do(opZero, nil, off, length)
}

// Sync makes every completed write durable. One working path suffices:
// no Path keeps a private write-back cache (a file's page cache is shared
// by all its handles; a block device path is O_DIRECT, as each device
// node has its own page cache), so fdatasync through any working path
// flushes every write completed through any path. A write abandoned on a
// hung path (IOTimeout) may still land later, with the same bytes: as
// under dm-multipath, only the transport could cancel it.
func (d *Device) Sync() error { return d.do(opSync, nil, 0, 0) }

// do runs one IO: it picks a path, and retries on another path after a
// path error or timeout until the IO succeeds, fails with a target error,
// or no path is left (ErrNoPath).
func (d *Device) do(o op, p []byte, off, length int64) error {
	dir := Write
	if o == opRead {
		dir = Read
	}
	for {
		ps, gen, wait, err := d.pick(dir, length)
		if err != nil {
			return err
		}
		if ps == nil {
			<-wait // no path: queue until one returns, queueing ends, or Close
			continue
		}
		r := d.getRequest(o, ps, off, length)
		if p != nil {
			r.bufPtr = getBuffer(len(p))
			r.buf = *r.bufPtr
			if o != opRead {
				copy(r.buf, p)
			}
		}
		if !d.attempt(r) {
			// The path did not answer in time. The worker owns r and its
			// buffer now; a late write lands with the same bytes.
			d.fail(ps, gen, o, fmt.Errorf("timed out after %s", d.cfg.IOTimeout))
			continue
		}
		err = r.err
		if err == nil && o == opRead {
			copy(p, r.buf)
		}
		d.putRequest(r)
		if err == nil {
			return nil
		}
		if !isPathError(err) {
			return fmt.Errorf("multipath %s through path %s: %w", o, ps.name, err)
		}
		d.fail(ps, gen, o, err)
	}
}

// pick chooses the path for one IO and counts it in flight there. With
// no path it returns a channel closed at the next change, or ErrNoPath
// once queueing has ended.
func (d *Device) pick(dir Direction, size int64) (*pathState, uint64, <-chan struct{}, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, 0, nil, ErrClosed
	}
	c := &d.choice
	c.Direction, c.Size = dir, size
	i := Choose(d.views, c)
	if i < 0 {
		if !d.queueing {
			return nil, 0, nil, fmt.Errorf("%w (LUN %s: %s)", ErrNoPath, d.uuid, d.reasons())
		}
		return nil, 0, d.changed, nil
	}
	if i == c.Last {
		c.IOsOnLast++
	} else {
		c.Last, c.IOsOnLast = i, 1
	}
	ps, v := d.paths[i], &d.views[i]
	if v.InFlight == 0 {
		ps.busyStart = d.cfg.Clock.Now()
	}
	v.InFlight++
	v.InFlightBytes += size
	return ps, ps.gen, nil, nil
}

// finish accounts one completed IO of ps (also one abandoned earlier).
func (d *Device) finish(ps *pathState, o op, length int64, err error, start, end time.Time) {
	ps.hist.record(end.Sub(start))
	ps.ios.Add(1)
	moved := err == nil && (o == opRead || o == opWrite || o == opWriteSync)
	if err != nil {
		ps.errs.Add(1)
	} else if moved {
		ps.bytes.Add(uint64(length))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v := &d.views[ps.index]
	v.InFlight--
	v.InFlightBytes -= length
	if moved {
		ps.winBytes += length
	}
	if v.InFlight == 0 {
		ps.busyAccum += end.Sub(ps.busyStart)
	}
	busy := ps.busyAccum
	if v.InFlight > 0 {
		busy += end.Sub(ps.busyStart)
	}
	if busy >= throughputWindow && ps.winBytes > 0 {
		rate := float64(ps.winBytes) / busy.Seconds()
		if v.Throughput == 0 {
			v.Throughput = rate
		} else {
			v.Throughput += throughputWeight * (rate - v.Throughput)
		}
		ps.winBytes, ps.busyAccum = 0, 0
		if v.InFlight > 0 {
			ps.busyStart = end
		}
	}
}

// fail marks ps FAIL after an error of an IO issued in generation gen.
func (d *Device) fail(ps *pathState, gen uint64, o op, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != ps.gen || d.views[ps.index].Health == Failed {
		return // already failed, or reinstated since the IO was issued
	}
	now := d.cfg.Clock.Now()
	d.setHealth(ps, Failed, fmt.Sprintf("%s error: %v", o, err), now)
	d.settle(now)
}

func (d *Device) anyUsable() bool {
	for i := range d.views {
		if d.views[i].Health != Failed {
			return true
		}
	}
	return false
}

// setHealth changes one path's health; the caller then calls settle.
func (d *Device) setHealth(ps *pathState, h Health, reason string, now time.Time) {
	v := &d.views[ps.index]
	old := v.Health
	v.Health, ps.reason = h, reason
	if old == Failed && h != Failed {
		ps.gen++
		ps.reinstatedAt = now
	}
	if h == Standby {
		ps.healthySince = now
	}
	if h == Healthy && old != Healthy && ps.index == d.home {
		d.choice.Preferred = d.home // failback
	}
}

// settle restores the invariants after a change: the preferred path
// works if any path does; the no-path clock runs exactly while no path
// works; each path's published state is current (OnChange); waiters wake.
func (d *Device) settle(now time.Time) {
	c := &d.choice
	if d.views[c.Preferred].Health != Healthy {
		if i := NextPreferred(d.views, c.Preferred); i >= 0 {
			c.Preferred = i
		}
	}
	switch {
	case d.anyUsable():
		d.noPathSince, d.queueing = time.Time{}, true
	case d.noPathSince.IsZero():
		d.noPathSince = now
		d.queueing = d.cfg.NoPathRetry != NoPathFail
	}
	for i, ps := range d.paths {
		s := StateOf(d.views, c.Policy, c.Preferred, i)
		if s == ps.state {
			continue
		}
		ps.state, ps.changedAt = s, now
		if d.cfg.OnChange != nil {
			d.cfg.OnChange(Event{Path: ps.name, State: s, Reason: ps.reason, Time: now})
		}
	}
	d.broadcast()
}

func (d *Device) broadcast() {
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *Device) lookup(name string) (*pathState, error) {
	for _, ps := range d.paths {
		if ps.name == name {
			return ps, nil
		}
	}
	return nil, fmt.Errorf("%w %q (paths: %s)", ErrUnknownPath, name, d.names())
}

// Fail marks a path FAIL until Restore (gmultipath fail). The checker
// does not reinstate it.
func (d *Device) Fail(name string) error {
	return d.setByOperator(name, Failed, "failed by the operator")
}

// Restore makes a path carry IO again at once (gmultipath restore; the
// manual failback). A path that still does not work fails again at its
// next IO, which is retried elsewhere.
func (d *Device) Restore(name string) error {
	return d.setByOperator(name, Healthy, "restored by the operator")
}

// setByOperator is Fail (h Failed) and Restore (h Healthy): the path
// stays failed by the operator exactly while h is Failed. A path failed
// already by its IO or probes takes the operator's reason.
func (d *Device) setByOperator(name string, h Health, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ps, err := d.lookup(name)
	if err != nil {
		return err
	}
	now := d.cfg.Clock.Now()
	ps.operatorFailed = h == Failed
	if d.views[ps.index].Health != h {
		d.setHealth(ps, h, reason, now)
	} else if h == Failed {
		ps.reason = reason
	}
	d.settle(now)
	return nil
}

// Rotate makes the next working path the preferred one (gmultipath
// rotate), and the one failback returns to.
func (d *Device) Rotate() {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := Rotate(d.views, d.choice.Preferred)
	d.choice.Preferred, d.home = i, i
	d.settle(d.cfg.Clock.Now())
}

// SetPolicy changes the policy online; the next IO follows it.
func (d *Device) SetPolicy(p Policy) error {
	if int(p) >= len(policyNames) {
		return fmt.Errorf("multipath: unknown policy %d", p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.choice.Policy = p
	d.settle(d.cfg.Clock.Now())
	return nil
}

// Policy is the current policy.
func (d *Device) Policy() Policy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.choice.Policy
}

// Paths returns every path's state and figures, in path order.
func (d *Device) Paths() []PathStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.cfg.Clock.Now()
	out := make([]PathStats, len(d.paths))
	for i, ps := range d.paths {
		v := &d.views[i]
		out[i] = PathStats{
			Name: ps.name, Group: ps.group, State: ps.state, Health: v.Health,
			Preferred: i == d.choice.Preferred, Reason: ps.reason,
			IOs: ps.ios.Load(), Bytes: ps.bytes.Load(), Errors: ps.errs.Load(),
			InFlight: v.InFlight, Throughput: v.Throughput,
			LatencyP50: ps.hist.quantile(0.5), LatencyP99: ps.hist.quantile(0.99),
			SinceChange: now.Sub(ps.changedAt),
		}
	}
	return out
}

// Close stops the checker, fails queued IO with ErrClosed and closes
// every path. IO still running on a hung path is abandoned.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.broadcast()
	d.mu.Unlock()
	close(d.quit)
	<-d.checked
	var errs []error
	for _, ps := range d.paths {
		if err := ps.path.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close path %s: %w", ps.name, err))
		}
	}
	return errors.Join(errs...)
}
