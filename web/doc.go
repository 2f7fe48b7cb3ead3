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
package web
