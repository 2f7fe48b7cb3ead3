package cluster

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/replvol/replvol/replication"
)

// TestTheStateMachineSaysWhichEntryItIsAsOf: the state machine gives its
// state with the index of the last entry it applied, a created volume
// records the index of its create, and a snapshot keeps both; a
// snapshot of an earlier release (the authority alone) restores as of
// index 0. The node frees a deleted volume's file only when the state
// machine has applied its create, so the pair must be taken at once.
func TestTheStateMachineSaysWhichEntryItIsAsOf(t *testing.T) {
	m := &fsm{applied: func() {}}
	entry := func(index uint64, cmd replication.AuthorityCommand) {
		t.Helper()
		data, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if res := m.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(applyResult); res.err != nil {
			t.Fatal(res.err)
		}
	}
	pvc := replication.CreatedVolume{Name: "pvc1", Size: 4096, Pool: "default", Protocol: "C", Nodes: []string{"alpha", "beta"}}
	entry(7, replication.CreateVolumeCommand(pvc))
	entry(9, replication.InitCommand("vol0", "alpha", 1, []string{"alpha"}))
	a, index := m.authorityAt()
	if def, ok := a.Created("pvc1"); index != 9 || !ok || def.Index != 7 {
		t.Fatalf("as of %d: pvc1 %+v (%v); want as of 9, pvc1 created at 7", index, def, ok)
	}

	snap, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(snap); err != nil {
		t.Fatal(err)
	}
	again := &fsm{applied: func() {}}
	if err := again.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if a, index := again.authorityAt(); index != 9 || a.Creates["pvc1"].Index != 7 {
		t.Fatalf("restored as of %d, pvc1 %+v; want as of 9, pvc1 created at 7", index, a.Creates["pvc1"])
	}

	old := &fsm{applied: func() {}}
	if err := old.Restore(io.NopCloser(bytes.NewReader([]byte(`{"volumes":{"vol0":{"primary":"alpha","epoch":1,"data_nodes":["alpha"],"up_to_date":["alpha"]}}}`)))); err != nil {
		t.Fatal(err)
	}
	if a, index := old.authorityAt(); index != 0 || a.Volumes["vol0"].Primary != "alpha" {
		t.Fatalf("an earlier release's snapshot restored as of %d: %+v", index, a)
	}
}
