package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/writepath"
	"github.com/replvol/replvol/replication"
)

// WriteAt implements nbd.Export. It returns after the local disk AND every
// connected peer wrote p (protocol C); a peer that is not connected has the
// blocks marked out of sync instead, BEFORE this returns.
func (v *Volume) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	defer v.observe(opWrite, v.clock.Now())
	var flags uint8
	if fua {
		flags = replication.EntryFUA
	}
	v.counters.writes.Add(1)
	v.counters.writeBytes.Add(uint64(len(p)))
	for {
		n := v.durable.piece(off, int64(len(p)))
		part := p[:n]
		e := replication.Entry{Op: replication.OpWrite, Flags: flags, Off: off, Length: n, Data: part}
		err := v.replicate(ctx, e, func() error {
			if fua {
				return backing.WriteSync(v.disk, part, e.Off)
			}
			_, err := v.disk.WriteAt(part, e.Off)
			return err
		})
		if err != nil || n == int64(len(p)) {
			return err
		}
		p, off = p[n:], off+n
	}
}

// WriteZeroes implements nbd.Export. The blocks become holes where the
// disk can punch them, here and on every peer.
func (v *Volume) WriteZeroes(ctx context.Context, off, length int64, fua bool) error {
	defer v.observe(opWriteZeroes, v.clock.Now())
	return v.zeroRange(ctx, replication.OpZero, off, length, fua)
}

// Trim implements nbd.Export. Trimmed blocks read back as zeroes on every
// replica, so the replicas stay identical.
func (v *Volume) Trim(ctx context.Context, off, length int64) error {
	defer v.observe(opTrim, v.clock.Now())
	return v.zeroRange(ctx, replication.OpTrim, off, length, false)
}

// zeroRange replicates a TRIM or WRITE_ZEROES piece by piece: NBD allows
// up to 4 GiB in one request (mkfs, fstrim and blkdiscard send that much),
// far more than one replication entry carries.
func (v *Volume) zeroRange(ctx context.Context, op replication.Op, off, length int64, fua bool) error {
	var flags uint8
	if fua {
		flags = replication.EntryFUA
	}
	for {
		n := v.durable.piece(off, length)
		e := replication.Entry{Op: op, Flags: flags, Off: off, Length: n}
		err := v.replicate(ctx, e, func() error {
			if err := v.disk.Zero(e.Off, e.Length); err != nil {
				return err
			}
			if fua {
				return v.disk.Sync()
			}
			return nil
		})
		if err != nil || n == length {
			return err
		}
		off, length = off+n, length-n
	}
}

// piece returns how much of [off, off+length) one replicated request
// carries: at most one replication entry (replication.MaxEntryLength),
// and no more activity-log extents than half the log holds, so that a
// request never waits for more hot extents than the log has (a write that
// needs all of them at once could never be admitted). Pieces end on
// multiples of their size, so each touches as few extents as it can.
func (d *durableState) piece(off, length int64) int64 {
	size := int64(replication.MaxEntryLength)
	if slots := int64(d.md.ActivityLog().Extents()); slots > 0 {
		size = min(size, max(1, slots/2)*metadata.ExtentSize)
	}
	return min(length, (off/size+1)*size-off)
}

