package transport

import "testing"

func TestClusterStatusVolumeFindsByName(t *testing.T) {
	cs := &ClusterStatus{Volumes: []VolumeStatus{{Name: "vol0", Primary: "alpha"}, {Name: "vol1", Primary: "beta"}}}
	if v, ok := cs.Volume("vol1"); !ok || v.Primary != "beta" {
		t.Fatalf("Volume(vol1) = %+v, %v; want beta's vol1", v, ok)
	}
	if v, ok := cs.Volume("vol9"); ok {
		t.Fatalf("Volume(vol9) = %+v, found; want not found", v)
	}
}
