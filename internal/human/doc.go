// Package human writes quantities for people: byte counts as 64.0MiB (or
// 64.0 MiB on the status page). It is the project's one such formatter
// (replctl's tables, the node's event messages and the web page share
// it); it imports nothing of the project and is safe for concurrent use.
package human
