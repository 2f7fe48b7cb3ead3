package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestStatusShowsBadBlocks: a replica with blocks on its bad-block list
// is named under the volume's table, with what it means and what to do,
// and in the volume's warnings; with none, nothing is said.
func TestStatusShowsBadBlocks(t *testing.T) {
	st := sampleStatus()
	v := &st.Volumes[0]
	for i := range v.Replicas {
		v.Replicas[i].Integrity = &transport.ReplicaIntegrity{Checksums: true, Scrub: transport.ScrubSummary{State: "idle"}}
	}
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	if strings.Contains(out.String(), "bad block") {
		t.Fatalf("a replica with no bad blocks shows:\n%s", out.String())
	}
	v.Replicas[0].Integrity.BadBlocks = 3
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{
		"  alpha: 3 bad blocks (could not be rewritten; read from a peer in sync; the disk is detached when the list is full): replctl events --node alpha names them (bad-block); plan to replace the disk\n",
		"! alpha 3 bad blocks",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}
