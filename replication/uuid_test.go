package replication

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
)

// gen returns a fixed, non-zero generation named by a letter, so that a case
// reads as a GI line ("A:B:C:D").
func gen(name byte) Generation { return Generation{0: name, 15: 1} }

var (
	genA, genB, genC, genD, genE = gen('A'), gen('B'), gen('C'), gen('D'), gen('E')
	empty                        Generation
)

func set(current, bitmap Generation, history ...Generation) UUIDSet {
	h := make([]Generation, 2)
	copy(h, history)
	return UUIDSet{Current: current, Bitmap: bitmap, History: h}
}

// TestCompareUUIDs has one case per row of DRBD's generation table
// (research/anchors-replication.md §1.6, drbd_uuid_compare), named after the
// situation that leads to it. Each case also checks that the peer, comparing
// the same two sets from its side, reaches the mirror outcome, so the two
// nodes never both want to be SyncSource or SyncTarget.
func TestCompareUUIDs(t *testing.T) {
	crashed := func(s UUIDSet, node uint32) UUIDSet { s.CrashedPrimary = true; s.NodeID = node; return s }
	node := func(s UUIDSet, id uint32) UUIDSet { s.NodeID = id; return s }
	cases := []struct {
		name        string
		local, peer UUIDSet
		roles       []Role
		want        UUIDOutcome
		rule        string
		repair      *UUIDSet
	}{
		{"both freshly created: nothing happens until an initial sync is forced",
			set(empty, empty), set(empty, empty), nil, NoResync, RuleJustCreatedBoth, nil},
		{"my disk is empty, the peer has data",
			set(empty, empty), set(genA, empty), nil, FullResyncTarget, RuleJustCreatedSelf, nil},
		{"the peer's disk is empty, I have data",
			set(genA, empty), set(empty, empty), nil, FullResyncSource, RuleJustCreatedPeer, nil},
		{"I was SyncSource and missed the resync-finished event the target recorded",
			set(genA, genB, genC, genD), set(genA, empty, genB, genC), nil, BitmapResyncSource, RuleSyncSourceMissedFinish,
			&UUIDSet{Current: genA, History: []Generation{genB, genC}}},
		{"the peer was SyncSource and missed the resync-finished event I recorded",
			set(genA, empty, genB, genC), set(genA, genB, genC, genD), nil, BitmapResyncTarget, RuleSyncTargetPeerMissedFinish, nil},
		{"I was SyncSource and the target failed to record the resync's end",
			set(genA, genB, genC), set(genA, empty, genD), nil, BitmapResyncSource, RuleSyncSourcePeerMissedFinish, nil},
		{"I was SyncTarget and failed to record the resync's end",
			set(genA, empty, genD), set(genA, genB, genC), nil, BitmapResyncTarget, RuleSyncTargetMissedFinish, nil},
		{"equal current generations after a replication link hiccup",
			set(genA, empty, genB), set(genA, empty, genB), nil, NoResync, RuleReconnected, nil},
		{"equal current, I crashed as primary and am primary again",
			crashed(set(genA, empty), 1), set(genA, empty), []Role{Primary, Secondary}, BitmapResyncSource, RuleCrashedPrimary, nil},
		{"equal current, I crashed as primary but the peer is primary now",
			crashed(set(genA, empty), 1), set(genA, empty), []Role{Secondary, Primary}, BitmapResyncTarget, RuleCrashedPrimary, nil},
		{"equal current, a crashed primary and both primary now",
			crashed(set(genA, empty), 1), set(genA, empty), []Role{Primary, Primary}, SplitBrainDisconnect, RuleCrashedPrimary, nil},
		{"equal current, both secondary, I crashed as primary",
			crashed(set(genA, empty), 2), node(set(genA, empty), 1), nil, BitmapResyncSource, RuleCrashedPrimary, nil},
		{"equal current, both secondary, the peer crashed as primary",
			node(set(genA, empty), 1), crashed(set(genA, empty), 2), nil, BitmapResyncTarget, RuleCrashedPrimary, nil},
		{"equal current, both crashed as primary: the lower node id is the source",
			crashed(set(genA, empty), 1), crashed(set(genA, empty), 2), nil, BitmapResyncSource, RuleCrashedPrimary, nil},
		{"peer bitmap UUID equals my current: I am the secondary that was away",
			set(genA, empty, genC), set(genB, genA, genC), nil, BitmapResyncTarget, RuleBitmapPeer, nil},
		{"the peer's history starts with my current, our older histories line up: I was rolled back to a snapshot, full resync (no DRBD missed-start)",
			set(genA, empty, genC), set(genB, genD, genA, genC), nil, FullResyncTarget, RuleHistoryPeer, nil},
		{"unused history entries prove no missed start: a primary restored from an old snapshot copies everything",
			set(genA, empty), set(genB, empty, genA), nil, FullResyncTarget, RuleHistoryPeer, nil},
		{"my current is in the peer's history: common ancestor, the peer's bitmap is useless",
			set(genA, empty, genC), set(genB, empty, genD, genA), nil, FullResyncTarget, RuleHistoryPeer, nil},
		{"my bitmap UUID equals the peer's current: the peer was away while I wrote",
			set(genB, genA, genC), set(genA, empty, genC), nil, BitmapResyncSource, RuleBitmapSelf, nil},
		{"the peer's current is in my history after the generation my bitmap tracks from: it took a sync-done whose ack I lost, then missed writes",
			set(genB, genC, genA, genC), set(genA, empty, genC), nil, BitmapResyncSource, RuleBitmapSelfHistory, nil},
		{"my current is in the peer's history after the generation its bitmap tracks from: the mirror of the row above",
			set(genA, empty, genC), set(genB, genC, genA, genC), nil, BitmapResyncTarget, RuleBitmapPeerHistory, nil},
		{"the peer's current is in my history, my bitmap tracks from a later generation: full resync (the peer was rolled back)",
			set(genB, genD, genD, genA), set(genA, empty, genE), nil, FullResyncSource, RuleHistorySelf, nil},
		{"my history starts with the peer's current, our older histories line up: the peer was rolled back, full resync (no DRBD missed-start)",
			set(genB, genD, genA, genC), set(genA, empty, genC), nil, FullResyncSource, RuleHistorySelf, nil},
		{"the peer's current is in my history: full resync from me",
			set(genB, empty, genD, genA), set(genA, empty, genC), nil, FullResyncSource, RuleHistorySelf, nil},
		{"bitmap UUIDs equal, currents differ: split brain with a common parent",
			set(genB, genA, genD), set(genC, genA, genE), nil, SplitBrainAutoRecover, RuleBitmapBoth, nil},
		{"only a history generation in common: split brain with unrelated ancestors",
			set(genB, genD, genA), set(genC, genE, genA), nil, SplitBrainDisconnect, RuleHistoryBoth, nil},
		{"nothing in common: unrelated data",
			set(genA, genB, genC), set(genD, genE, gen('F')), nil, UnrelatedData, RuleUnrelated, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := CompareUUIDs(c.local, c.peer, c.roles...)
			if d.Outcome != c.want || d.Rule != c.rule {
				t.Fatalf("got %v, want %v by rule=%s", d, c.want, c.rule)
			}
			if d.RuleNumber == 0 {
				t.Error("decision carries no DRBD rule number")
			}
			switch {
			case c.repair == nil && d.Repair != nil:
				t.Errorf("unexpected repair %+v", *d.Repair)
			case c.repair != nil && (d.Repair == nil || !sameSet(*d.Repair, *c.repair)):
				t.Errorf("repair = %+v, want %+v", d.Repair, *c.repair)
			}
			var mirrorRoles []Role
			if len(c.roles) == 2 {
				mirrorRoles = []Role{c.roles[1], c.roles[0]}
			}
			m := CompareUUIDs(c.peer, c.local, mirrorRoles...)
			if m.Outcome != d.Outcome.Mirror() {
				t.Errorf("peer decides %v, want the mirror of %v", m, d)
			}
		})
	}
}

