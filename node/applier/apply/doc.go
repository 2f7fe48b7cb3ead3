// Package apply is the receiving side's step: Stream.Apply applies one
// decoded batch of a primary's stream to the local disk in order (writes,
// discards and resync data with their activity log extents, flushes,
// sync starts and ends; reads and verifies answered BEFORE the ack) and
// returns its ack, on the caller's goroutine, with no clock, channel or
// goroutine of its own. node/applier's Stream.Run drives it from the wire
// in production, and the simulation (node/sim) drives it on its one
// goroutine over its simulated disk, activity log and volume state, so
// that what the simulation checks is the code that ships (issue 28).
//
// It imports replication and the standard library (and internal/lockorder,
// its mutex type, and internal/clock, the type of Volume.Clock): never
// transport, package node, node/cluster, backing, metadata, config or web,
// nor raft, memberlist, gRPC or bbolt (node's TestLayering and
// TestSimLayering).
//
// A Stream's Apply may be called from one goroutine at a time; Stop,
// Fail, Exclusive, State, SetState and From from any goroutine meanwhile.
// Apply holds the stream's apply lock while it runs and calls State's
// methods with it held, which comes before the volume's stateMu and mu
// in node's lock order (node/doc.go).
package apply
