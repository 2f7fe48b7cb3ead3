package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// errNoCopy: the local disk is detached and no peer holds the data.
var errNoCopy = errors.New("the local disk is detached and no peer is in sync")

// errAttachAborted: the disk failed again while it was being re-attached.
var errAttachAborted = errors.New("the disk failed again while it was being re-attached")

// diskOp is the kind of a local disk operation.
type diskOp uint8

const (
	diskRead  diskOp = iota + 1
	diskWrite        // a write, a write of zeroes or a trim
	diskSync
	diskLog // an activity-log transaction
	diskPath
)

func (o diskOp) String() string {
	switch o {
	case diskRead:
		return "read"
	case diskWrite:
		return "write"
	case diskSync:
		return "flush"
	case diskLog:
		return "activity-log write"
	case diskPath:
		return "path check"
	}
	return fmt.Sprintf("diskOp(%d)", o)
}

// diskFailure is one failed operation on the local disk: where it failed
// (length 0 for a flush, the activity log and the paths) and why.
type diskFailure struct {
	op          diskOp
	off, length int64
	err         error
}

func (f diskFailure) Error() string {
	if f.length > 0 {
		return fmt.Sprintf("%s of %s at %s: %v", f.op, human.Bytes(f.length), human.Bytes(f.off), f.err)
	}
	return fmt.Sprintf("%s: %v", f.op, f.err)
}

func (f diskFailure) Unwrap() error { return f.err }

const (
	// maxFailedAreas is how many failed extents a detach keeps for its
	// probes; maxProbeLength caps each.
	maxFailedAreas = 8
	maxProbeLength = 1 << 20
)

// diskWatch is what a volume keeps of its local disk's failures, for the
// re-attach (the fields under v.mu unless said otherwise).
type diskWatch struct {
	// failed: the extents where the disk failed since it was last in
	// service (each at most maxProbeLength, at most maxFailedAreas).
	failed []diskFailure
	// last is the last failure.
	last diskFailure
	// running: a reattachLoop runs; there is one at most.
	running bool
	// localWrites counts the client writes admitted to the local disk
	// that have not finished writing to it (atomic; incremented under
	// v.mu, and only while the disk is in service).
	localWrites atomic.Int64
	// rule is the back-off and flap rule; only the running loop uses it.
	rule *reattachState
	// probes counts the probes made (tests wait on it).
	probes atomic.Int64
}

// recordFailureLocked keeps f for the probes. Callers hold v.mu.
func (w *diskWatch) recordFailureLocked(f diskFailure) {
	w.last = f
	if f.length <= 0 || len(w.failed) >= maxFailedAreas {
		return
	}
	f.length = min(f.length, maxProbeLength)
	for _, a := range w.failed {
		if a.off <= f.off && f.off+f.length <= a.off+a.length {
			return
		}
	}
	w.failed = append(w.failed, f)
}

// detach takes a failed local disk out of service, as DRBD's on-io-error
// detach does: the primary goes on serving, reading from and writing to a
// peer that is in sync, and marks what the local disk misses. f is the
// operation that failed; [missOff, missOff+missLen) is what the request
// did not write to the local disk (nothing for a read).
//
// It reports whether the request may be served through a peer: the disk
// is out of service (now, or already: a request in flight when another
// detached it, or when a re-attach began), and what it misses is marked.
// It does not when no peer could take over; the IO error must then reach
// the client. The state machine decides (volstate.DiskFailed, on the
// peers' facts as the step is taken); the stale mark is durable BEFORE
// any write skips this disk: after a restart this copy must never pass
// for up to date. The blocks the request missed are marked under
// v.stateMu, BEFORE it completes: in the step's install (or, when the
// volume closes and takes no step, here), so a re-attach, which ends
// under v.stateMu once nothing is marked (volstate.LocalResyncFinished),
// then copies them back.
func (v *Volume) detach(f diskFailure, missOff, missLen int64) bool {
	var was replication.DiskState
	detached := false
	err := v.drive(volstate.DiskFailed{}, driveOptions{
		texts: func(volstate.Cause) reason {
			if f.reason() == reasonBadBlocksFull {
				return because(CauseDetached, "disk detached: %v; reading and writing through the peer", f)
			}
			return because(CauseDetached, "disk detached after an IO error (%v); reading and writing through the peer", f)
		},
		notify: func(volstate.Action) {
			if was == replication.Inconsistent {
				// The re-attach under way fails; its loop says so.
				return
			}
			v.log.Error("local disk detached; serving from the peer until it works again", "cause", f.Error())
			v.node.emit(statefile.Event{Volume: v.name, Kind: "detached", Reason: string(f.reason()),
				Message: fmt.Sprintf("%s detached its disk (%v); IO goes to the peer until it works again", v.self, f)})
		},
		install: func(c volstate.Change) {
			was = c.Old.Disk
			detached = v.markMissedLocked(f, missOff, missLen)
		},
	})
	switch {
	case errors.Is(err, volloop.ErrClosed):
		// No step: a disk detached already still serves through the peer.
		v.stateMu.Lock()
		v.mu.Lock()
		detached = v.markMissedLocked(f, missOff, missLen)
		v.mu.Unlock()
		v.stateMu.Unlock()
	case err != nil:
		v.log.Error("cannot record durably that the disk is detached: not detaching; the IO error reaches the client", "cause", f, "err", err)
		return false
	}
	return detached
}

