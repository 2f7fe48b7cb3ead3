// Package human writes quantities and phrases for people: byte counts as
// 64.0MiB (or 64.0 MiB on the status page), two clauses as "a; b". It is
// the project's one such formatter (replctl's tables, the node's event
// messages and reasons, and the web page share it); it imports nothing
// of the project and is safe for concurrent use.
package human
