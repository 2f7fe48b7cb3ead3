package replication

import "fmt"

// UUIDSet is what one node knows of its data generations toward one peer
// (DRBD's generation identifiers, research/anchors-replication.md §1.6). Two
// nodes exchange their sets when they (re)connect and CompareUUIDs decides
// what the connection does.
//
// The zero Generation means "empty": no data yet, or none that is consistent.
// DRBD encodes the role in the lowest bit of a UUID and masks it before
// comparing; a Generation carries no role, so generations compare whole.
type UUIDSet struct {
	// Current names the data on the node's disk now.
	Current Generation `json:"current"`
	// Bitmap names the generation the node's bitmap for this peer tracks
	// changes from: the peer's data is Bitmap plus the marked blocks. Zero
	// while connected and in sync.
	Bitmap Generation `json:"bitmap"`
	// History holds older generations, newest first (at least two; zero
	// entries are unused).
	History []Generation `json:"history"`
	// CrashedPrimary is the primary indicator found set at attach: the node
	// was primary when it went down, so it may be "one write ahead".
	CrashedPrimary bool `json:"crashed_primary,omitempty"`
	// NodeID breaks the tie when both nodes crashed as primary: the lower
	// id becomes the SyncSource.
	NodeID uint32 `json:"node_id"`
}

// history returns History[i], or zero when there is no such entry.
func (s UUIDSet) history(i int) Generation {
	if i < len(s.History) {
		return s.History[i]
	}
	return Generation{}
}

// sameGeneration reports whether a and b name the same, real generation:
// two unused (zero) history entries prove nothing in common.
func sameGeneration(a, b Generation) bool { return !a.IsZero() && a == b }

// inHistory reports whether g (non-zero) is one of s's history generations.
func (s UUIDSet) inHistory(g Generation) bool {
	if g.IsZero() {
		return false
	}
	for _, h := range s.History {
		if h == g {
			return true
		}
	}
	return false
}

// historyIndex is g's place in s's history (0: the newest), -1 when g
// is zero or not there.
func (s UUIDSet) historyIndex(g Generation) int {
	if g.IsZero() {
		return -1
	}
	for i, h := range s.History {
		if h == g {
			return i
		}
	}
	return -1
}

// trackedSince reports whether g, a generation of s's history, came
// after the one s's bitmap tracks changes from (also in its history):
// the bitmap then marks every block changed since g that the peer did
// not take, for it marks every one since an older generation. (The peer
// reached g after the tracking began: a sync-done whose ack never came,
// and writes that missed the peer since.)
func (s UUIDSet) trackedSince(g Generation) bool {
	i, j := s.historyIndex(g), s.historyIndex(s.Bitmap)
	return i >= 0 && j > i
}

// withBitmapRetired returns s after a finished resync as SyncSource: the
// bitmap generation moves into the history and the bitmap UUID clears.
func (s UUIDSet) withBitmapRetired() UUIDSet {
	s.History = pushHistory(s.History, s.Bitmap)
	s.Bitmap = Generation{}
	return s
}

// UUIDOutcome is what a connection does after comparing generations.
type UUIDOutcome int

// Outcomes of CompareUUIDs, from the local node's point of view. String
// gives DRBD's words, which operators know from its kernel log.
const (
	// NoResync: both disks hold the same generation.
	NoResync UUIDOutcome = iota
	// BitmapResyncSource: I send the blocks marked in the bitmaps.
	BitmapResyncSource
	// BitmapResyncTarget: I receive the blocks marked in the bitmaps.
	BitmapResyncTarget
	// FullResyncSource: I send every block.
	FullResyncSource
	// FullResyncTarget: I receive every block.
	FullResyncTarget
	// SplitBrainAutoRecover: both changed the data since a common parent
	// that both bitmaps track; an after-sb policy may pick a victim and
	// resync the union of the bitmaps.
	SplitBrainAutoRecover
	// SplitBrainDisconnect: the data diverged and the bitmaps cannot tell
	// by how much; stay StandAlone until an operator decides.
	SplitBrainDisconnect
	// UnrelatedData: no generation in common; refuse and disconnect.
	UnrelatedData
)