// markMissedLocked marks, while the disk is detached, what the failed
// request f missed (see detach) and keeps f for the probes; it reports
// whether the disk is detached. Callers hold v.stateMu and v.mu.
func (v *Volume) markMissedLocked(f diskFailure, missOff, missLen int64) bool {
	if !v.detachedLocked() {
		return false
	}
	v.dw.recordFailureLocked(f)
	if missLen > 0 {
		v.durable.localMissing.SetRange(missOff, missLen)
	}
	if f.op == diskRead && f.length > 0 {
		// What the disk could not read is copied back from the peer
		// before the disk serves it again (md rewrites a bad sector).
		v.durable.localMissing.SetRange(f.off, f.length)
	}
	return true
}

// admitLocal decides, once per write, whether it goes to the local disk:
// while the disk is detached it does not, and the blocks it misses are
// marked now, BEFORE it is shipped. A write admitted to the local disk
// counts in localWrites until localDone.
func (v *Volume) admitLocal(off, length int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.detachedLocked() {
		v.durable.localMissing.SetRange(off, length)
		return false
	}
	v.dw.localWrites.Add(1)
	return true
}

// localDone ends a write admitted to the local disk.
func (v *Volume) localDone() { v.dw.localWrites.Add(-1) }

// needsPeer reports whether [off, off+length) must be read from a peer:
// the local disk is detached or still misses some of those blocks.
func (v *Volume) needsPeer(off, length int64) bool {
	v.mu.Lock()
	detached := v.detachedLocked()
	v.mu.Unlock()
	return detached || v.durable.localMissing.AnySet(off, length)
}

func (v *Volume) isDetached() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.detachedLocked()
}

// detachedLocked reports whether the local disk is out of service.
// Callers hold v.mu.
func (v *Volume) detachedLocked() bool { return v.st.Disk == replication.Diskless }

// readFromPeer reads through a peer that is in sync: while this primary
// copies newer data from a peer (pulling), that peer alone, whose copy
// of the blocks this disk misses is the newer one (another peer in sync
// with this primary holds what this primary held: older data, or a
// write the source did not take, which the pull copies over).
func (v *Volume) readFromPeer(ctx context.Context, p []byte, off int64) error {
	peers := v.streamingPeers()
	if src := pullSource(peers); src != nil {
		if err := src.read(ctx, p, off); err != nil {
			return fmt.Errorf("this node copies newer data from %s, and a read from it failed: %w (%w)", src.name, err, syscall.EIO)
		}
		return nil
	}
	for _, pr := range peers {
		if !pr.inSync() {
			continue
		}
		if err := pr.read(ctx, p, off); err == nil {
			return nil
		} else {
			v.log.Warn("read from peer failed", "peer", pr.name, "err", err)
		}
	}
	return fmt.Errorf("%w (%w)", errNoCopy, syscall.EIO)
}

// pullingFrom is the peer other than except this primary copies newer
// data from, if any.
func (v *Volume) pullingFrom(except string) *peer {
	v.mu.Lock()
	peers := slices.Clone(v.peers.list)
	v.mu.Unlock()
	for _, pr := range peers {
		if pr.name != except && pr.pulling.Load() {
			return pr
		}
	}
	return nil
}

// pullSource is the peer this primary copies newer data from, if any.
func pullSource(peers []*peer) *peer {
	for _, pr := range peers {
		if pr.pulling.Load() {
			return pr
		}
	}
	return nil
}

