package node

import (
	"errors"
	"fmt"

	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Cause says why a volume, or its link to one peer, is not doing its usual
// job. Decisions are made on the Cause; the text that goes with it
// (reason) is for people. Status shows both (reason_code, reason).
type Cause string

// Causes. Those the volume's state machine sets are its words.
const (
	CauseNone Cause = ""
	// CauseWaitingForPeer: a node that restarted as primary serves no IO
	// until a peer compared generations and epochs with it (DRBD's
	// wait-for-connection), or an operator forces it.
	CauseWaitingForPeer = Cause(volstate.CauseWaitingForPeer)
	// CauseFenced: a primary of a newer epoch exists; IO stopped.
	CauseFenced = Cause(volstate.CauseFenced)
	// CauseSplitBrain: both nodes changed the data since their last common
	// generation; neither syncs until a policy or an operator picks a victim.
	CauseSplitBrain = Cause(volstate.CauseSplitBrain)
	// CauseUnrelated: the peer's data shares no generation with this node's.
	CauseUnrelated Cause = "unrelated-data"
	// CauseNoSource: the generations say the peer holds newer data but it
	// has nothing consistent to copy, or neither node holds data.
	CauseNoSource Cause = "no-source"
	// CauseAdminDown: the operator disconnected this node.
	CauseAdminDown Cause = "disconnected-by-operator"
	// CauseDetached: the local disk failed and is out of service.
	CauseDetached = Cause(volstate.CauseDetached)
	// CauseDiscarding: the operator told this node to give up its changes
	// after a split brain; it waits for the primary to overwrite them.
	CauseDiscarding = Cause(volstate.CauseDiscarding)
	// CausePulling: this primary copies newer data from its peer.
	CausePulling = Cause(volstate.CausePulling)
	// CauseStateWriteFailed: the volume's state could not be written to
	// stable storage; IO stopped rather than risk a wrong UpToDate.
	CauseStateWriteFailed = Cause(volstate.CauseStateWriteFailed)
	// CauseDiskFailed: a replicated write failed on this secondary's disk.
	CauseDiskFailed Cause = "disk-failed"
	// CauseFrameRefused: the peer refused a frame whose blocks did not
	// match the checksums they came with (damaged on the way); the
	// stream is retried and the frame's blocks resynced.
	CauseFrameRefused Cause = "frame-refused"
	// CauseSourceUnrecoverable: the resync to the peer reached a block
	// this node holds bad (it fails its checksum) and no replica holds
	// good: it is not shipped, the peer stays out of sync in it (not
	// UpToDate), and the resync is retried; a write to the block (its
	// block-unrecoverable event names it) lets it finish.
	CauseSourceUnrecoverable Cause = "source-unrecoverable"
	// CausePeerLost: the link to the peer failed; it is being retried.
	CausePeerLost Cause = "peer-lost"
	// CausePeerTimeout: the peer answered nothing for peer_timeout.
	CausePeerTimeout Cause = "peer-timeout"
	// CauseRefused: the peer refused the stream (retried).
	CauseRefused Cause = "refused"
	// CauseIdentity: a certificate was refused on the link (retried): the
	// peer's (of another CA, naming another node), or this node's by the
	// peer.
	CauseIdentity Cause = "identity-refused"
	// CauseWireVersion: the two nodes' replication wire versions are more
	// than one apart (retried: an upgrade of one of them ends it).
	CauseWireVersion Cause = "wire-version"
	// CauseNoVolume: the peer's cluster file does not list the volume
	// (it was not reloaded yet after the volume was added): retried.
	CauseNoVolume Cause = "no-such-volume"
	// CauseRemoved: the volume was removed from this node's cluster file
	// and is stopping.
	CauseRemoved Cause = "removed"
)

// reason is a Cause and its words.
type reason struct {
	cause Cause
	text  string
}

func because(c Cause, format string, a ...any) reason {
	return reason{cause: c, text: fmt.Sprintf(format, a...)}
}

// Errors with a class, checked with errors.Is.
var (
	// ErrNotPrimary: the volume is not served here (any more).
	ErrNotPrimary = errors.New("not primary")
	// ErrNotServing: this node is primary but holds its IO (waiting for a
	// peer, fenced, or in a switchover).
	ErrNotServing = errors.New("primary not serving IO")
	// ErrStaleEpoch: a peer holds a newer epoch.
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrSplitBrain: both nodes changed the data.
	ErrSplitBrain = errors.New("split brain")
	// ErrUnrelated: the peer's data shares no generation with ours.
	ErrUnrelated = errors.New("unrelated data")
	// ErrPeerTimeout: the peer answered nothing for peer_timeout.
	ErrPeerTimeout = session.ErrPeerTimeout
	// ErrStateWrite: the volume's state could not be made durable.
	ErrStateWrite = errors.New("state not durable")
	// ErrHasClients: a switchover was refused while NBD clients are
	// connected to the old primary, or a mount holds the volume's claim
	// there (claims.go).
	ErrHasClients = errors.New("the primary has NBD clients")
	// ErrNotSplitBrain: discard-my-data outside a split brain.
	ErrNotSplitBrain = errors.New("not in a split brain")
)

// refusal ends a connection attempt without a stream: the peer refused
// it, or the generations forbid syncing either way.
type refusal struct {
	cause Cause
	// final: it holds until an operator acts; the primary stops trying
	// (StandAlone). Otherwise it tries again.
	final bool
	// rule is the generation rule behind it, text the words for people.
	rule, text string
	// peerPrimary and peerEpoch: the refusing node is primary, at that epoch.
	peerPrimary bool
	peerEpoch   uint64
	// peer: what the other side changed since a split brain.
	peer replication.SplitBrainSide
	// was: the peer's replication state before the handshake whose step
	// refused it (the step made it StandAlone); empty for the peer's own
	// refusal.
	was replication.ReplState
}

// refusalOf classifies a peer's refusal.
func refusalOf(r replication.HelloReply) *refusal {
	out := &refusal{final: r.Refused.Final(), rule: r.Rule, text: r.Reason, peerPrimary: r.Primary, peerEpoch: r.Epoch,
		peer: replication.SplitBrainSide{Changes: r.Changes, PrimarySince: r.PrimarySince}}
	switch r.Refused {
	case replication.RefusedNewerEpoch:
		out.cause = CauseFenced
	case replication.RefusedSplitBrain:
		out.cause = CauseSplitBrain
	case replication.RefusedUnrelated:
		out.cause = CauseUnrelated
	case replication.RefusedAdminDown:
		out.cause = CauseAdminDown
	case replication.RefusedIdentity:
		out.cause = CauseIdentity
	case replication.RefusedWireVersion:
		out.cause = CauseWireVersion
	case replication.RefusedNoVolume:
		out.cause = CauseNoVolume
	default:
		out.cause = CauseRefused
	}
	return out
}

func (r *refusal) Error() string {
	if r.text != "" {
		return fmt.Sprintf("refused (%s): %s", r.cause, r.text)
	}
	return fmt.Sprintf("refused (%s, rule %s)", r.cause, r.rule)
}

func (r *refusal) Is(target error) bool {
	switch target {
	case ErrSplitBrain:
		return r.cause == CauseSplitBrain
	case ErrUnrelated:
		return r.cause == CauseUnrelated
	case ErrStaleEpoch:
		return r.cause == CauseFenced
	}
	return false
}
