package volstate

import (
	"fmt"
	"strings"

	"github.com/replvol/replvol/replication"
)

// Indicator is what a step does with the primary indicator in the
// metadata (the crashed-primary mark).
type Indicator uint8

const (
	// KeepIndicator: unchanged.
	KeepIndicator Indicator = iota
	// SetIndicator: set BEFORE Persist is written (and so BEFORE the
	// first write of the new primary). It is cleared by an action
	// (ClearPrimaryIndicator), AFTER the state names another primary.
	SetIndicator
)

// Ready is what a step asks of the driver, in this order: Prepare, what
// must be done BEFORE the new state may exist (the old primary's stream
// ended, the activity log marked toward a peer); the indicator when set, then
// Persist, both on stable storage BEFORE the new state is installed; then
// Actions, in order. ResetPeers among them is done in the same step as
// the install, before any IO sees the new role. When a write fails the
// driver keeps the old state and performs none of the Actions (Apply).
type Ready struct {
	Prepare   []Action
	Persist   *Durable
	Indicator Indicator
	Actions   []Action
	// Err refuses the event (an operator command that may not run now):
	// nothing changes.
	Err error
}

func (rd Ready) needsWrite() bool { return rd.Persist != nil || rd.Indicator != KeepIndicator }

// ActionKind names an action.
type ActionKind uint8

// Actions the driver performs.
const (
	// DrainIO: close the NBD export, answer the requests in flight, stop
	// the peers' senders and flush the bitmaps; then step Quiesced.
	DrainIO ActionKind = iota + 1
	// WaitIO: answer the requests in flight; then step Quiesced.
	WaitIO
	// HandOverIO: close the export, answer the requests in flight, flush
	// every replica and wait until the peer holds every write; then step
	// HandedOver (or HandoverAborted).
	HandOverIO
	// ClearPrimaryIndicator: flush the bitmaps, then clear the primary
	// indicator (the state names another primary by then).
	ClearPrimaryIndicator
	// StartPeers: start a sender for every peer (a restarted primary).
	StartPeers
	// ResetPeers: fresh senders for every peer, started unless the
	// operator disconnected this node (with the install of the state).
	ResetPeers
	// StopPeers: stop the senders and wait for them.
	StopPeers
	// DetachIncoming: end the stream of a primary applied here.
	DetachIncoming
	// ClearLocalMissing: the local disk misses nothing (it was adopted).
	ClearLocalMissing
	// StartLease: run the lease renewals of term Epoch.
	StartLease
	// StopLease: end the renewals; the lease runs out by itself.
	StopLease
	// ReleaseLease: hand the lease of Epoch back (a handover).
	ReleaseLease
	// Propose: propose Detail to raft (init, reclaim).
	Propose
	// StartResync: resync Peer as its SyncSource (every block when
	// Detail is FullResync).
	StartResync
	// StartPull: copy from Peer the newer blocks this node misses.
	StartPull
	// Reattach: probe the detached disk until it works.
	Reattach
	// CopyMissing: copy back what the local disk missed.
	CopyMissing
	// RunHook: run the hook Detail with Epoch.
	RunHook
	// Notify: log and record the event Detail (with Peer, Epoch).
	Notify
	// MarkActivityLog (a preparation): mark every extent of the activity
	// log out of sync toward Peer and flush that bitmap. The log holds
	// the extents this node wrote last, as primary or applying a
	// primary's stream; when the primary changes, a write of the old one
	// still in flight may have reached this node and not Peer, or Peer
	// and not this node, with no generation moved and nothing marked.
	// The new primary copies those extents to its peers (DRBD 9
	// reconciles the same way after it loses a primary).
	MarkActivityLog
	// RefusePeer: the handshake with Peer refuses to sync either way, by the
	// generation rule Detail, for Cause: the peer is StandAlone.
	RefusePeer
	// RefuseStream: this node refuses the stream of the primary Peer
	// (PrimaryReached), answering Refusal, by the rule Detail.
	RefuseStream
)

var actionNames = map[ActionKind]string{
	DrainIO: "drain-io", WaitIO: "wait-io", HandOverIO: "hand-over-io", ClearPrimaryIndicator: "clear-primary-indicator", StartPeers: "start-peers", ResetPeers: "reset-peers", StopPeers: "stop-peers",
	DetachIncoming: "detach-incoming", ClearLocalMissing: "clear-local-missing",
	StartLease: "start-lease", StopLease: "stop-lease", ReleaseLease: "release-lease", Propose: "propose",
	StartResync: "start-resync", StartPull: "start-pull", Reattach: "reattach", CopyMissing: "copy-missing",
	RunHook: "run-hook", Notify: "notify", MarkActivityLog: "mark-activity-log", RefusePeer: "refuse-peer",
	RefuseStream: "refuse-stream",
}

func (k ActionKind) String() string {
	if n, ok := actionNames[k]; ok {
		return n
	}
	return fmt.Sprintf("ActionKind(%d)", int(k))
}

// Action is one thing the driver does after the step's writes.
type Action struct {
	Kind   ActionKind
	Peer   string
	Epoch  uint64
	Detail string
	// Cause is why, for a Refuse.
	Cause Cause
	// Refusal is the answer a RefuseStream gives the primary.
	Refusal replication.Refusal
}

func (a Action) String() string {
	var b strings.Builder
	b.WriteString(a.Kind.String())
	if a.Detail != "" {
		b.WriteString(" " + a.Detail)
	}
	if a.Peer != "" {
		b.WriteString(" peer=" + a.Peer)
	}
	if a.Epoch != 0 {
		fmt.Fprintf(&b, " epoch=%d", a.Epoch)
	}
	if a.Cause != CauseNone {
		b.WriteString(" cause=" + string(a.Cause))
	}
	if a.Refusal != "" {
		b.WriteString(" refusal=" + string(a.Refusal))
	}
	return b.String()
}

// Apply steps s with e. It hands the step's preparations to prepare and
// its writes to persist (the driver's durable commit, which installs next
// in the same step once the writes are on stable storage). Only then does
// the volume take the new state and are the actions returned: when
// prepare or persist fails the volume keeps s (a failed write of a new
// generation stops its IO) and the event's actions do not happen.
func Apply(s State, e Event, prepare func([]Action) error, persist func(rd Ready, next State) error) (State, []Action, error) {
	next, rd := Step(s, e)
	if rd.Err != nil {
		return s, nil, rd.Err
	}
	if len(rd.Prepare) > 0 {
		if err := prepare(rd.Prepare); err != nil {
			return persistFailed(s, e), nil, err
		}
	}
	if rd.needsWrite() {
		if err := persist(rd, next); err != nil {
			return persistFailed(s, e), nil, err
		}
	}
	return next, rd.Actions, nil
}

// persistFailed is s after the writes of e failed: nothing changes,
// except that a primary that could not record that a peer misses writes
// stops its IO (a restart could take that peer for up to date), and the
// why of a start that could not be written.
func persistFailed(s State, e Event) State {
	switch e.(type) {
	case WriteMissed:
		if s.Role() == replication.Primary {
			s = s.Clone()
			s.Serving, s.Why = Stopped, CauseStateWriteFailed
		}
	case Started:
		// A restarted primary that cannot set its indicator serves
		// nothing (it never began), and says why.
		s = s.Clone()
		s.Why = CauseStateWriteFailed
	}
	return s
}