// reattachLoop puts a detached disk back in service once it works again:
// it probes the disk where it failed, backing off while the probes fail
// (reattachState's rule), and once they have passed for long enough it
// copies back what the disk missed from a peer: DiskWorks (the disk
// Inconsistent while the copy runs: writes go to it, reads of what it
// misses go to the peer), then LocalResyncFinished, which records it
// UpToDate. AttachFailed takes it out of service again when the copy or
// that record fails, and so does an IO that fails meanwhile (DiskFailed);
// the probes then go on, backing off further. One loop runs at most; each
// transition is logged once, and failing probes once per back-off.
func (v *Volume) reattachLoop() {
	v.mu.Lock()
	if v.dw.running {
		v.mu.Unlock()
		return // the running loop sees the new detach
	}
	v.dw.running = true
	if v.dw.rule == nil {
		v.dw.rule = newReattachState(v.node.opts.reattach)
	}
	rule := v.dw.rule
	v.mu.Unlock()
	clk := rule.p.clock // a test's, for the probes alone
	if clk == nil {
		clk = v.clock
	}
	timer := clk.NewTimer(rule.Detached(clk.Now()))
	defer timer.Stop()
	passing := false
	for {
		select {
		case <-v.stopping:
			v.mu.Lock()
			v.dw.running = false
			v.mu.Unlock()
			return
		case <-timer.C():
		}
		v.mu.Lock()
		disk := v.st.Disk
		v.mu.Unlock()
		switch disk {
		case replication.Diskless:
			err := v.probeDisk()
			if errors.Is(err, errWritesInFlight) {
				// Not yet: no probe was made.
				timer.Reset(rule.p.Probe)
				continue
			}
			v.dw.probes.Add(1)
			verdict := rule.Probed(clk.Now(), err == nil)
			switch {
			case err != nil:
				passing = false
				if verdict.Log {
					v.log.Warn("detached disk still fails its probe; it stays detached", "err", err.Error(), "next_probe_in", verdict.Wait.String())
				}
			case !verdict.Attach && !passing:
				passing = true
				v.log.Info("detached disk passes its probe; it is re-attached once its probes pass for long enough", "for", rule.StableFor().String())
			}
			if !verdict.Attach {
				timer.Reset(verdict.Wait)
				continue
			}
			passing = false
			if !v.diskWorks(rule) {
				timer.Reset(rule.p.Probe)
				continue
			}
		case replication.Inconsistent:
			// Being re-attached: copy back what it misses.
		default:
			if v.endReattach() {
				return // in service again, by another way
			}
			timer.Reset(0)
			continue
		}
		err := v.copyBack()
		if errors.Is(err, volloop.ErrClosed) {
			// Its state changes no more: the loop ends, as when it stops.
			v.mu.Lock()
			v.dw.running = false
			v.mu.Unlock()
			return
		}
		if err == nil {
			v.log.Info("local disk re-attached and in sync again")
			v.node.event(v.name, "attached", fmt.Sprintf("%s: disk re-attached and UpToDate again", v.self))
			rule.Attached(clk.Now())
			if v.endReattach() {
				return
			}
			// It failed again already: a flap.
			timer.Reset(rule.Detached(clk.Now()))
			continue
		}
		verdict := rule.AttachFailed(clk.Now())
		if errors.Is(err, errAttachAborted) {
			v.mu.Lock()
			err = v.dw.last
			v.mu.Unlock()
		}
		v.log.Warn("re-attach failed; the disk is detached again", "err", err.Error(), "next_probe_in", verdict.Wait.String())
		timer.Reset(verdict.Wait)
	}
}

// diskWorks puts a disk whose probes passed back toward service: the disk
// is Inconsistent while what it missed is copied back. It reports whether
// it did (a stopped volume, or a state that cannot be written, does not).
func (v *Volume) diskWorks(rule *reattachState) bool {
	attaching := false
	err := v.drive(volstate.DiskWorks{}, driveOptions{
		texts: func(volstate.Cause) reason {
			return because(CauseDetached, "disk works again: copying the blocks it missed from the peer")
		},
		notify: func(volstate.Action) {
			v.node.event(v.name, "attaching", fmt.Sprintf("%s: disk works again (its probes passed for %s); copying the %s it missed from the peer", v.self, rule.StableFor(), human.Bytes(v.durable.localMissing.Bytes())))
		},
		install: func(c volstate.Change) { attaching = c.Next.Disk == replication.Inconsistent },
	})
	return err == nil && attaching
}

