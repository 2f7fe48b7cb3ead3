package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/applier"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// A scrub (replctl scrub, docs/integrity.md) reads this node's whole disk
// of a volume in order, at a rate, verifies every block that has a known
// checksum, and repairs a bad one (a mismatch, or EIO) with the code a
// verified read repairs with (repairBlock): on the primary from a peer in
// sync, on a secondary from its primary (ReadBlocks). A block no replica
// holds good is counted unrecoverable, with the block-unrecoverable
// event. It runs on the primary and on a secondary whose disk is
// UpToDate. On the primary each range is read under the range lock a
// read takes, which excludes the writes to it; on a secondary under the
// stream's apply lock (applier.Stream.Exclusive), and a repair is written
// only if the block's sum did not change meanwhile. The offset reached
// is the checkpoint, kept in the state file every scrubCheckpointEvery or
// scrubCheckpointBytes and whenever the scrub stops, so a restart resumes
// a running or paused scrub there.
//
// Every scrub also builds the sums of the blocks that have none (a volume
// whose checksums were just turned on, metadata made by create-md over
// existing data, blocks trimmed or written in part): each is computed
// from what the range read, under the same lock, so a write to the block
// is ordered before or after it and never has its sum replaced by a
// stale one. The pass that turning checksums on starts is such a scrub,
// marked Build in the state file and shown as the integrity's build in
// status. The sums it stored are flushed BEFORE the checkpoint that
// passes them is written, so a restart never skips a block whose sum was
// lost.

const (
	// scrubChunk is what a scrub reads at once.
	scrubChunk = 256 << 10
	// scrubRateShare: by default a scrub reads at this share of the
	// volume's resync rate (resync_rate / scrubRateShare) ...
	scrubRateShare = 4
	// defaultScrubRate: ... or, when resync is uncapped, at this rate.
	defaultScrubRate = 64 << 20
	// scrubCheckpointEvery and scrubCheckpointBytes: the checkpoint is
	// written at least this often while a scrub runs.
	scrubCheckpointEvery = 5 * time.Second
	scrubCheckpointBytes = 256 << 20
	// scrubRetry: a secondary's scrub waits this long for its stream
	// from the primary, or for its disk to be UpToDate again.
	scrubRetry = time.Second
	// scrubScheduleRetry: a scrub due by scrub_interval that cannot start
	// (one runs or is paused, the disk is not UpToDate) is tried again
	// this much later.
	scrubScheduleRetry = 10 * time.Minute
)

// scrubPhase is where a volume's scrub is on this node.
type scrubPhase int

const (
	scrubIdle scrubPhase = iota
	scrubRunning
	scrubPaused
)

// String is the phase's word in status (integrity.scrub.state) and in
// the state file.
func (p scrubPhase) String() string {
	switch p {
	case scrubRunning:
		return "running"
	case scrubPaused:
		return "paused"
	}
	return "idle"
}

func scrubPhaseOf(word string) scrubPhase {
	switch word {
	case "running":
		return scrubRunning
	case "paused":
		return scrubPaused
	}
	return scrubIdle
}

// errScrubWaits: a secondary's scrub cannot go on now (no stream from
// the primary, or its disk not UpToDate); it tries again.
var errScrubWaits = errors.New("the scrub waits")

// scrubber is a volume's scrub on this node. mu (a leaf) guards it; one
// loop (runScrub) at a time reads the disk and moves rec.Offset on.
type scrubber struct {
	mu    mutex
	phase scrubPhase
	rec   statefile.ScrubState
	// stop ends the running loop (a pause or a stop); done is closed
	// once it ended. Both nil when no loop runs.
	stop, done chan struct{}
	// rate is the running scrub's rate; since and from when and where
	// this run started (for the ETA).
	rate  int64
	since time.Time
	from  int64
	// next is when scrub_interval starts the next scrub (zero: it is
	// not set); ended wakes its loop when a scrub ends (nil without
	// scrub_interval).
	next  time.Time
	ended chan struct{}
}

// scrubRate is the rate a scrub asked to read at rate (0: the default)
// reads at.
func (v *Volume) scrubRate(rate int64) int64 {
	switch {
	case rate > 0:
		return rate
	case v.settings().resyncRate > 0:
		return max(v.settings().resyncRate/scrubRateShare, 1)
	}
	return defaultScrubRate
}

