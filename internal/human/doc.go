// Package human writes quantities for people: byte counts as 64.0MiB. It
// is the project's one such formatter (replctl's tables and the node's
// event messages share it); it imports nothing of the project and is safe
// for concurrent use.
package human
