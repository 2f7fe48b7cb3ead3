package volmount

import (
	"strings"
	"testing"
)

// TestParseMountinfo: mount points with escaped spaces, optional fields, and a directory
// mounted over twice (the later line is on top).
func TestParseMountinfo(t *testing.T) {
	const text = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 7:3 / /srv/my\040data rw,relatime shared:50 - ext4 /dev/loop3 rw
99 22 0:55 / /run/replvol/mounts/srv%2Fdata.fuse rw,nosuid,nodev,relatime shared:51 - fuse.replvol replvol:vol0 rw,user_id=0,group_id=0
100 98 43:0 / /srv/my\040data rw - xfs /dev/nbd0 rw
`
	mounts, err := parseMountinfo(strings.NewReader(text))
	if err != nil || len(mounts) != 4 {
		t.Fatalf("%d mounts, %v", len(mounts), err)
	}
	m, ok := mountedOn(mounts, "/srv/my data")
	if !ok || m.Source != "/dev/nbd0" || m.FSType != "xfs" || m.Dev != "43:0" {
		t.Fatalf("on /srv/my data: %+v %v, want the xfs on top", m, ok)
	}
	m, ok = mountedOn(mounts, "/run/replvol/mounts/srv%2Fdata.fuse")
	if !ok || m.FSType != "fuse.replvol" || m.Source != "replvol:vol0" {
		t.Fatalf("the FUSE mount: %+v %v", m, ok)
	}
	if _, ok := mountedOn(mounts, "/srv"); ok {
		t.Fatal("/srv is no mount point")
	}
	if _, err := parseMountinfo(strings.NewReader("1 2 3\n")); err == nil {
		t.Fatal("a malformed line was taken")
	}
}
