// Package sim is a seeded, deterministic simulation of a replvol cluster
// (FoundationDB's simulator, TigerBeetle's VOPR): two data nodes and a
// witness, or three data nodes, each data node running the real volume state machine
// (volstate.Step through volstate.Apply), raft's committed state the real
// replication.Authority, and a modelled raft leader running the real
// failover.Decide; each write of a primary goes through node's own order
// of stages (node/writepath), one stage per step or more, so that a crash,
// a lost link or a new primary can fall between any two. Only the
// mechanism around those rules is modelled: disks
// with a volatile write cache, replication links, leases, the data path
// and resync, the clock. One PCG source seeded from the seed drives
// everything and the invariants of DESIGN.md §2 are checked after every
// step, so a seed replays a failure exactly. Writes are acknowledged as
// node acknowledges them: from the disks' volatile caches (protocol C:
// the primary's and its streaming peers'), durable at a FLUSH or when
// FUA; a crash loses or tears what a cache held. check.go states each
// invariant as checked, and the defects of production the checks found
// (Finding, knownFindingSeeds).
//
// It may import volstate, failover, writepath, replication and the standard library,
// never node or cluster (nothing of the node's I/O, no raft, memberlist or
// bbolt). It runs on one goroutine, reads no wall clock and never sleeps:
// virtual time moves only when the scheduler advances it. A Sim is not safe for concurrent use.
package sim