func (o UUIDOutcome) String() string {
	switch o {
	case NoResync:
		return "no-sync"
	case BitmapResyncSource:
		return "source-use-bitmap"
	case BitmapResyncTarget:
		return "target-use-bitmap"
	case FullResyncSource:
		return "source-set-bitmap"
	case FullResyncTarget:
		return "target-set-bitmap"
	case SplitBrainAutoRecover:
		return "split-brain-auto-recover"
	case SplitBrainDisconnect:
		return "split-brain-disconnect"
	case UnrelatedData:
		return "unrelated-data"
	}
	return fmt.Sprintf("UUIDOutcome(%d)", int(o))
}

// Mirror returns the outcome the peer reaches from the same two sets.
func (o UUIDOutcome) Mirror() UUIDOutcome {
	switch o {
	case BitmapResyncSource:
		return BitmapResyncTarget
	case BitmapResyncTarget:
		return BitmapResyncSource
	case FullResyncSource:
		return FullResyncTarget
	case FullResyncTarget:
		return FullResyncSource
	}
	return o
}

// IsSource reports whether the local node sends data.
func (o UUIDOutcome) IsSource() bool { return o == BitmapResyncSource || o == FullResyncSource }

// IsTarget reports whether the local node receives data (and is
// Inconsistent until the resync ends).
func (o UUIDOutcome) IsTarget() bool { return o == BitmapResyncTarget || o == FullResyncTarget }

// IsSplitBrain reports whether the data diverged on both nodes.
func (o UUIDOutcome) IsSplitBrain() bool {
	return o == SplitBrainAutoRecover || o == SplitBrainDisconnect
}

// Rule names, after DRBD 9's (drbd_uuid_compare) so that logs read the same;
// RuleNumber gives DRBD 8.4's rule_nr.
const (
	RuleJustCreatedBoth            = "just-created-both"
	RuleJustCreatedSelf            = "just-created-self"
	RuleJustCreatedPeer            = "just-created-peer"
	RuleSyncSourceMissedFinish     = "sync-source-missed-finish"
	RuleSyncTargetPeerMissedFinish = "sync-target-peer-missed-finish"
	RuleSyncSourcePeerMissedFinish = "sync-source-peer-missed-finish"
	RuleSyncTargetMissedFinish     = "sync-target-missed-finish"
	RuleReconnected                = "reconnected"
	RuleCrashedPrimary             = "crashed-primary"
	RuleBitmapPeer                 = "bitmap-peer"
	RuleBitmapPeerHistory          = "bitmap-peer-history"
	RuleHistoryPeer                = "history-peer"
	RuleBitmapSelf                 = "bitmap-self"
	RuleBitmapSelfHistory          = "bitmap-self-history"
	RuleHistorySelf                = "history-self"
	RuleBitmapBoth                 = "bitmap-both"
	RuleHistoryBoth                = "history-both"
	RuleUnrelated                  = "unrelated"
	// RuleOutdatedPeer is not DRBD's: a primary's decision toward a peer
	// raft records Outdated (UUIDDecision.TowardOutdated).
	RuleOutdatedPeer = "outdated-peer"
	// RulePrimaryMissedFinish is not DRBD's either: equal current
	// generations where only the peer names a bitmap generation toward
	// this primary (the shapes of sync-target-missed-finish and
	// sync-target-peer-missed-finish). A primary that holds the
	// generation the peer holds took it with its data: a resync of which
	// it was the target ended (its ack lost), or the peer's bitmap is of
	// a term in which the peer was primary, and this node was resynced
	// past it since. Nothing on the peer is newer than the primary's copy
	// (a write the peer took that this primary missed would have moved the
	// peer's generation on), so the primary is the source of what either
	// marked, never the target: copying the peer's blocks back would lose
	// writes acknowledged since. DRBD makes no primary a sync target
	// (rr-conflict).
	RulePrimaryMissedFinish = "primary-missed-finish"
)

// UUIDDecision is the outcome of CompareUUIDs and the rule that chose it.
type UUIDDecision struct {
	Outcome UUIDOutcome
	// Rule names the row of the table that fired, for logs and status.
	Rule string
	// RuleNumber is DRBD 8.4's rule_nr for the same row.
	RuleNumber int
	// Repair, when non-nil, is the local set corrected for an event this
	// node missed (a resync's end or start that never reached its
	// metadata). The caller stores it BEFORE the resync it decided starts.
	Repair *UUIDSet
}

