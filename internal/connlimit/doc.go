// Package connlimit decides which connections a port accepts, so that
// hosts with no certificate cannot deny its service: it counts a port's
// connections in all, from each source address (an IPv4 address, an IPv6
// /64), and those still in their handshake (TLS, an NBD negotiation),
// keeps a share of the port for the cluster's own nodes (Known addresses),
// gives each handshake a deadline that shortens while the port is under
// pressure, and, when the port is full, closes the oldest unfinished
// handshake of the source that holds the most rather than refuse a new
// connection. Refusals and closes are counted (Stats) and logged a line
// per source and interval, never a line per connection.
//
// Every listener of a node uses it (NBD, control, raft, replication);
// what differs between them is their Config. It imports nothing of the
// project but internal/clock and internal/lockorder; a Limiter and its Slots may be used from
// many goroutines at once.
//
// Its mutexes are leaves: a Limiter's mu (nothing is called under it; the
// connections it closes are closed after unlocking) and a Known's
// RWMutex, read before the Limiter's is taken. Other packages take the
// Limiter's mu under theirs by closing a connection (a Slot's Release).
package connlimit
