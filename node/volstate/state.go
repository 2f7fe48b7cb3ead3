package volstate

import (
	"maps"
	"time"

	"github.com/replvol/replvol/replication"
)

// Serving is what the volume does with IO on this node: one value where
// there were five booleans. A detached disk is no serving state: it is
// the disk state Diskless, and a primary serves through a peer meanwhile.
type Serving uint8

const (
	// Stopped: no IO. A secondary, or a primary between roles (a
	// handover, a step-down, a discard, a shutdown) or whose state could
	// not be written.
	Stopped Serving = iota
	// Open: a primary serving IO (in authority mode, while it holds its
	// lease: IO freezes without one).
	Open
	// OpenWithoutLease: forced to primary while raft had no quorum; it
	// serves without a lease until raft records it.
	OpenWithoutLease
	// Waiting: restarted as primary, it serves nothing until a peer (or,
	// in authority mode, raft) confirmed that no newer primary exists.
	Waiting
	// Fenced: a primary of a newer epoch exists; IO stopped until that
	// primary reaches this node, then it steps down (or finds a split
	// brain).
	Fenced
)

func (s Serving) String() string {
	switch s {
	case Stopped:
		return "Stopped"
	case Open:
		return "Open"
	case OpenWithoutLease:
		return "OpenWithoutLease"
	case Waiting:
		return "Waiting"
	case Fenced:
		return "Fenced"
	}
	return "Serving(?)"
}

// IsOpen reports whether a primary in this state serves IO (subject to
// its lease when Open).
func (s Serving) IsOpen() bool { return s == Open || s == OpenWithoutLease }

// Cause is why the volume is not doing its usual job: node's cause words
// (node.Cause), which node gives its own texts.
type Cause string

// Causes the state machine sets.
const (
	CauseNone             Cause = ""
	CauseWaitingForPeer   Cause = "waiting-for-peer"
	CauseFenced           Cause = "fenced"
	CauseSplitBrain       Cause = "split-brain"
	CauseDiscarding       Cause = "discarding"
	CausePulling          Cause = "pulling"
	CauseDetached         Cause = "detached"
	CauseStateWriteFailed Cause = "state-write-failed"
	// CauseUnrelated: a peer's data shares no generation with this node's.
	CauseUnrelated Cause = "unrelated-data"
	// CauseNoSource: neither side of a connection holds data to copy.
	CauseNoSource Cause = "no-source"
	// CauseAdminDown: the operator disconnected this node from the volume.
	CauseAdminDown Cause = "disconnected-by-operator"
	// CauseRefused: this node refused a primary's stream (an older epoch,
	// or the epoch of another primary).
	CauseRefused Cause = "refused"
	// CauseDiskFailed: a replicated write failed on this secondary's disk.
	CauseDiskFailed Cause = "disk-failed"
	// CauseRemoved: the cluster file no longer lists the volume.
	CauseRemoved Cause = "removed"
)

// Durable is the part of the state that survives a restart; it changes
// only through Ready.Persist, which the driver writes to stable storage
// BEFORE the state that holds it is installed.
type Durable struct {
	// Epoch is the highest primary epoch this node agreed to, held by
	// Primary ("" when unknown); this node is primary when Primary is
	// itself.
	Epoch   uint64
	Primary string
	// Gens are the data generations.
	Gens replication.Generations
	// SyncGen is, while Gens.Current is zero because a resync into this
	// disk is under way, the generation it resumes from.
	SyncGen replication.Generation
	// LocalStale: this disk was detached and misses writes its peers hold.
	LocalStale bool
	// PrimarySince is when this node last became primary.
	PrimarySince time.Time
}

// Clone returns a copy that shares nothing with d.
func (d Durable) Clone() Durable {
	d.Gens = d.Gens.Clone()
	return d
}

