package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport"
)

// The monitor samples the cluster for the page: one goroutine (run) owns
// the IO samples and the event log, and publishes each sample as an
// immutable frame, rendered once for every open page.

const (
	// viewedInterval is how often the cluster is sampled while a page is
	// open; idleInterval while none is (the sparklines still fill).
	viewedInterval = time.Second
	idleInterval   = 5 * time.Second
	// idlePerVolumes: with no page open, a cluster of more volumes than
	// this is sampled as much less often as it has more (a sample reads
	// every volume of every node), down to maxIdleInterval, which still
	// leaves the sparklines ten points of their window.
	idlePerVolumes  = 100
	maxIdleInterval = ioWindow / 10
	// busyInterval, while a page is open and a resync or verify runs,
	// moves its bar smoothly.
	busyInterval = 500 * time.Millisecond
	// eventDelay: an event makes the monitor sample again this soon, so
	// the page shows its consequence without waiting for the next tick.
	eventDelay = 100 * time.Millisecond
	// sampleTimeout bounds one sample (a dead peer must not stall it).
	sampleTimeout = 3 * time.Second
	// eventHistory is how many past events the page asks each node for;
	// keptEvents how many of the cluster's it shows.
	eventHistory = 50
	keptEvents   = 40
	// ioSpacing is the least time between two IO samples (samples come
	// faster during a resync and after events); ioCapacity holds ioWindow
	// of them.
	ioSpacing  = viewedInterval * 3 / 4
	ioCapacity = int(ioWindow/ioSpacing) + 1
	// eventRetry is the pause before following the node's events again
	// after the stream failed.
	eventRetry = 2 * time.Second
)

// frame is one sample, ready to send: immutable once published.
type frame struct {
	At       time.Time
	Title    string
	Sections []section
	// VolumeIDs are the volume sections, in page order.
	VolumeIDs []string
	// IO and Events feed a fresh rendering of the whole page.
	IO     map[string]volumeIO
	Events []transport.Event
}

type monitor struct {
	src  Source
	peer func(ctx context.Context, n transport.NodeInfo) (*transport.NodeStatus, error)
	// client reads other nodes' /api/node when Source.Peer is nil.
	client *http.Client
	// life ends the sampler and every stream.
	life context.Context
	once sync.Once
	// viewers counts open streams; kick asks for a sample now.
	viewers atomic.Int32
	kick    chan struct{}

	mu      lockorder.Mutex
	cur     *frame
	changed chan struct{} // closed when cur is replaced

	// Owned by run.
	self     string // this node's name, once Node said it
	io       map[string]*ioRing
	counters map[string]ioCounters
	events   eventLog
}

func newMonitor(life context.Context, src Source) *monitor {
	m := &monitor{src: src, peer: src.Peer, life: life, kick: make(chan struct{}, 1), changed: make(chan struct{}),
		io: map[string]*ioRing{}, counters: map[string]ioCounters{}}
	if m.peer == nil {
		// Straight to the node (no proxy from the environment); its idle
		// connections close with the sampler.
		m.client = &http.Client{Timeout: sampleTimeout, Transport: &http.Transport{
			Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 2 * idleInterval}}
		m.peer = func(ctx context.Context, n transport.NodeInfo) (*transport.NodeStatus, error) {
			return fetchNode(ctx, m.client, n.Control)
		}
	}
	return m
}

// start starts the sampler once; it runs until life ends.
func (m *monitor) start() {
	m.once.Do(func() { go m.run(m.life) })
}

// current returns the latest frame (nil before the first) and a channel
// closed when a newer one is published.
func (m *monitor) current() (*frame, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur, m.changed
}

func (m *monitor) publish(f *frame) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur = f
	close(m.changed)
	m.changed = make(chan struct{})
}

