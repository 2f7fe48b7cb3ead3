package replication

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"
)

// volumeAt is a volume state written as a case reads: primary, epoch, data
// nodes, UpToDate, Outdated.
func volumeAt(primary string, epoch uint64, data, upToDate, outdated []string) VolumeAuthority {
	return VolumeAuthority{Primary: primary, Epoch: epoch, DataNodes: data, UpToDate: upToDate, Outdated: outdated}
}

func nodes(n ...string) []string { return n }

// authorityOf is an Authority holding one volume, "vol".
func authorityOf(va VolumeAuthority) Authority {
	return Authority{Volumes: map[string]VolumeAuthority{"vol": va}}
}

// TestAuthorityApply pins the rules of the cluster's state machine, one
// case per situation: who may be promoted (never an Outdated or unknown
// node without force), that the epoch moves only by a promotion and only
// from the epoch the proposer saw, and that a refused command changes
// nothing. Every case also checks that Apply left its receiver as it was
// (a raft snapshot may hold it).
func TestAuthorityApply(t *testing.T) {
	// Two data nodes a and b and a third data node c; w is a witness.
	healthy := volumeAt("a", 7, nodes("a", "b", "c"), nodes("a", "b", "c"), nil)
	bOutdated := volumeAt("a", 7, nodes("a", "b", "c"), nodes("a", "c"), nodes("b"))
	cSyncing := volumeAt("a", 7, nodes("a", "b", "c"), nodes("a", "b"), nil)
	at := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	failedOver := func(va VolumeAuthority, from, to string, epoch uint64, reason string, forced bool) VolumeAuthority {
		va.LastFailover = &FailoverRecord{From: from, To: to, Epoch: epoch, At: at, Reason: reason, Forced: forced}
		return va
	}
	bFailedOver := failedOver(volumeAt("b", 8, nodes("a", "b", "c"), nodes("a", "b", "c"), nil), "a", "b", 8, "a lost", false)
	bForced := failedOver(volumeAt("b", 8, nodes("a", "b", "c"), nodes("b"), nodes("a", "c")), "a", "b", 8, "forced by the operator", true)
	sinceForce := func(va VolumeAuthority, marked ...string) VolumeAuthority {
		va.MarkedSinceForce = marked
		return va
	}
	cases := []struct {
		name  string
		start Authority
		cmd   AuthorityCommand
		want  VolumeAuthority // the volume after the command (its current state on an error)
		err   error
	}{
		{"init makes the primary UpToDate and every other data node Outdated",
			Authority{}, InitCommand("vol", "a", 3, nodes("b", "a", "c")),
			volumeAt("a", 3, nodes("a", "b", "c"), nodes("a"), nodes("b", "c")), nil},
		{"a second init of a known volume changes nothing and returns the state",
			authorityOf(bOutdated), InitCommand("vol", "b", 1, nodes("a", "b")),
			bOutdated, nil},
		{"init with a primary that is not a data node is refused",
			Authority{}, InitCommand("vol", "w", 1, nodes("a", "b")),
			VolumeAuthority{}, ErrNotADataNode},
		{"init without data nodes is refused",
			Authority{}, InitCommand("vol", "a", 1, nil),
			VolumeAuthority{}, ErrBadCommand},
		{"the primary marks a secondary that missed a write Outdated",
			authorityOf(healthy), MarkOutdatedCommand("vol", 7, "b"),
			bOutdated, nil},
		{"marking an Outdated node Outdated again changes nothing",
			authorityOf(bOutdated), MarkOutdatedCommand("vol", 7, "b"),
			bOutdated, nil},
		{"a node being synced (unknown) is marked Outdated",
			authorityOf(cSyncing), MarkOutdatedCommand("vol", 7, "c"),
			volumeAt("a", 7, nodes("a", "b", "c"), nodes("a", "b"), nodes("c")), nil},
		{"a secondary whose resync finished is marked UpToDate",
			authorityOf(bOutdated), MarkUpToDateCommand("vol", 7, "b"),
			healthy, nil},
		{"a stale epoch changes nothing",
			authorityOf(healthy), MarkOutdatedCommand("vol", 6, "b"),
			healthy, ErrStaleEpoch},
		{"a stale epoch never promotes, even an UpToDate node",
			authorityOf(healthy), PromoteCommand("vol", 6, "b", false),
			healthy, ErrStaleEpoch},
		{"an epoch from the future changes nothing either",
			authorityOf(healthy), MarkUpToDateCommand("vol", 8, "b"),
			healthy, ErrStaleEpoch},
		{"an UpToDate secondary is promoted at the next epoch",
			authorityOf(healthy), PromoteCommand("vol", 7, "b", false),
			volumeAt("b", 8, nodes("a", "b", "c"), nodes("a", "b", "c"), nil), nil},
		{"the old primary keeps its disk state after a promotion",
			authorityOf(bOutdated), PromoteCommand("vol", 7, "c", false),
			volumeAt("c", 8, nodes("a", "b", "c"), nodes("a", "c"), nodes("b")), nil},
		{"an Outdated node is never promoted without force",
			authorityOf(bOutdated), PromoteCommand("vol", 7, "b", false),
			bOutdated, ErrNotUpToDate},
		{"a node being synced (unknown) is never promoted without force",
			authorityOf(cSyncing), PromoteCommand("vol", 7, "c", false),
			cSyncing, ErrNotUpToDate},
		{"a forced promotion of an Outdated node makes it the only UpToDate node",
			authorityOf(bOutdated), PromoteCommand("vol", 7, "b", true),
			volumeAt("b", 8, nodes("a", "b", "c"), nodes("b"), nodes("a", "c")), nil},
		{"a forced promotion of an UpToDate node outdates all the others too",
			authorityOf(healthy), PromoteCommand("vol", 7, "c", true),
			volumeAt("c", 8, nodes("a", "b", "c"), nodes("c"), nodes("a", "b")), nil},
		{"a failover records who was primary, who took over, when and why",
			authorityOf(healthy), FailoverCommand("vol", 7, "b", false, at, "a lost"),
			bFailedOver, nil},
		{"a forced failover is recorded as forced",
			authorityOf(bOutdated), FailoverCommand("vol", 7, "b", true, at, "forced by the operator"),
			failedOver(volumeAt("b", 8, nodes("a", "b", "c"), nodes("b"), nodes("a", "c")), "a", "b", 8, "forced by the operator", true), nil},
		{"a mark in a forced term is the forced primary's own word on the node",
			authorityOf(bForced), MarkOutdatedCommand("vol", 8, "c"),
			sinceForce(bForced, "c"), nil},
		{"so is a mark UpToDate",
			authorityOf(sinceForce(bForced, "c")), MarkUpToDateCommand("vol", 8, "a"),
			sinceForce(failedOver(volumeAt("b", 8, nodes("a", "b", "c"), nodes("a", "b"), nodes("c")), "a", "b", 8, "forced by the operator", true), "a", "c"), nil},
		{"a mark in a term not forced is not recorded as one since a force",
			authorityOf(bFailedOver), MarkOutdatedCommand("vol", 8, "c"),
			failedOver(volumeAt("b", 8, nodes("a", "b", "c"), nodes("a", "b"), nodes("c")), "a", "b", 8, "a lost", false), nil},
		{"a promotion forgets the marks since the force",
			authorityOf(sinceForce(bForced, "c")), FailoverCommand("vol", 8, "a", true, at, "forced again"),
			failedOver(volumeAt("a", 9, nodes("a", "b", "c"), nodes("a"), nodes("b", "c")), "b", "a", 9, "forced again", true), nil},
		{"a data node removed leaves the marks since the force",
			authorityOf(sinceForce(bForced, "a", "c")), SetDataNodesCommand("vol", nodes("b", "c")),
			sinceForce(failedOver(volumeAt("b", 8, nodes("b", "c"), nodes("b"), nodes("c")), "a", "b", 8, "forced by the operator", true), "c"), nil},
		{"a switchover keeps the last failover",
			authorityOf(bFailedOver), PromoteCommand("vol", 8, "a", false),
			failedOver(volumeAt("a", 9, nodes("a", "b", "c"), nodes("a", "b", "c"), nil), "a", "b", 8, "a lost", false), nil},
		{"a refused failover records nothing",
			authorityOf(bOutdated), FailoverCommand("vol", 7, "b", false, at, "a lost"),
			bOutdated, ErrNotUpToDate},
		{"the primary forced again (it reclaims its own epoch) is no failover",
			authorityOf(healthy), FailoverCommand("vol", 7, "a", true, at, "forced"),
			volumeAt("a", 8, nodes("a", "b", "c"), nodes("a"), nodes("b", "c")), nil},
		{"force does not promote a witness",
			authorityOf(healthy), PromoteCommand("vol", 7, "w", true),
			healthy, ErrNotADataNode},
		{"a witness cannot be marked",
			authorityOf(healthy), MarkUpToDateCommand("vol", 7, "w"),
			healthy, ErrNotADataNode},
		{"a command for a volume never initialised is refused",
			authorityOf(healthy), PromoteCommand("other", 7, "b", false),
			VolumeAuthority{}, ErrUnknownVolume},
		{"a new data node starts Outdated and a removed one leaves both sets",
			authorityOf(bOutdated), SetDataNodesCommand("vol", nodes("d", "a", "c")),
			volumeAt("a", 7, nodes("a", "c", "d"), nodes("a", "c"), nodes("d")), nil},
		{"a node being synced stays unknown when the data nodes change",
			authorityOf(cSyncing), SetDataNodesCommand("vol", nodes("a", "c")),
			volumeAt("a", 7, nodes("a", "c"), nodes("a"), nil), nil},
		{"the primary cannot be removed from the data nodes",
			authorityOf(healthy), SetDataNodesCommand("vol", nodes("b", "c")),
			healthy, ErrRemovesPrimary},
		{"an unknown op is refused",
			authorityOf(healthy), AuthorityCommand{Op: "demote", Volume: "vol", Epoch: 7, Node: "a"},
			healthy, ErrBadCommand},
		{"a command without a volume is refused",
			authorityOf(healthy), MarkOutdatedCommand("", 7, "b"),
			VolumeAuthority{}, ErrBadCommand},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.start.Clone()
			next, got, err := tc.start.Apply(tc.cmd)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("volume\n got %+v\nwant %+v", got, tc.want)
			}
			if !reflect.DeepEqual(tc.start, before) {
				t.Errorf("Apply changed its receiver: %+v, was %+v", tc.start, before)
			}
			if err != nil && !reflect.DeepEqual(next, tc.start) {
				t.Errorf("a refused command changed the state: %+v", next)
			}
			if stored, _ := next.Volume(tc.cmd.Volume); !reflect.DeepEqual(stored, tc.want) {
				t.Errorf("stored %+v, returned %+v", stored, tc.want)
			}
			// Changing what Apply returned must not reach the state.
			if len(got.UpToDate) > 0 {
				got.UpToDate[0] = "mutated"
				if stored, _ := next.Volume(tc.cmd.Volume); stored.UpToDate[0] == "mutated" {
					t.Error("the returned volume shares its sets with the state")
				}
			}
		})
	}
}

