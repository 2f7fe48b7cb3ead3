// Package nbd serves Exports to NBD clients (fixed newstyle handshake, NBD_OPT_STARTTLS, simple
// replies) with many requests in flight per connection, each holding bytes of a per-connection and a node-wide budget
// until its reply is written, so a client that reads no replies is pushed back on, not buffered;
// connections are admitted within the limits of package connlimit (in all, per address, and
// negotiations in progress, each under a deadline), so that a flood of connections that never
// negotiate does not keep a client out.
// It imports nothing of the project but internal/connlimit and internal/lockorder; a Server and an Export's methods
// are called from many goroutines at once.
//
// Lock order (internal/lockorder's mutexes; go test -tags deadlock
// checks it), outermost first: the Server's mu, a connection's writeMu, a
// connection's mu, its budget's mu, the node budget's mu; the buffer
// pool's class mutexes and the log limiter's mu are leaves. The Server's
// mu reads each connection's state (isDraining) and gives back the slot
// of a connection refused at shutdown (internal/connlimit's Limiter mu
// comes after it); the writer gives each request's buffer and budget back
// under writeMu; a connection's budget queues at the node budget under
// its own mu. A connection's mu is held while the read deadline is set on
// the network connection (in tests, internal/fault's Conn takes its mu).
package nbd