// scrubCommand runs the operator's scrub command here and says where the
// scrub is then.
func (v *Volume) scrubCommand(rate int64, pause, resume, stop, query bool) (transport.ScrubStatus, error) {
	var err error
	switch {
	case query:
	case rate < 0:
		err = fmt.Errorf("scrub rate %d: give a rate above 0, or none for the default", rate)
	case pause:
		err = v.pauseScrub(scrubPaused)
	case stop:
		err = v.pauseScrub(scrubIdle)
	case resume:
		err = v.startScrub(0, true)
	default:
		err = v.startScrub(rate, false)
	}
	return v.scrubStatus(), err
}

// startScrub starts a scrub from the volume's first byte at rate, or,
// with resume, the paused one from its checkpoint. The state file says
// so BEFORE it starts.
func (v *Volume) startScrub(rate int64, resume bool) error {
	if !v.durable.integ.on() {
		return fmt.Errorf("%s keeps no checksums on %s (its metadata has no checksum area): there is nothing to scrub against", v.name, v.self)
	}
	if d := v.state().st.Disk; d != replication.UpToDate {
		return fmt.Errorf("the disk of %s on %s is %s: a scrub checks an UpToDate disk; start it once the disk is UpToDate", v.name, v.self, d)
	}
	msg, err := v.startScrubLocked(rate, resume)
	if err == nil {
		v.node.event(v.name, "scrub", msg)
	}
	return err
}

// startScrubLocked is startScrub's part under sc.mu: the event's words.
func (v *Volume) startScrubLocked(rate int64, resume bool) (string, error) {
	sc := &v.scrub
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.phase == scrubRunning:
		return "", fmt.Errorf("a scrub of %s is running on %s (%.1f%%): pause it (--pause) or stop it (--stop) first", v.name, v.self, v.scrubPercentLocked())
	case resume && sc.phase != scrubPaused:
		return "", fmt.Errorf("no scrub of %s is paused on %s: start one with replctl scrub %s", v.name, v.self, v.name)
	case !resume && sc.phase == scrubPaused:
		return "", fmt.Errorf("the scrub of %s on %s is paused at %.1f%%: resume it (--resume) or stop it (--stop) first", v.name, v.self, v.scrubPercentLocked())
	}
	rec := sc.rec
	rec.State = scrubRunning.String()
	if !resume {
		rec.Offset, rec.Rate, rec.Checked, rec.Repaired, rec.Unrecoverable = 0, rate, 0, 0, 0
		rec.Build, rec.Built = false, 0
	}
	if err := v.node.store.PutScrub(v.name, rec); err != nil {
		return "", fmt.Errorf("record the scrub of %s in the state file: %w", v.name, err)
	}
	sc.rec, sc.phase = rec, scrubRunning
	v.launchScrubLocked()
	what := "started"
	if resume {
		what = "resumed"
	}
	return fmt.Sprintf("scrub of %s on %s %s at %.1f%%, reading %s/s", v.name, v.self, what, v.scrubPercentLocked(), human.Bytes(v.scrubRate(rec.Rate))), nil
}

// launchScrubLocked starts the loop of a scrub that is running. Callers
// hold sc.mu.
func (v *Volume) launchScrubLocked() {
	sc := &v.scrub
	stop, done := make(chan struct{}), make(chan struct{})
	sc.stop, sc.done = stop, done
	sc.rate, sc.since, sc.from = v.scrubRate(sc.rec.Rate), v.clock.Now(), sc.rec.Offset
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		defer close(done)
		v.runScrub(stop)
	}()
}

