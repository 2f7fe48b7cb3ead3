package backing

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/clock"
)

// TestAMultipathDiskKeepsTheClockItIsOpenedWith: Open gives the multipath
// device the clock of its options, so that its path rules (the checker,
// failback, flap damping, IO timeouts) run on the node's time and never
// on the real clock behind it. On a clock.Fake moved an hour on, each
// path has been in its state exactly that hour.
func TestAMultipathDiskKeepsTheClockItIsOpenedWith(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	const size = 1 << 20
	if err := os.WriteFile(path, make([]byte, size+4096), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	dc := config.MultiPath(path, path)
	d, dev, err := Open(config.VolumeConfig{Name: "vol0"}, dc, size, OpenOptions{Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if dev == nil {
		t.Fatal("a disk of two paths opened without a multipath device")
	}
	fake.Advance(time.Hour)
	for _, ps := range dev.Paths() {
		if ps.SinceChange != time.Hour {
			t.Errorf("path %s: in its state %v after the fake clock moved an hour on, want exactly an hour: the device does not keep the clock it was opened with", ps.Name, ps.SinceChange)
		}
	}
}