func sameSet(a, b UUIDSet) bool {
	if a.Current != b.Current || a.Bitmap != b.Bitmap || a.CrashedPrimary != b.CrashedPrimary {
		return false
	}
	for i := range max(len(a.History), len(b.History)) {
		if a.history(i) != b.history(i) {
			return false
		}
	}
	return true
}

// TestUUIDLifecycle builds the common situations by the transitions node/
// makes (Generations' methods), rather than by hand, and checks the rule
// each one meets.
func TestUUIDLifecycle(t *testing.T) {
	// Two connected, in-sync nodes.
	primary := Generations{Current: genA, History: []Generation{genC}}.Clone()
	secondary := primary.Clone()

	// The secondary goes away; the primary writes: a new generation.
	primary = primary.PeerMisses("s", empty, genB)
	if d := CompareUUIDs(primary.Toward("s"), secondary.Toward("p"), Primary, Secondary); d.Outcome != BitmapResyncSource || d.Rule != RuleBitmapSelf {
		t.Fatalf("secondary back after a failure: %v", d)
	}
	if d := CompareUUIDs(secondary.Toward("p"), primary.Toward("s"), Secondary, Primary); d.Outcome != BitmapResyncTarget || d.Rule != RuleBitmapPeer {
		t.Fatalf("secondary's view: %v", d)
	}

	// The resync ends on both sides: no resync on the next connect.
	source := primary.ResyncFinishedAsSource("s")
	target := secondary.Inconsistent().ResyncFinishedAsTarget("p", source.Current, source.History)
	if d := CompareUUIDs(source.Toward("s"), target.Toward("p")); d.Outcome != NoResync {
		t.Fatalf("after the resync: %v", d)
	}

	// Both nodes are promoted while apart and write: split brain with a
	// common parent, which the bitmaps can undo.
	left := source.Promoted().PeerMisses("s", empty, genD)
	right := target.Promoted().PeerMisses("p", empty, genE)
	if d := CompareUUIDs(left.Toward("s"), right.Toward("p")); d.Outcome != SplitBrainAutoRecover {
		t.Fatalf("split brain: %v", d)
	}
}