// pauseScrub pauses (to scrubPaused) or stops (to scrubIdle) the scrub,
// and returns once its loop has ended and the state file says so.
func (v *Volume) pauseScrub(to scrubPhase) error {
	sc := &v.scrub
	sc.mu.Lock()
	switch {
	case sc.phase == scrubIdle:
		sc.mu.Unlock()
		return fmt.Errorf("no scrub of %s is running or paused on %s: nothing to %s", v.name, v.self, map[scrubPhase]string{scrubPaused: "pause", scrubIdle: "stop"}[to])
	case sc.phase == scrubPaused && to == scrubPaused:
		sc.mu.Unlock()
		return fmt.Errorf("the scrub of %s on %s is paused already: resume it with --resume", v.name, v.self)
	}
	at := v.scrubPercentLocked()
	sc.phase = to
	sc.rec.State = ""
	if to == scrubPaused {
		sc.rec.State = to.String()
	} else {
		sc.rec.Offset, sc.rec.Checked, sc.rec.Repaired, sc.rec.Unrecoverable = 0, 0, 0, 0
		// A build stopped leaves the blocks it did not reach without a
		// sum, as they were: the next scrub builds them.
		sc.rec.Build, sc.rec.Built = false, 0
		if sc.ended != nil {
			// scrub_interval's next scrub is due an interval after
			// the operator stopped this one, not at once.
			sc.rec.ScheduledSince = v.clock.Now().UTC()
			v.scrubEndedLocked()
		}
	}
	stop, done := sc.stop, sc.done
	sc.stop, sc.done = nil, nil
	rec := sc.rec
	sc.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if err := v.node.store.PutScrub(v.name, rec); err != nil {
		return fmt.Errorf("record the scrub of %s in the state file: %w", v.name, err)
	}
	word := map[scrubPhase]string{scrubPaused: "paused", scrubIdle: "stopped"}[to]
	v.node.event(v.name, "scrub", fmt.Sprintf("scrub of %s on %s %s at %.1f%%", v.name, v.self, word, at))
	return nil
}

// resumeScrubAtStart takes up the scrub the state file says was running
// or paused when the node stopped: a running one goes on from its
// checkpoint.
func (v *Volume) resumeScrubAtStart() {
	rec, ok, err := v.node.store.Scrub(v.name)
	if err != nil {
		v.log.Warn("read the scrub checkpoint", "err", err)
		return
	}
	if !ok {
		return
	}
	if !v.durable.integ.on() && rec.State != "" {
		// The metadata has no checksum area (the node went down after
		// recording the build of checksums and before laying out their
		// area, and their conversion did not happen at this start): there
		// is nothing to scrub against.
		v.log.Warn("a scrub was recorded, but the volume keeps no checksums here: it is dropped", "state", rec.State, "build", rec.Build)
		rec.State, rec.Build, rec.Offset, rec.Built = "", false, 0, 0
		if err := v.node.store.PutScrub(v.name, rec); err != nil {
			v.log.Warn("drop the scrub checkpoint", "err", err)
		}
		return
	}
	sc := &v.scrub
	sc.mu.Lock()
	sc.rec, sc.phase = rec, scrubPhaseOf(rec.State)
	running, at := sc.phase == scrubRunning, v.scrubPercentLocked()
	if running {
		v.launchScrubLocked()
	}
	sc.mu.Unlock()
	switch {
	case running && rec.Build:
		v.node.event(v.name, "scrub", fmt.Sprintf("the build of the checksums of %s on %s goes on at %.1f%%", v.name, v.self, at))
	case running:
		v.node.event(v.name, "scrub", fmt.Sprintf("scrub of %s on %s resumed after the restart at %.1f%%", v.name, v.self, at))
	}
}

// startScrubSchedule starts, when the volume has a scrub_interval, the
// loop that starts its scrubs by themselves (runScrubSchedule).
func (v *Volume) startScrubSchedule() {
	interval := time.Duration(v.cfg.ScrubInterval)
	if interval <= 0 {
		return
	}
	if !v.durable.integ.on() {
		v.log.Warn("scrub_interval is set but the volume keeps no checksums on this node (its metadata has no checksum area): no scrub is scheduled", "scrub_interval", interval)
		return
	}
	v.scrub.mu.Lock()
	v.scrub.ended = make(chan struct{}, 1)
	v.scrub.mu.Unlock()
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		v.runScrubSchedule(interval)
	}()
}

// scrubEndedLocked wakes the scrub_interval loop: a scrub ended, so the
// next is due an interval after now. Callers hold sc.mu.
func (v *Volume) scrubEndedLocked() {
	select {
	case v.scrub.ended <- struct{}{}:
	default:
	}
}

