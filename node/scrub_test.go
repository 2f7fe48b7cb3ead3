package node

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/transport"
)

// scrubOf is name's scrub of vol0, as its status says.
func (c *testCluster) scrubOf(name string) transport.ScrubStatus {
	c.t.Helper()
	return c.vol(name).scrubStatus()
}

// waitScrubFinished waits until name's scrub of vol0 has finished (idle,
// with a last_finished).
func (c *testCluster) waitScrubFinished(t *testing.T, name string) transport.ScrubStatus {
	t.Helper()
	var st transport.ScrubStatus
	if !within(60*time.Second, 10*time.Millisecond, func() bool {
		st = c.scrubOf(name)
		return st.State == "idle" && st.LastFinished != nil
	}) {
		t.Fatalf("%s: the scrub did not finish: %+v", name, st)
	}
	return st
}

// writeFlushed writes data at off through alpha, the primary, and
// flushes.
func (c *testCluster) writeFlushed(t *testing.T, data []byte, off int64) {
	t.Helper()
	ctx := context.Background()
	v := c.vol("alpha")
	if err := v.WriteAt(ctx, data, off, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAScrubRepairsBothReplicas: blocks rotten on the primary's disk and
// others on the secondary's: a scrub on each node repairs every one (the
// primary from the secondary, the secondary from the primary), counts
// them in status and in the scrub-finished event, and the replicas are
// identical again.
func TestAScrubRepairsBothReplicas(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	data := randomBytes(51, 2<<20)
	c.writeFlushed(t, data, 1<<20)
	c.waitInSync()
	rotten := map[string][]int64{"alpha": {300, 301, 420}, "beta": {260, 380, 500, 510, 767}}
	for name, blocks := range rotten {
		for _, b := range blocks {
			flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, b*4096+123, 2)
		}
	}
	for _, name := range []string{"alpha", "beta"} {
		if _, err := c.vol(name).scrubCommand(0, false, false, false, false); err != nil {
			t.Fatalf("%s: start the scrub: %v", name, err)
		}
	}
	for _, name := range []string{"alpha", "beta"} {
		st := c.waitScrubFinished(t, name)
		if st.LastRepaired != int64(len(rotten[name])) || st.LastUnrecoverable != 0 || st.Percent != 100 {
			t.Fatalf("%s: scrub status %+v, want %d repaired, none unrecoverable", name, st, len(rotten[name]))
		}
		e := waitForEvent(t, c.nodes[name], "scrub-finished", nil)
		if !bytes.Contains([]byte(e.Message), []byte("512 blocks checked")) {
			t.Fatalf("%s: scrub-finished says %q, want the 512 blocks written checked", name, e.Message)
		}
	}
	c.requireIdentical()
	if got := c.disk("beta")[1<<20 : 3<<20]; !bytes.Equal(got, data) {
		t.Fatal("beta's disk does not hold the data written")
	}
	waitMetric(t, c.nodes["beta"], "the scrub done", metricIs(1), "replvol_scrub_progress_ratio", "volume=vol0", "node=beta")
}

// TestAScrubOfABlockBadEverywhereCountsItUnrecoverable: the same block
// rotten on both replicas: the scrub goes on past it, counts it
// unrecoverable, and names it in the block-unrecoverable event.
func TestAScrubOfABlockBadEverywhereCountsItUnrecoverable(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(52, 1<<20), 0)
	c.waitInSync()
	for _, name := range []string{"alpha", "beta"} {
		flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, 77*4096+5, 1)
	}
	flipFileBytes(t, c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, 99*4096+5, 1)
	if _, err := c.vol("beta").scrubCommand(0, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	st := c.waitScrubFinished(t, "beta")
	if st.LastUnrecoverable != 1 || st.LastRepaired != 1 {
		t.Fatalf("scrub status %+v, want 1 unrecoverable and 1 repaired", st)
	}
	e := waitForEvent(t, c.nodes["beta"], "block-unrecoverable", nil)
	if e.Offset != 77*4096 || e.Length != 4096 {
		t.Fatalf("block-unrecoverable event: %+v", e)
	}
}