// TestCompareUUIDsSymmetric walks two nodes through random lineages made
// by node/'s transitions — each writes while apart (a new generation), they
// reconnect and resync the way the decision says, a side sometimes misses
// the resync's end — and checks at every reconnection that the two nodes
// reach mirror outcomes and that every decision names its rule.
func TestCompareUUIDsSymmetric(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var next uint64
	fresh := func() Generation {
		next++
		var g Generation
		binary.BigEndian.PutUint64(g[8:], next)
		return g
	}
	seen := map[string]bool{}
	for trial := range 2000 {
		root := fresh()
		a := Generations{Current: root}.Clone()
		b := a.Clone()
		for step := range 12 {
			switch r.IntN(4) {
			case 0:
				a = a.PeerMisses("b", empty, fresh())
			case 1:
				b = b.PeerMisses("a", empty, fresh())
			default:
				sa, sb := a.Toward("b"), b.Toward("a")
				sa.NodeID, sb.NodeID = 1, 2
				d, m := CompareUUIDs(sa, sb), CompareUUIDs(sb, sa)
				seen[d.Rule] = true
				if d.Rule == "" || m.Outcome != d.Outcome.Mirror() {
					t.Fatalf("trial %d step %d:\n%+v\nvs %+v:\n%v but the peer decides %v", trial, step, sa, sb, d, m)
				}
				source, target, sourceName, targetName := &a, &b, "a", "b"
				switch {
				case d.Outcome.IsTarget():
					source, target, sourceName, targetName = &b, &a, "b", "a"
				case d.Outcome.IsSource():
				case d.Outcome == SplitBrainAutoRecover:
					// discard-my-data on one of them.
					if r.IntN(2) == 0 {
						source, target, sourceName, targetName = &b, &a, "b", "a"
					}
				default:
					continue
				}
				s := source.ResyncFinishedAsSource(targetName)
				tg := target.Inconsistent().ResyncFinishedAsTarget(sourceName, s.Current, s.History)
				switch r.IntN(4) {
				case 0: // the source misses the end
					*target = tg
				case 1: // the target misses the end
					*source = s
				default:
					*source, *target = s, tg
				}
			}
		}
	}
	// RuleSyncSourceMissedFinish is not met by node/'s transitions in this
	// walk; TestCompareUUIDs has its row, built by hand.
	for _, rule := range []string{RuleBitmapSelf, RuleBitmapPeer, RuleReconnected, RuleBitmapBoth} {
		if !seen[rule] {
			t.Errorf("the walk never met rule %s", rule)
		}
	}
}

