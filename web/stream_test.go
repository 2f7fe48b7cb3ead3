package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// The live page: a stream that sends every section first and then only
// what changed, that follows the node's events, and that ends when the
// node stops (its context, or its http.Server's Shutdown), so an open page
// never holds a node up.

// fakeSource is a node whose status a test changes.
type fakeSource struct {
	mu     sync.Mutex
	st     *transport.ClusterStatus
	self   *transport.NodeStatus
	peers  map[string]*transport.NodeStatus
	events []transport.Event
	subs   []chan transport.Event
}

// emit records e and sends it to every subscriber of Events.
func (f *fakeSource) emit(e transport.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
	for _, ch := range f.subs {
		select {
		case ch <- e:
		default: // a subscriber that is gone
		}
	}
}

func newFakeSource(st *transport.ClusterStatus) *fakeSource {
	return &fakeSource{st: st, peers: map[string]*transport.NodeStatus{},
		self: &transport.NodeStatus{Node: transport.NodeInfo{Name: st.From}}}
}

// set changes the status under the lock.
func (f *fakeSource) set(change func(st *transport.ClusterStatus)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.st)
}

// source is the fake as a Source, without a Context.
func (f *fakeSource) source() Source {
	return Source{
		Status: func(context.Context) (*transport.ClusterStatus, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			b, _ := json.Marshal(f.st)
			var st transport.ClusterStatus
			return &st, json.Unmarshal(b, &st)
		},
		Node: func(context.Context) (*transport.NodeStatus, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			ns := *f.self
			return &ns, nil
		},
		Peer: func(_ context.Context, n transport.NodeInfo) (*transport.NodeStatus, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if ns, ok := f.peers[n.Name]; ok {
				c := *ns
				return &c, nil
			}
			return nil, io.EOF
		},
		Events: func(ctx context.Context, history int, fn func(*transport.Event) error) error {
			live := make(chan transport.Event, 16)
			f.mu.Lock()
			past := append([]transport.Event(nil), f.events[max(0, len(f.events)-history):]...)
			f.subs = append(f.subs, live)
			f.mu.Unlock()
			for i := range past {
				if err := fn(&past[i]); err != nil {
					return err
				}
			}
			for {
				select {
				case <-ctx.Done():
					return nil
				case e := <-live:
					if err := fn(&e); err != nil {
						return err
					}
				}
			}
		},
		History: func(_ context.Context, n int) ([]transport.Event, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return append([]transport.Event(nil), f.events[max(0, len(f.events)-n):]...), nil
		},
	}
}

// sourceUntil is the fake as a Source that lives until ctx ends.
func (f *fakeSource) sourceUntil(ctx context.Context) Source {
	src := f.source()
	src.Context = ctx
	return src
}

// sseReader reads one Server-Sent Events stream.
type sseReader struct {
	t    *testing.T
	body io.ReadCloser
	sc   *bufio.Scanner
}

type sseEvent struct{ id, name, data string }

func openSSE(t *testing.T, url string, header http.Header) *sseReader {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream") // as EventSource asks
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("GET %s: %s, Content-Type %q", url, resp.Status, ct)
	}
	t.Cleanup(func() { resp.Body.Close() })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return &sseReader{t: t, body: resp.Body, sc: sc}
}

// next returns the next event (comments and retry lines skipped), or ok
// false at the end of the stream.
func (r *sseReader) next() (e sseEvent, ok bool) {
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if e.data != "" {
				return e, true
			}
		case strings.HasPrefix(line, "id: "):
			e.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			e.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			e.data += line[6:]
		}
	}
	return e, false
}

// patchUntil reads patches until cond holds of one, within timeout.
func (r *sseReader) patchUntil(timeout time.Duration, cond func(patchMessage) bool) patchMessage {
	r.t.Helper()
	type result struct {
		m  patchMessage
		ok bool
	}
	found := make(chan result, 1)
	go func() {
		for {
			e, ok := r.next()
			if !ok {
				found <- result{}
				return
			}
			var m patchMessage
			if err := json.Unmarshal([]byte(e.data), &m); err != nil || e.name != "patch" {
				continue
			}
			if cond(m) {
				found <- result{m, true}
				return
			}
		}
	}()
	select {
	case res := <-found:
		if !res.ok {
			r.t.Fatalf("stream ended before the patch came")
		}
		return res.m
	case <-time.After(timeout):
		r.body.Close()
		r.t.Fatalf("no such patch within %s", timeout)
	}
	return patchMessage{}
}

func patchOf(m patchMessage, id string) (string, bool) {
	for _, p := range m.Patches {
		if p.ID == id {
			return p.HTML, true
		}
	}
	return "", false
}

