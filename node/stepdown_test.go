package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// TestAStepDownSyncsTheDiskBeforeTheIndicatorGoes: alpha's writes are in
// its page cache (its fault disk loses what was not synced in a power
// loss) when it stops being primary. The new primary's FLUSH counts
// alpha's disk as holding them (a stream to alpha marks only what alpha
// acknowledges from then on), so the step's last action syncs the disk
// BEFORE the primary indicator goes; when the sync fails, the indicator
// stays set, and a crash resyncs the activity log's extents.
func TestAStepDownSyncsTheDiskBeforeTheIndicatorGoes(t *testing.T) {
	for _, syncFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync fails: %v", syncFails), func(t *testing.T) {
			c := newTestCluster(t, 8<<20)
			o := c.opts["alpha"]
			o.OpenDisk = openFaulty(func(d *fault.Disk) { d.Add(fault.On(fault.Write, fault.Zero).Lose()) })
			c.opts["alpha"] = o
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			a := c.vol("alpha")
			writeRandomBlocks(t, a, 10, 3)
			fd := c.faultDisk("alpha")
			if fd.Unsynced() == 0 {
				t.Fatal("alpha's writes went to its disk synced: the test needs them in its cache")
			}
			if syncFails {
				fd.Add(fault.On(fault.Sync).Err(errInjectedDisk))
			}
			// The step-down's step names another primary; this test does
			// its last action alone.
			stepDownInPlace(a, "beta")
			a.perform(volstate.Action{Kind: volstate.ClearPrimaryIndicator}, driveOptions{})
			indicator := a.durable.md.Superblock().Flags&metadata.FlagPrimary != 0
			switch {
			case !syncFails && (fd.Unsynced() != 0 || indicator):
				t.Fatalf("after the step-down %d sectors are in alpha's cache only, indicator set %v: want none, and the indicator cleared", fd.Unsynced(), indicator)
			case syncFails && !indicator:
				t.Fatal("the disk's sync failed and the primary indicator went: a power loss now costs writes nothing marks")
			}
		})
	}
}

// stepDownInPlace has v's state name to as its primary, as a step-down's
// step leaves it, without the step's actions: a test of one of them.
func stepDownInPlace(v *Volume, to string) {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.st.Durable.Primary = to
	v.publishLocked()
}

// TestAStepDownsIndicatorClearSparesAPrimaryMadeMeanwhile: a step-down's
// ClearPrimaryIndicator runs off the volume's loop (its sync may take
// long), and the loop takes other steps meanwhile. When one made this
// node primary again (the operator's force), the indicator it set covers
// that primary's writes, which the step-down's sync did not: it stays
// set, so that a crash resyncs their activity log and computes their
// checksums again. Found by the simulation with its waits interleaved
// (seed 1095 of -interleave).
func TestAStepDownsIndicatorClearSparesAPrimaryMadeMeanwhile(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	indicator := func() bool { return a.durable.md.Superblock().Flags&metadata.FlagPrimary != 0 }
	if !indicator() {
		t.Fatal("alpha, the primary, has no primary indicator set")
	}
	stepDownInPlace(a, "beta")

	// Made primary again while the clear's sync ran: a set came since.
	sets := a.durable.primarySets.Load()
	a.stateMu.Lock()
	err := (&volumeSteps{v: a}).SetIndicator()
	a.stateMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.clearPrimaryUnlessSetSince(sets); err != nil || !indicator() {
		t.Fatalf("a clear begun before a set: %v, indicator set %v; want it set", err, indicator())
	}

	// Made primary again before the clear began: the node is primary.
	stepDownInPlace(a, "alpha")
	if err := a.clearPrimaryUnlessSetSince(a.durable.primarySets.Load()); err != nil || !indicator() {
		t.Fatalf("a clear on a node primary again: %v, indicator set %v; want it set", err, indicator())
	}

	// Neither: it goes.
	stepDownInPlace(a, "beta")
	if err := a.clearPrimaryUnlessSetSince(a.durable.primarySets.Load()); err != nil || indicator() {
		t.Fatalf("a clear with no primary since: %v, indicator set %v; want it cleared", err, indicator())
	}
}

// TestATakenBackVolumeRecordsAMissedWriteInRaftAgain: alpha remembers
// that raft has beta Outdated at its epoch (its record, before beta's
// resync ended), and hands the volume over to beta; the switchover has
// raft record beta UpToDate, and raft does not record beta primary, so
// alpha takes the volume back. Its memory no longer holds: once beta is
// gone, alpha's next write has raft record beta Outdated again BEFORE it
// completes, so that raft never promotes beta without it.
func TestATakenBackVolumeRecordsAMissedWriteInRaftAgain(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	ctx := context.Background()
	a := c.vol("alpha")
	a.mu.Lock()
	epoch := a.st.Durable.Epoch
	if a.authority.outdated == nil {
		a.authority.outdated = map[string]uint64{}
	}
	a.authority.outdated["beta"] = epoch
	a.mu.Unlock()
	handed, gen, err := a.demote(ctx, "beta", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.retake(handed, gen); err != nil {
		t.Fatal(err)
	}
	c.crash("beta")
	authority := func() replication.VolumeAuthority {
		va, _ := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return va
	}
	if !authority().IsUpToDate("beta") {
		t.Fatalf("raft has %+v before alpha's write: want beta UpToDate, or the test shows nothing", authority())
	}
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(9, 4096), 1<<20, false) == nil }, "alpha serves again")
	if !within(5*time.Second, 10*time.Millisecond, func() bool { return authority().IsOutdated("beta") }) {
		t.Fatalf("alpha completed a write beta missed and raft has %+v: beta could be promoted without it", authority())
	}
}