// TestATrackedPeerThatMayHoldTheCurrentGenerationIsNeverInSync: the
// primary tracks a peer from a bitmap generation and finished a resync
// toward it; the peer may have committed the sync-done (the primary's
// current generation) without the primary seeing its ack. The next write
// without the peer moves the primary on (TrackedPeerMayHoldCurrent), its
// bitmap kept: the peer at the primary's old generation is never found in
// sync; it is resynced from the bitmap, which marks every write it missed
// since the older generation the bitmap tracks from (bitmap-self-history;
// DRBD, and replvol until the simulation's finding history-full-resync,
// copied it in full), and a peer that never took the sync-done resumes
// from the bitmap too; a third node in sync with the primary, which took
// the new generation and tracks nothing toward the peer, copies it in
// full.
func TestATrackedPeerThatMayHoldTheCurrentGenerationIsNeverInSync(t *testing.T) {
	primary := Generations{Current: genA, History: []Generation{genC}}.Clone()
	before := primary.Clone()
	primary = primary.PeerMisses("s", empty, genB) // bitmap from genA, current genB
	tookSyncDone := primary.Clone()
	tookSyncDone.Bitmaps = nil // the peer's own set after the sync-done: genB
	if d := CompareUUIDs(primary.Toward("s"), tookSyncDone.Toward("p"), Primary, Secondary); d.Outcome != BitmapResyncSource {
		t.Fatalf("before any further write the peer that took the sync-done is resynced from the bitmap: %v", d)
	}

	moved := primary.TrackedPeerMayHoldCurrent("s", genD)
	if moved.Current != genD || moved.Bitmaps["s"] != genA || moved.History[0] != genB {
		t.Fatalf("moved on: %+v; want current %s, the bitmap from %s kept, %s first in the history", moved, genD, genA, genB)
	}
	if primary.Current != genB {
		t.Fatal("TrackedPeerMayHoldCurrent changed its receiver")
	}
	d := CompareUUIDs(moved.Toward("s"), tookSyncDone.Toward("p"), Primary, Secondary)
	if d.Outcome != BitmapResyncSource || d.Rule != RuleBitmapSelfHistory {
		t.Fatalf("the peer that took the sync-done: %v, want a bitmap resync by %s", d, RuleBitmapSelfHistory)
	}
	if d := CompareUUIDs(moved.Toward("s"), before.Toward("p"), Primary, Secondary); d.Outcome != BitmapResyncSource || d.Rule != RuleBitmapSelf {
		t.Fatalf("the peer that never took it: %v, want a bitmap resync", d)
	}
	third := tookSyncDone.Clone()
	third.Current, third.History = genD, moved.History // announced
	if d := CompareUUIDs(third.Toward("s"), tookSyncDone.Toward("x"), Primary, Secondary); d.Outcome != FullResyncSource {
		t.Fatalf("a third node that took the new generation, toward the peer: %v", d)
	}

	// An untracked peer (PeerMisses is its transition) or an Inconsistent
	// primary changes nothing.
	if g := before.TrackedPeerMayHoldCurrent("s", genD); g.Current != genA || g.Tracking("s") {
		t.Fatalf("untracked peer: %+v", g)
	}
	if g := primary.Inconsistent().TrackedPeerMayHoldCurrent("s", genD); !g.Current.IsZero() {
		t.Fatalf("Inconsistent primary: %+v", g)
	}
}