// TestAuthorityJSON pins that the state and the commands survive a JSON
// round trip (raft snapshots and log entries) and encode the same bytes
// every time (every node's snapshot of one state is identical).
func TestAuthorityJSON(t *testing.T) {
	var a Authority
	for _, cmd := range []AuthorityCommand{
		InitCommand("vol", "a", 1, nodes("a", "b", "c")),
		InitCommand("other", "b", 4, nodes("a", "b")),
		MarkUpToDateCommand("vol", 1, "b"),
		PromoteCommand("vol", 1, "b", false),
		PromoteCommand("other", 4, "a", true),
		FailoverCommand("vol", 2, "a", false, time.Date(2026, 3, 14, 15, 9, 26, 5, time.UTC), "b lost"),
	} {
		raw, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		var decoded AuthorityCommand
		if err := json.Unmarshal(raw, &decoded); err != nil || !reflect.DeepEqual(decoded, cmd) {
			t.Fatalf("command %s came back as %+v (%v)", raw, decoded, err)
		}
		if a, _, err = a.Apply(decoded); err != nil {
			t.Fatal(err)
		}
	}
	first, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back Authority
	if err := json.Unmarshal(first, &back); err != nil || !reflect.DeepEqual(back, a) {
		t.Fatalf("state %s came back as %+v (%v)", first, back, err)
	}
	again, _ := json.Marshal(back)
	if string(again) != string(first) {
		t.Errorf("two encodings of one state differ:\n%s\n%s", first, again)
	}
}

