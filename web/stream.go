package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport"
)

// The live streams are Server-Sent Events: /api/stream sends the page the
// sections that changed (the page's script swaps them in), and
// /api/events, to a client that asks for a stream, this node's events
// as they happen. /api/events is the node's event history: a plain GET
// (a browser, curl) gets the last events as a JSON array.

// keepalive is how often an idle stream sends a comment, so that proxies
// and the browser see it alive.
const keepalive = 15 * time.Second

// patchMessage is one "patch" event of /api/stream: the page's new title
// and the sections to replace, by element id.
type patchMessage struct {
	Title   string  `json:"title"`
	Patches []patch `json:"patches"`
	// Order, when the volumes moved (problem volumes go first), lists
	// the volume sections' element ids in their new order.
	Order []string `json:"order,omitempty"`
}

type patch struct {
	ID   string `json:"id"`
	HTML string `json:"html"`
}

// patcher remembers what one open page holds, so that it is sent only
// what changed.
type patcher struct {
	sent map[string]uint64
	// volumes are the volume sections the page holds, sorted and joined;
	// a change of the set replaces the volume container whole. order is
	// the order they are in on the page, joined.
	volumes, order string
	fresh          bool
}

func newPatcher() *patcher { return &patcher{sent: map[string]uint64{}, fresh: true} }

// patches returns what the page needs to show f, but for the order of
// the volumes (reorder).
func (p *patcher) patches(f *frame) []patch {
	set := slices.Clone(f.VolumeIDs)
	slices.Sort(set)
	volumes := strings.Join(set, "\x00")
	replaceVolumes := p.fresh || volumes != p.volumes
	if replaceVolumes {
		// The new container holds them in f's order.
		p.order = strings.Join(f.VolumeIDs, "\x00")
	}
	isVolume := map[string]bool{}
	for _, id := range f.VolumeIDs {
		isVolume[id] = true
	}
	var out []patch
	for _, s := range f.Sections {
		switch {
		case s.ID == volumesID:
			if replaceVolumes {
				out = append(out, patch{ID: s.ID, HTML: s.HTML})
			}
		case isVolume[s.ID] && replaceVolumes:
			p.sent[s.ID] = s.Hash // inside the container
		case p.sent[s.ID] != s.Hash:
			out = append(out, patch{ID: s.ID, HTML: s.HTML})
			p.sent[s.ID] = s.Hash
		}
	}
	p.volumes, p.fresh = volumes, false
	return out
}

// reorder returns the order of f's volume sections when the page holds
// them in another (after patches), else nil.
func (p *patcher) reorder(f *frame) []string {
	order := strings.Join(f.VolumeIDs, "\x00")
	if order == p.order {
		return nil
	}
	p.order = order
	return slices.Clone(f.VolumeIDs)
}

// stream serves /api/stream to one open page: every section on the first
// frame, then those that changed, until the page goes or the node stops.
func (h *handlers) stream(w http.ResponseWriter, r *http.Request) {
	h.bind(r)
	if h.mon.life.Err() != nil {
		w.WriteHeader(http.StatusNoContent) // EventSource: do not retry
		return
	}
	h.mon.start()
	h.mon.viewers.Add(1)
	defer h.mon.viewers.Add(-1)
	joined := time.Now()
	h.mon.wake()

	out, err := startSSE(w)
	defer out.close()
	if err != nil {
		return
	}
	pt := newPatcher()
	ticker := time.NewTicker(keepalive)
	defer ticker.Stop()
	for {
		f, changed := h.mon.current()
		// The page was rendered just now: start from a sample as new.
		if f != nil && !f.At.Before(joined) {
			if ps, order := pt.patches(f), pt.reorder(f); len(ps) > 0 || order != nil {
				data, err := json.Marshal(patchMessage{Title: f.Title, Patches: ps, Order: order})
				if err != nil {
					panic(err) // strings only
				}
				if out.send("event: patch\ndata: %s\n\n", data) != nil {
					return
				}
			}
		}
		select {
		case <-changed:
		case <-ticker.C:
			if out.send(": keepalive\n\n") != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-h.mon.life.Done():
			return
		}
	}
}

// defaultHistory is how many past events /api/events gives without
// ?history=N.
const defaultHistory = 20

// wantsStream says whether a request of /api/events asks for the live
// stream: it accepts text/event-stream (EventSource sends that), names
// the last event it saw (a reconnecting EventSource), or says ?follow.
func wantsStream(r *http.Request) bool {
	if r.Header.Get("Last-Event-ID") != "" || r.URL.Query().Has("follow") {
		return true
	}
	for _, accept := range r.Header.Values("Accept") {
		for _, mt := range strings.Split(accept, ",") {
			mt, _, _ = strings.Cut(mt, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// events serves /api/events, this node's event history: the last
// ?history=N (default 20), oldest first. A plain GET gets them as a JSON
// array. A client that asks for a stream (wantsStream) gets them as SSE
// ("event" events, id the sequence number), then each new event as it
// happens; one that reconnects with Last-Event-ID gets what it missed, if
// the node still holds it.
func (h *handlers) events(w http.ResponseWriter, r *http.Request) {
	h.bind(r)
	history := defaultHistory
	if s := r.URL.Query().Get("history"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			http.Error(w, "history: want a count of events, 0 or more", http.StatusBadRequest)
			return
		}
		history = n
	}
	if !wantsStream(r) {
		h.eventHistory(w, r, history)
		return
	}
	if h.src.Events == nil {
		http.NotFound(w, r)
		return
	}
	if h.mon.life.Err() != nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var after uint64
	if s := r.Header.Get("Last-Event-ID"); s != "" {
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			after, history = n, max(history, eventHistory)
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(h.mon.life, cancel)()

	// The events and the keepalive write from two goroutines.
	out, err := startSSE(w)
	defer out.close()
	if err != nil {
		return
	}
	go func() {
		ticker := time.NewTicker(keepalive)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				if out.send(": keepalive\n\n") != nil {
					cancel()
					return
				}
			}
		}
	}()
	_ = h.src.Events(ctx, history, func(e *transport.Event) error {
		if e.Seq != 0 && e.Seq <= after {
			return nil
		}
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if e.Seq != 0 {
			return out.send("id: %d\nevent: event\ndata: %s\n\n", e.Seq, data)
		}
		return out.send("event: event\ndata: %s\n\n", data)
	})
}

// eventHistory answers /api/events with the node's last n events as a
// JSON array, oldest first.
func (h *handlers) eventHistory(w http.ResponseWriter, r *http.Request, n int) {
	if h.src.History == nil {
		http.NotFound(w, r)
		return
	}
	events, err := h.src.History(r.Context(), n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if events == nil {
		events = []transport.Event{}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, events)
}

// sseWriter writes one Server-Sent Events stream. It is safe for
// concurrent use, and writes nothing once closed (the handler returned).
type sseWriter struct {
	mu     lockorder.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	closed bool
}

// startSSE answers with an event stream and sends the reconnect delay.
func startSSE(w http.ResponseWriter) (*sseWriter, error) {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	return s, s.send("retry: 1000\n\n")
}

// send writes one event (or comment) and flushes it to the client.
func (s *sseWriter) send(format string, args ...any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return context.Canceled
	}
	if _, err := fmt.Fprintf(s.w, format, args...); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseWriter) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}