// runScrubSchedule starts a scrub whenever the last finished one is
// older than interval; a node that never finished one counts from when
// it first ran the volume with the setting, and a scrub the operator
// stopped counts as ended then (ScheduledSince, kept in the state file
// so that a restart does not move it on). It ends when the volume shuts
// down.
func (v *Volume) runScrubSchedule(interval time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-v.stopping:
		case <-ctx.Done():
		}
		cancel()
	}()
	sc := &v.scrub
	sc.mu.Lock()
	first := sc.rec.LastFinished.IsZero() && sc.rec.ScheduledSince.IsZero()
	if first {
		sc.rec.ScheduledSince = v.clock.Now().UTC()
	}
	rec := sc.rec
	sc.mu.Unlock()
	if first {
		if err := v.node.store.PutScrub(v.name, rec); err != nil {
			v.log.Warn("record when the scrub schedule began", "err", err)
		}
	}
	// wait waits d on the node's clock; next is published once the
	// timer is armed (a test that moves a fake clock on once it sees
	// next moves this timer). False: the volume shuts down.
	wait := func(d time.Duration, next time.Time) bool {
		t := v.clock.NewTimer(d)
		defer t.Stop()
		sc.mu.Lock()
		sc.next = next
		ended := sc.ended
		sc.mu.Unlock()
		select {
		case <-t.C():
		case <-ended:
		case <-ctx.Done():
			return false
		}
		return true
	}
	for {
		sc.mu.Lock()
		phase, base := sc.phase, sc.rec.LastFinished
		if sc.rec.ScheduledSince.After(base) {
			base = sc.rec.ScheduledSince
		}
		sc.mu.Unlock()
		due := base.Add(interval)
		var ok bool
		switch d := v.clock.Until(due); {
		case phase != scrubIdle:
			// A scrub runs or is paused: the next is counted from its
			// end; look again later.
			ok = wait(scrubScheduleRetry, time.Time{})
		case d > 0:
			ok = wait(d, due)
		default:
			err := v.startScheduledScrub(interval, base)
			if err == nil {
				continue
			}
			v.log.Info("a scheduled scrub is due but does not start now", "err", err, "retry_in", scrubScheduleRetry)
			ok = wait(scrubScheduleRetry, v.clock.Now().Add(scrubScheduleRetry))
		}
		if !ok {
			return
		}
	}
}

// startScheduledScrub starts the scrub scrub_interval (interval) made
// due, counted from base.
func (v *Volume) startScheduledScrub(interval time.Duration, base time.Time) error {
	if d := v.state().st.Disk; d != replication.UpToDate {
		return fmt.Errorf("the disk is %s", d)
	}
	msg, err := v.startScrubLocked(0, false)
	if err != nil {
		return err
	}
	v.node.event(v.name, "scrub", fmt.Sprintf("%s, by itself: scrub_interval is %s and the last scrub ended (or was stopped, or the schedule began) at %s", msg, interval, base.UTC().Format(time.RFC3339)))
	return nil
}

// scrubPercentLocked is how far the scrub got. Callers hold sc.mu.
func (v *Volume) scrubPercentLocked() float64 {
	size := v.size.Load()
	if size <= 0 {
		return 0
	}
	return 100 * float64(min(v.scrub.rec.Offset, size)) / float64(size)
}

// scrubStatus is the scrub's part of status (integrity.scrub).
func (v *Volume) scrubStatus() transport.ScrubStatus {
	sc := &v.scrub
	sc.mu.Lock()
	defer sc.mu.Unlock()
	rec := sc.rec
	st := transport.ScrubStatus{State: sc.phase.String(), LastRepaired: rec.LastRepaired, LastUnrecoverable: rec.LastUnrecoverable, BuiltBlocks: rec.Built}
	if !rec.LastFinished.IsZero() {
		t := rec.LastFinished
		st.LastFinished = &t
	}
	if !sc.next.IsZero() {
		t := sc.next
		st.NextScheduled = &t
	}
	if sc.phase == scrubIdle {
		if st.LastFinished != nil {
			st.Percent = 100
		}
		return st
	}
	st.Percent = v.scrubPercentLocked()
	st.CheckedBlocks, st.RepairedBlocks, st.UnrecoverableBlocks = rec.Checked, rec.Repaired, rec.Unrecoverable
	if sc.phase == scrubRunning {
		st.RateBytes = sc.rate
		if sc.rate > 0 {
			st.ETASeconds = float64(max(v.size.Load()-rec.Offset, 0)) / float64(sc.rate)
		}
	}
	return st
}