// TestChooseFailover pins the automatic failover rule: an alive UpToDate
// data node other than the primary, the first by name; otherwise a reason.
func TestChooseFailover(t *testing.T) {
	data := nodes("a", "b", "c")
	cases := []struct {
		name  string
		va    VolumeAuthority
		alive []string
		want  string // "" when there is none
		why   string
		data  []string // the caller's data nodes; nil: a, b, c
	}{
		{"an alive UpToDate secondary takes over",
			volumeAt("a", 3, data, nodes("a", "b"), nodes("c")), nodes("b", "c"), "b", "", nil},
		{"of two alive UpToDate secondaries the first by name takes over",
			volumeAt("a", 3, data, nodes("a", "b", "c"), nil), nodes("c", "b"), "b", "", nil},
		{"the primary is never chosen, even when it looks alive",
			volumeAt("a", 3, data, nodes("a"), nodes("b", "c")), nodes("a", "b", "c"), "",
			"no UpToDate data node besides the primary a; b, c alive but Outdated (only a forced promotion takes it)", nil},
		{"an alive Outdated node is not chosen; the dead UpToDate one is named",
			volumeAt("a", 3, data, nodes("a", "c"), nodes("b")), nodes("b"), "",
			"no UpToDate node alive (c not alive); b alive but Outdated (only a forced promotion takes it)", nil},
		{"a node being synced is not chosen",
			volumeAt("a", 3, data, nodes("a"), nil), nodes("b", "c"), "",
			"no UpToDate data node besides the primary a", nil},
		{"an UpToDate node the caller no longer counts as a data node is not chosen",
			volumeAt("a", 3, data, nodes("a", "c"), nil), nodes("c"), "",
			"no UpToDate data node besides the primary a", nodes("a", "b")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			alive := map[string]bool{}
			for _, n := range tc.alive {
				alive[n] = true
			}
			dataNodes := data
			if tc.data != nil {
				dataNodes = tc.data
			}
			got, ok, why := ChooseFailover(tc.va, alive, dataNodes)
			if got != tc.want || ok != (tc.want != "") || why.String() != tc.why {
				t.Errorf("got %q %v %q, want %q %q", got, ok, why, tc.want, tc.why)
			}
		})
	}
}

