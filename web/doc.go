// Package web serves a node's status page, its JSON status API and its
// Prometheus metrics, all read from the same status model replctl prints.
// It imports only transport's status types; handlers are safe for
// concurrent use.
package web
