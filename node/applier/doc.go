// Package applier is the receiving side of replication on a secondary: it
// applies a primary's stream to the local disk in order (writes, discards
// and resync data with their activity log extents, flushes; reads and
// verifies answered BEFORE the ack), acknowledges what it applied, one ack
// for the batches that were waiting, and writes the secondary's side of
// the stream from one goroutine. The apply of one batch is the step of
// node/applier/apply (Stream.Apply), which Run drives from the wire and
// the simulation (node/sim) drives on its one goroutine; this package adds
// the wire: transport's stream, the receipts, the empty acks of a long
// apply or of a long frame arriving over a slow link, the read replies
// and the acks. Package node takes the stream (the
// handshake, the refusals, the epoch adoption, a step-down or a fence) and
// then calls Stream.Run; what only the volume decides when an entry
// changes its state (a resync's start and end, the replica indicator, a
// failed disk) it reaches through the State interface.
//
// It imports node/applier/apply, replication, transport and the standard
// library (and internal/clock): never package node, node/cluster, backing,
// metadata, config or web, nor raft, memberlist or bbolt (node's
// TestLayering).
//
// One goroutine (node's stream handler) calls Run for a Stream; Stop,
// State, SetState and From may be called from any goroutine meanwhile.
// Stop waits for the batch being applied. Run calls State's methods with
// the stream's apply lock held (apply.Stream.Apply), which comes before
// the volume's stateMu and mu in node's lock order (node/doc.go).
package applier