// String renders the decision the way DRBD logs it.
func (d UUIDDecision) String() string {
	return fmt.Sprintf("%v by rule=%s", d.Outcome, d.Rule)
}

// TowardOutdated is what a primary does instead of d with a peer that
// raft records Outdated: such a peer missed a write the cluster
// acknowledged (or was never counted in sync since), so it is NEVER the
// source of a copy onto the primary, which raft counts as holding every
// acknowledged write. A decision that would have the primary copy from
// it (a resync as target: equal generations where only the peer names a
// bitmap generation, an old one, left by an earlier term; or the peer's
// history holding the primary's current) becomes the resync of the same
// blocks the other way: the primary sends what either side marked. DRBD
// refuses a primary as sync target outright (rr-conflict disconnect);
// replvol pulls from a peer raft counts UpToDate, and from no other. A
// primary with no generation (a pull of its own was interrupted) is then
// refused as a source: nothing moves.
func (d UUIDDecision) TowardOutdated() UUIDDecision {
	switch d.Outcome {
	case BitmapResyncTarget:
		return UUIDDecision{Outcome: BitmapResyncSource, Rule: RuleOutdatedPeer, RuleNumber: d.RuleNumber}
	case FullResyncTarget:
		return UUIDDecision{Outcome: FullResyncSource, Rule: RuleOutdatedPeer, RuleNumber: d.RuleNumber}
	}
	return d
}

func decide(o UUIDOutcome, rule string, nr int) UUIDDecision {
	return UUIDDecision{Outcome: o, Rule: rule, RuleNumber: nr}
}

// CompareUUIDs decides what a connection between two nodes does from their
// generation sets: DRBD's drbd_uuid_compare (research/anchors-replication.md
// §1.6). local is this node's set toward the peer, peer is the set the peer
// sent; roles are the local then the peer's current role (Secondary when
// left out), which matter only when the current generations are equal
// and one node crashed as primary. It is pure: the caller persists Repair
// and performs the resync.
//
// The rows, in the order they are tried:
//
//	both empty                                  no-sync          just-created-both
//	I am empty, the peer is not                 full, target     just-created-self
//	the peer is empty, I am not                 full, source     just-created-peer
//	equal current, only I have a bitmap UUID    bitmap, source   sync-source-(peer-)missed-finish
//	equal current, only the peer has one        bitmap, target   sync-target-(peer-)missed-finish
//	equal current, no one crashed as primary    no-sync          reconnected
//	equal current, a crashed primary            bitmap, from the primary now, else from the crashed primary
//	peer bitmap == my current                   bitmap, target   bitmap-peer
//	my current in the peer's history, after
//	  the generation its bitmap tracks from     bitmap, target   bitmap-peer-history
//	my current in the peer's history            full, target     history-peer
//	my bitmap == peer current                   bitmap, source   bitmap-self
//	peer current in my history, after the
//	  generation my bitmap tracks from          bitmap, source   bitmap-self-history
//	peer current in my history                  full, source     history-self
//	bitmap UUIDs equal                          split brain, auto-recoverable  bitmap-both
//	a history generation in common              split brain, disconnect        history-both
//	nothing in common                           unrelated data   unrelated
//
// DRBD 8.4 has two more rows (51 and 71, the "missed start" of a resync:
// the peer's history[0] is my current and our older histories line up),
// for its rotation of the bitmap UUID into the history when a resync
// starts. replvol never does that (the target records the bitmap
// generation instead, durably, before any data moves), so those shapes
// only arise when a node was rolled back to an old snapshot, and DRBD's
// bitmap resync would then copy nothing of what changed since: here they
// fall to history-peer and history-self, a full resync.
//
// DRBD copies in full whenever the peer's current is only in the history.
// replvol's rows bitmap-peer-history and bitmap-self-history do not when
// the source's bitmap toward the peer tracks changes from an older
// generation of the same history: the peer then took a later generation
// (a sync-done whose ack never came) and writes missed it since, every
// one marked. Only the marked blocks move.
func CompareUUIDs(local, peer UUIDSet, roles ...Role) UUIDDecision {
	localRole, peerRole := Secondary, Secondary
	if len(roles) > 0 {
		localRole = roles[0]
	}
	if len(roles) > 1 {
		peerRole = roles[1]
	}
	self, other := local.Current, peer.Current

	switch {
	case self.IsZero() && other.IsZero():
		return decide(NoResync, RuleJustCreatedBoth, 10)
	case self.IsZero():
		return decide(FullResyncTarget, RuleJustCreatedSelf, 20)
	case other.IsZero():
		return decide(FullResyncSource, RuleJustCreatedPeer, 30)
	}

	if self == other {
		return compareEqualCurrent(local, peer, localRole, peerRole)
	}

	if !peer.Bitmap.IsZero() && peer.Bitmap == self {
		return decide(BitmapResyncTarget, RuleBitmapPeer, 50)
	}
	if peer.trackedSince(self) {
		return decide(BitmapResyncTarget, RuleBitmapPeerHistory, 55)
	}
	if peer.inHistory(self) {
		return decide(FullResyncTarget, RuleHistoryPeer, 60)
	}
	if !local.Bitmap.IsZero() && local.Bitmap == other {
		return decide(BitmapResyncSource, RuleBitmapSelf, 70)
	}
	if local.trackedSince(other) {
		return decide(BitmapResyncSource, RuleBitmapSelfHistory, 75)
	}
	if local.inHistory(other) {
		return decide(FullResyncSource, RuleHistorySelf, 80)
	}
	if !local.Bitmap.IsZero() && local.Bitmap == peer.Bitmap {
		return decide(SplitBrainAutoRecover, RuleBitmapBoth, 90)
	}
	for _, h := range local.History {
		if peer.inHistory(h) {
			return decide(SplitBrainDisconnect, RuleHistoryBoth, 100)
		}
	}
	return decide(UnrelatedData, RuleUnrelated, 1000)
}

