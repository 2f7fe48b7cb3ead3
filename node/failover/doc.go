// Package failover is the raft leader's failover rule, pure: Decide (from
// the authority, the cluster as this node sees it, the lease renewals it
// granted, its own office and observation and a time: which primaries to
// fail over, why every other volume is left alone, whether to hand the
// leadership off) and the watch over a primary (Watch, PrimaryWatch.Judge:
// when a primary counts as lost), with the plain types they read (Status,
// MemberState, Liveness, Standing).
//
// It reads no clock, starts no goroutine and does no I/O: it imports only
// replication and the standard library (never raft, memberlist, bbolt,
// gRPC, transport or node; TestLayering pins it), so that the simulation
// (node/sim) runs the same rule as the node's cluster loop without linking
// them. node/cluster gathers the inputs (and names these types for its
// callers); the node layer calls Decide. Its functions are safe for
// concurrent use; a Watch belongs to one loop.
package failover