// TestAScrubPausesResumesStopsAndResumesAfterARestart: a slow scrub is
// paused and resumed where it was; a restart of the node resumes a
// running scrub from its checkpoint, not from 0; stop makes it idle; bad
// commands are refused and change nothing.
func TestAScrubPausesResumesStopsAndResumesAfterARestart(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(53, 1<<20), 0)
	v := c.vol("beta")
	if _, err := v.scrubCommand(0, true, false, false, false); err == nil {
		t.Fatal("a pause with no scrub running was taken")
	}
	if _, err := v.scrubCommand(0, false, true, false, false); err == nil {
		t.Fatal("a resume with no scrub paused was taken")
	}
	if st := c.scrubOf("beta"); st.State != "idle" || st.LastFinished != nil {
		t.Fatalf("a refused command changed the scrub: %+v", st)
	}
	// 1 MiB/s over 8 MiB: about 8 s.
	if _, err := v.scrubCommand(1<<20, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := v.scrubCommand(0, false, false, false, false); err == nil {
		t.Fatal("a second scrub was started over a running one")
	}
	eventually(t, func() bool { return c.scrubOf("beta").Percent >= 15 }, "the scrub reaches 15%")
	st, err := v.scrubCommand(0, true, false, false, false)
	if err != nil || st.State != "paused" {
		t.Fatalf("pause: %+v, %v", st, err)
	}
	paused := st.Percent
	if st := c.scrubOf("beta"); st.Percent != paused {
		t.Fatalf("a paused scrub moved on: %.1f%% then %.1f%%", paused, st.Percent)
	}
	if _, err := v.scrubCommand(0, false, true, false, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return c.scrubOf("beta").Percent >= paused+10 }, "the resumed scrub moves on")
	before := c.scrubOf("beta").Percent
	c.stop("beta")
	c.start("beta")
	st = c.scrubOf("beta")
	if st.State != "running" || st.Percent < before {
		t.Fatalf("after a restart the scrub is %s at %.1f%%, want running from %.1f%% (its checkpoint)", st.State, st.Percent, before)
	}
	st, err = c.vol("beta").scrubCommand(0, false, false, true, false)
	if err != nil || st.State != "idle" || st.LastFinished != nil {
		t.Fatalf("stop: %+v, %v", st, err)
	}
	c.stop("beta")
	c.start("beta")
	if st := c.scrubOf("beta"); st.State != "idle" {
		t.Fatalf("a stopped scrub came back %s after a restart", st.State)
	}
}

