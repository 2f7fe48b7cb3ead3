package node

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/replication"
)

// volatileDisk is a disk with a volatile cache, for fault injection: it
// keeps the old content of every block written since the last Sync (a
// write with FUA is durable at once), and loseUnsynced puts that content
// back in the file, as a power loss would leave it.
type volatileDisk struct {
	Disk
	mu  sync.Mutex
	pre map[int64][]byte // block → its content at the last Sync
}

func (d *volatileDisk) keep(off, length int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pre == nil {
		d.pre = map[int64][]byte{}
	}
	for b := off / replication.BlockSize; b*replication.BlockSize < off+length; b++ {
		if _, ok := d.pre[b]; ok {
			continue
		}
		old := make([]byte, replication.BlockSize)
		if _, err := d.Disk.ReadAt(old, b*replication.BlockSize); err == nil {
			d.pre[b] = old
		}
	}
}

func (d *volatileDisk) WriteAt(p []byte, off int64) (int, error) {
	d.keep(off, int64(len(p)))
	return d.Disk.WriteAt(p, off)
}

func (d *volatileDisk) WriteAtSync(p []byte, off int64) error {
	if err := backing.WriteSync(d.Disk, p, off); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for b := off / replication.BlockSize; b*replication.BlockSize < off+int64(len(p)); b++ {
		delete(d.pre, b)
	}
	return nil
}

func (d *volatileDisk) Zero(off, length int64) error {
	d.keep(off, length)
	return d.Disk.Zero(off, length)
}

func (d *volatileDisk) Sync() error {
	err := d.Disk.Sync()
	if err == nil {
		d.mu.Lock()
		d.pre = nil
		d.mu.Unlock()
	}
	return err
}

// loseUnsynced writes the content of the last Sync back into the file at
// path (the disk is closed) and returns how many blocks went back.
func (d *volatileDisk) loseUnsynced(t *testing.T, path string) int {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d.mu.Lock()
	defer d.mu.Unlock()
	for b, old := range d.pre {
		if _, err := f.WriteAt(old, b*replication.BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	n := len(d.pre)
	d.pre = nil
	return n
}

// TestAPowerLossOfTheSecondaryResyncsItsActivityLog: beta acknowledges
// writes once they are in its page cache. A power loss then takes some
// away, unflushed; beta comes back after the reboot, resyncs its activity
// log's extents from alpha, and the disks are equal again. A crash of
// the process alone (the same boot: the page cache kept the writes)
// resyncs nothing.
func TestAPowerLossOfTheSecondaryResyncsItsActivityLog(t *testing.T) {
	const size = 16 << 20
	c := newTestCluster(t, size)
	vd := &volatileDisk{}
	opts := Options{OpenDisk: func(path string, size int64) (Disk, error) {
		d, err := OpenDisk(path, size)
		vd.Disk = d
		return vd, err
	}}
	c.opts["beta"] = opts
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")

	// A crash of the process: nothing is lost, nothing is resynced.
	writeRandomBlocks(t, a, 50, 8)
	c.crash("beta")
	c.start("beta")
	c.waitInSync()
	if moved := c.vol("beta").resynced.Load(); moved != 0 {
		t.Fatalf("beta's process crashed (no reboot) and %d bytes were resynced, want 0", moved)
	}
	c.requireIdentical()

	// A power loss: the writes beta acknowledged since its last sync go.
	writeRandomBlocks(t, a, 200, 7)
	c.crash("beta")
	path := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	if lost := vd.loseUnsynced(t, path); lost == 0 {
		t.Fatal("beta had no unsynced write to lose: the test shows nothing")
	}
	if bytes.Equal(c.disk("alpha")[:size], c.disk("beta")[:size]) {
		t.Fatal("beta's disk lost nothing: the test shows nothing")
	}
	opts.bootID = "after-a-reboot"
	c.opts["beta"] = opts
	c.start("beta")
	c.waitInSync()
	c.requireIdentical()
	evs, err := c.nodes["beta"].store.Events(50)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || (e.Kind == "crashed-secondary" && strings.Contains(e.Message, "resynced from the primary"))
	}
	if !found {
		t.Fatal("no crashed-secondary event on beta")
	}
}