// replicate runs one write-type request through the write's stages, in
// the order node/writepath's machine gives them (the simulation runs the
// same machine); each stage's I/O is here:
//
//   - admit (before the machine): ordered behind earlier overlapping
//     requests (the range lock); whether the write goes to the local
//     disk is decided once;
//   - Log: the extent durably in the activity log;
//   - Ship: each peer's session takes e, or what the peer misses is
//     marked in its bitmap, after the volume durably tracks it
//     (submit.go);
//   - Local: write here, or mark what a detached disk misses;
//   - Wait: for the peers as the protocol says (C every ack, B every
//     receipt, A none), and for the end of a stream whose peer
//     acknowledged the write from its cache, which tracks the peer;
//   - CountLag: under A and B each peer's lag counts the write from now;
//   - Lease: the write completes under a valid lease.
func (v *Volume) replicate(ctx context.Context, e replication.Entry, local func() error) error {
	if err := v.enter(ctx); err != nil {
		return err
	}
	defer v.iopath.io.Done()
	if size := v.size.Load(); e.Off < 0 || e.Length < 0 || e.Off+e.Length > size {
		// Past the end: NBD never sends it; past the old end during a
		// resize, the peers may not hold it yet.
		return fmt.Errorf("%s: write at %d+%d beyond the volume's %d bytes (%w)", v.name, e.Off, e.Length, size, syscall.EINVAL)
	}
	v.counters.lastWrite.Store(v.clock.Now().UnixNano())

	hold, err := v.iopath.locks.Lock(ctx, e.Off, e.Length)
	if err != nil {
		return err
	}
	defer hold.Release()
	// Whether the write goes to the local disk is decided here, once
	// (admitLocal): a write admitted while the disk is detached marks
	// what it misses now, and never reaches the disk, even when the disk
	// is re-attached before it completes. A detached disk gets no data,
	// so it needs no log entry.
	al := v.durable.md.ActivityLog()
	toDisk := v.admitLocal(e.Off, e.Length)
	diskHeld := toDisk
	defer func() {
		if diskHeld {
			v.localDone()
		}
	}()
	// The extent leaves the log's working set only once every peer has
	// the write: under protocols A and B that is after this returns.
	held := &countdown{}
	held.add()
	defer held.Done()
	if e.Op == replication.OpWrite {
		// Over the buffer that is written, once, before it is shipped:
		// the peers verify the blocks against them (a slice of held,
		// which outlives every use of e: no allocation per write; a
		// write of up to 1 MiB too large for held's own room takes a
		// kept one, which held gives back once its last holder is done).
		dst := held.sums[:0]
		if blocks := (len(e.Data) + blocksum.BlockSize - 1) / blocksum.BlockSize; blocks > len(held.sums) && blocks <= len(sumsRoom{}) && v.durable.integ.on() {
			held.room, held.rooms = v.durable.integ.takeRoom(), v.durable.integ
			dst = held.room[:0]
		}
		e.Sums = v.durable.integ.sumsOf(dst, e.Off, e.Data, v.size.Load())
	}

	w := writepath.Begin(v.settings().protocol, toDisk)
	var room [2]*session.Pending // a pending per peer, on the stack
	var waits []*session.Pending
	var source uint64 // the waits that go to the peer this primary pulls from
	var lerr, perr, leaseErr error
	for {
		switch w.Next() {
		case writepath.Log:
			// A log that cannot be written means the disk failed: detach it.
			if err := al.Admit(ctx, e.Off, e.Length); err != nil {
				v.log.Error("activity log", "err", err)
				diskHeld = false
				v.localDone()
				w.Logged(false, v.detach(diskFailure{op: diskLog, err: err}, e.Off, e.Length))
				continue
			}
			held.al, held.off, held.length = al, e.Off, e.Length
			w.Logged(true, false)
		case writepath.Ship:
			v.mu.Lock()
			// Only a peer holds the whole volume while this primary
			// copies newer data from it.
			pulling := v.st.Durable.Gens.Current.IsZero()
			v.mu.Unlock()
			proto := w.Protocol(pulling)
			if proto == 'A' && e.Data != nil {
				// The entry outlives this call; the client's buffer does not.
				e.Data = append([]byte(nil), e.Data...)
			}
			if err := v.throttleLag(ctx, proto); err != nil {
				return err
			}
			var serr error
			waits, source, serr = v.submitAll(room[:0], e, proto, held, false)
			perr = serr
			w.Shipped(serr != nil)
		case writepath.Drain:
			// A peer misses this write and that could not be tracked
			// durably: it must not be acknowledged, so it is not written
			// here either.
			for _, p := range waits {
				<-p.Done()
			}
			w.Drained()
		case writepath.Local:
			// A detached disk is skipped; what it misses is marked BEFORE
			// the write completes (at admission, or here when the disk was
			// detached since, or by detach when this write fails).
			v.mu.Lock()
			skipped := !w.ToDisk() || v.detachedLocked()
			if skipped && w.ToDisk() {
				v.durable.localMissing.SetRange(e.Off, e.Length)
			}
			pulling := v.st.Durable.Gens.Current.IsZero()
			v.mu.Unlock()
			if !skipped {
				lerr = local()
				if lerr == nil {
					// The sums before the write's activity-log Done;
					// under FUA durable with the data.
					lerr = v.durable.integ.written(e.Off, e.Length, e.Sums)
				}
				if lerr == nil && e.Flags&replication.EntryFUA != 0 {
					lerr = v.durable.integ.flushRange(e.Off, e.Length)
				}
			}
			if diskHeld {
				// Done with the disk, before a detach (probes wait for it).
				diskHeld = false
				v.localDone()
			}
			if lerr != nil {
				v.log.Error("local write failed", "op", e.Op, "off", e.Off, "len", e.Length, "err", lerr)
				skipped = v.detach(diskFailure{op: diskWrite, off: e.Off, length: e.Length, err: lerr}, e.Off, e.Length)
			}
			w.Wrote(skipped, lerr != nil, pulling)
		case writepath.Wait:
			acked, failed := v.waitPeers(waits, w.WaitFor(), &held.acks)
			if failed == nil {
				// A peer that acknowledged the write from its cache may
				// have lost it since, with its stream.
				failed = session.AwaitCacheLoss(waits)
			}
			if failed != nil {
				perr = failed
			}
			// While this primary pulls, only its source's copy is whole:
			// another peer's ack does not make the write safe (a pull that
			// starts again copies the source's block over it).
			sourceAcked := false
			for i, p := range waits {
				if i < 64 && source&(1<<i) != 0 && p.Acked() {
					sourceAcked = true
				}
			}
			w.Waited(acked, sourceAcked, failed != nil)
		case writepath.CountLag:
			// The client has the write before its peers do: each peer's
			// loop counts it in the peer's lag from now, before this
			// returns. A write whose session ended is not counted: its
			// blocks are marked.
			now := v.clock.Now()
			for _, p := range waits {
				if p.Session == nil || p.LagSeq == 0 {
					continue
				}
				p.Session.CompletedLocally(p.LagSeq, e.Length, now)
			}
			w.Counted()
		case writepath.Lease:
			// Completed only under a valid lease (authority mode), and
			// only once the end of every stream whose peer acknowledged
			// the write from its cache tracked that peer: a stream may
			// end after the Wait stage looked, while the lease is
			// awaited, so the last look is made with the lease held.
			for {
				if leaseErr = v.holdLease(ctx); leaseErr != nil {
					break
				}
				pending, err := session.CacheLossPending(waits)
				if err == nil && pending {
					err = session.AwaitCacheLoss(waits)
				}
				if err != nil {
					leaseErr = fmt.Errorf("write at %d: %w (%w)", e.Off, err, syscall.EIO)
					break
				}
				if !pending {
					break
				}
			}
			w.Leased(leaseErr == nil)
		case writepath.Done:
			o := w.Outcome()
			if (o == writepath.TrackFailed || o == writepath.LocalFailed) && len(waits) > 0 && w.ToDisk() && !v.isDetached() {
				v.revertPeers(e, waits)
			}
			return v.writeOutcome(e, o, perr, lerr, leaseErr)
		}
	}
}