// TestConnectWordsAreForPeople: every rule and decision of the table has
// words, and none of them is a rule's name: status notes and events say
// what a connection did and why without DRBD's names.
func TestConnectWordsAreForPeople(t *testing.T) {
	rules := []string{RuleJustCreatedBoth, RuleJustCreatedSelf, RuleJustCreatedPeer, RuleSyncSourceMissedFinish,
		RuleSyncTargetPeerMissedFinish, RuleSyncSourcePeerMissedFinish, RuleSyncTargetMissedFinish, RuleReconnected,
		RuleCrashedPrimary, RuleBitmapPeer, RuleHistoryPeer, RuleBitmapSelf, RuleHistorySelf, RuleBitmapBoth,
		RuleHistoryBoth, RuleUnrelated, RuleOutdatedPeer, RulePrimaryMissedFinish}
	outcomes := []UUIDOutcome{NoResync, BitmapResyncSource, BitmapResyncTarget, FullResyncSource, FullResyncTarget,
		SplitBrainAutoRecover, SplitBrainDisconnect, UnrelatedData}
	for _, rule := range rules {
		for _, o := range outcomes {
			got := ConnectWords(o.String(), rule)
			for _, name := range append(rules, o.String(), "rule=") {
				if strings.Contains(got, name) {
					t.Errorf("ConnectWords(%q, %q) = %q: names %q", o, rule, got, name)
				}
			}
		}
	}
	for _, tc := range []struct{ decision, rule, want string }{
		{"source-set-bitmap", RuleJustCreatedPeer, "resynced all of it, as its copy was new"},
		{"no-sync", RuleReconnected, "nothing to resync, as both held the same data"},
		{"source-use-bitmap (blocks marked)", RuleReconnected, "resynced the blocks marked for it, as both held the same data"},
		{"source-use-bitmap", "some-future-rule", "resynced the blocks that changed (rule some-future-rule)"},
	} {
		if got := ConnectWords(tc.decision, tc.rule); got != tc.want {
			t.Errorf("ConnectWords(%q, %q) = %q, want %q", tc.decision, tc.rule, got, tc.want)
		}
	}
}

// TestAPrimaryNeverCopiesFromAnOutdatedPeer: every decision that would
// copy onto the primary from a peer raft has Outdated turns into the copy
// of the same blocks the other way (a bitmap resync stays one, a full one
// stays full), by the rule outdated-peer; every other decision is kept.
func TestAPrimaryNeverCopiesFromAnOutdatedPeer(t *testing.T) {
	want := map[UUIDOutcome]UUIDOutcome{BitmapResyncTarget: BitmapResyncSource, FullResyncTarget: FullResyncSource}
	for o := NoResync; o <= UnrelatedData; o++ {
		d := UUIDDecision{Outcome: o, Rule: RuleSyncTargetMissedFinish, RuleNumber: 37}
		got := d.TowardOutdated()
		w, turned := want[o]
		switch {
		case turned && (got.Outcome != w || got.Rule != RuleOutdatedPeer || got.RuleNumber != 37):
			t.Errorf("%v toward an Outdated peer: got %v (rule %s, %d), want %v by %s", o, got.Outcome, got.Rule, got.RuleNumber, w, RuleOutdatedPeer)
		case !turned && got != d:
			t.Errorf("%v toward an Outdated peer: got %+v, want it kept", o, got)
		}
		if got.Outcome.IsTarget() {
			t.Errorf("%v toward an Outdated peer still copies onto the primary", o)
		}
	}
	// The row of the sim's seed 4374: equal currents, only the peer names
	// a bitmap generation (an old one of both histories). Between two
	// secondaries the one without is the target; a primary never is
	// (primary-missed-finish), Outdated peer or not.
	d := CompareUUIDs(set(genA, empty, genB, genC), set(genA, genC, genB, genC), Secondary, Secondary)
	if d.Outcome != BitmapResyncTarget || d.Rule != RuleSyncTargetMissedFinish {
		t.Fatalf("between secondaries the shape decides %v, want target by %s", d, RuleSyncTargetMissedFinish)
	}
	for _, peerBM := range []UUIDSet{set(genA, genC, genB, genC), set(genA, genB, genC, genD)} {
		d = CompareUUIDs(set(genA, empty, genB, genC), peerBM, Primary, Secondary)
		if d.Outcome != BitmapResyncSource || d.Rule != RulePrimaryMissedFinish {
			t.Fatalf("a primary meets %v: it decides %v, want source by %s", peerBM, d, RulePrimaryMissedFinish)
		}
		if got := d.TowardOutdated(); got != d {
			t.Fatalf("toward an Outdated peer it decides %v, want %v", got, d)
		}
	}
	if w := RuleWords(RuleOutdatedPeer); strings.HasPrefix(w, "rule ") {
		t.Errorf("rule %s has no words for people: %q", RuleOutdatedPeer, w)
	}
}
