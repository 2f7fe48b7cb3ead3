package replication

import "testing"

func TestResolveSplitBrain(t *testing.T) {
	older, younger := int64(100), int64(200)
	cases := []struct {
		name     string
		policy   AfterSplitBrain
		me, peer SplitBrainSide
		want     SplitBrainVictim
	}{
		{"disconnect never picks a victim", SBDisconnect, SplitBrainSide{0, older}, SplitBrainSide{4096, younger}, VictimNone},
		{"zero changes: I changed nothing", SBDiscardZeroChanges, SplitBrainSide{0, older}, SplitBrainSide{4096, younger}, VictimMe},
		{"zero changes: the peer changed nothing", SBDiscardZeroChanges, SplitBrainSide{8192, older}, SplitBrainSide{0, younger}, VictimPeer},
		{"zero changes: both changed", SBDiscardZeroChanges, SplitBrainSide{8192, older}, SplitBrainSide{4096, younger}, VictimNone},
		{"zero changes: neither changed", SBDiscardZeroChanges, SplitBrainSide{0, older}, SplitBrainSide{0, younger}, VictimNone},
		{"least changes: mine are fewer", SBDiscardLeastChanges, SplitBrainSide{4096, older}, SplitBrainSide{8192, younger}, VictimMe},
		{"least changes: the peer's are fewer", SBDiscardLeastChanges, SplitBrainSide{8192, older}, SplitBrainSide{4096, younger}, VictimPeer},
		{"least changes: a tie", SBDiscardLeastChanges, SplitBrainSide{4096, older}, SplitBrainSide{4096, younger}, VictimNone},
		{"younger primary: I am younger", SBDiscardYoungerPrimary, SplitBrainSide{8192, younger}, SplitBrainSide{0, older}, VictimMe},
		{"younger primary: the peer is younger", SBDiscardYoungerPrimary, SplitBrainSide{0, older}, SplitBrainSide{8192, younger}, VictimPeer},
		{"younger primary: same instant", SBDiscardYoungerPrimary, SplitBrainSide{0, older}, SplitBrainSide{0, older}, VictimNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ResolveSplitBrain(c.policy, c.me, c.peer); got != c.want {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			// The other side must name the same node.
			mirror := map[SplitBrainVictim]SplitBrainVictim{VictimNone: VictimNone, VictimMe: VictimPeer, VictimPeer: VictimMe}
			if got := ResolveSplitBrain(c.policy, c.peer, c.me); got != mirror[c.want] {
				t.Fatalf("the peer's view: got %v, want %v", got, mirror[c.want])
			}
		})
	}
	if _, err := ParseAfterSplitBrain("discard-everything"); err == nil {
		t.Fatal("accepted an unknown policy")
	}
}
