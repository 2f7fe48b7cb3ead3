// Package cluster is cluster membership and authority for one node: raft
// decides, memberlist hints. Raft (hashicorp/raft, every node of the
// cluster file a voter, a witness too) holds the replication.Authority:
// per volume the primary, its epoch and who is UpToDate or Outdated. The
// leader grants the primary its lease and says when no lease can still be
// valid (LeaseFree), the condition for promoting another node. Memberlist
// gossips liveness and each node's metadata: a fast hint, never the
// authority.
//
// The leader's failover decision lives in one pure function, Decide, in
// package node/failover (which links no raft; the cluster names it and
// its types for its callers): from the authority, the members, the lease
// renewals it granted, its own office and observation (Watch) and a
// time, it returns
// the failovers to propose, why it leaves every other volume alone, and
// whether a leader that serves as a primary hands its leadership off; it
// reads no clock and calls neither raft nor the network. The node layer
// gathers those inputs once per pass, proposes with ProposeAsLeader, and
// the leases (lease.go) hold each promotion until no old lease can be
// valid. The cluster's own time is an injected clock (Config.Clock,
// internal/clock: the real one unless a test sets a Fake; Cluster.Clock
// names it for the node layer, which compares its leases and paces its
// renewals by it): the leases, gossip's dates, the pauses of its loops.
// Raft and memberlist keep real time; what is compared with raft's own
// times (its last contact with the leader) is read on the real clock, and
// the waits on raft's state wait on its events (leader changes,
// heartbeats), never on a timer.
//
// With the cluster's PKI (Config.TLS, Config.GossipKey), raft's
// connections are mutual TLS 1.3 and gossip is encrypted with memberlist's
// keyring: a node of another CA, or without the key, neither votes nor is
// heard (tls.go). Raft's transport checks every inbound RPC before raft
// sees it: the node it names must be the node of its connection's
// certificate, a voter (or, for AppendEntries and InstallSnapshot, a node
// of the cluster file), at its raft address (rpcgate.go).
//
// It imports metadata/raftlog (the raft log on bbolt), replication (the
// rules) and internal/pki, and nothing of node or transport: the node
// layer carries forwarded requests to the leader through a Forwarder it
// implements. A Cluster is safe for concurrent use; several run in one
// process (no globals).
//
// Lock order (internal/lockorder's mutexes; go test -tags deadlock checks
// it): a Cluster's leases.mu before leases.changed's broadcast mu (a lease
// change wakes the waiters under it); gatedTransport.mu and tlsLayer.mu
// close connections under them, whose Close may take internal/connlimit's
// Limiter mu (a slot given back) or, in tests, internal/fault's link mu;
// gossip.mu asks raft for its configuration (isVoter: raft's own locks,
// which take none of these). Every other mutex is a leaf, under which
// nothing is taken: fsm.mu (the FSM signals its change after unlocking),
// membership.mu, renewer.mu, sharedBarrier.mu, addrBook.mu and the
// broadcasts'. No two of this package's mutexes are held at once but
// leases.mu and its broadcast's. The node layer holds none of its own
// mutexes but its state locks (package node's doc.go) when it calls in.
package cluster