// wake asks the sampler for a sample now.
func (m *monitor) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *monitor) run(ctx context.Context) {
	if m.client != nil {
		defer m.client.CloseIdleConnections()
	}
	events := make(chan transport.Event, 64)
	if m.src.Events != nil {
		go m.follow(ctx, events)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	due := time.Now()
	soon := func(d time.Duration) {
		if at := time.Now().Add(d); at.Before(due) {
			due = at
			timer.Reset(d)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-events:
			m.events.add(e)
			soon(eventDelay)
		case <-m.kick:
			soon(0)
		case <-timer.C:
			busy, volumes := m.sample(ctx)
			interval := idleEvery(volumes)
			switch {
			case m.viewers.Load() == 0:
			case busy:
				interval = busyInterval
			default:
				interval = viewedInterval
			}
			due = time.Now().Add(interval)
			timer.Reset(interval)
		}
	}
}

// follow streams this node's events (history first) into out, again
// after a failure, until ctx ends.
func (m *monitor) follow(ctx context.Context, out chan<- transport.Event) {
	for {
		err := m.src.Events(ctx, eventHistory, func(e *transport.Event) error {
			select {
			case out <- *e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if ctx.Err() != nil {
			return
		}
		_ = err // the page shows the events it has; retry
		select {
		case <-ctx.Done():
			return
		case <-time.After(eventRetry):
		}
	}
}

// idleEvery is the sampling interval with no page open, for a cluster of
// volumes volumes.
func idleEvery(volumes int) time.Duration {
	if volumes <= idlePerVolumes {
		return idleInterval
	}
	return min(maxIdleInterval, idleInterval*time.Duration(volumes)/idlePerVolumes)
}

// sample reads the status, this node's and the other nodes' own views
// (their IO counters and events), and publishes a frame. It says whether
// a resync or verify is under way, and how many volumes the cluster has.
func (m *monitor) sample(ctx context.Context) (busy bool, volumes int) {
	ctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	now := time.Now()
	viewed := m.viewers.Load() > 0 // after now: a page that opened since is counted
	st, err := m.src.Status(ctx)
	statusErr := ""
	if err != nil {
		statusErr = err.Error()
		st = nil
	}
	views := m.nodeViews(ctx, st)
	for name, ns := range views {
		if name == m.self && m.src.Events != nil {
			continue // this node's events come from Source.Events
		}
		for _, e := range ns.Events {
			if e.Node == "" {
				e.Node = ns.Node.Name
			}
			m.events.add(e)
		}
	}
	in := pageInput{Status: st, StatusError: statusErr, Now: now, Events: m.events.recent(), IO: map[string]volumeIO{}}
	if st != nil {
		for _, v := range st.Volumes {
			ring := m.record(now, v, views)
			in.IO[v.Name] = drawIO(ring.samples(), now)
		}
	}
	pv := buildPage(in)
	volumes = len(pv.Volumes)
	for _, v := range pv.Volumes {
		for _, r := range v.Replicas {
			busy = busy || r.Resync != nil || r.Verify != nil
		}
	}
	// Only an open page reads the sections: with none open, the sample
	// keeps the sparklines and events and renders nothing (a page that
	// opens wakes the sampler, and waits for a frame taken after it
	// opened, which sees it).
	var sections []section
	if viewed {
		var err error
		if sections, err = renderSections(pv); err != nil {
			// A template that cannot render is a bug, not a state of the cluster.
			panic(fmt.Sprintf("web: render the status page: %v", err))
		}
	}
	f := &frame{At: now, Title: pv.Title, Sections: sections, IO: in.IO, Events: in.Events}
	for _, v := range pv.Volumes {
		f.VolumeIDs = append(f.VolumeIDs, v.ID)
	}
	m.publish(f)
	return busy, volumes
}

// nodeViews is every reachable node's own view, by name: this node's from
// Source.Node, the others' from their control address.
func (m *monitor) nodeViews(ctx context.Context, st *transport.ClusterStatus) map[string]*transport.NodeStatus {
	views := map[string]*transport.NodeStatus{}
	if m.src.Node != nil {
		if ns, err := m.src.Node(ctx); err == nil && ns != nil {
			m.self = ns.Node.Name
			views[m.self] = ns
		}
	}
	if st == nil {
		return views
	}
	var mu lockorder.Mutex
	var wg sync.WaitGroup
	for _, n := range st.Nodes {
		if n.Name == m.self || n.Name == st.From || !n.Alive || n.Control == "" {
			continue
		}
		wg.Go(func() {
			ns, err := m.peer(ctx, n)
			if err != nil || ns == nil {
				return // the status already says what is wrong with it
			}
			mu.Lock()
			defer mu.Unlock()
			views[n.Name] = ns
		})
	}
	wg.Wait()
	return views
}

// fetchNode reads a node's /api/node.
func fetchNode(ctx context.Context, client *http.Client, control string) (*transport.NodeStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+control+"/api/node", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/api/node: %s", control, resp.Status)
	}
	var ns transport.NodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&ns); err != nil {
		return nil, fmt.Errorf("GET %s/api/node: %w", control, err)
	}
	return &ns, nil
}

// ioCounters are a primary's IO counters for one volume when last read.
type ioCounters struct {
	Node       string
	At         time.Time
	Ops, Bytes uint64
}

// record adds v's IO rates since the last sample to its ring, from the
// counters of the node that is primary now. A new primary (or a counter
// that went back: a restart) starts over without a sample.
func (m *monitor) record(now time.Time, v transport.VolumeStatus, views map[string]*transport.NodeStatus) *ioRing {
	ring := m.io[v.Name]
	if ring == nil {
		ring = &ioRing{}
		m.io[v.Name] = ring
	}
	var cur *ioCounters
	if ns := views[v.Primary]; ns != nil {
		for _, lv := range ns.Volumes {
			if lv.Name == v.Name && lv.Role == transport.RolePrimary {
				cur = &ioCounters{Node: v.Primary, At: now, Ops: lv.Reads + lv.Writes, Bytes: lv.ReadBytes + lv.WriteBytes}
			}
		}
	}
	if cur == nil {
		delete(m.counters, v.Name)
		return ring
	}
	last, ok := m.counters[v.Name]
	if ok && last.Node == cur.Node && cur.Ops >= last.Ops && cur.Bytes >= last.Bytes {
		dt := cur.At.Sub(last.At)
		if dt < ioSpacing {
			return ring // too soon: the next sample measures from last
		}
		ring.add(ioSample{At: now, IOPS: float64(cur.Ops-last.Ops) / dt.Seconds(), Rate: float64(cur.Bytes-last.Bytes) / dt.Seconds()})
	}
	m.counters[v.Name] = *cur
	return ring
}

// ioRing holds a volume's last ioCapacity samples, those of the last
// ioWindow: what its sparklines draw. Its buffer grows as samples come
// and shrinks as they age out, so that an idle cluster's volumes, sampled
// every maxIdleInterval with no page open, hold a dozen samples each, not
// the window's worth at the open page's pace.
type ioRing struct {
	buf   []ioSample
	start int
	n     int
}

// minRing is the least buffer a ring holds once it holds a sample.
const minRing = 16

func (r *ioRing) add(s ioSample) {
	// Samples out of the window of the newest draw nothing.
	for r.n > 0 && r.buf[r.start].At.Before(s.At.Add(-ioWindow)) {
		r.start = (r.start + 1) % len(r.buf)
		r.n--
	}
	switch {
	case r.n == len(r.buf) && r.n < ioCapacity:
		r.resize(min(ioCapacity, max(minRing, 2*r.n)))
	case len(r.buf) > minRing && r.n < len(r.buf)/4:
		r.resize(max(minRing, 2*r.n))
	}
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = s
		r.n++
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % len(r.buf)
}

// resize moves the samples to a buffer of size, oldest first.
func (r *ioRing) resize(size int) {
	buf := make([]ioSample, size)
	for i := range r.n {
		buf[i] = r.buf[(r.start+i)%len(r.buf)]
	}
	r.buf, r.start = buf, 0
}

// samples returns the samples, oldest first.
func (r *ioRing) samples() []ioSample {
	out := make([]ioSample, 0, r.n)
	for i := range r.n {
		out = append(out, r.buf[(r.start+i)%len(r.buf)])
	}
	return out
}

// eventLog keeps the cluster's latest events, each once.
type eventLog struct {
	seen   map[string]bool
	events []transport.Event // newest first, at most keptEvents
}

func (l *eventLog) add(e transport.Event) {
	key := eventKey(e)
	if l.seen[key] {
		return
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	if len(l.events) == keptEvents && e.Time.Before(l.events[len(l.events)-1].Time) {
		return // older than everything kept
	}
	l.seen[key] = true
	l.events = append(l.events, e)
	sortEvents(l.events)
	if len(l.events) > keptEvents {
		for _, old := range l.events[keptEvents:] {
			delete(l.seen, eventKey(old))
		}
		l.events = l.events[:keptEvents]
	}
}

// eventKey identifies an event whichever way it came: a node's /api/node
// leaves out the sequence number its event stream sends.
func eventKey(e transport.Event) string {
	return e.Node + "\x00" + strconv.FormatInt(e.Time.UnixNano(), 10) + "\x00" + e.Kind + "\x00" + e.Message
}

// recent is a copy of the kept events, newest first.
func (l *eventLog) recent() []transport.Event {
	return append([]transport.Event(nil), l.events...)
}
