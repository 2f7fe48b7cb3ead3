package node

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/replvol/replvol/internal/fault"
)

// TestAPowerLossOfTheSecondaryResyncsItsActivityLog: beta acknowledges
// writes once they are in its page cache. A power loss then takes some
// away, unflushed; beta comes back after the reboot, resyncs its activity
// log's extents from alpha, and the disks are equal again. A crash of
// the process alone after a FLUSH (the same boot: the page cache kept the
// writes) resyncs nothing.
func TestAPowerLossOfTheSecondaryResyncsItsActivityLog(t *testing.T) {
	const size = 16 << 20
	c := newTestCluster(t, size)
	// beta's disk has a volatile cache: what it acknowledged since its
	// last sync (but a write with FUA) a power loss takes away.
	var vd atomic.Pointer[fault.Disk]
	opts := Options{OpenDisk: openFaulty(func(d *fault.Disk) {
		d.Add(fault.On(fault.Write, fault.Zero).Lose())
		vd.Store(d)
	})}
	c.opts["beta"] = opts
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")

	// A crash of the process after a FLUSH: nothing is lost, nothing is
	// resynced. (Without the FLUSH alpha resyncs what beta acknowledged
	// since its last flush: it cannot tell a crash of beta's process from
	// a power loss.)
	writeRandomBlocks(t, a, 50, 8)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	if lost := loseUnsynced(t, vd.Load(), path); lost == 0 {
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
