package cluster

// FuzzRaftEntries: what raft hands every node's state machine, a snapshot
// (the leader's, installed on a follower that fell behind) and log
// entries (the JSON authority commands a leader proposed; a forwarded
// proposal's command is the same JSON), never panics it and never breaks
// the authority's invariants. Its committed seed corpus
// (testdata/fuzz/FuzzRaftEntries) holds the commands each node proposes
// and edge cases.
//
//	go test -run '^$' -fuzz '^FuzzRaftEntries$' ./node/cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/fuzzseed"
	"github.com/replvol/replvol/replication"
)

// fuzzStart is the state a fuzzed log applies to when its snapshot does
// not restore: vol0 on alpha and beta, alpha primary at epoch 3, beta
// Outdated.
func fuzzStart() replication.Authority {
	a, _, err := replication.Authority{}.Apply(replication.InitCommand("vol0", "alpha", 3, []string{"alpha", "beta"}))
	if err != nil {
		panic(err)
	}
	return a
}

func entryLines(cmds ...replication.AuthorityCommand) []byte {
	var lines [][]byte
	for _, c := range cmds {
		b, err := json.Marshal(c)
		if err != nil {
			panic(err)
		}
		lines = append(lines, b)
	}
	return bytes.Join(lines, []byte("\n"))
}

func snapshotOf(a replication.Authority) []byte {
	b, err := json.Marshal(a)
	if err != nil {
		panic(err)
	}
	return b
}

// raftSeed is one seed of FuzzRaftEntries.
type raftSeed struct{ snapshot, entries []byte }

// seedRaftEntries: the commands of a volume's life (init, outdated,
// UpToDate again, a switchover, a failover, a forced promotion, a new data
// node), each refusal, and damage.
func seedRaftEntries() []raftSeed {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	start := snapshotOf(fuzzStart())
	life := entryLines(
		replication.InitCommand("vol1", "beta", 0, []string{"alpha", "beta"}),
		replication.MarkUpToDateCommand("vol0", 3, "beta"),
		replication.PromoteCommand("vol0", 3, "beta", false),
		replication.MarkOutdatedCommand("vol0", 4, "alpha"),
		replication.FailoverCommand("vol0", 4, "alpha", true, at, "beta's lease ran out"),
		replication.SetDataNodesCommand("vol0", []string{"alpha", "beta", "gamma"}),
	)
	refused := entryLines(
		replication.PromoteCommand("vol0", 3, "beta", false),      // beta is Outdated
		replication.PromoteCommand("vol0", 2, "alpha", false),     // stale epoch
		replication.MarkOutdatedCommand("vol0", 3, "wit"),         // not a data node
		replication.SetDataNodesCommand("vol0", []string{"beta"}), // removes the primary
		replication.MarkUpToDateCommand("vol9", 0, "alpha"),       // unknown volume
		replication.AuthorityCommand{Op: "shrink", Volume: "vol0"},
		replication.AuthorityCommand{Op: replication.OpPromote},
	)
	pvc := replication.CreatedVolume{Name: "pvc1", Size: 64 << 20, Pool: "default", Protocol: "C", Nodes: []string{"beta", "alpha"}}
	other := pvc
	other.Size *= 2
	created := entryLines(
		replication.CreateVolumeCommand(pvc),
		replication.CreateVolumeCommand(pvc),   // a retry: nothing changes
		replication.CreateVolumeCommand(other), // another definition: refused
		replication.InitCommand("pvc1", "beta", 1, []string{"alpha", "beta"}),
		replication.DeleteVolumeCommand("pvc1"),
		replication.DeleteVolumeCommand("pvc1"), // gone already: nothing changes
		replication.CreateVolumeCommand(other),
	)
	last := entryLines(
		replication.InitCommand("vol2", "alpha", math.MaxUint64, []string{"alpha"}),
		replication.PromoteCommand("vol2", math.MaxUint64, "alpha", false),
	)
	return []raftSeed{
		{start, life},
		{start, refused},
		{start, created},
		{nil, last},
		{[]byte(`{"volumes":{"vol0":{"primary":"alpha","epoch":1,"data_nodes":["alpha","beta"],"up_to_date":["alpha","beta"]}}}`), entryLines(
			replication.PromoteCommand("vol0", 1, "beta", false))},
		{[]byte(`{"volumes":{"vol0":{"primary":"gamma","epoch":1,"data_nodes":["beta","alpha"],"up_to_date":["beta","alpha","alpha"],"outdated":["beta"]}}}`), nil},
		{[]byte(`{"volumes":{"":{}}}`), []byte(`{"op":"init","volume":"vol0","node":"","nodes":[""]}`)},
		{[]byte("null"), []byte("null\n{}\n\n[]\n{\"op\":\"promote\",\"volume\":\"vol0\",\"epoch\":-1}")},
	}
}

