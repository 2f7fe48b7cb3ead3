package web

import (
	"context"
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
}

//go:embed status.html
var statusHTML string

var page = template.Must(template.New("status").Funcs(template.FuncMap{
	"bytes":   humanBytes,
	"int64":   func(u uint64) int64 { return int64(u) },
	"percent": func(f float64) string { return template.HTMLEscapeString(formatPercent(f)) },
	"now":     func() string { return time.Now().Format(time.RFC3339) },
}).Parse(statusHTML))

// NewMux returns the handler for "/", "/api/status" and "/metrics".
func NewMux(src Source) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context(), src)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st)
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
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context(), src)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := page.Execute(w, st); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	// Profiling, for operators chasing a slow path (go tool pprof URL).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	if src.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(src.Registry, promhttp.HandlerOpts{Registry: src.Registry}))
	}
	return mux
}

func status(ctx context.Context, src Source) (*transport.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return src.Status(ctx)
}