// copyBack copies what the disk being re-attached missed from a peer and
// records it UpToDate; on failure the disk is out of service again. The
// rules decide the end as it is stepped: not while a block is marked
// missing (a write admitted while the disk was detached marked it after
// the copy passed it: the copy goes again), nor once an IO failed
// meanwhile and detached the disk again (errAttachAborted).
func (v *Volume) copyBack() error {
	for {
		err := v.copyMissingFromPeer(context.Background(), func(context.Context) error {
			if v.isDetached() {
				return errAttachAborted
			}
			return nil
		})
		if err == nil {
			// The activity log may have failed with the disk: write it
			// out again before it guards writes (the probe did, unless it
			// failed since).
			if err = v.durable.md.ActivityLog().Reset(); err != nil {
				err = diskFailure{op: diskLog, err: err}
			}
		}
		if err != nil {
			var f diskFailure
			errors.As(err, &f)
			return v.attachFailed(err, f)
		}
		err = v.drive(volstate.LocalResyncFinished{}, driveOptions{})
		switch {
		case errors.Is(err, volstate.ErrLocalMissing):
			continue
		case errors.Is(err, volstate.ErrNotAttaching):
			return errAttachAborted
		case errors.Is(err, volloop.ErrClosed):
			return err
		case err != nil:
			v.log.Error("disk in sync again, but that cannot be recorded; it stays out of service", "err", err)
			v.attachFailed(fmt.Errorf("disk in sync, but the state cannot be written: %w", err), diskFailure{})
		}
		return err
	}
}

// attachFailed takes a disk that was being attached out of service again
// (its stale mark is still on stable storage), saying why, and returns
// why; f, when it names an operation, is kept for the next probes. When
// the disk is not being attached as the step is taken (an IO failed
// meanwhile and detached it again), it returns errAttachAborted.
func (v *Volume) attachFailed(why error, f diskFailure) error {
	aborted := false
	err := v.drive(volstate.AttachFailed{}, driveOptions{
		texts: func(volstate.Cause) reason {
			return because(CauseDetached, "disk detached again while it was re-attached: %v", why)
		},
		install: func(c volstate.Change) {
			if aborted = c.Old.Disk != replication.Inconsistent; !aborted && f.op != 0 {
				v.dw.recordFailureLocked(f) // the next probes check it too
			}
		},
	})
	switch {
	case err != nil:
		v.log.Error("take the disk out of service again", "err", err)
	case aborted:
		return errAttachAborted
	}
	return why
}

// endReattach ends the loop, unless the disk is out of service again:
// then the loop goes on (a detach that came while it ended started none).
func (v *Volume) endReattach() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.st.Disk == replication.Diskless || v.st.Disk == replication.Inconsistent {
		return false
	}
	v.dw.running, v.dw.failed = false, nil
	return true
}

// errWritesInFlight: a probe waits for the writes that were going to the
// disk when it was detached.
var errWritesInFlight = errors.New("writes admitted before the detach are still in flight")

// probeDisk checks the detached disk where it failed: a path must be
// usable (multipath), the activity log must take its ring again when it
// failed, each failed extent must be read, written and read back the
// same, and a flush must succeed. With no extent recorded (a flush or
// the activity log failed) the first block is probed.
//
// A PROBE NEVER LEAVES OTHER DATA ON THE DISK THAN WAS THERE, AND NEVER
// RACES A CLIENT'S WRITE: IT WRITES BACK THE BYTES IT HAS JUST READ, AND
// ONLY WHILE NO CLIENT WRITE CAN REACH THE DISK (IT IS DISKLESS, SO NO
// WRITE IS ADMITTED TO IT, AND NO WRITE ADMITTED BEFORE THE DETACH IS
// STILL WRITING: localWrites IS ZERO). THE PROBED BLOCKS ARE MARKED
// MISSING BEFORE THE PROBE WRITES THEM, SO THE COPY BACK REWRITES THEM
// FROM THE PEER BEFORE THE DISK SERVES THEM AGAIN. The probe never holds
// a range lock: a client request never waits for a probe of a failing
// disk.
func (v *Volume) probeDisk() error {
	if v.mp != nil {
		usable := false
		for _, p := range v.mp.Paths() {
			usable = usable || p.State != multipath.Fail
		}
		if !usable {
			return diskFailure{op: diskPath, err: multipath.ErrNoPath}
		}
	}
	v.mu.Lock()
	if !v.detachedLocked() || v.dw.localWrites.Load() > 0 {
		v.mu.Unlock()
		return errWritesInFlight
	}
	areas := append([]diskFailure(nil), v.dw.failed...)
	v.mu.Unlock()
	if len(areas) == 0 {
		areas = append(areas, diskFailure{off: 0, length: min(replication.BlockSize, v.size.Load())})
	}
	if err := v.durable.md.ActivityLog().Reset(); err != nil {
		return diskFailure{op: diskLog, err: err}
	}
	for _, a := range areas {
		if err := v.probeArea(a.off, a.length); err != nil {
			return err
		}
	}
	if err := v.disk.Sync(); err != nil {
		return diskFailure{op: diskSync, err: err}
	}
	return nil
}