// Peer is what this node knows of one other node of the volume.
type Peer struct {
	// Repl is its replication state as this node sees it.
	Repl replication.ReplState
	// Session numbers the stream Repl belongs to: an event of an older
	// stream (one that ended) changes nothing.
	Session uint64
	// SplitBrainRule is set (to the rule that found it) while this node
	// is in a split brain with the peer.
	SplitBrainRule string
	// Pulling: this primary copies newer data from the peer.
	Pulling bool
	// InSync and Marked are facts the driver reads from the peer when
	// the step is taken; the rules read them and never set them. InSync:
	// the peer holds every write (its stream connected, its disk
	// UpToDate, nothing marked for it). Marked: its bitmap holds bits.
	InSync, Marked bool
}

// Streamed is the rule of a stream's own news: the peer's state after e.
// down: replication of the volume is down (the operator disconnected it,
// or it stops), so a lost stream is not re-established. The congestion
// controller (replication.Congestion) decides when a stream congests and
// drains; this rule says what the peer is shown meanwhile:
//
//   - Ahead only while its stream marks its writes: from Connected or from
//     a resync (which pauses), never while writes are shipped, never for a
//     peer not streaming;
//   - drained, back to the resync when one goes on, else Connected;
//   - a catch-up is SyncSource, unless the peer is Ahead again;
//   - in sync once it acknowledged the primary's generation, unless it
//     is Ahead (its blocks are marked again).
func (p Peer) Streamed(e StreamEvent, down bool) Peer {
	if _, session := e.Stream(); session != p.Session {
		return p
	}
	switch e := e.(type) {
	case PeerLost:
		p.Repl, p.Pulling = replication.Connecting, false
		if down {
			p.Repl = replication.StandAlone
		}
	case PeerCongested:
		if p.Repl == replication.Connected || p.Repl == replication.SyncSource {
			p.Repl = replication.Ahead
		}
	case PeerDrained:
		if p.Repl == replication.Ahead {
			p.Repl = replication.Connected
			if e.Resyncing {
				p.Repl = replication.SyncSource
			}
		}
	case PeerCatchingUp:
		if p.Repl == replication.Connected {
			p.Repl = replication.SyncSource
		}
	case PeerInSync:
		p = p.inSync()
	}
	return p
}

// inSync: the peer holds the primary's generation.
func (p Peer) inSync() Peer {
	if p.Repl == replication.SyncSource {
		p.Repl = replication.Connected
	}
	return p
}

// streaming reports whether the peer takes this primary's stream.
func (p Peer) streaming() bool {
	switch p.Repl {
	case "", replication.StandAlone, replication.Connecting:
		return false
	}
	return true
}

// State is one volume on one node: everything its rules read.
type State struct {
	// Self names this node, and SelfID is its node ID (it breaks the
	// tie of the generation rules when both nodes crashed as primary).
	Self   string
	SelfID uint32
	// Durable is what is on stable storage.
	Durable Durable
	// Serving is what it does with IO.
	Serving Serving
	// Disk is the local disk's state (Diskless while detached).
	Disk replication.DiskState
	// Why says why it does not do its usual job.
	Why Cause
	// Peers holds every other node of the volume.
	Peers map[string]Peer
	// KnownEpoch is the highest epoch heard of from a peer.
	KnownEpoch uint64
	// Auth: authority mode (raft names the primary, leases gate IO).
	Auth bool
	// Fresh: the volume was created by this start.
	Fresh bool
	// CrashedPrimary: it went down as primary (the indicator was set).
	CrashedPrimary bool
	// AdminDown: the operator disconnected this node.
	AdminDown bool
	// Discard: the operator made this node give up its data after a
	// split brain; it follows the next primary that connects.
	Discard bool
	// LeaseEpoch is the term whose lease renewals run (0: none), and
	// LeaseUntil the end of the lease they got.
	LeaseEpoch uint64
	LeaseUntil time.Time
	// Pending is a role change waiting for IO to drain (Quiesced
	// completes it), or a handover waiting for the peer (HandedOver).
	Pending *Pending
	// Stopping: the volume shuts down; nothing starts serving.
	Stopping bool
	// LocalMissing: the local disk misses blocks it must copy back from a
	// peer (a fact the driver reads when the step is taken, as
	// Peer.InSync).
	LocalMissing bool
	// NoRaftLeader: no raft leader answers this node now, so what its
	// copy of raft's state machine says may be old (a fact the driver
	// reads when the step is taken). Raft's promotion of this node waits
	// for one: raft may have named another primary since.
	NoRaftLeader bool
}