// TestAScrubDoesNotRaceWrites: writes run on the primary while both nodes
// scrub at full speed: no block is taken for bad (no repair), and the
// replicas are identical at the end.
func TestAScrubDoesNotRaceWrites(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 8<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.writeFlushed(t, randomBytes(54, 8<<20), 0)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		v := c.vol("alpha")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Up to 3 blocks from one of the first 2046: every write
			// lies inside the 2048 blocks of the volume, however many
			// the writer gets through (alone, once a peer timed out, it
			// passes 2018 writes in a few seconds).
			off := int64((i*7919)%2046) * 4096
			if err := v.WriteAt(ctx, randomBytes(uint64(i), 4096*(1+i%3)), off, i%5 == 0); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for round := 0; round < 3; round++ {
		for _, name := range []string{"alpha", "beta"} {
			if _, err := c.vol(name).scrubCommand(1<<40, false, false, false, false); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"alpha", "beta"} {
			if st := c.waitScrubFinished(t, name); st.LastRepaired != 0 || st.LastUnrecoverable != 0 {
				t.Fatalf("%s: a scrub racing writes found %d blocks bad and %d unrecoverable", name, st.LastRepaired, st.LastUnrecoverable)
			}
		}
	}
	close(stop)
	wg.Wait()
	if err := c.vol("alpha").Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestASecondaryBehindItsPrimaryDoesNotCallABlockLost: a secondary
// whose block fails its sum asks its primary for it while the primary's
// newer write of it is still on its way (protocol A, the link held): the
// primary's copy, good by its own sum, is another version than the
// secondary's sum. That is no verdict of lost: the scrub counts nothing
// unrecoverable, names no block, and once the link heals the write
// arrives and a scrub finds the replicas whole and identical.
func TestASecondaryBehindItsPrimaryDoesNotCallABlockLost(t *testing.T) {
	c, link := partitionableCluster(t, 8<<20)
	c.cfg.Volumes[0].Protocol = "A"
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	const block = 10
	c.writeFlushed(t, randomBytes(61, 64<<10), 0)
	c.waitInSync()
	beta := c.vol("beta")
	in := beta.incomingStream()
	if in == nil {
		t.Fatal("beta has no stream from alpha")
	}

	link.Partition()
	newer := randomBytes(62, 4096)
	if err := c.vol("alpha").WriteAt(context.Background(), newer, block*4096, false); err != nil {
		t.Fatal(err)
	}
	// beta's copy rots: it fails beta's sum, which is of the older data.
	flipFileBytes(t, c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, block*4096+7, 1)
	if _, err := beta.scrubCommand(1<<40, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	st := c.waitScrubFinished(t, "beta")
	if beta.incomingStream() != in {
		// The partition holds beta's end of the link: its stream from
		// alpha stays, whatever alpha gave up meanwhile.
		t.Fatal("beta's stream from alpha ended during the partition")
	}
	if st.LastUnrecoverable != 0 || st.LastRepaired != 0 {
		t.Fatalf("beta's scrub while alpha's newer write of the block is on its way: %d repaired, %d unrecoverable; want neither", st.LastRepaired, st.LastUnrecoverable)
	}
	if _, _, lost := c.integrityOf("beta"); lost != 0 {
		t.Fatalf("beta counts %d blocks unrecoverable", lost)
	}
	if kinds := c.eventKinds("beta"); kinds["block-unrecoverable"] != 0 {
		t.Fatalf("beta reported %d blocks unrecoverable", kinds["block-unrecoverable"])
	}

	link.Heal()
	if err := c.vol("alpha").Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	if got := c.disk("beta")[block*4096 : (block+1)*4096]; !bytes.Equal(got, newer) {
		t.Fatal("beta's block is not alpha's newer write after the heal")
	}
	if _, err := beta.scrubCommand(1<<40, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	if st := c.waitScrubFinished(t, "beta"); st.LastUnrecoverable != 0 || st.LastRepaired != 0 {
		t.Fatalf("beta's scrub after the heal: %d repaired, %d unrecoverable; want neither", st.LastRepaired, st.LastUnrecoverable)
	}
	c.requireIdentical()
}

// TestScrubIntervalStartsAScrubByItself: with scrub_interval 24h, a node
// that never scrubbed the volume schedules a scrub a day after it began
// running it with the setting (a restart half-way keeps that), starts it
// by itself once its clock (a clock.Fake) passes that, not a second
// before, then schedules the next a day after that scrub finished, and
// one the operator stops a day after the stop.
func TestScrubIntervalStartsAScrubByItself(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	c.cfg.Volumes[0].ScrubInterval = Duration(24 * time.Hour)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	fc := clock.NewFake(start)
	c.opts["alpha"] = Options{clock: fc}
	c.start("alpha")
	next := func() time.Time {
		st := c.scrubOf("alpha")
		if st.NextScheduled == nil {
			return time.Time{}
		}
		return *st.NextScheduled
	}
	eventually(t, func() bool { return !next().IsZero() }, "a scrub scheduled")
	if got, want := next(), start.Add(24*time.Hour); !got.Equal(want) {
		t.Fatalf("the first scrub is scheduled at %v, want a day after the node began: %v", got, want)
	}
	scheduled := func(e statefile.Event) bool { return strings.Contains(e.Message, "by itself") }
	// A restart half-way does not move the schedule on: when it began
	// is in the state file.
	fc.Advance(12 * time.Hour)
	c.stop("alpha")
	c.start("alpha")
	eventually(t, func() bool { return !next().IsZero() }, "a scrub scheduled after the restart")
	if got, want := next(), start.Add(24*time.Hour); !got.Equal(want) {
		t.Fatalf("after a restart the first scrub is scheduled at %v, want still %v", got, want)
	}
	fc.Advance(12*time.Hour - time.Second)
	if st := c.scrubOf("alpha"); st.State != "idle" || st.LastFinished != nil {
		t.Fatalf("a second before the interval passed, the scrub is %+v, want idle and never run", st)
	}
	fc.Advance(time.Second)
	e := waitForEvent(t, c.nodes["alpha"], "scrub", scheduled)
	if !strings.Contains(e.Message, "scrub_interval is 24h0m0s") {
		t.Errorf("the scrub's event says %q, want it to name the interval", e.Message)
	}
	var finished time.Time
	eventually(t, func() bool {
		fc.Advance(time.Second) // the scrub's rate runs on the node's clock
		if st := c.scrubOf("alpha"); st.LastFinished != nil {
			finished = *st.LastFinished
			return true
		}
		return false
	}, "the scheduled scrub finished")
	eventually(t, func() bool { return next().Equal(finished.Add(24 * time.Hour)) }, "the next scrub scheduled a day after the last finished")
	// The next starts a day later; the operator stops it: the one after
	// is due a day after the stop, not at once.
	fc.Advance(finished.Add(24 * time.Hour).Sub(fc.Now()))
	eventually(t, func() bool { return c.scrubOf("alpha").State == "running" }, "the second scheduled scrub running")
	stopped := fc.Now()
	if _, err := c.vol("alpha").scrubCommand(0, false, false, true, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return next().Equal(stopped.Add(24 * time.Hour)) }, "the next scrub scheduled a day after the operator stopped one")
	if st := c.scrubOf("alpha"); st.State != "idle" {
		t.Fatalf("after the operator's stop the scrub is %s, want idle", st.State)
	}
	evs, err := c.nodes["alpha"].store.Events(500)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Kind == "scrub" && scheduled(e) {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d scrubs started by themselves, want 2", n)
	}
}