// probeArea reads [off, off+length), writes it back and reads it again
// (see probeDisk for why that is safe).
func (v *Volume) probeArea(off, length int64) error {
	v.durable.localMissing.SetRange(off, length)
	buf := make([]byte, 2*length)
	was, again := buf[:length], buf[length:]
	if _, err := v.disk.ReadAt(was, off); err != nil {
		return diskFailure{op: diskRead, off: off, length: length, err: err}
	}
	if _, err := v.disk.WriteAt(was, off); err != nil {
		return diskFailure{op: diskWrite, off: off, length: length, err: err}
	}
	if _, err := v.disk.ReadAt(again, off); err != nil {
		return diskFailure{op: diskRead, off: off, length: length, err: err}
	}
	if !bytes.Equal(was, again) {
		return diskFailure{op: diskRead, off: off, length: length, err: errors.New("read back other data than the probe wrote")}
	}
	return nil
}

// forwardPulled hands a run this primary copied from the peer it pulls
// newer data from (none: a disk copied back after a detach, whose peers
// took every write meanwhile) to every other peer, as a write: in its
// stream, or marked in its bitmap. Those peers hold what this primary
// held before the pull, older data or a write the source never took,
// and count as in sync with it. Callers hold the run's range lock, so a
// later write to it follows in the streams.
func (v *Volume) forwardPulled(data []byte, off int64) error {
	peers := v.streamingPeers()
	src := pullSource(peers)
	if src == nil {
		return nil
	}
	e := replication.Entry{Op: replication.OpWrite, Off: off, Length: int64(len(data)), Data: bytes.Clone(data)}
	for _, p := range peers {
		if p == src {
			continue
		}
		if _, err := p.submit(e, 'C', nil, false); err != nil {
			return fmt.Errorf("pass the data pulled from %s at %d on to %s: %w", src.name, off, p.name, err)
		}
	}
	return nil
}

// copyMissingFromPeer copies every block the local disk misses from a
// peer in sync. Each run holds the range lock while it is read and
// written, so an application write to it lands before (and is re-copied)
// or after. Before each run it calls wait, when given (a pause).
func (v *Volume) copyMissingFromPeer(ctx context.Context, wait func(context.Context) error) error {
	cursor := int64(0)
	var pacer resyncPacer
	copied := int64(0)
	for {
		start, n, ok := v.durable.localMissing.NextRun(cursor, resyncRunBlocks)
		if !ok {
			if v.durable.localMissing.Count() == 0 {
				break
			}
			cursor = 0
			continue
		}
		cursor = start + n
		off := start * replication.BlockSize
		length := min(n*replication.BlockSize, v.size.Load()-off)
		if wait != nil {
			if err := wait(ctx); err != nil {
				return err
			}
		}
		// The volume's resync_rate caps this copy too (one run at a
		// time: no window to hold back).
		if err := v.resyncPace(ctx, &pacer, copied, nil); err != nil {
			return err
		}
		copied += length
		hold, err := v.iopath.locks.Lock(ctx, off, length)
		if err != nil {
			return err
		}
		bp := resyncBufs.Get().(*[]byte)
		buf := (*bp)[:length]
		err = v.readFromPeer(ctx, buf, off)
		if err == nil {
			if _, werr := v.disk.WriteAt(buf, off); werr != nil {
				err = diskFailure{op: diskWrite, off: off, length: length, err: werr}
			} else if werr := v.durable.integ.written(off, length, v.durable.integ.sumsOf(nil, off, buf, v.size.Load())); werr != nil {
				// The copy is not in the activity log: a crash before
				// the flush below leaves the disk stale, copied again.
				err = diskFailure{op: diskWrite, off: off, length: length, err: werr}
			}
		}
		if err == nil {
			err = v.forwardPulled(buf, off)
		}
		if err == nil {
			v.durable.localMissing.ClearRange(off, length)
			v.counters.resynced.Add(length)
		}
		resyncBufs.Put(bp)
		hold.Release()
		if err != nil {
			return err
		}
	}
	if err := v.durable.integ.syncData(v.disk.Sync); err != nil {
		return diskFailure{op: diskSync, err: err}
	}
	return nil
}
