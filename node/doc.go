// Package node runs one replvol node: its configuration, its state store,
// its volumes (the replicated IO path on the primary, the applier on a
// secondary), the NBD export, the replication and control servers and the
// web status page. Several Nodes may run in one process: nothing here is
// global. Node and Volume methods are safe for concurrent use. Volumes are
// added and removed while the node runs (volumes.go, on a SIGHUP): the
// node's config and volume map are replaced whole, never changed in
// place, and read through config() and volumes().
//
// What is not the volume's data path or the wiring of a node is a package
// of its own below this one, each importing nothing of it (TestLayering):
//   - node/volstate: the volume's state machine, a pure Step; this
//     package's driver (drive.go) persists, then performs;
//   - node/cluster: raft, gossip, the leases and the failover decision
//     (Decide, pure);
//   - node/session: the primary's stream to one peer, one owner loop;
//   - node/applier: a secondary's apply of the primary's stream (the
//     apply of one batch is node/applier/apply's step, which the
//     simulation runs too);
//   - node/control: the control API's handlers, authorization and port;
//   - node/multipath: the userspace multipath device;
//   - node/sim: the seeded simulation of volstate, cluster and the data
//     path (it links nothing of this package).
//
// What stays here is the volume: its write and read path (write.go,
// submit.go, readbalance.go, detach.go), its peers (peer.go, handshake.go,
// runloops.go), its role functions as events of its state machine
// (roles.go, drive.go), and the node that holds the volumes, the state
// store and the servers (node.go, volumes.go, authority.go).
//
// Time: the node reads the time and makes its timers only on its clock
// (Node.clock, internal/clock; tests may give a clock.Fake), never through
// the time package (TestTheNodeReadsTimeOnlyThroughItsClock); the leases
// keep the cluster's (Cluster.Clock). Nothing polls a state: its writer
// notifies its changes (Volume.changed, changes.go) and a waiter looks
// again then (waitUntil), or at a timer of the clock.
//
// A primary runs one peer per secondary (peer.go), which dials it. The
// handshake (handshake.go) sends both nodes' generation sets;
// replication.CompareUUIDs decides, and the primary then streams writes
// and either resyncs the blocks its bitmap marks (SyncSource), copies from
// the peer what it lacks (SyncTarget, reading those blocks from the peer
// meanwhile), or refuses (split brain, unrelated data). Both sides also
// compare the settings that must agree (settingscheck.go). Each stream is a
// session (package node/session) with one owner loop: it alone holds the
// queue, the entries in flight, their sequence numbers, the congestion
// controller, the resync runs in flight and the peer's lag, and makes the
// session's changes of the peer's state, in order. Writers, the resync
// and verify windows (runloops.go) and catch-up submit entries through a
// channel and wait on the pending they get back; the receiving goroutine
// hands it acks and replies as messages; one sending goroutine writes the
// frames it builds. The session reaches the peer and its volume only
// through session.Peer, which the peer implements (peersession.go).
// Readers see the peer's state and lag as snapshots the
// owners publish. A write on the primary (write.go) is one pipeline, its
// stages in the order they run: admit (the range lock, then the extent
// durably in the activity log), ship (submit.go: each peer's session takes
// the entry, or the peer's bitmap marks it once the volume durably tracks
// the peer), write locally (or mark what a detached disk misses), wait as
// the protocol says, complete (each peer's loop counts it in the lag, as a
// message). The streams of all volumes to one peer node share one
// heartbeat (session.PairBeat): one of them probes the node, and an idle
// stream owes nothing while the node answers on any. A secondary (secondary.go) applies the stream in order,
// through node/applier: its read loop, the ordered apply of each batch,
// and the one goroutine that writes its side of it; secondary.go keeps
// the handshake, the refusals and the epochs. An old primary reached by a
// primary of a newer epoch steps down when nothing is lost by following
// it, and stops its IO at once when the data diverged. A node that
// restarts as primary serves no IO until a peer has compared generations
// and epochs with it.
//
// With a tls: section (tls.go) the replication stream is mutual TLS 1.3:
// a primary streams only to the node its certificate names, and a
// secondary takes a stream only when the certificate names the node its
// Hello says it comes from (RefusedIdentity otherwise); raft and gossip are
// secured in node/cluster. Each refusal is logged once per peer and cause.
//
// The durable state of a volume (state.go: epoch, primary, generations)
// changes only through Volume.commit, which writes the new value to stable
// storage BEFORE any goroutine can see it; when that write fails, what
// depended on it does not happen. Why a volume or a link is not doing its
// job is a typed Cause (reason.go), never matched from its words.
//
// A volume's role and serving state (one volstate.Serving: Open,
// OpenWithoutLease, Waiting, Fenced, Stopped) change through its state
// machine, node/volstate, a pure function of (state, event). The driver
// (drive.go, running volstate.Drive, the order the simulation runs too)
// steps it, writes what the step makes durable (the primary indicator,
// then the state, through commit) BEFORE it installs the new state, and
// only then performs the step's actions (drain the IO, stop the senders,
// start the lease, run the hooks). Every drive runs on the volume's loop
// (node/volloop, its Loop): one goroutine per volume, started when it opens and ended
// at its close, takes the drives posted on its inbox in order and runs
// each by volstate's order in its resumable form (volstate.Driving); the
// preparations and actions that wait for the senders, the incoming
// stream, the IO in flight or the cluster run off the loop, and their end
// comes back to the inbox, so a sender or a stream that drives the volume
// while a drive waits for it is taken meanwhile. A drive posted to a
// volume that closes gets volloop.ErrClosed. Some steps run on the loop
// as a call (volloop.Loop.Call) rather than a drive: the handshake's
// decision (takeStream: the marks, the step with stepLocked and the switch
// of the peer's writes to the stream, one critical section under
// v.stateMu) and the end of the stream from the primary (incomingEnded:
// the check that it is the current stream and the step, under v.stateMu,
// which a new stream takes to replace it); and the news of a peer's link
// and streams is a step told or asked (volloop.Loop.Tell, Ask: takeNews,
// below). So every step of a volume is taken on its loop, one at a time
// (TestTheVolumesStepsRunOnItsLoop); v.stateMu, which every step holds,
// orders the write path's own checks (a write marked or streamed, a peer
// tracked already) against them. What a step checks is read when it is taken, under
// v.stateMu (modelLocked): the peers' states and facts (a peer in sync,
// bits in its bitmap) and whether the local disk misses blocks, so a
// caller checks nothing before it posts. The role functions build an
// event and drive it: promote and takeOverAt (raft's choice) are one
// promotion, stepDown (a newer primary reached this one) and yieldTo
// (raft names another) one step-down, and retake, forcePromote, demote (with HandedOver or
// HandoverAborted), fence and discardMyData are events too.
// A volume's start (Started), a handshake's decision (PeerConnected: the
// generation rules refuse, resync or pull, durably; handshake.go marks the
// blocks that move, then renders a refusal in words), a peer's answer
// lifting a wait or a fence (PeerAnswered, once the stream carries
// writes), the end of a resync either way (ResyncFinished: the peer's
// bitmap generation retired, or the pulled generation taken) and a write
// that misses a peer (WriteMissed: a new generation, or IO stopped when it
// cannot be written; a peer that streams takes the write) are events too,
// and so are the operator's disconnect and connect (Disconnect, Connect:
// the senders stopped or started, the operator's cause, and a connect's
// retry after a split brain). The receiving side is stepped the same way:
// the loaded state at open (Opened: a stale disk comes back Inconsistent
// and Secondary), a primary's stream reaching this node (PrimaryReached:
// the rules refuse it with the answer's code, RefuseStream, which
// secondary.go words, or take it, the epoch durable first), a resync into
// this disk (ResyncStarted, ResyncFinished), its stream's end
// (IncomingEnded), a replicated write that failed (ReplicaWriteFailed) and
// a split brain a peer reported (SplitBrainFound). The volume's state is
// the machine's value itself (Volume.st, a volstate.State under v.mu),
// every peer's replication state, stream and pull among it: a step takes
// a copy of it with the facts (modelLocked), and only a step's install
// writes it (TestOnlyTheStepsWriteTheVolumesState), which publishes each
// peer's state to the peer's view (publishPeersLocked, the one writer of
// those fields: TestOnlyTheStepsInstallAPeersState). Each install publishes a copy
// (Volume.state, never changed once published) BEFORE it notifies the
// change; status, the metrics, the NBD export list and the claims read
// that without v.mu, while IO's admission reads st under v.mu (its count
// of IO in flight must agree with the state a step-down drains).
// A lease renewal (LeaseRenewed), a shutdown or removal (Stop), a failed
// replicated write and a split brain reported are drives too; they write
// nothing, so they wait behind a commit only as long as it takes. A detach is the disk state
// Diskless in the state machine, and a flag here; one loop per volume
// (detach.go) probes the detached disk where it failed and puts it back
// by reattachState's rule (reattach.go: back-off, passing time, flaps). A stream's own news
// (a peer congested, drained, catching up, in sync: volstate.StreamEvent)
// and its link's (LinkDown: its stream lost, or the link stopped for good;
// LinkStarted) are steps too, which change that peer's state alone, by
// volstate's rule (Peer.Streamed), which is also the congestion
// controller's; they write nothing and run on the loop under v.stateMu
// (peer.takeNews). The peers' views (their published states, their
// streams, disks and why) are the volume's loop's too: only code on the
// loop changes them (peer.update; the deadlock build checks the
// goroutine, internal/lockorder's Owner, across every test). A session's
// loop, which the volume's loop may wait for as it hands it entries,
// tells its news (volloop.Loop.Tell: queued, never waited for, run on the
// loop BEFORE the next drive or call it takes); the peer's connect loop
// and the control API ask (volloop.Loop.Ask: told, and waited for). The one change of a view made off the loop is a
// stream's end taking the writes' route off it at once (peer.route), so
// that a write never waits for the loop to learn of it.
//
// An online resize (resize.go) grows every replica while IO runs, the
// secondaries before the primary, which only then takes writes past the
// old end and shows new NBD connections the new size; the range gained
// reads as zeroes on every disk, so nothing is copied or resynced.
//
// The control port is HTTPS with a tls: section, and every node also
// serves it on STATE_DIR/control.sock. The control API is package
// node/control: its handlers, its Gate (who may call what: authorize, a
// pure rule; and the marks of the calls a node forwards on someone's
// behalf) and the port's Listener. It runs the node through
// control.Node, which controlapi.go adapts; what a command decides (a
// switchover, switchover.go; discard-my-data) stays here. So do the mount
// claims (claims.go): a primary gives a volume's claim to one replctl
// mount at a time, for its term, while the connections made under it are
// open and the mount's --io-timeout after; a switchover is refused while
// one lasts, naming the mount's host and directory.
//
// Its cluster file is package config's (node names its types by alias),
// its disks package backing's, and its durable files metadata's (the
// volume's on-disk metadata), metadata/statefile's (state.db) and, through
// node/cluster, metadata/raftlog's (raft.db). cmd/replnode, replbench and
// replctl's demo (cmd/replctl/internal/demo) call it; replctl's other
// commands never link it (layering_test.go).
//
// Lock order, outermost first; a goroutine holding one takes only those
// after it: n.volMu, v.resizeMu, in.applyMu, v.stateMu, v.mu; then the
// leaves, under which nothing is taken: n.mu, n.cl.mu, v.iopath.rb.mu,
// v.loop's newsMu (node/volloop: the news told and not yet run),
// n.events.mu, n.claims.mu (claims.go: the mount claims), v.scrub.mu
// (scrub.go: the scrub's phase and checkpoint), v.durable.integ.listMu
// (integrity.go, badblocks.go: the lost blocks and the bad-block list;
// held across the list's durable write, so the metadata's mutexes come
// under it), the metrics'
// eventCounts.mu and statusCache.mu. These are every mutex of the
// package (type mutex, lock.go: internal/lockorder's); the mutexes of the
// packages it calls under them (metadata, replication's bitmaps and
// range locks, node/cluster, transport, internal/connlimit) come after
// them, in the order their doc.go gives. The peer and session
// code declares none, and a session's loop takes v.stateMu and v.mu only
// at its end (startTracking, through session.Peer: the write path's check,
// then a drive of the volume's loop it waits for, which never waits for a
// session's loop on the loop itself).
// v.stateMu is never taken while waiting for an entry's ack; v.mu is never
// held while the state is written. The volume's loop holds no lock while
// it waits for a message, and no goroutine posts a drive to it, or asks
// it, while holding v.stateMu or v.mu (the loop takes them for its Take
// and for the news it is told or asked). go test
// -tags deadlock (make test-locks) (and make test) checks the order at
// run time, with every other mutex of the process. in.applyMu, a stream's
// apply lock, is node/applier/apply's, of the same kind (its lock.go).
package node