// checkAuthority fails t unless a holds the authority's invariants: per
// volume, the data nodes a sorted set of names, the primary one of them,
// UpToDate and Outdated sorted sets of data nodes that do not meet.
func checkAuthority(t *testing.T, a replication.Authority) {
	t.Helper()
	for name, va := range a.Volumes {
		if name == "" {
			t.Fatalf("a volume without a name: %+v", va)
		}
		set := func(what string, s []string) {
			if !slices.IsSorted(s) || len(slices.Compact(slices.Clone(s))) != len(s) || slices.Contains(s, "") {
				t.Fatalf("%s: %s %q is not a sorted set of names", name, what, s)
			}
			for _, n := range s {
				if !slices.Contains(va.DataNodes, n) {
					t.Fatalf("%s: %s %q holds %s, no data node", name, what, s, n)
				}
			}
		}
		set("data nodes", va.DataNodes)
		set("UpToDate", va.UpToDate)
		set("Outdated", va.Outdated)
		if !slices.Contains(va.DataNodes, va.Primary) {
			t.Fatalf("%s: primary %q is no data node of %q", name, va.Primary, va.DataNodes)
		}
		for _, n := range va.UpToDate {
			if va.IsOutdated(n) {
				t.Fatalf("%s: %s is UpToDate and Outdated", name, n)
			}
		}
	}
}

var authorityErrors = []error{
	replication.ErrStaleEpoch, replication.ErrNotUpToDate, replication.ErrUnknownVolume,
	replication.ErrNotPrimary, replication.ErrNotADataNode, replication.ErrRemovesPrimary, replication.ErrBadCommand,
	replication.ErrVolumeExists,
}

// FuzzRaftEntries: a snapshot that restores holds the invariants (one
// that does not is refused and changes nothing); each entry either
// applies, keeping the invariants, moving no epoch backwards and a
// promoted volume's epoch up by one, or fails with a classified error and
// changes nothing; and the state that results snapshots and restores to
// itself.
func FuzzRaftEntries(f *testing.F) {
	for _, s := range seedRaftEntries() {
		f.Add(s.snapshot, s.entries)
	}
	f.Fuzz(func(t *testing.T, snapshot, entries []byte) {
		m := &fsm{applied: func() {}}
		if err := m.Restore(io.NopCloser(bytes.NewReader(snapshot))); err != nil {
			if len(m.authority().Volumes) != 0 {
				t.Fatalf("a snapshot that did not restore (%v) left %+v", err, m.authority())
			}
			m.state = fuzzStart()
		}
		checkAuthority(t, m.authority())
		for i, line := range bytes.Split(entries, []byte("\n")) {
			before := m.authority().Clone()
			res := m.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: line}).(applyResult)
			after := m.authority()
			if res.err != nil {
				if !slices.ContainsFunc(authorityErrors, func(e error) bool { return errors.Is(res.err, e) }) {
					t.Fatalf("entry %q: error of no class: %v", line, res.err)
				}
				if !reflect.DeepEqual(after, before) {
					t.Fatalf("entry %q failed (%v) but changed the state", line, res.err)
				}
				continue
			}
			checkAuthority(t, after)
			var cmd replication.AuthorityCommand
			if err := json.Unmarshal(line, &cmd); err != nil {
				t.Fatalf("entry %q applied but does not decode: %v", line, err)
			}
			for name, va := range after.Volumes {
				old, known := before.Volumes[name]
				switch {
				case !known:
				case name == cmd.Volume && cmd.Op == replication.OpPromote:
					if va.Epoch != old.Epoch+1 || va.Epoch <= old.Epoch || va.Primary != cmd.Node {
						t.Fatalf("entry %q: %s went from epoch %d to %d, primary %s", line, name, old.Epoch, va.Epoch, va.Primary)
					}
				case va.Epoch != old.Epoch:
					t.Fatalf("entry %q: %s went from epoch %d to %d", line, name, old.Epoch, va.Epoch)
				}
			}
			if got, _ := after.Volume(cmd.Volume); !reflect.DeepEqual(got, res.volume) {
				t.Fatalf("entry %q: Apply returned %+v, the state holds %+v", line, res.volume, got)
			}
		}
		var buf strings.Builder
		if err := json.NewEncoder(&buf).Encode(m.authority()); err != nil {
			t.Fatal(err)
		}
		again := &fsm{applied: func() {}}
		if err := again.Restore(io.NopCloser(strings.NewReader(buf.String()))); err != nil {
			t.Fatalf("the state's own snapshot does not restore: %v", err)
		}
		if got := snapshotOf(again.authority()); !bytes.Equal(got, snapshotOf(m.authority())) {
			t.Fatalf("snapshot round trip: %s, want %s", got, snapshotOf(m.authority()))
		}
	})
}

// TestFuzzSeedCorpus keeps FuzzRaftEntries' committed corpus the seeds
// above (go test -run TestFuzzSeedCorpus -write-fuzz-seeds rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	var seeds []fuzzseed.Seed
	for _, s := range seedRaftEntries() {
		seeds = append(seeds, fuzzseed.Seed{s.snapshot, s.entries})
	}
	fuzzseed.Sync(t, "FuzzRaftEntries", seeds, fuzzseed.Exact)
}
