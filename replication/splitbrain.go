package replication

import "fmt"

// AfterSplitBrain is a volume's policy when two nodes both took writes as
// primary (DRBD's after-sb-0pri names).
type AfterSplitBrain string

// Split-brain policies.
const (
	// SBDisconnect: stay StandAlone; the operator chooses the victim.
	SBDisconnect AfterSplitBrain = "disconnect"
	// SBDiscardYoungerPrimary: the node that became primary last gives up
	// its changes.
	SBDiscardYoungerPrimary AfterSplitBrain = "discard-younger-primary"
	// SBDiscardLeastChanges: the node with fewer changed bytes gives up
	// its changes; a tie is left to the operator.
	SBDiscardLeastChanges AfterSplitBrain = "discard-least-changes"
	// SBDiscardZeroChanges: a node that changed nothing since the split
	// resyncs from the other; if both changed, the operator chooses.
	SBDiscardZeroChanges AfterSplitBrain = "discard-zero-changes"
)

// ParseAfterSplitBrain checks a policy name; "" is disconnect.
func ParseAfterSplitBrain(s string) (AfterSplitBrain, error) {
	switch p := AfterSplitBrain(s); p {
	case "":
		return SBDisconnect, nil
	case SBDisconnect, SBDiscardYoungerPrimary, SBDiscardLeastChanges, SBDiscardZeroChanges:
		return p, nil
	}
	return "", fmt.Errorf("after-sb %q: want disconnect, discard-younger-primary, discard-least-changes or discard-zero-changes", s)
}

// SplitBrainSide is what one side knows of itself at a split brain.
type SplitBrainSide struct {
	// Changes is the bytes it wrote since the split (its bitmap for the
	// other side).
	Changes int64
	// PrimarySince is when it became primary (unix nanoseconds).
	PrimarySince int64
}

// SplitBrainVictim is who gives up its changes.
type SplitBrainVictim int

// Victims.
const (
	VictimNone SplitBrainVictim = iota // the operator decides
	VictimMe
	VictimPeer
)

func (v SplitBrainVictim) String() string {
	return [...]string{"none", "me", "peer"}[v]
}

// ResolveSplitBrain applies policy to a split brain as seen from one side.
// Both sides, given the same two facts, name the same node.
func ResolveSplitBrain(policy AfterSplitBrain, me, peer SplitBrainSide) SplitBrainVictim {
	switch policy {
	case SBDiscardZeroChanges:
		switch {
		case me.Changes == 0 && peer.Changes != 0:
			return VictimMe
		case peer.Changes == 0 && me.Changes != 0:
			return VictimPeer
		}
	case SBDiscardLeastChanges:
		switch {
		case me.Changes < peer.Changes:
			return VictimMe
		case peer.Changes < me.Changes:
			return VictimPeer
		}
	case SBDiscardYoungerPrimary:
		switch {
		case me.PrimarySince > peer.PrimarySince:
			return VictimMe
		case peer.PrimarySince > me.PrimarySince:
			return VictimPeer
		}
	}
	return VictimNone
}
