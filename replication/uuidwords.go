package replication

import (
	"fmt"
	"strings"
)

// The generation rules in words, for people: status's notes and the
// "connected" event say what a connection did and why in these; the
// rule's name (DRBD's) stays in the logs and in the JSON (sync_rule,
// sync_decision, an event's reason).

// ruleWords says why a rule decided, from the primary's side of the
// handshake, of the peer it connected.
var ruleWords = map[string]string{
	RuleJustCreatedBoth:            "both copies were new",
	RuleJustCreatedSelf:            "the primary's copy was new",
	RuleJustCreatedPeer:            "its copy was new",
	RuleSyncSourceMissedFinish:     "an earlier resync to it had ended without the primary recording it",
	RuleSyncSourcePeerMissedFinish: "an earlier resync to it had not ended",
	RuleSyncTargetMissedFinish:     "an earlier resync from it had not ended",
	RuleSyncTargetPeerMissedFinish: "an earlier resync from it had ended without it recording it",
	RuleReconnected:                "both held the same data",
	RuleCrashedPrimary:             "a node had gone down as primary, so its last writes (its activity log) may be missing on the other",
	RuleBitmapPeer:                 "it had written since they last met",
	RuleBitmapPeerHistory:          "it had written since a resync from it whose end the primary did not learn",
	RuleHistoryPeer:                "it held newer data, and no record of what changed",
	RuleBitmapSelf:                 "the primary had written since they last met",
	RuleBitmapSelfHistory:          "the primary had written since a resync to it whose end it did not learn",
	RuleHistorySelf:                "the primary held newer data, and no record of what changed",
	RuleBitmapBoth:                 "both had written since they last met (a split brain)",
	RuleHistoryBoth:                "both had written since they last met (a split brain)",
	RuleUnrelated:                  "their data has no common history",
	RuleOutdatedPeer:               "it missed acknowledged writes (raft has it Outdated), so the primary's copy wins where either had changed",
	RulePrimaryMissedFinish:        "it named changes since a generation the primary holds, whose data the primary took with it, so the primary's copy wins where either had changed",
	"discard-my-data":              "the operator had it give up its changes since a split brain",
	"discard-my-data-unrelated":    "the operator had it give up its changes since a split brain, and its data had no common history",
}

// decisionWords says what a decision (a UUIDOutcome's String) did, from
// the primary's side, for the peer it connected.
var decisionWords = map[string]string{
	NoResync.String():              "nothing to resync",
	BitmapResyncSource.String():    "resynced the blocks that changed",
	FullResyncSource.String():      "resynced all of it",
	BitmapResyncTarget.String():    "the primary copied back the blocks that changed",
	FullResyncTarget.String():      "the primary copied all of it back",
	SplitBrainAutoRecover.String(): "refused: a split brain",
	SplitBrainDisconnect.String():  "refused: a split brain",
	UnrelatedData.String():         "refused: the data of the two has no common history",
}

// RuleWords says in words why a rule decided ("both had written since
// they last met (a split brain)"); a rule it does not know is named as it
// is.
func RuleWords(rule string) string {
	if why, ok := ruleWords[rule]; ok {
		return why
	}
	return "rule " + rule
}

// ConnectWords says in words what a peer's last connection did (decision,
// a UUIDOutcome's String as status and events carry it, possibly with a
// note in parentheses) and why (rule): "resynced all of it, as its copy
// was new". A decision or rule it does not know is given as it is.
func ConnectWords(decision, rule string) string {
	base, note, _ := strings.Cut(decision, " (")
	what, ok := decisionWords[base]
	switch {
	case !ok:
		what = decision
	case note != "":
		// Equal generations, but blocks were marked for the peer (a
		// write missed it): those are resynced.
		what = "resynced the blocks marked for it"
	}
	why, ok := ruleWords[rule]
	if !ok {
		if rule == "" {
			return what
		}
		return fmt.Sprintf("%s (rule %s)", what, rule)
	}
	return fmt.Sprintf("%s, as %s", what, why)
}