// revertPeers undoes on the peers a write that failed after it went to
// their streams, and that the local disk does not hold: a peer's miss of
// it could not be tracked (so it was not written here), or the local
// write failed with no peer in sync to detach the disk for. The client
// was told it failed, so either content is allowed, but the replicas
// would differ in its blocks while they count each other in sync (DRBD
// marks such blocks out of sync). What the local disk holds there goes
// to every peer after it, as a write: in its stream, or marked for the
// peer. It runs BEFORE the write is over, under its range lock, so a
// later write to those blocks follows it. waits are the write's own
// pendings: the peers took it or not before the revert is sent.
//
// A block the local disk misses holds nothing to send. While this
// primary pulls, the pull copies the source's block (the copy kept, which
// the revert must not overwrite) and passes it on to every other peer
// (forwardPulled), so the replicas agree on it; only the blocks the local
// disk holds are reverted.
func (v *Volume) revertPeers(e replication.Entry, waits []*session.Pending) {
	for _, p := range waits {
		<-p.Done()
	}
	if !v.durable.localMissing.AnySet(e.Off, e.Length) {
		v.revertRange(e.Off, e.Length)
		return
	}
	end := e.Off + e.Length
	for off := e.Off; off < end; {
		next := min(end, (off/replication.BlockSize+1)*replication.BlockSize)
		if v.durable.localMissing.AnySet(off, next-off) {
			off = next
			continue
		}
		// A run of blocks held here.
		runEnd := next
		for runEnd < end {
			n := min(end, (runEnd/replication.BlockSize+1)*replication.BlockSize)
			if v.durable.localMissing.AnySet(runEnd, n-runEnd) {
				break
			}
			runEnd = n
		}
		v.revertRange(off, runEnd-off)
		off = runEnd
	}
}

