package replication

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

// The volumes created at run time are recorded whole in the authority:
// a create of a new name records it, the same create again changes
// nothing, another definition of the name is refused, and a delete
// forgets the definition and the volume's authority both, so that the
// name may be created afresh. Every state is a value and a snapshot
// (JSON) keeps it.
func TestCreatedVolumesAreRecordedAndForgotten(t *testing.T) {
	def := CreatedVolume{Name: "pvc1", Size: 64 << 20, Pool: "default", Protocol: "C", Nodes: []string{"beta", "alpha"}}
	var a Authority
	a1, _, err := a.Apply(CreateVolumeCommand(def))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Created("pvc1"); ok {
		t.Fatal("Apply changed the authority it was called on")
	}
	got, ok := a1.Created("pvc1")
	if !ok || !got.Same(def) {
		t.Fatalf("recorded %+v %v, want %+v", got, ok, def)
	}

	t.Run("the same create again changes nothing", func(t *testing.T) {
		a2, _, err := a1.Apply(CreateVolumeCommand(def))
		if err != nil || len(a2.Creates) != 1 {
			t.Fatalf("got %v, %d volumes", err, len(a2.Creates))
		}
	})
	t.Run("the same create under the same request ID changes nothing", func(t *testing.T) {
		asked := def
		asked.RequestID = "7f3a"
		b1, _, err := a.Apply(CreateVolumeCommand(asked))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := b1.Created("pvc1"); got.RequestID != "7f3a" {
			t.Fatalf("the record holds request ID %q, want 7f3a", got.RequestID)
		}
		b2, _, err := b1.Apply(CreateVolumeCommand(asked))
		if err != nil || len(b2.Creates) != 1 {
			t.Fatalf("the create again under its ID: %v, %d volumes; want a retry that changes nothing", err, len(b2.Creates))
		}
		// Another caller's create of the same definition did not make
		// the volume: it is refused, so that it does not say it did, and
		// the record stays the first caller's.
		another := def
		another.RequestID = "91c0"
		b3, _, err := b1.Apply(CreateVolumeCommand(another))
		if !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("the same definition under another request ID: %v, want ErrVolumeExists", err)
		}
		if got, _ := b3.Created("pvc1"); got.RequestID != "7f3a" {
			t.Fatalf("after the refused create the record holds request ID %q, want 7f3a", got.RequestID)
		}
		if _, _, err := b1.Apply(CreateVolumeCommand(def)); !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("the same definition without a request ID: %v, want ErrVolumeExists", err)
		}
	})
	t.Run("a create of an older version, without a request ID, decodes and is retried as before", func(t *testing.T) {
		// A log entry as a version without request IDs wrote it.
		old := []byte(`{"op":"create-volume","volume":"pvc1","epoch":0,"create":{"name":"pvc1","size":67108864,"pool":"default","protocol":"C","nodes":["beta","alpha"]}}`)
		var cmd AuthorityCommand
		if err := json.Unmarshal(old, &cmd); err != nil {
			t.Fatal(err)
		}
		b1, _, err := a.Apply(cmd)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := b1.Created("pvc1")
		if !ok || !got.Same(def) || got.RequestID != "" {
			t.Fatalf("recorded %+v %v, want %+v without a request ID", got, ok, def)
		}
		if _, _, err := b1.Apply(cmd); err != nil {
			t.Fatalf("the old create again: %v, want a retry that changes nothing", err)
		}
	})
	t.Run("a grow records the larger size only", func(t *testing.T) {
		a2, _, err := a1.Apply(GrowVolumeCommand("pvc1", 96<<20))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := a2.Created("pvc1"); got.Size != 96<<20 || !slices.Equal(got.Nodes, def.Nodes) {
			t.Fatalf("after the grow: %+v", got)
		}
		if got, _ := a1.Created("pvc1"); got.Size != def.Size {
			t.Fatalf("Apply changed the authority it was called on: %+v", got)
		}
		a3, _, err := a2.Apply(GrowVolumeCommand("pvc1", 64<<20))
		if got, _ := a3.Created("pvc1"); err != nil || got.Size != 96<<20 {
			t.Fatalf("a smaller size: %v, %+v; want no change", err, got)
		}
		if _, _, err := a2.Apply(GrowVolumeCommand("pvc1", 96<<20+1)); !errors.Is(err, ErrBadCommand) {
			t.Fatalf("a size not of whole blocks: %v, want ErrBadCommand", err)
		}
		a4, _, err := a2.Apply(GrowVolumeCommand("other", 1<<30))
		if _, ok := a4.Created("other"); err != nil || ok {
			t.Fatalf("a grow of a name not created: %v, created %v", err, ok)
		}
	})
	t.Run("another definition of the name is refused", func(t *testing.T) {
		other := def
		other.Size *= 2
		_, _, err := a1.Apply(CreateVolumeCommand(other))
		if !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("got %v, want ErrVolumeExists", err)
		}
	})
	t.Run("a name of a volume the authority holds is refused", func(t *testing.T) {
		b, _, err := a.Apply(InitCommand("vol0", "alpha", 1, []string{"alpha", "beta"}))
		if err != nil {
			t.Fatal(err)
		}
		other := def
		other.Name = "vol0"
		if _, _, err := b.Apply(CreateVolumeCommand(other)); !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("got %v, want ErrVolumeExists", err)
		}
	})
	t.Run("a bad definition is refused", func(t *testing.T) {
		for name, bad := range map[string]CreatedVolume{
			"size not a multiple of 4096": {Name: "x", Size: 1000, Pool: "default", Protocol: "C", Nodes: []string{"alpha"}},
			"no nodes":                    {Name: "x", Size: 4096, Pool: "default", Protocol: "C"},
			"a node twice":                {Name: "x", Size: 4096, Pool: "default", Protocol: "C", Nodes: []string{"alpha", "alpha"}},
			"no such protocol":            {Name: "x", Size: 4096, Pool: "default", Protocol: "D", Nodes: []string{"alpha"}},
		} {
			if _, _, err := a.Apply(CreateVolumeCommand(bad)); !errors.Is(err, ErrBadCommand) {
				t.Errorf("%s: got %v, want ErrBadCommand", name, err)
			}
		}
	})
	t.Run("a snapshot keeps the definitions", func(t *testing.T) {
		b, err := json.Marshal(a1)
		if err != nil {
			t.Fatal(err)
		}
		var back Authority
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if err := back.Check(); err != nil {
			t.Fatal(err)
		}
		if got, ok := back.Created("pvc1"); !ok || !got.Same(def) {
			t.Fatalf("restored %+v %v", got, ok)
		}
		bad := back.Clone()
		bad.Creates["pvc1"] = CreatedVolume{Name: "pvc2", Size: 4096, Pool: "p", Protocol: "C", Nodes: []string{"a"}}
		if err := bad.Check(); !errors.Is(err, ErrBadAuthority) {
			t.Fatalf("a definition under another name: got %v", err)
		}
	})
	t.Run("a delete forgets the definition and the authority", func(t *testing.T) {
		b, _, err := a1.Apply(InitCommand("pvc1", "beta", 1, []string{"alpha", "beta"}))
		if err != nil {
			t.Fatal(err)
		}
		c, _, err := b.Apply(DeleteVolumeCommand("pvc1"))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Created("pvc1"); ok {
			t.Fatal("the definition stayed")
		}
		if _, ok := c.Volume("pvc1"); ok {
			t.Fatal("the volume's authority stayed")
		}
		if _, ok := b.Volume("pvc1"); !ok {
			t.Fatal("Apply changed the authority it was called on")
		}
		d, va, err := c.Apply(InitCommand("pvc1", "alpha", 1, []string{"alpha", "beta"}))
		if err != nil || va.Primary != "alpha" || len(d.Volumes) != 1 {
			t.Fatalf("a new volume of the name: %v %+v", err, va)
		}
	})
	t.Run("a delete of a name not created changes nothing", func(t *testing.T) {
		b, _, err := a.Apply(InitCommand("vol0", "alpha", 1, []string{"alpha", "beta"}))
		if err != nil {
			t.Fatal(err)
		}
		c, _, err := b.Apply(DeleteVolumeCommand("vol0"))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Volume("vol0"); !ok {
			t.Fatal("a delete removed a volume of the cluster file")
		}
	})
}
