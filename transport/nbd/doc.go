// Package nbd serves Exports to NBD clients (fixed newstyle handshake, NBD_OPT_STARTTLS, simple
// replies) with many requests in flight per connection, each holding bytes of a per-connection and a node-wide budget
// until its reply is written, so a client that reads no replies is pushed back on, not buffered;
// connections are admitted within the limits of package connlimit (in all, per address, and
// negotiations in progress, each under a deadline), so that a flood of connections that never
// negotiate does not keep a client out.
// It imports nothing of the project but internal/connlimit; a Server and an Export's methods
// are called from many goroutines at once.
package nbd