// buildStatus is the integrity's build in status: how far the pass that
// builds the checksums just turned on got; nil when none runs or is paused.
func (v *Volume) buildStatus() *transport.ChecksumBuild {
	sc := &v.scrub
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.phase == scrubIdle || !sc.rec.Build {
		return nil
	}
	return &transport.ChecksumBuild{State: sc.phase.String(), Percent: v.scrubPercentLocked()}
}

// scrubProgress is the ratio of the metric replvol_scrub_progress_ratio:
// the running or paused scrub's share done, 1 once one finished, 0
// before any.
func (v *Volume) scrubProgress() float64 {
	return v.scrubStatus().Percent / 100
}

// runScrub is a running scrub's loop: it reads from the checkpoint to the
// end, at the scrub's rate, until stop is closed (a pause or stop) or the
// volume shuts down (the checkpoint is written then: a restart resumes).
func (v *Volume) runScrub(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
		case <-v.stopping:
		case <-ctx.Done():
		}
		cancel()
	}()
	sc := &v.scrub
	sc.mu.Lock()
	off, rate := sc.rec.Offset, sc.rate
	sc.mu.Unlock()
	buf := make([]byte, scrubChunk)
	var pace resyncPacer
	var read int64
	savedAt, savedOff := v.clock.Now(), off
	// unflushed: sums were built since the last checkpoint; they are
	// made durable BEFORE the next one (and before the loop ends, which
	// a pause, stop or shutdown records).
	unflushed := false
	defer func() {
		if unflushed {
			if err := v.durable.integ.syncData(v.disk.Sync); err != nil {
				v.log.Warn("flush the checksums the scrub built", "err", err)
			}
		}
	}()
	for off < v.size.Load() {
		if due := pace.due(rate, read, v.clock.Now()); !due.IsZero() {
			if d := v.clock.Until(due); d > 0 && !waitOut(ctx, v.clock, d) {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		n := min(int64(scrubChunk), v.size.Load()-off)
		var t blockTally
		var built int64
		err := v.scrubRange(ctx, buf[:n], off, &t, &built)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errScrubWaits):
			waitOut(ctx, v.clock, scrubRetry)
			continue
		case err != nil:
			v.scrubFailed(off, err)
			return
		}
		if ctx.Err() != nil {
			break
		}
		off += n
		read += n
		sc.mu.Lock()
		if sc.phase != scrubRunning {
			sc.mu.Unlock()
			break
		}
		sc.rec.Offset = off
		sc.rec.Checked += t.checked
		sc.rec.Repaired += t.repaired
		sc.rec.Unrecoverable += t.unrecoverable
		sc.rec.Built += built
		rec := sc.rec
		sc.mu.Unlock()
		unflushed = unflushed || built > 0
		if now := v.clock.Now(); now.Sub(savedAt) >= scrubCheckpointEvery || off-savedOff >= scrubCheckpointBytes {
			if unflushed {
				if err := v.durable.integ.syncData(v.disk.Sync); err != nil {
					// The checkpoint stays where it was: a restart
					// builds these sums again.
					v.log.Warn("flush the checksums the scrub built", "err", err)
					continue
				}
				unflushed = false
			}
			if err := v.node.store.PutScrub(v.name, rec); err != nil {
				v.log.Warn("write the scrub checkpoint", "err", err)
			}
			savedAt, savedOff = now, off
		}
	}
	if unflushed {
		if err := v.durable.integ.syncData(v.disk.Sync); err != nil {
			v.scrubFailed(off, fmt.Errorf("flush the checksums it built: %w", err))
			return
		}
		unflushed = false
	}
	sc.mu.Lock()
	if ctx.Err() != nil || sc.phase != scrubRunning {
		// Paused, stopped (the command records it) or shut down: the
		// checkpoint is written now, the scrub still running in it.
		rec, running := sc.rec, sc.phase == scrubRunning
		sc.mu.Unlock()
		if running {
			if err := v.node.store.PutScrub(v.name, rec); err != nil {
				v.log.Warn("write the scrub checkpoint", "err", err)
			}
		}
		return
	}
	rec := sc.rec
	build, built := rec.Build, rec.Built
	rec.State, rec.Offset, rec.Build, rec.Built = "", 0, false, 0
	rec.LastFinished = v.clock.Now().UTC()
	rec.LastChecked, rec.LastRepaired, rec.LastUnrecoverable = rec.Checked, rec.Repaired, rec.Unrecoverable
	rec.Checked, rec.Repaired, rec.Unrecoverable = 0, 0, 0
	sc.rec, sc.phase, sc.stop, sc.done = rec, scrubIdle, nil, nil
	v.scrubEndedLocked()
	sc.mu.Unlock()
	if err := v.node.store.PutScrub(v.name, rec); err != nil {
		v.log.Warn("record the end of the scrub", "err", err)
	}
	msg := fmt.Sprintf("scrub of %s on %s finished: %d blocks checked, %d repaired, %d unrecoverable", v.name, v.self, rec.LastChecked, rec.LastRepaired, rec.LastUnrecoverable)
	if rec.LastUnrecoverable > 0 {
		msg += " (the block-unrecoverable events name them: write those ranges again, from a backup or what the application knows)"
	}
	v.node.event(v.name, "scrub-finished", msg)
	if build {
		v.node.event(v.name, "checksums-built", fmt.Sprintf("the checksums of %s on %s are built: %d blocks got theirs; every block is verified from now on", v.name, v.self, built))
	}
}