// revertRange sends every peer what the local disk holds in [off,
// off+length) (revertPeers).
func (v *Volume) revertRange(off, length int64) {
	e := replication.Entry{Off: off, Length: length}
	buf := make([]byte, e.Length)
	if err := v.readLocal(buf, e.Off); err != nil {
		// Nothing to send: the blocks are marked for every peer, and its
		// next resync copies them from here (a peer streaming now keeps
		// the failed write until then).
		v.log.Error("a failed write reached the peers and its blocks cannot be read back here: marked for every peer, for its next resync", "off", e.Off, "len", e.Length, "err", err)
		for _, p := range v.streamingPeers() {
			p.bm.SetBits(e.Off, e.Length)
		}
		return
	}
	r := replication.Entry{Op: replication.OpWrite, Off: e.Off, Length: e.Length, Data: buf}
	reverts, _, err := v.submitAll(nil, r, 'C', nil, false)
	if _, werr := waitAll(reverts); err == nil {
		err = werr
	}
	if err != nil {
		v.log.Error("a failed write reached the peers, and undoing it on a peer could not be tracked", "off", e.Off, "len", e.Length, "err", err)
	}
}

// waitPeers waits for the peers' pendings as mode says: acked says a peer
// took the write, failed is the first failure to track a write a peer did
// not take (under B, it ends the wait). acks, when armed, completes with
// the last of waits (submitAll): the wait for every ack wakes once.
func (v *Volume) waitPeers(waits []*session.Pending, mode writepath.WaitMode, acks *session.Joint) (acked bool, failed error) {
	switch mode {
	case writepath.WaitAcks: // every ack (or completion)
		if acks.Armed() {
			<-acks.Done()
		}
		return waitAll(waits)
	case writepath.WaitReceipts: // every receipt; a failure to track ends the wait
		for _, p := range waits {
			<-p.Received
			select {
			case <-p.Done():
				if p.Err() != nil {
					return false, p.Err()
				}
			default:
			}
		}
	}
	return false, nil
}

// writeOutcome is the error a write that ended with o returns (nil when
// it completed).
func (v *Volume) writeOutcome(e replication.Entry, o writepath.Outcome, perr, lerr, leaseErr error) error {
	switch o {
	case writepath.Completed:
		return nil
	case writepath.LogFailed:
		return fmt.Errorf("activity log: %w", syscall.EIO)
	case writepath.TrackFailed, writepath.PeerFailed:
		return fmt.Errorf("write at %d: %w (%w)", e.Off, perr, syscall.EIO)
	case writepath.NoCopy:
		return fmt.Errorf("write at %d: %w (%w)", e.Off, errNoCopy, syscall.EIO)
	case writepath.PullNotTaken:
		return fmt.Errorf("write at %d: %s is copying newer data from a peer and that peer did not take the write; it completes again once the peer is back (%w)", e.Off, v.self, syscall.EIO)
	case writepath.LocalFailed:
		return fmt.Errorf("local write: %w", syscall.EIO)
	case writepath.LeaseLost:
		return leaseErr
	}
	panic(fmt.Sprintf("volume %s: write outcome %s", v.name, o))
}

