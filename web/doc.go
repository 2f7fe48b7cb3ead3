// Package web serves a node's status page, its JSON status API, its event
// stream and its Prometheus metrics, all read from the same status model
// replctl prints. The page is html/template with embedded assets and
// follows the cluster live over Server-Sent Events; a sampler goroutine
// per mux (no globals) keeps the IO history and the cluster's recent
// events, reading other nodes' /api/node. Warnings, the pure rule that
// turns a status into what needs attention and how to fix it, is the one
// the node fills the status's JSON with. It imports only transport's
// status types and internal/human's wording of bytes and clauses;
// handlers are safe for concurrent use.
//
// Its mutexes (the monitor's, a fan-out's, an event stream's, the
// handler's) are leaves of internal/lockorder's kind: an event stream's
// mu is held while a line is written and flushed to its client, and the
// handler's while it registers with an http.Server; no other lock of the
// project is taken under them.
package web