// TestCheckPrimary pins the question the leader asks before it grants a
// lease: is the requester the primary at that epoch?
func TestCheckPrimary(t *testing.T) {
	va := volumeAt("a", 5, nodes("a", "b"), nodes("a", "b"), nil)
	if err := va.CheckPrimary("a", 5); err != nil {
		t.Errorf("the primary at its epoch: %v", err)
	}
	if err := va.CheckPrimary("a", 4); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("the old primary at an older epoch: %v, want ErrStaleEpoch", err)
	}
	if err := va.CheckPrimary("b", 5); !errors.Is(err, ErrNotPrimary) {
		t.Errorf("a secondary at the current epoch: %v, want ErrNotPrimary", err)
	}
}

// TestAuthorityCheck: a raft snapshot that breaks what Apply keeps true
// is refused before it replaces the state, and no promotion wraps the
// epoch around to 0.
func TestAuthorityCheck(t *testing.T) {
	good, _, err := Authority{}.Apply(InitCommand("vol0", "alpha", 3, []string{"alpha", "beta"}))
	if err != nil || good.Check() != nil {
		t.Fatalf("a state Apply made: %v, %v", err, good.Check())
	}
	for name, va := range map[string]VolumeAuthority{
		"data nodes out of order":      {Primary: "alpha", DataNodes: []string{"beta", "alpha"}},
		"a data node twice":            {Primary: "alpha", DataNodes: []string{"alpha", "alpha"}},
		"an empty name":                {Primary: "", DataNodes: []string{""}},
		"a primary that holds no copy": {Primary: "wit", DataNodes: []string{"alpha", "beta"}},
		"UpToDate outside the nodes":   {Primary: "alpha", DataNodes: []string{"alpha"}, UpToDate: []string{"gamma"}},
		"UpToDate and Outdated":        {Primary: "alpha", DataNodes: []string{"alpha", "beta"}, UpToDate: []string{"beta"}, Outdated: []string{"beta"}},
	} {
		if err := (Authority{Volumes: map[string]VolumeAuthority{"vol0": va}}).Check(); !errors.Is(err, ErrBadAuthority) {
			t.Errorf("%s: %v, want ErrBadAuthority", name, err)
		}
	}
	if err := (Authority{Volumes: map[string]VolumeAuthority{"": good.Volumes["vol0"]}}).Check(); !errors.Is(err, ErrBadAuthority) {
		t.Errorf("a volume without a name: %v", err)
	}
	last, _, _ := Authority{}.Apply(InitCommand("vol0", "alpha", math.MaxUint64, []string{"alpha"}))
	if _, va, err := last.Apply(PromoteCommand("vol0", math.MaxUint64, "alpha", false)); !errors.Is(err, ErrBadCommand) || va.Epoch != math.MaxUint64 {
		t.Errorf("a promotion at the last epoch: %+v, %v", va, err)
	}
}

