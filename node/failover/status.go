package failover

import "time"

// Liveness is what gossip says of a node: a hint, never the authority.
type Liveness string

// Liveness values. memberlist v0.7.0 tells no event when it merely
// suspects a node, and the nodes its Members returns point into its own
// state (reading their State races with its updates), so a suspected node
// stays Alive until it is declared Dead: within about 1 s with the
// cluster's default Timing (suspicion included).
const (
	Alive Liveness = "alive"
	// Dead: its probes failed and the suspicion ran out, unrefuted.
	Dead Liveness = "dead"
	// Left: it announced its leave.
	Left Liveness = "left"
	// Unknown: a member never heard of since this node started.
	Unknown Liveness = "unknown"
)

// MemberState is one node as this node sees it.
type MemberState struct {
	Name  string   `json:"name"`
	State Liveness `json:"state"`
	// Since is when this node learned State (zero for Unknown).
	Since   time.Time `json:"since,omitzero"`
	Witness bool      `json:"witness,omitempty"`
	// Voter: a voter in the latest raft configuration.
	Voter bool `json:"voter"`
	// Meta is what the node gave SetMeta, as last gossiped.
	Meta []byte `json:"meta,omitempty"`
}

// Standing is this node's place in raft, when it is not a voter.
type Standing string

// Standings. The empty Standing is a voter's (or a node that knows no
// better).
const (
	// Removed: it was a voter and the cluster removed it.
	Removed Standing = "removed"
	// Joining: it started with NoBootstrap and is not a voter yet.
	Joining Standing = "joining"
)

// Status is the cluster as this node sees it.
type Status struct {
	Self string `json:"self"`
	// Leader is the raft leader's name, "" when none is known.
	Leader string `json:"leader"`
	// Quorum: a leader is known and had contact with a majority recently
	// (it is this node, which steps down after LeaderLeaseTimeout without
	// one, or it reached this node within HeartbeatTimeout).
	Quorum bool `json:"quorum"`
	// Electing: no quorum, for less than ElectionGrace: a leader handed
	// its office on, or died, and the election that replaces it runs.
	// Status says so; it warns of no quorum only once that lasts longer.
	Electing bool          `json:"electing,omitempty"`
	Voters   []string      `json:"voters"`
	Members  []MemberState `json:"members"`
	// Standing is set when this node is not a voter (removed, or joining
	// and not added yet): then Leader is "", Quorum false, Voters the
	// cluster's as told, and NotAVoter says it in words.
	Standing  Standing `json:"standing,omitempty"`
	NotAVoter string   `json:"not_a_voter,omitempty"`
}
