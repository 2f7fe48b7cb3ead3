package transport

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestClusterStatusVolumeFindsByName(t *testing.T) {
	cs := &ClusterStatus{Volumes: []VolumeStatus{{Name: "vol0", Primary: "alpha"}, {Name: "vol1", Primary: "beta"}}}
	if v, ok := cs.Volume("vol1"); !ok || v.Primary != "beta" {
		t.Fatalf("Volume(vol1) = %+v, %v; want beta's vol1", v, ok)
	}
	if v, ok := cs.Volume("vol9"); ok {
		t.Fatalf("Volume(vol9) = %+v, found; want not found", v)
	}
}

// TestIntegrityStatusJSON pins the names issue 29 gives the integrity
// part of a replica's status: scrub idle with no last_finished is null.
func TestIntegrityStatusJSON(t *testing.T) {
	b, err := json.Marshal(LocalVolume{Integrity: &IntegrityStatus{Checksums: true, RepairedBlocks: 2, Scrub: ScrubStatus{State: "idle"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := `"integrity":{"checksums":true,"repaired_blocks":2,"unrecoverable_blocks":0,"bad_blocks":0,"scrub":{"state":"idle","percent":0,"last_finished":null,"last_repaired":0}}`
	if !strings.Contains(string(b), want) {
		t.Fatalf("status JSON %s lacks %s", b, want)
	}
}