// compareEqualCurrent is the part of the table where both current
// generations are equal (DRBD's rules 34–41).
func compareEqualCurrent(local, peer UUIDSet, localRole, peerRole Role) UUIDDecision {
	localBM, peerBM := !local.Bitmap.IsZero(), !peer.Bitmap.IsZero()
	switch {
	case localBM && !peerBM:
		if local.Bitmap == peer.history(0) && sameGeneration(local.history(0), peer.history(1)) {
			// I was SyncSource and missed the resync-finished event the
			// target recorded: retire my bitmap UUID as it did.
			d := decide(BitmapResyncSource, RuleSyncSourceMissedFinish, 34)
			repaired := local.withBitmapRetired()
			d.Repair = &repaired
			return d
		}
		// I was SyncSource and the target failed to record the end.
		return decide(BitmapResyncSource, RuleSyncSourcePeerMissedFinish, 36)
	case !localBM && peerBM:
		if localRole == Primary && peerRole != Primary {
			return decide(BitmapResyncSource, RulePrimaryMissedFinish, 37)
		}
		if peer.Bitmap == local.history(0) && sameGeneration(peer.history(0), local.history(1)) {
			// The peer will correct itself (its sync-source-missed-finish).
			return decide(BitmapResyncTarget, RuleSyncTargetPeerMissedFinish, 35)
		}
		return decide(BitmapResyncTarget, RuleSyncTargetMissedFinish, 37)
	}

	if !local.CrashedPrimary && !peer.CrashedPrimary {
		return decide(NoResync, RuleReconnected, 40)
	}
	// Equal generations but a node went down as primary: it may hold
	// writes the other never saw (its AL extents, now in its bitmap).
	if localRole == Primary || peerRole == Primary {
		switch {
		case localRole == Primary && peerRole == Primary:
			return decide(SplitBrainDisconnect, RuleCrashedPrimary, 41)
		case localRole == Primary:
			return decide(BitmapResyncSource, RuleCrashedPrimary, 41)
		default:
			return decide(BitmapResyncTarget, RuleCrashedPrimary, 41)
		}
	}
	switch {
	case local.CrashedPrimary && !peer.CrashedPrimary:
		return decide(BitmapResyncSource, RuleCrashedPrimary, 40)
	case !local.CrashedPrimary && peer.CrashedPrimary:
		return decide(BitmapResyncTarget, RuleCrashedPrimary, 40)
	case local.NodeID < peer.NodeID:
		return decide(BitmapResyncSource, RuleCrashedPrimary, 40)
	default:
		return decide(BitmapResyncTarget, RuleCrashedPrimary, 40)
	}
}
