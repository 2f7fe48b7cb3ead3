package mdtest

import (
	"bytes"
	"testing"
)

// TestCrashKeepsOnlySynced: a crash keeps synced writes, loses unsynced
// ones, or keeps the sectors of them that the caller says reached the media;
// dropped and torn writes report success and change less than asked.
func TestCrashKeepsOnlySynced(t *testing.T) {
	d := NewDevice(1 << 20)
	a, b := bytes.Repeat([]byte{'a'}, 4096), bytes.Repeat([]byte{'b'}, 4096)
	d.WriteAt(a, 0)
	d.Sync()
	d.WriteAt(b, 0)
	if got := d.Snapshot(0, 4096); !bytes.Equal(got, b) {
		t.Fatal("reads do not see the unsynced write")
	}
	if got := d.Crash().Snapshot(0, 4096); !bytes.Equal(got, a) {
		t.Fatal("a crash kept an unsynced write")
	}
	torn := d.CrashKeeping(func(int, int64, int) int { return 2 }).Snapshot(0, 4096)
	if !bytes.Equal(torn[:1024], b[:1024]) || !bytes.Equal(torn[1024:], a[1024:]) {
		t.Fatal("a torn crash did not keep exactly two sectors")
	}

	d.SetInjector(func(op Op) Fault {
		switch {
		case op.Kind == OpWrite && op.N == 3:
			return Fault{Drop: true}
		case op.Kind == OpWrite && op.N == 4:
			return Fault{Tear: 1}
		case op.Kind == OpSync:
			return Fault{Err: ErrInjected}
		}
		return Fault{}
	})
	c := bytes.Repeat([]byte{'c'}, 4096)
	if n, err := d.WriteAt(c, 8192); n != 4096 || err != nil {
		t.Fatal("a dropped write must report success")
	}
	if !bytes.Equal(d.Snapshot(8192, 4096), make([]byte, 4096)) {
		t.Fatal("a dropped write changed the device")
	}
	d.WriteAt(c, 8192)
	if got := d.Snapshot(8192, 4096); !bytes.Equal(got[:512], c[:512]) || got[512] != 0 {
		t.Fatal("a torn write did not land one sector")
	}
	if d.Sync() == nil {
		t.Fatal("injected sync error lost")
	}
	if ops, _ := d.Count(OpWrite); ops != 4 {
		t.Fatalf("%d writes counted", ops)
	}
}
