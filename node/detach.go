package node

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// reattachInterval is how often a detached disk is probed.
const reattachInterval = time.Second

// errNoCopy: the local disk is detached and no peer holds the data.
var errNoCopy = errors.New("the local disk is detached and no peer is in sync")

// detach takes a failed local disk out of service, as DRBD's on-io-error
// detach does: the primary goes on serving, reading from and writing to a
// peer that is in sync, and marks what the local disk misses. It reports
// whether the volume is (now) detached; it is not when no peer could take
// over, and the IO error must then reach the client. The state machine
// decides (volstate.DiskFailed); the stale mark is durable BEFORE any
// write skips this disk: after a restart this copy must never pass for up
// to date.
func (v *Volume) detach(cause error) bool {
	v.mu.Lock()
	if v.detachedLocked() {
		v.mu.Unlock()
		return true
	}
	if v.role != replication.Primary {
		v.mu.Unlock()
		return false
	}
	peers := v.peerList
	v.mu.Unlock()
	var inSync bool
	for _, p := range peers {
		inSync = inSync || p.inSync()
	}
	if !inSync {
		return false
	}
	v.stateMu.Lock()
	acts, err := v.stepLocked(volstate.DiskFailed{PeerInSync: true}, func(volstate.Cause) reason {
		return because(CauseDetached, "disk detached after an IO error: %v", cause)
	}, nil)
	v.stateMu.Unlock()
	if err != nil {
		v.log.Error("cannot record durably that the disk is detached: not detaching; the IO error reaches the client", "cause", cause, "err", err)
		return false
	}
	for _, a := range acts {
		v.perform(a, driveOptions{notify: func(volstate.Action) {
			v.log.Error("local disk detached; serving from the peer", "cause", cause)
			v.node.event(v.name, "detached", fmt.Sprintf("%s detached its disk (%v); IO goes to the peer until it comes back", v.self, cause))
		}})
	}
	return v.isDetached()
}

// needsPeer reports whether [off, off+length) must be read from a peer:
// the local disk is detached or still misses some of those blocks.
func (v *Volume) needsPeer(off, length int64) bool {
	v.mu.Lock()
	detached := v.detachedLocked()
	v.mu.Unlock()
	return detached || v.localMissing.AnySet(off, length)
}

func (v *Volume) isDetached() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.detachedLocked()
}

// detachedLocked reports whether the local disk is out of service.
// Callers hold v.mu.
func (v *Volume) detachedLocked() bool { return v.diskState == replication.Diskless }

// readFromPeer reads through any peer that is in sync.
func (v *Volume) readFromPeer(ctx context.Context, p []byte, off int64) error {
	for _, pr := range v.streamingPeers() {
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

// reattachLoop probes the detached disk until it works again, then copies
// back what it missed from a peer and puts it in service: DiskWorks (the
// disk Inconsistent while the copy runs), then LocalResyncFinished, which
// records it UpToDate; AttachFailed takes it out of service again when the
// copy or that record fails.
func (v *Volume) reattachLoop() {
	tick := time.NewTicker(reattachInterval)
	defer tick.Stop()
	for {
		select {
		case <-v.stopping:
			return
		case <-tick.C:
		}
		v.mu.Lock()
		disk := v.diskState
		v.mu.Unlock()
		switch {
		case disk != replication.Diskless && disk != replication.Inconsistent:
			return // in service again, or no longer this loop's
		case !v.diskWorks():
			continue
		case disk == replication.Diskless:
			v.stateMu.Lock()
			acts, err := v.stepLocked(volstate.DiskWorks{}, func(volstate.Cause) reason {
				return because(CauseDetached, "disk back: copying the blocks it missed from the peer")
			}, nil)
			v.stateMu.Unlock()
			if err != nil {
				continue
			}
			for _, a := range acts {
				if a.Kind == volstate.Notify {
					v.node.event(v.name, "attaching", fmt.Sprintf("%s: disk works again; resyncing %s from the peer", v.self, human.Bytes(v.localMissing.Bytes())))
				}
			}
		}
		err := v.copyMissingFromPeer(context.Background(), nil)
		if err == nil {
			// The activity log may have failed with the disk: write it
			// out again before it guards writes.
			err = v.md.ActivityLog().Reset()
		}
		if err != nil {
			v.log.Warn("resync from peer failed; detaching again", "err", err)
			v.attachFailed(because(CauseDetached, "disk detached: %v", err))
			continue
		}
		v.stateMu.Lock()
		if v.localMissing.Count() > 0 {
			// A write failed over to the peer during the copy: go again.
			v.stateMu.Unlock()
			continue
		}
		_, err = v.stepLocked(volstate.LocalResyncFinished{}, nil, nil)
		v.stateMu.Unlock()
		if err != nil {
			v.log.Error("disk in sync again, but that cannot be recorded; it stays out of service", "err", err)
			v.attachFailed(because(CauseDetached, "disk in sync, but the state cannot be written: %v", err))
			continue
		}
		v.log.Info("local disk attached and in sync again")
		v.node.event(v.name, "attached", fmt.Sprintf("%s: disk attached and UpToDate again", v.self))
		return
	}
}

// attachFailed takes a disk that was being attached out of service again
// (its stale mark is still on stable storage), saying why.
func (v *Volume) attachFailed(why reason) {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	if _, err := v.stepLocked(volstate.AttachFailed{}, func(volstate.Cause) reason { return why }, nil); err != nil {
		v.log.Error("take the disk out of service again", "err", err)
	}
}

// diskWorks probes the local disk: a path must be usable (multipath) and a
// read of the first block must succeed.
func (v *Volume) diskWorks() bool {
	if v.mp != nil {
		usable := false
		for _, p := range v.mp.Paths() {
			usable = usable || p.State.String() != "FAIL"
		}
		if !usable {
			return false
		}
	}
	buf := make([]byte, replication.BlockSize)
	_, err := v.disk.ReadAt(buf, 0)
	return err == nil
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
		start, n, ok := v.localMissing.NextRun(cursor, resyncRunBlocks)
		if !ok {
			if v.localMissing.Count() == 0 {
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
		hold, err := v.locks.Lock(ctx, off, length)
		if err != nil {
			return err
		}
		bp := resyncBufs.Get().(*[]byte)
		buf := (*bp)[:length]
		err = v.readFromPeer(ctx, buf, off)
		if err == nil {
			_, err = v.disk.WriteAt(buf, off)
		}
		if err == nil {
			v.localMissing.ClearRange(off, length)
			v.resynced.Add(length)
		}
		resyncBufs.Put(bp)
		hold.Release()
		if err != nil {
			return err
		}
	}
	return v.disk.Sync()
}
