package applier

import (
	"errors"
	"slices"
	"testing"

	"github.com/replvol/replvol/node/applier/apply"
	"github.com/replvol/replvol/replication"
)

// apply is the step (apply.Stream.Apply) as the tests of this package
// call it: one batch, its ack.
func (in *Stream) apply(v *Volume, entries []replication.Entry, readReply func(seq uint64, st replication.AckStatus, data []byte) error) replication.Ack {
	a, err := in.Apply(v, apply.Batch{Entries: entries, ReadReply: readReply})
	if err != nil {
		panic(err)
	}
	return a
}

// TestAStoppedStreamAppliesNothing: once a stream is stopped (a newer one
// replaced it, or the volume stops), the step applies nothing of a batch
// and says so with ErrStopped, and a batch that runs tells its Applying
// hook when it starts and when it is done (Run paces its empty acks by it).
func TestAStoppedStreamAppliesNothing(t *testing.T) {
	v, _, tr := newVolume(1 << 16)
	in := NewStream("alpha")
	var applying []bool
	b := apply.Batch{Entries: []replication.Entry{{Op: replication.OpWrite, Seq: 1, Off: 0, Length: 512, Data: make([]byte, 512)}},
		Applying: func(on bool) { applying = append(applying, on) }}
	if ack, err := in.Apply(v, b); err != nil || ack != (replication.Ack{Seq: 1}) {
		t.Fatalf("apply: ack %+v, %v; want seq 1 OK", ack, err)
	}
	if !slices.Equal(applying, []bool{true, false}) {
		t.Errorf("the Applying hook was told %v; want [true false]", applying)
	}
	before := len(tr.list())
	in.Stop()
	b.Entries[0].Seq = 2
	if _, err := in.Apply(v, b); !errors.Is(err, apply.ErrStopped) {
		t.Fatalf("apply after Stop: %v; want ErrStopped", err)
	}
	if got := tr.list()[before:]; len(got) != 0 {
		t.Errorf("a stopped stream applied %q", got)
	}
}