// scrubFailed ends a scrub the disk failed (it is taken for failed, as a
// read that fails so is): the scrub is idle, its checkpoint dropped.
func (v *Volume) scrubFailed(off int64, err error) {
	sc := &v.scrub
	sc.mu.Lock()
	sc.phase, sc.stop, sc.done = scrubIdle, nil, nil
	sc.rec.State, sc.rec.Offset, sc.rec.Build, sc.rec.Built = "", 0, false, 0
	rec := sc.rec
	sc.mu.Unlock()
	if perr := v.node.store.PutScrub(v.name, rec); perr != nil {
		v.log.Warn("record the end of the scrub", "err", perr)
	}
	msg := fmt.Sprintf("scrub of %s on %s stopped at byte %d: %v", v.name, v.self, off, err)
	v.log.Error(msg)
	v.node.event(v.name, "scrub-stopped", msg)
}

// scrubRange checks and repairs [off, off+len(p)) of the local disk,
// counting in t, and builds the sums of its blocks that have none,
// counting them in built.
func (v *Volume) scrubRange(ctx context.Context, p []byte, off int64, t *blockTally, built *int64) error {
	if v.durable.integ.listedIn(off, int64(len(p))) {
		// The blocks on the bad-block list are not read from this disk
		// (reads take them from a peer): the scrub checks the others.
		for _, r := range v.durable.integ.unlistedRuns(off, int64(len(p))) {
			if err := v.scrubRange(ctx, p[r[0]-off:r[1]-off], r[0], t, built); err != nil {
				return err
			}
		}
		return nil
	}
	if v.state().role() == replication.Primary {
		return v.scrubOnPrimary(ctx, p, off, t, built)
	}
	return v.scrubOnSecondary(ctx, p, off, t, built)
}

// buildSums stores the sum of every block of p, read at off, that has no
// known sum, and returns how many it stored. The caller holds what
// orders it with the writes to those blocks (the range lock on the
// primary, the stream on a secondary) from the read on: a write is then
// either on the disk before the read, or sets its own sum after this
// one. The sums reach the disk with the next flush (syncData): a block
// written since the last one lies in an activity-log extent, whose sums
// a crash rebuilds, and any other is durable already.
func (d *durableState) buildSums(p []byte, off int64) (int64, error) {
	in := d.integ
	if !in.on() || len(p) == 0 {
		return 0, nil
	}
	first := off / blocksum.BlockSize
	n := (len(p) + blocksum.BlockSize - 1) / blocksum.BlockSize
	sums, known := make([]uint32, n), make([]bool, n)
	if err := in.sums.GetRange(first, sums, known); err != nil {
		return 0, fmt.Errorf("read the checksums: %w", err)
	}
	var built int64
	// A lost block gets no sum from what it holds: that is no good copy.
	for k := range n {
		known[k] = known[k] || in.isLost(first+int64(k))
	}
	for k := 0; k < n; {
		if known[k] {
			k++
			continue
		}
		j := k
		for j < n && !known[j] {
			j++
		}
		// The run's sums go over the start of sums, whose values (all
		// read already, and unknown for this run) are not needed again.
		run := in.seed.Sums(sums[:0], uint64(first+int64(k)), p[k*blocksum.BlockSize:min(j*blocksum.BlockSize, len(p))])
		if err := in.sums.SetRange(first+int64(k), run); err != nil {
			return built, fmt.Errorf("store the checksums: %w", err)
		}
		built += int64(j - k)
		k = j
	}
	return built, nil
}

