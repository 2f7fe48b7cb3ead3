package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/pki"
)

// Member is one node of the cluster file. Every member is a raft voter, a
// witness too (two data nodes and a witness survive the loss of any one).
type Member struct {
	Name string `json:"name"`
	// Raft is the host:port of the node's raft stream (TCP).
	Raft string `json:"raft"`
	// Gossip is the host:port memberlist binds, UDP and TCP.
	Gossip string `json:"gossip"`
	// Witness: the node has no disks; it votes only.
	Witness bool `json:"witness,omitempty"`
}

// Forwarder sends a request to the node named leader and returns its
// HandleForward reply; its error is for a request that did not get a
// reply (the reply carries the leader's own errors). The node layer
// implements it over its control API (ForwardRequest and ForwardReply
// encode to JSON); it must honour ctx. It is called from the goroutine
// of Propose, RenewLease, ReleaseLease, AddVoter and RemoveVoter, never
// with a lock held.
type Forwarder func(ctx context.Context, leader string, req ForwardRequest) (ForwardReply, error)

// Config is what Open needs.
type Config struct {
	// Self is this node's name among Members.
	Self    string
	Members []Member
	// Dir holds raft.db (the raft log and stable state) and the raft
	// snapshots.
	Dir    string
	Logger *slog.Logger
	// RaftListener, if set, accepts raft's connections (tests pass
	// 127.0.0.1:0; Self's Raft must be its address). If it also has
	// raft.StreamLayer's Dial method, raft dials through it too: the seam
	// for TLS or fault injection. Nil: listen on Self's Raft address.
	RaftListener net.Listener
	// Forward carries requests to the leader.
	Forward Forwarder
	// TLS, when set, makes raft's connections mutual TLS 1.3 with the
	// cluster's CA (this node's certificate): only nodes of the CA are
	// heard, and a connection to a member's raft address must reach that
	// member. Nil: plaintext.
	TLS *pki.Bundle
	// GossipKey, when set, encrypts and authenticates every gossip
	// message and push/pull (memberlist's keyring, 16, 24 or 32 bytes): a
	// node without the key is not a member. Nil: plaintext.
	GossipKey []byte
	// Refused, when set, is told each refusal of a raft connection, of a
	// raft RPC or of a forwarded request (in words, once per peer and
	// cause) for the node's events. It must not block.
	Refused func(words string)
	// NoBootstrap is for a node added at runtime (replctl node add): it
	// starts with no raft configuration and waits for the leader's
	// AddVoter. Otherwise a node without raft state bootstraps with every
	// member as a voter; all nodes of one cluster file do so identically,
	// which raft allows.
	NoBootstrap bool
	Timing      Timing
	// Clock keeps the cluster's own time: the leases (when a leader took
	// office, when a renewal was sent and a grant ended, when no lease
	// can still be valid: LeaseFree, and Propose's wait for it), when
	// gossip last changed its mind of a member, the pauses of the rejoin
	// and membership loops and of a failed accept, and the raft port's
	// handshake deadlines. Nil is clock.Real(); a test sets a clock.Fake.
	// Raft and memberlist keep real time, which they take no clock for:
	// what is compared with raft's own times (its last contact with the
	// leader, a context's deadline handed to raft) is read on the real
	// clock (Cluster.raftTime), and so are the pauses that wait for raft
	// (a command asked again after a leadership transfer or a leader that
	// lost its office while committing it).
	Clock clock.Clock
}

// Timing holds the timeouts; a zero field takes its default.
type Timing struct {
	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are raft's
	// (defaults 500 ms, 500 ms and 250 ms: a lost leader is replaced within
	// about 1.5 s on a LAN).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// RaftIOTimeout bounds one raft RPC on the network (default 2 s).
	RaftIOTimeout time.Duration
	// LeaseDuration is the primary's lease (default 2 s).
	LeaseDuration time.Duration
	// LeaseDrift is how much faster or slower one node's clock may run
	// than another's, as a fraction (default 0.05): the primary holds its
	// lease for LeaseDuration×(1−LeaseDrift) from sending the request; the
	// leader counts it valid for LeaseDuration×(1+LeaseDrift) from the
	// grant.
	LeaseDrift float64
	// ProbeInterval, ProbeTimeout and SuspicionMult are memberlist's
	// (defaults 200 ms, 100 ms and 2: a dead node is declared so in about
	// 1 s on loopback or a LAN).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
	// RejoinInterval is how often a node tries to gossip again with
	// members it does not see alive (a partition heals, a node restarts;
	// default 1 s).
	RejoinInterval time.Duration
}

// ElectionGrace is how long a node may see no leader with a quorum before
// that is more than an election under way (a leader handing its office
// on, or one lost and replaced): the heartbeat timeout that notices the
// loss and two election rounds. Until then status says "electing"; after
// it, no quorum is a warning.
func (t Timing) ElectionGrace() time.Duration { return t.HeartbeatTimeout + 2*t.ElectionTimeout }

func (t Timing) withDefaults() Timing {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.HeartbeatTimeout, 500*time.Millisecond)
	def(&t.ElectionTimeout, 500*time.Millisecond)
	def(&t.LeaderLeaseTimeout, t.HeartbeatTimeout/2)
	def(&t.RaftIOTimeout, 2*time.Second)
	def(&t.LeaseDuration, 2*time.Second)
	def(&t.ProbeInterval, 200*time.Millisecond)
	def(&t.ProbeTimeout, t.ProbeInterval/2)
	def(&t.RejoinInterval, time.Second)
	if t.LeaseDrift == 0 {
		t.LeaseDrift = 0.05
	}
	if t.SuspicionMult == 0 {
		t.SuspicionMult = 2
	}
	return t
}

// validate checks cfg (with defaults) and returns Self's member.
func (cfg *Config) validate() (Member, error) {
	var self Member
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if cfg.Dir == "" {
		bad("no state directory")
	}
	seen := map[string]bool{}
	for _, m := range cfg.Members {
		if err := m.validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[m.Name] {
			bad("member %q twice", m.Name)
		}
		seen[m.Name] = true
		if m.Name == cfg.Self {
			self = m
		}
	}
	if !seen[cfg.Self] {
		bad("self %q is not among the members", cfg.Self)
	}
	if cfg.Forward == nil && len(cfg.Members) > 1 {
		bad("no Forwarder")
	}
	t := cfg.Timing
	if t.LeaseDrift < 0 || t.LeaseDrift >= 0.5 {
		bad("lease drift %v: want at least 0 and under 0.5", t.LeaseDrift)
	}
	if n := len(cfg.GossipKey); n != 0 && n != 16 && n != 24 && n != 32 {
		bad("gossip key of %d bytes: want 16, 24 or 32", n)
	}
	if t.LeaseDuration < 0 || t.SuspicionMult < 1 {
		bad("negative lease duration or suspicion multiplier")
	}
	if err := errors.Join(errs...); err != nil {
		return Member{}, fmt.Errorf("cluster config: %w", err)
	}
	return self, nil
}

func (m Member) validate() error {
	if m.Name == "" {
		return errors.New("a member without a name")
	}
	for _, a := range []struct{ what, addr string }{{"raft", m.Raft}, {"gossip", m.Gossip}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("member %s: %s address %q: %w", m.Name, a.what, a.addr, err)
		}
	}
	return nil
}
