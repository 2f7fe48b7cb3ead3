// Package volstate is one volume's state machine on one node, as a pure
// function: Step(state, event) returns the next state and a Ready, what
// must be on stable storage (Persist, the primary indicator) BEFORE the
// Actions may be performed. Role changes, the serving state and the
// peers' replication states change only here. The driver's order around
// a step (drive.go: Drive, Take: the preparations, the indicator and the
// durable state BEFORE the install, then the actions, then Quiesced) is
// here too, over an interface of effects, so node's volume and the
// simulation (node/sim) run the same order, each over its own disks,
// metadata and locks. A stream's own news about its peer (StreamEvent: lost,
// congested, drained, catching up, in sync) changes that peer's state
// alone, by Peer.Streamed, so node's session loop steps it on the peer
// without the volume's locks.
//
// It may import the replication package and the standard library, never
// node, raft, memberlist or grpc, and it reads no clock: time comes in
// events. It is not safe for concurrent use: one driver per volume steps it.
package volstate