// scrubOnPrimary reads the range as a client's read does, under the
// range lock that excludes the writes to it, and repairs from a peer.
func (v *Volume) scrubOnPrimary(ctx context.Context, p []byte, off int64, t *blockTally, built *int64) error {
	hold, err := v.iopath.locks.LockShared(ctx, off, int64(len(p)))
	if err != nil {
		return err
	}
	defer hold.Release()
	if v.needsPeer(off, int64(len(p))) {
		// This disk does not hold these blocks (detached, or copying
		// them from a peer): nothing here to check.
		return nil
	}
	if err := v.readLocal(p, off); err != nil {
		handled, rerr := v.repairUnreadableTally(ctx, p, off, t)
		if handled {
			return rerr
		}
		v.detach(diskFailure{op: diskRead, off: off, length: int64(len(p)), err: err}, 0, 0)
		return fmt.Errorf("more than %d blocks fail to read: the disk is taken for failed (%w)", maxRepairsPerRead, err)
	}
	if err := v.verifyBlocks(ctx, p, off, t); err != nil {
		return err
	}
	n, err := v.durable.buildSums(p, off)
	*built += n
	return err
}

// scrubBad is a block a secondary's scrub found bad.
type scrubBad struct {
	b     int64
	sum   uint32
	known bool
	cause repairCause
}

// scrubOnSecondary reads the range while no batch of the stream is
// applied, then repairs each bad block from the primary (repairBlock),
// without holding the stream, which the primary's read may wait for.
func (v *Volume) scrubOnSecondary(ctx context.Context, p []byte, off int64, t *blockTally, built *int64) error {
	in := v.incomingStream()
	if in == nil {
		return errScrubWaits
	}
	var bad []scrubBad
	var err error
	upToDate := false
	if !in.Exclusive(func() {
		// Checked under the stream: a sync start applied after the
		// check would otherwise make this a resync target's scan.
		if upToDate = v.state().st.Disk == replication.UpToDate; !upToDate {
			return
		}
		var readOK bool
		if bad, readOK, err = v.scanBlocks(p, off, t); err == nil && readOK {
			// Under the stream, as the read: no write to these blocks
			// is applied between the two.
			var n int64
			n, err = v.durable.buildSums(p, off)
			*built += n
		}
	}) || !upToDate {
		return errScrubWaits
	}
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		v.logScanFindings(in, p, off, bad)
	}
	for _, sb := range bad {
		rerr := v.repairBlock(ctx, nil, 0, sb.b, sb.sum, sb.known, sb.cause, false)
		if errors.Is(rerr, errRepairLater) {
			continue
		}
		if !t.add(sb.b, rerr) {
			return rerr
		}
	}
	return nil
}

// logScanFindings says what a secondary's scan of p (read at off) found
// bad, once per range: how many blocks, the first, its stored sum and the
// sum of what the disk holds there, and the stream it was read under, so
// that an operator (and a failed test's log) can tell a block that rotted
// from one whose sum and data are of different writes.
func (v *Volume) logScanFindings(in *applier.Stream, p []byte, off int64, bad []scrubBad) {
	first := bad[0]
	boff, blen := blockSpan(first.b, v.size.Load())
	args := []any{"blocks", len(bad), "first_off", boff, "cause", first.cause,
		"primary", in.From(), "stream", in.State()}
	if first.known && first.cause == repairChecksum && boff >= off && boff+blen <= off+int64(len(p)) {
		args = append(args, "stored_sum", fmt.Sprintf("%08x", first.sum),
			"disk_sum", fmt.Sprintf("%08x", v.durable.integ.seed.Sum(uint64(first.b), p[boff-off:boff-off+blen])))
	}
	v.log.Warn("scrub: blocks of this secondary fail their checksum or cannot be read; each is asked of the primary", args...)
}

