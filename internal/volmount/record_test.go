package volmount

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRegistryKeepsOneRecordPerMountPoint: a record is created once (the second Create of a
// mount point is ErrAlreadyMounted: the lock two replctl mounts of one directory meet at),
// saved over, listed, and removed; mount points with odd names get files of their own.
func TestRegistryKeepsOneRecordPerMountPoint(t *testing.T) {
	reg := Registry{Dir: t.TempDir() + "/mounts"}
	dirs := []string{"/srv/data", "/srv/data-2", "/srv/a b", "/srv/100%", "/srv/data/sub"}
	for _, d := range dirs {
		if err := reg.Create(&Record{Dir: d, Volume: "vol0", Via: ViaFUSE, Created: time.Now()}); err != nil {
			t.Fatalf("Create %s: %v", d, err)
		}
	}
	if err := reg.Create(&Record{Dir: "/srv/data"}); !errors.Is(err, ErrAlreadyMounted) {
		t.Fatalf("a second Create: %v, want ErrAlreadyMounted", err)
	}
	rec, err := reg.Load("/srv/a b")
	if err != nil || rec.Dir != "/srv/a b" || rec.Volume != "vol0" {
		t.Fatalf("Load: %+v, %v", rec, err)
	}
	rec.Loop, rec.Mounted = "/dev/loop7", true
	if err := reg.Save(rec); err != nil {
		t.Fatal(err)
	}
	if again, err := reg.Load("/srv/a b"); err != nil || again.Loop != "/dev/loop7" || !again.Mounted {
		t.Fatalf("Load after Save: %+v, %v", again, err)
	}
	all, err := reg.List()
	if err != nil || len(all) != len(dirs) {
		t.Fatalf("List: %d records, %v; want %d", len(all), err, len(dirs))
	}
	for _, d := range dirs {
		if !strings.HasPrefix(reg.FUSEDir(d), reg.Dir+"/") || strings.Contains(strings.TrimPrefix(reg.FUSEDir(d), reg.Dir+"/"), "/") {
			t.Errorf("FUSEDir(%s) = %s: not a file of the run directory", d, reg.FUSEDir(d))
		}
	}
	if err := reg.Remove("/srv/data"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Load("/srv/data"); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("Load after Remove: %v, want ErrNoRecord", err)
	}
	if err := reg.Remove("/srv/data"); err != nil {
		t.Fatalf("a second Remove: %v", err)
	}
}