func TestStreamSendsEverythingThenWhatChanged(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := newFakeSource(healthyCluster())
	fake.events = []transport.Event{{Seq: 1, Time: time.Now().Add(-time.Hour), Node: "alpha", Kind: "started", Message: "node alpha started"}}
	srv := httptest.NewServer(NewMux(fake.sourceUntil(ctx)))
	defer srv.Close()
	defer cancel() // the streams end before the server closes

	stream := openSSE(t, srv.URL+"/api/stream", nil)
	first := stream.patchUntil(5*time.Second, func(patchMessage) bool { return true })
	for _, id := range []string{"asof", "warnings", "cluster", "topology", "events", "volumes"} {
		if _, ok := patchOf(first, id); !ok {
			t.Errorf("first patch lacks %q", id)
		}
	}
	if _, ok := patchOf(first, "vol-vol0"); ok {
		t.Errorf("first patch sends vol-vol0 beside the whole volume container")
	}
	// The history arrives beside the first sample, in that patch or the
	// next one.
	if events, _ := patchOf(first, "events"); !strings.Contains(events, "node alpha started") {
		stream.patchUntil(5*time.Second, func(m patchMessage) bool {
			events, _ := patchOf(m, "events")
			return strings.Contains(events, "node alpha started")
		})
	}

	// beta disconnects: the node's event makes the page sample at once.
	fake.set(func(st *transport.ClusterStatus) {
		st.Volumes[0].Replica("beta").Replication = "StandAlone"
	})
	fake.emit(transport.Event{Seq: 2, Time: time.Now(), Node: "alpha", Volume: "vol0", Kind: "disconnected", Message: "beta gone"})
	m := stream.patchUntil(5*time.Second, func(m patchMessage) bool {
		w, ok := patchOf(m, "warnings")
		return ok && strings.Contains(w, "warning-standalone-vol0-beta")
	})
	if vol, ok := patchOf(m, "vol-vol0"); !ok || !strings.Contains(vol, "StandAlone") {
		t.Errorf("the patch lacks the changed volume section")
	}
	if _, ok := patchOf(m, "cluster"); ok {
		t.Errorf("the patch resends the unchanged cluster section")
	}
	if !strings.Contains(m.Title, "1 warning") {
		t.Errorf("title %q", m.Title)
	}

	// A new volume replaces the container.
	fake.set(func(st *transport.ClusterStatus) { st.Volumes = append(st.Volumes, healthyVolume("vol1")) })
	stream.patchUntil(5*time.Second, func(m patchMessage) bool {
		v, ok := patchOf(m, "volumes")
		return ok && strings.Contains(v, `id="vol-vol1"`) && strings.Contains(v, `id="vol-vol0"`)
	})

	// The node stops: the stream ends.
	cancel()
	done := make(chan struct{})
	go func() {
		for {
			if _, ok := stream.next(); !ok {
				close(done)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream outlived the node's context")
	}
}

func TestStreamEndsWhenTheServerShutsDown(t *testing.T) {
	fake := newFakeSource(healthyCluster())
	src := fake.source() // no Context: the server's Shutdown ends it
	srv := httptest.NewServer(NewMux(src))
	defer srv.Close()
	stream := openSSE(t, srv.URL+"/api/stream", nil)
	stream.patchUntil(5*time.Second, func(patchMessage) bool { return true })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a page open: %v", err)
	}
}

func TestPatcherSendsOnlyChanges(t *testing.T) {
	frameOf := func(st *transport.ClusterStatus) *frame {
		pv := buildPage(pageInput{Status: st, Now: testNow})
		secs, err := renderSections(pv)
		if err != nil {
			t.Fatal(err)
		}
		f := &frame{Sections: secs}
		for _, v := range pv.Volumes {
			f.VolumeIDs = append(f.VolumeIDs, v.ID)
		}
		return f
	}
	st := healthyCluster()
	st.Volumes = append(st.Volumes, healthyVolume("vol1"))
	p := newPatcher()
	ids := func(ps []patch) []string {
		var out []string
		for _, x := range ps {
			out = append(out, x.ID)
		}
		return out
	}
	if got := ids(p.patches(frameOf(st))); strings.Join(got, " ") != "asof warnings cluster topology events volumes" {
		t.Errorf("first frame: %v", got)
	}
	if got := ids(p.patches(frameOf(st))); len(got) != 0 {
		t.Errorf("same frame again: %v", got)
	}
	st.Volumes[1].Replica("beta").Disk = "Outdated"
	if got := ids(p.patches(frameOf(st))); strings.Join(got, " ") != "warnings topology vol-vol1" {
		t.Errorf("vol1's beta Outdated: %v", got)
	}
	st.Volumes = st.Volumes[:1]
	if got := ids(p.patches(frameOf(st))); strings.Join(got, " ") != "warnings topology volumes" {
		t.Errorf("vol1 gone: %v", got)
	}
}

// TestPatcherMovesProblemVolumesFirst: a volume that gets a warning moves
// to the top by an order message (its section alone is sent, not the
// whole container); the order is sent once.
func TestPatcherMovesProblemVolumesFirst(t *testing.T) {
	frameOf := func(st *transport.ClusterStatus) *frame {
		pv := buildPage(pageInput{Status: st, Now: testNow})
		secs, err := renderSections(pv)
		if err != nil {
			t.Fatal(err)
		}
		f := &frame{Sections: secs}
		for _, v := range pv.Volumes {
			f.VolumeIDs = append(f.VolumeIDs, v.ID)
		}
		return f
	}
	st := healthyCluster()
	st.Volumes = append(st.Volumes, healthyVolume("vol1"))
	p := newPatcher()
	f := frameOf(st)
	p.patches(f)
	if order := p.reorder(f); order != nil {
		t.Errorf("first frame: the container came in its order, but reorder says %v", order)
	}
	st.Volumes[1].Replica("beta").Replication = "StandAlone"
	f = frameOf(st)
	var ids []string
	for _, x := range p.patches(f) {
		ids = append(ids, x.ID)
	}
	if slices.Contains(ids, volumesID) || !slices.Contains(ids, "vol-vol1") {
		t.Errorf("vol1 StandAlone: patches %v, want vol-vol1's and not the container", ids)
	}
	if order := p.reorder(f); strings.Join(order, " ") != "vol-vol1 vol-vol0" {
		t.Errorf("vol1 StandAlone: order %v, want vol-vol1 vol-vol0", order)
	}
	if order := p.reorder(frameOf(st)); order != nil {
		t.Errorf("the same frame again: order %v", order)
	}
}

// TestAPIStatusCarriesTheWarnings: /api/status holds the warnings the page
// shows, also from a source that does not fill them in.
func TestAPIStatusCarriesTheWarnings(t *testing.T) {
	fake := newFakeSource(healthyCluster())
	fake.set(func(st *transport.ClusterStatus) { st.Volumes[0].Replica("beta").Replication = "StandAlone" })
	srv := httptest.NewServer(NewMux(fake.source()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st transport.ClusterStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Warnings) != 1 || st.Warnings[0].ID != "warning-standalone-vol0-beta" || st.Warnings[0].Command != "replctl connect vol0 --node beta" {
		t.Fatalf("/api/status warnings %+v, want beta's StandAlone with its fix", st.Warnings)
	}
}

func TestEventsStreamHistoryThenLive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := newFakeSource(healthyCluster())
	for i := 1; i <= 5; i++ {
		fake.events = append(fake.events, transport.Event{Seq: uint64(i), Node: "alpha", Kind: "k", Message: "m"})
	}
	srv := httptest.NewServer(NewMux(fake.sourceUntil(ctx)))
	defer srv.Close()
	defer cancel()

	s := openSSE(t, srv.URL+"/api/events?history=2", nil)
	var got []string
	for len(got) < 2 {
		e, ok := s.next()
		if !ok {
			t.Fatal("stream ended")
		}
		got = append(got, e.id)
	}
	fake.emit(transport.Event{Seq: 6, Node: "alpha", Kind: "disconnected", Message: "beta gone"})
	e, ok := s.next()
	if !ok {
		t.Fatal("stream ended")
	}
	var ev transport.Event
	if err := json.Unmarshal([]byte(e.data), &ev); err != nil || ev.Kind != "disconnected" || e.name != "event" {
		t.Fatalf("live event %+v (%v)", e, err)
	}
	if strings.Join(append(got, e.id), " ") != "4 5 6" {
		t.Errorf("ids %v %s, want 4 5 6", got, e.id)
	}

	// A client that saw 4 gets 5 and on from the history.
	s2 := openSSE(t, srv.URL+"/api/events?history=3", http.Header{"Last-Event-ID": {"4"}})
	if e, _ := s2.next(); e.id != "5" {
		t.Errorf("after Last-Event-ID 4 the first id is %q, want 5", e.id)
	}
}

// TestEventsIsTheEventHistory: /api/events is the node's event history,
// as the README and the page's link call it. A plain GET (a browser, curl)
// gets the last 20 events, or ?history=N, oldest first, as a JSON array,
// and the response ends; a client that asks for a stream (Accept:
// text/event-stream, as EventSource sends, or ?follow) gets them as
// server-sent events and stays to follow.
func TestEventsIsTheEventHistory(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := newFakeSource(healthyCluster())
	for i := 1; i <= 30; i++ {
		fake.events = append(fake.events, transport.Event{Seq: uint64(i), Node: "alpha", Kind: "k", Message: fmt.Sprintf("event %d", i)})
	}
	srv := httptest.NewServer(NewMux(fake.sourceUntil(ctx)))
	defer srv.Close()
	defer cancel()

	history := func(url string, header http.Header) []uint64 {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		hc := http.Client{Timeout: 10 * time.Second} // a stream would never end
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/json" {
			t.Fatalf("GET %s: %s, Content-Type %q: want the history as JSON", url, resp.Status, ct)
		}
		var evs []transport.Event
		if err := json.NewDecoder(resp.Body).Decode(&evs); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		var seqs []uint64
		for _, e := range evs {
			seqs = append(seqs, e.Seq)
		}
		return seqs
	}
	span := func(from, to uint64) []uint64 {
		var out []uint64
		for i := from; i <= to; i++ {
			out = append(out, i)
		}
		return out
	}
	if got := history(srv.URL+"/api/events", nil); !slices.Equal(got, span(11, 30)) {
		t.Errorf("GET /api/events: events %v, want the last 20 (11..30), oldest first", got)
	}
	browser := http.Header{"Accept": {"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}}
	if got := history(srv.URL+"/api/events?history=3", browser); !slices.Equal(got, span(28, 30)) {
		t.Errorf("GET /api/events?history=3 from a browser: events %v, want 28..30", got)
	}
	if got := history(srv.URL+"/api/events?history=0", nil); len(got) != 0 {
		t.Errorf("GET /api/events?history=0: events %v, want none", got)
	}

	// Asked for a stream: the history, then what happens.
	for _, url := range []string{srv.URL + "/api/events", srv.URL + "/api/events?follow"} {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(url, "follow") {
			req.Header.Set("Accept", "text/event-stream")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			resp.Body.Close()
			t.Fatalf("GET %s asking for a stream: Content-Type %q", url, ct)
		}
		sc := bufio.NewScanner(resp.Body)
		s := &sseReader{t: t, body: resp.Body, sc: sc}
		var ids []string
		for len(ids) < defaultHistory {
			e, ok := s.next()
			if !ok {
				t.Fatalf("%s: the stream ended after %v", url, ids)
			}
			ids = append(ids, e.id)
		}
		if ids[0] != "11" || ids[len(ids)-1] != "30" {
			t.Errorf("%s: the stream began with ids %v, want 11..30", url, ids)
		}
		resp.Body.Close()
	}
}

func TestMonitorSamplesThePrimarysCounters(t *testing.T) {
	// beta is primary: its counters come through Peer.
	st := healthyCluster()
	st.Volumes[0].Primary = "beta"
	fake := newFakeSource(st)
	m := newMonitor(context.Background(), fake.source())
	views := func(ops, bytes uint64) map[string]*transport.NodeStatus {
		return map[string]*transport.NodeStatus{"beta": {Volumes: []transport.LocalVolume{
			{Name: "vol0", Role: "Primary", Reads: ops / 2, Writes: ops - ops/2, ReadBytes: bytes, WriteBytes: 0}}}}
	}
	t0 := testNow
	m.record(t0, st.Volumes[0], views(100, 1<<20))
	m.record(t0.Add(ioSpacing/2), st.Volumes[0], views(200, 2<<20)) // too soon: skipped
	ring := m.record(t0.Add(2*time.Second), st.Volumes[0], views(300, 5<<20))
	got := ring.samples()
	if len(got) != 1 || got[0].IOPS != 100 || got[0].Rate != 2<<20 {
		t.Fatalf("samples %+v, want one at 100 IOPS and 2 MiB/s", got)
	}
	// alpha takes over: its counters start a new series, no bogus rate.
	st.Volumes[0].Primary = "alpha"
	alpha := map[string]*transport.NodeStatus{"alpha": {Volumes: []transport.LocalVolume{{Name: "vol0", Role: "Primary", Writes: 7}}}}
	if got := m.record(t0.Add(4*time.Second), st.Volumes[0], alpha).samples(); len(got) != 1 {
		t.Fatalf("a new primary added a sample: %+v", got)
	}
	// The views come from Node for this node and Peer for the others.
	fake.peers["beta"] = &transport.NodeStatus{Node: transport.NodeInfo{Name: "beta"},
		Events: []transport.Event{{Seq: 3, Kind: "k"}}}
	vs := m.nodeViews(context.Background(), st)
	if vs["alpha"] == nil || vs["beta"] == nil || vs["witness"] != nil {
		t.Errorf("views of %v, want alpha and beta", keys(vs))
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestIORingKeepsTheLastSamples(t *testing.T) {
	var r ioRing
	for i := range ioCapacity + 5 {
		r.add(ioSample{IOPS: float64(i)})
	}
	s := r.samples()
	if len(s) != ioCapacity || s[0].IOPS != 5 || s[len(s)-1].IOPS != float64(ioCapacity+4) {
		t.Fatalf("ring holds %d samples from %v to %v", len(s), s[0].IOPS, s[len(s)-1].IOPS)
	}
}

// An idle cluster's ring holds the window's samples at the idle pace, in
// a buffer of about their number; a page that opens then draws them, and
// the ring grows to the window's worth at the fastest pace, then shrinks
// back once the page closed and the fast samples aged out.
func TestIORingHoldsTheWindowOnly(t *testing.T) {
	var r ioRing
	now := testNow
	idle := idleEvery(1000)
	for i := range 3 * int(ioWindow/idle) {
		r.add(ioSample{At: now, IOPS: float64(i)})
		if i < int(ioWindow/idle) {
			now = now.Add(idle)
			continue
		}
		if r.n > int(ioWindow/idle)+1 || len(r.buf) > minRing {
			t.Fatalf("idle: %d samples in a buffer of %d, want the window's %d in one of %d", r.n, len(r.buf), int(ioWindow/idle)+1, minRing)
		}
		now = now.Add(idle)
	}
	now = now.Add(-idle)
	if io := drawIO(r.samples(), now); io.IOPS.Empty || io.IOPS.Latest != humanCount(float64(3*int(ioWindow/idle)-1)) {
		t.Fatalf("a page opened on an idle ring draws %+v", io.IOPS)
	}
	for range 2 * ioCapacity {
		now = now.Add(ioSpacing)
		r.add(ioSample{At: now, IOPS: 1})
	}
	if r.n != ioCapacity {
		t.Fatalf("viewed: %d samples, want %d", r.n, ioCapacity)
	}
	for range 2 * int(ioWindow/idle) {
		now = now.Add(idle)
		r.add(ioSample{At: now, IOPS: 2})
	}
	if r.n > int(ioWindow/idle)+1 || len(r.buf) > 4*minRing {
		t.Fatalf("idle again: %d samples in a buffer of %d", r.n, len(r.buf))
	}
	if s := r.samples(); s[0].At.Before(now.Add(-ioWindow)) || s[len(s)-1].At != now {
		t.Fatalf("idle again: samples from %v to %v, want the window up to %v", s[0].At, s[len(s)-1].At, now)
	}
}

func TestEventLogKeepsTheNewestOnce(t *testing.T) {
	var l eventLog
	for i := range keptEvents + 10 {
		e := transport.Event{Seq: uint64(i + 1), Node: "alpha", Time: testNow.Add(time.Duration(i) * time.Second)}
		l.add(e)
		l.add(e) // again, as the next sample brings it
	}
	l.add(transport.Event{Seq: 1, Node: "alpha", Time: testNow}) // fell off: stays off
	l.add(transport.Event{Seq: 1, Node: "beta", Time: testNow.Add(time.Hour)})
	got := l.recent()
	if len(got) != keptEvents {
		t.Fatalf("%d events kept, want %d", len(got), keptEvents)
	}
	if got[0].Node != "beta" || got[1].Seq != keptEvents+10 || got[len(got)-1].Seq != 12 {
		t.Errorf("kept %s/%d, %d ... %d", got[0].Node, got[0].Seq, got[1].Seq, got[len(got)-1].Seq)
	}
}

func TestPageServedWithItsAssetsOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := newFakeSource(healthyCluster())
	srv := httptest.NewServer(NewMux(fake.sourceUntil(ctx)))
	defer srv.Close()
	defer cancel()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	p := parsePage(t, string(body))
	if got := p.text("vol-vol0-primary"); got != "alpha" {
		t.Errorf("vol-vol0-primary %q", got)
	}
	for _, asset := range []string{"/assets/page.css", "/assets/page.js", "/assets/favicon.svg"} {
		if !strings.Contains(string(body), `"`+asset+`"`) {
			t.Errorf("the page does not use %s", asset)
		}
		resp, err := http.Get(srv.URL + asset)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", asset, resp.Status)
		}
	}
}