// scanBlocks reads [off, off+len(p)) and returns the blocks that fail
// their sum or cannot be read (one by one, after a failed read of the
// whole), counting the blocks verified in t; readOK says the read of the
// whole succeeded (p holds the range as the disk does; a block that
// failed its sum has one, so no sum is built for it).
func (v *Volume) scanBlocks(p []byte, off int64, t *blockTally) (bad []scrubBad, readOK bool, err error) {
	in := v.durable.integ
	size := v.size.Load()
	readErr := v.readLocal(p, off)
	first, last := off/blocksum.BlockSize, (off+int64(len(p))-1)/blocksum.BlockSize
	for b := first; b <= last; b++ {
		boff, blen := blockSpan(b, size)
		data := p[boff-off : boff-off+blen]
		sum, known, err := in.sums.Get(b)
		if err != nil {
			return nil, false, fmt.Errorf("read the checksums: %w", err)
		}
		if readErr != nil {
			if _, err := v.disk.ReadAt(data, boff); err != nil {
				if len(bad) >= maxRepairsPerRead {
					return nil, false, fmt.Errorf("more than %d blocks fail to read: %w", maxRepairsPerRead, err)
				}
				bad = append(bad, scrubBad{b: b, sum: sum, known: known, cause: repairReadError})
				continue
			}
		}
		if in.isLost(b) {
			// Lost (a resync source held it back as unrecoverable):
			// no good copy whatever it reads, so the primary's is
			// asked for again.
			t.checked++
			bad = append(bad, scrubBad{b: b, sum: sum, known: known, cause: repairChecksum})
			continue
		}
		if !known {
			continue
		}
		t.checked++
		if in.seed.Verify(uint64(b), data, sum) != nil {
			bad = append(bad, scrubBad{b: b, sum: sum, known: true, cause: repairChecksum})
		}
	}
	return bad, readErr == nil, nil
}

// incomingStream is the volume's stream from its primary (nil: none).
func (v *Volume) incomingStream() *applier.Stream {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.incoming
}

// readFromPrimary reads good (block-aligned) at off from the primary,
// which reads it as a client's read: verified, and repaired from a peer
// when bad (its control API's ReadBlocks).
func (v *Volume) readFromPrimary(ctx context.Context, primary string, good []byte, off int64) error {
	api, err := v.node.peerAPI(primary)
	if err != nil {
		return err
	}
	reply, err := api.ReadBlocks(ctx, &transport.ReadBlocksRequest{Volume: v.name, Offset: off, Length: int64(len(good))})
	if err != nil {
		return err
	}
	if len(reply.Data) != len(good) {
		return fmt.Errorf("%s answered %d bytes for %d", primary, len(reply.Data), len(good))
	}
	copy(good, reply.Data)
	return nil
}

// readBlocks serves a secondary's ReadBlocks: the range read as a
// client's read is, on the primary only.
func (v *Volume) readBlocks(ctx context.Context, off, length int64) ([]byte, error) {
	if v.state().role() != replication.Primary {
		return nil, fmt.Errorf("%s is not the primary of %s: a block's good copy is read from the primary", v.self, v.name)
	}
	if off+length > v.size.Load() {
		return nil, fmt.Errorf("read of %d bytes at %d: past the end of %s (%d bytes)", length, off, v.name, v.size.Load())
	}
	p := make([]byte, length)
	if err := v.ReadAt(ctx, p, off); err != nil {
		return nil, err
	}
	return p, nil
}

// writeBackUnderStream writes a secondary's repaired block while no
// batch of the stream is applied, and only when the block still has the
// sum its good copy was checked against: a write the stream applied
// meanwhile holds newer data (skipped true, nothing written; so is a
// stream that ended).
func (v *Volume) writeBackUnderStream(in *applier.Stream, good []byte, b int64, sum uint32, known bool) (skipped bool, err error) {
	ran := in.Exclusive(func() {
		now, nowKnown, gerr := v.durable.integ.sums.Get(b)
		if gerr != nil || nowKnown != known || now != sum {
			skipped = true
			return
		}
		err = backing.WriteSync(v.disk, good, b*blocksum.BlockSize)
	})
	return skipped || !ran, err
}
