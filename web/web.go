package web

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport"
)

// Source is what the pages read.
type Source struct {
	// Status assembles the cluster's status.
	Status func(context.Context) (*transport.ClusterStatus, error)
	// Node reports this node's own view (its peers' counters, events).
	Node func(context.Context) (*transport.NodeStatus, error)
	// Registry holds the node's metrics (never the global registry).
	Registry *prometheus.Registry
	// Events streams the node's events to fn: the last history first,
	// then each new one, until ctx ends or fn fails.
	Events func(ctx context.Context, history int, fn func(*transport.Event) error) error
	// History returns the node's last n events, oldest first.
	History func(ctx context.Context, n int) ([]transport.Event, error)
	// Peer reports another node's own view, for the IO counters of a
	// primary elsewhere and that node's events. Nil reads the node's
	// /api/node on its control address.
	Peer func(ctx context.Context, node transport.NodeInfo) (*transport.NodeStatus, error)
	// Context is the node's lifetime: the page's sampler starts at once
	// and stops, and every live stream ends, when it does. Nil: the
	// sampler starts with the first page view, and the sampler and the
	// streams end when the http.Server serving the mux shuts down.
	Context context.Context
}

// contentSecurity lets the page load only from its own node: a browser
// refuses anything else, so the page works with no other host reachable.
const contentSecurity = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// NewMux returns the handler for the status page "/" (its assets and its
// live stream /api/stream), "/api/status", "/api/node", "/api/events" (the
// event history as JSON, or as a live stream to a client that asks for
// text/event-stream), "/metrics" and pprof.
func NewMux(src Source) *http.ServeMux {
	parent := src.Context
	if parent == nil {
		parent = context.Background()
	}
	life, stop := context.WithCancel(parent)
	h := &handlers{src: src, mon: newMonitor(life, src), stop: stop, servers: map[*http.Server]bool{}}
	if src.Context != nil {
		h.mon.start()
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context(), src)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if st.Warnings == nil {
			// A source that does not fill them in: the same rule.
			st.Warnings = Warnings(st)
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("GET /api/node", func(w http.ResponseWriter, r *http.Request) {
		if src.Node == nil {
			http.NotFound(w, r)
			return
		}
		st, err := src.Node(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("GET /api/stream", h.stream)
	mux.HandleFunc("GET /api/events", h.events)
	mux.Handle("GET /assets/", http.FileServerFS(assets))
	// Profiling, for operators chasing a slow path (go tool pprof URL).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	if src.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(src.Registry, promhttp.HandlerOpts{Registry: src.Registry}))
	}
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func status(ctx context.Context, src Source) (*transport.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return src.Status(ctx)
}

// handlers serve the page and its streams.
type handlers struct {
	src  Source
	mon  *monitor
	stop context.CancelFunc

	mu      lockorder.Mutex
	servers map[*http.Server]bool
}

// bind ties the mux's lifetime to the server that serves r: its
// Shutdown ends the sampler and the streams, which would otherwise keep
// their connections busy and hold Shutdown up.
func (h *handlers) bind(r *http.Request) {
	srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.servers[srv] {
		h.servers[srv] = true
		srv.RegisterOnShutdown(h.stop)
	}
}

// page renders the whole page from a fresh status, with the monitor's
// sparklines and events.
func (h *handlers) page(w http.ResponseWriter, r *http.Request) {
	h.bind(r)
	h.mon.start()
	in := pageInput{Now: time.Now()}
	st, err := status(r.Context(), h.src)
	if err != nil {
		in.StatusError = err.Error()
	}
	in.Status = st
	f, changed := h.mon.current()
	if f == nil {
		// The first view starts the sampler: give it a moment for the
		// events and the first IO sample.
		select {
		case <-changed:
			f, _ = h.mon.current()
		case <-time.After(sampleTimeout):
		case <-r.Context().Done():
			return
		}
	}
	if f != nil {
		in.IO, in.Events = f.IO, f.Events
	}
	var buf bytes.Buffer
	if err := renderPage(&buf, buildPage(in)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", contentSecurity)
	hd.Set("X-Content-Type-Options", "nosniff")
	w.Write(buf.Bytes())
}