// TestOutdatedOnRecord: raft's Outdated record counts as the term's word
// on a node but for the blanket record of a forced promotion (every other
// data node, whatever each holds); the forced primary's own marks since
// count (a node that missed writes acknowledged in the forced term is
// never pulled from: its older blocks would go over them).
func TestOutdatedOnRecord(t *testing.T) {
	at := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	a := authorityOf(volumeAt("a", 7, nodes("a", "b", "c"), nodes("a", "b"), nodes("c")))
	step := func(a Authority, cmd AuthorityCommand) Authority {
		t.Helper()
		next, _, err := a.Apply(cmd)
		if err != nil {
			t.Fatalf("%s: %v", cmd.Op, err)
		}
		return next
	}
	check := func(a Authority, want map[string]bool) {
		t.Helper()
		va := a.Volumes["vol"]
		for n, w := range want {
			if got := va.OutdatedOnRecord(n); got != w {
				t.Errorf("epoch %d (forced %t): OutdatedOnRecord(%s) = %t, want %t", va.Epoch, va.ForcedAt(va.Epoch), n, got, w)
			}
		}
	}
	check(a, map[string]bool{"a": false, "b": false, "c": true})
	// A failover not forced: its Outdated set is the term's word.
	a = step(a, FailoverCommand("vol", 7, "b", false, at, "a lost"))
	check(a, map[string]bool{"a": false, "b": false, "c": true})
	// Forced: every other node is Outdated, on no one's word.
	a = step(a, FailoverCommand("vol", 8, "c", true, at, "forced"))
	check(a, map[string]bool{"a": false, "b": false, "c": false})
	if va := a.Volumes["vol"]; !va.IsOutdated("a") || !va.IsOutdated("b") {
		t.Fatalf("a forced promotion of c left %v Outdated, want a and b", va.Outdated)
	}
	// b misses a write of the forced term: the forced primary's word.
	a = step(a, MarkOutdatedCommand("vol", 9, "b"))
	check(a, map[string]bool{"a": false, "b": true})
	// a is resynced, then misses a write too.
	a = step(a, MarkUpToDateCommand("vol", 9, "a"))
	check(a, map[string]bool{"a": false, "b": true})
	a = step(a, MarkOutdatedCommand("vol", 9, "a"))
	check(a, map[string]bool{"a": true, "b": true})
	// The record survives raft's snapshot (its JSON).
	buf, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back Authority
	if err := json.Unmarshal(buf, &back); err != nil {
		t.Fatal(err)
	}
	check(back, map[string]bool{"a": true, "b": true, "c": false})
	if err := back.Check(); err != nil {
		t.Fatalf("the authority after marks in a forced term fails its check: %v", err)
	}
	// a is resynced again, and forced (the reclaim of a no-quorum force):
	// it held every write acknowledged on record, so b, Outdated on the
	// forced term's word, missed one a holds, which the new term's word
	// keeps; c, the primary it replaces, is Outdated on no one's word.
	a = step(back, MarkUpToDateCommand("vol", 9, "a"))
	a = step(a, FailoverCommand("vol", 9, "a", true, at, "reclaim"))
	check(a, map[string]bool{"a": false, "b": true, "c": false})
	// Forced from Outdated, it held no such record: nothing is kept.
	a = step(a, FailoverCommand("vol", 10, "b", true, at, "forced"))
	check(a, map[string]bool{"a": false, "b": false, "c": false})
}

// TestOutdatedUnder: a peer is never copied onto a primary when raft's
// record says it missed a write that primary holds: under the primary's
// own term (OutdatedOnRecord), or, for a primary ahead of the record (an
// operator forced it without a quorum), under the record's term when it
// held the primary UpToDate. A primary behind the record, or one the
// record's term held Outdated itself, learns nothing of it.
func TestOutdatedUnder(t *testing.T) {
	rec := volumeAt("g", 3, nodes("a", "b", "g"), nodes("a", "g"), nodes("b"))
	for _, c := range []struct {
		what          string
		primary, peer string
		epoch         uint64
		want          bool
	}{
		{"the record's primary, its term, a peer Outdated", "g", "b", 3, true},
		{"the record's primary, its term, a peer UpToDate", "g", "a", 3, false},
		{"forced ahead of the record, UpToDate in it, a peer Outdated", "a", "b", 4, true},
		{"forced ahead of the record, UpToDate in it, a peer UpToDate", "a", "g", 4, false},
		{"forced ahead of the record, Outdated in it", "b", "a", 4, false},
		{"behind the record", "a", "b", 2, false},
		{"at the record's epoch, not its primary", "a", "b", 3, false},
	} {
		if got := rec.OutdatedUnder(c.primary, c.epoch, c.peer); got != c.want {
			t.Errorf("%s: OutdatedUnder(%s, %d, %s) = %t, want %t", c.what, c.primary, c.epoch, c.peer, got, c.want)
		}
	}
}