// PendingKind says what a Pending change is.
type PendingKind uint8

const (
	// PendingStepDown: become Secondary under Pending.To at Pending.Epoch.
	PendingStepDown PendingKind = iota + 1
	// PendingDiscard: give up the data (discard-my-data on a primary).
	PendingDiscard
	// PendingHandover: a switchover to Pending.To (demote).
	PendingHandover
)

func (k PendingKind) String() string {
	switch k {
	case PendingStepDown:
		return "step-down"
	case PendingDiscard:
		return "discard"
	case PendingHandover:
		return "handover"
	}
	return "?"
}

// Pending is a role change under way.
type Pending struct {
	Kind  PendingKind
	To    string
	Epoch uint64
	// Recheck: compare generations with UUIDs again once IO drained (a
	// write completed meanwhile may have started a new generation).
	Recheck bool
	UUIDs   replication.UUIDSet
	// Was is the serving state to restore when a handover is aborted.
	Was Serving
}

// Role is the node's role: Primary when the durable state names it.
func (s State) Role() replication.Role {
	if s.Durable.Primary == s.Self {
		return replication.Primary
	}
	return replication.Secondary
}

// IdleDisk is the disk state of a node that is in no stream.
func (s State) IdleDisk() replication.DiskState {
	switch {
	case s.Durable.LocalStale && (s.Disk == replication.Diskless || s.Disk == replication.Inconsistent):
		// A detached disk stays out of service (or being copied back),
		// whatever the role: it misses writes its peers hold.
		return s.Disk
	case s.Durable.Gens.Current.IsZero():
		return replication.Inconsistent
	case s.Role() == replication.Primary:
		return replication.UpToDate
	default:
		return replication.Consistent
	}
}

// InSplitBrain reports whether a split brain with any peer is unresolved.
func (s State) InSplitBrain() bool {
	for _, p := range s.Peers {
		if p.SplitBrainRule != "" {
			return true
		}
	}
	return false
}

// UUIDs is this node's generation set toward peer, as a handshake sends it.
func (s State) UUIDs(peer string) replication.UUIDSet {
	u := s.Durable.Gens.Toward(peer)
	if u.Current.IsZero() {
		u.Current = s.Durable.SyncGen
	}
	u.CrashedPrimary, u.NodeID = s.CrashedPrimary, s.SelfID
	return u
}

// Clone returns a copy that shares nothing with s.
func (s State) Clone() State {
	s.Durable = s.Durable.Clone()
	s.Peers = maps.Clone(s.Peers)
	if s.Pending != nil {
		p := *s.Pending
		s.Pending = &p
	}
	return s
}

// Admission is what the volume does with one IO request now.
type Admission uint8

const (
	// Refuse: not serving here (not primary, or IO stopped).
	Refuse Admission = iota
	// Serve: the request runs.
	Serve
	// Freeze: the primary's lease ran out; the request waits (IO is
	// frozen, not failed) until it is renewed or another node takes over.
	Freeze
)

func (a Admission) String() string {
	switch a {
	case Serve:
		return "serve"
	case Freeze:
		return "freeze"
	}
	return "refuse"
}

// Admit says what an IO request arriving at now meets: a primary serves
// only while it holds the current epoch and, in authority mode, its lease.
func Admit(s State, now time.Time) Admission {
	switch {
	case s.Role() != replication.Primary || !s.Serving.IsOpen():
		return Refuse
	case !s.Auth || s.Serving == OpenWithoutLease || now.Before(s.LeaseUntil):
		return Serve
	}
	return Freeze
}