// Flush implements nbd.Export: every write completed before it is durable
// on the local disk AND on every connected peer when it returns.
func (v *Volume) Flush(ctx context.Context) error {
	defer v.observe(opFlush, v.clock.Now())
	if err := v.enter(ctx); err != nil {
		return err
	}
	defer v.iopath.io.Done()
	v.counters.flushes.Add(1)
	if err := v.flushAll(true); err != nil {
		return err
	}
	return v.holdLease(ctx)
}

// flushAll flushes the local disk and every peer. A peer whose stream
// ended before it acknowledged the flush was tracked, and what it
// acknowledged from its cache marked, BEFORE this returns (its session's
// end); when that could not be made durable, the flush fails. declares:
// the flush tells someone the writes before it are durable (a client's
// FLUSH, a handover), so a peer never streamed to is tracked too (submit).
func (v *Volume) flushAll(declares bool) error {
	waits, _, serr := v.submitAll(nil, replication.Entry{Op: replication.OpFlush}, 'C', nil, declares)
	var err error
	if !v.isDetached() {
		// The data, and the sums of what was written with it.
		if err = v.durable.integ.syncData(v.disk.Sync); err != nil {
			v.log.Error("local flush failed", "err", err)
			if v.detach(diskFailure{op: diskSync, err: err}, 0, 0) {
				err = nil
			}
		}
	}
	acked, perr := waitAll(waits)
	if perr == nil {
		perr = serr
	}
	switch {
	case err != nil:
		return fmt.Errorf("local flush: %w", syscall.EIO)
	case perr != nil:
		return fmt.Errorf("flush: %w (%w)", perr, syscall.EIO)
	case v.isDetached() && !acked:
		return fmt.Errorf("flush: %w (%w)", errNoCopy, syscall.EIO)
	}
	return nil
}

// throttleLag holds a write back, under protocols A and B, while a
// connected peer lags by max_lag or more (replication.ThrottleForLag). It
// looks again at each change of the volume's or a peer's state (a
// published lag, a stream that ended: v.changed).
func (v *Volume) throttleLag(ctx context.Context, proto byte) error {
	maxLag := v.settings().maxLag
	if proto == 'C' || maxLag <= 0 {
		return nil
	}
	for _, p := range v.streamingPeers() {
		held := func() bool {
			lag, _ := p.lagOf(v.clock.Now())
			return replication.ThrottleForLag(maxLag, lag, p.session() != nil)
		}
		for held() {
			// Taken only when held (it makes a channel), and looked again
			// after: a change between the looks wakes the wait.
			changed := v.changed.wait()
			if !held() {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
			}
		}
	}
	return nil
}

// countdown takes a write's extent out of the activity log's working set
// (al, when not nil) once every holder is done. (Fields, not a closure: a
// closure would move the write's entry to the heap.)
type countdown struct {
	n           atomic.Int32
	al          *metadata.ActivityLog
	off, length int64
	// sums holds the write's block checksums (replication.Entry.Sums)
	// for writes of up to 64 KiB; room, a kept array of rooms, those of
	// a larger one up to 1 MiB (larger ones allocate their own).
	sums  [16]uint32
	room  *sumsRoom
	rooms *integrity
	// acks completes once every peer's entry of the write completed,
	// when the write waits for more than one (submitAll).
	acks session.Joint
}

func (c *countdown) add() { c.n.Add(1) }

// Done releases one hold (session.Hold: an entry's, once it completed).
// The last gives the sums' room back: no entry of the write is read any
// more (an entry shipped without a hold copies them, peer.shipLater).
func (c *countdown) Done() {
	if c.n.Add(-1) != 0 {
		return
	}
	if c.al != nil {
		c.al.Done(c.off, c.length)
	}
	if c.room != nil {
		c.rooms.returnRoom(c.room)
		c.room = nil
	}
}

// waitAll waits for every pending: acked says at least one peer took the
// entry; err is the first failure to track an entry a peer did not take.
// A flush waits so; a write waits so under protocol C, in its stage 4.
func waitAll(waits []*session.Pending) (acked bool, err error) {
	for _, w := range waits {
		<-w.Done()
		acked = acked || w.Acked()
		if w.Err() != nil && err == nil {
			err = w.Err()
		}
	}
	return acked, err
}
