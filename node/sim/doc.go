// Package sim is a seeded, deterministic simulation of a replvol cluster
// (FoundationDB's simulator, TigerBeetle's VOPR): two data nodes and a
// witness, or three data nodes, each data node running the real volume state machine
// (volstate.Step) through the production driver's order (volstate's
// Driving: the preparations, the indicator and the durable state BEFORE
// the install, the actions, Quiesced fed back) on production's volume
// loop: each drive is posted to the node's node/volloop Core, the step
// node's loop runs, and what that hands back to be done off the loop (a
// Wait) is done on the sim's goroutine and handed back to it (node.go's
// take; simVolume is its effects): at once for a caller that reads the
// drive's result (drive, driveActs: the handshake, a forced promotion, a
// switchover's HandedOver, the applier's sync start and end), and, with
// Config.Interleave, left pending for a seeded number of steps for one
// that posts its event and goes on (post: the authority's news, the lease's
// renewals, a lost peer, a discard), while the scheduler takes the other
// steps of the cluster and the node's Core takes its other drives (a
// crash drops the Core and its waits); raft's committed state the real
// replication.Authority, and a modelled raft leader running the real
// failover.Decide; each write of a primary goes through node's own order
// of stages (node/writepath), one stage per step or more, so that a crash,
// a lost link or a new primary can fall between any two; what a primary
// sends a peer goes through production's peer session (node/session's
// Stepper, stepped on the sim's goroutine: its queue, its frames on the
// link, its acks, its end, which marks what the peer misses once the sim
// tracked the peer; wire.go); and each secondary applies what its primary
// ships through the production applier's step
// (node/applier/apply's Stream.Apply: the replica indicator, the activity
// log, writes, FUA, flushes, resync data, sync start and end, the ack),
// over the sim's disk, activity log, checksums and volume state behind its
// interfaces (applied.go), whose state writes at a sync start or end fail
// as node's metadata writes can (stateWrite). Only the mechanism around those rules is
// modelled: disks with a volatile write cache, replication links, leases,
// the primary's data path, resync and pulls (the blocks a pulling
// primary's disk misses: State.LocalMissing), the clock. One PCG source seeded from the seed drives
// everything and the invariants of DESIGN.md §2 are checked after every
// step, so a seed replays a failure exactly. Writes are acknowledged as
// node acknowledges them: from the disks' volatile caches (protocol C:
// the primary's and its streaming peers'), durable at a FLUSH or when
// FUA; a crash loses or tears what a cache held. Each data node keeps
// checksums at rest as node does (sums.go): a sum per block, set in
// memory with its data, durable at a FLUSH or a primary's FUA after the
// data and BEFORE a block leaves the activity log's bounded hot window,
// lost with a crash and computed again from the data for the hot blocks
// at the restart; every step checks that no block's data differs from
// its known sum (a verified read would report a false repair or lose the
// block), and that outside the hot blocks data and sum are durable and
// agree (what a crash would leave). check.go states each invariant as
// checked, and the defects of production the checks found (Finding,
// knownFindingSeeds).
//
// It may import volstate, volloop, failover, writepath, applier/apply,
// session, replication, transport/frame, internal/clock and the standard
// library, never node, node/applier (which links the
// wire) or cluster (nothing of the node's I/O, no raft, memberlist or
// bbolt). It runs on one goroutine, reads no wall clock and never sleeps:
// virtual time moves only when the scheduler advances it. A Sim is not safe for concurrent use.
package sim
