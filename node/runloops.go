package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/replication"
)

const (
	// resyncRunBlocks is the largest resync or verify run (1 MiB).
	resyncRunBlocks = 256
	// resyncWindow is how many runs may await their ack.
	resyncWindow = 16
)

var zeroBlock = make([]byte, resyncRunBlocks*replication.BlockSize)

var resyncBufs = sync.Pool{New: func() any { b := make([]byte, resyncRunBlocks*replication.BlockSize); return &b }}

// readBlock reads a run into a pooled buffer.
func readBlock(d Disk, off, length int64) (*[]byte, error) {
	bp := resyncBufs.Get().(*[]byte)
	if _, err := d.ReadAt((*bp)[:length], off); err != nil {
		resyncBufs.Put(bp)
		return nil, fmt.Errorf("read at %d: %w", off, err)
	}
	return bp, nil
}

// resync sends every block marked in the bitmap through the session's
// window, then makes the peer UpToDate. Application writes go on
// meanwhile: a run holds the range lock from its read until its entry is
// queued, so a write to the same blocks is queued before the read (and
// overwritten by it) or after it. With csums, the first pass sends
// checksums and only the blocks the peer lacks are sent (DRBD's
// csums-alg); later passes send data: what the checksums showed differs,
// and what was written meanwhile.
func (p *peer) resync(s *session.Session) error {
	v, ctx := p.v, s.Context()
	p.resyncTotal.Store(p.bm.Bytes())
	began := time.Unix(0, p.resyncStart.Load())
	var pacer resyncPacer
	var wire int64 // data bytes sent (zero ranges cost no bandwidth)
	w := s.Window(resyncWindow)
	flight := &runsInFlight{count: w.InFlight}
	pace := func() error {
		if err := p.waitUnpaused(ctx); err != nil {
			return err
		}
		// A catch-up pauses while its peer is Behind again (congestion):
		// the session says it is not any more BEFORE it steps the peer's
		// state (PeerDrained), which notifies v.changed.
		for {
			changed := v.changed.wait()
			if !s.CatchUpPaused() {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
			}
		}
		return v.resyncPace(ctx, &pacer, wire, flight)
	}
	for csums := v.cfg.Csums; ; csums = false {
		cursor := int64(0)
		// held counts the blocks this pass held back (bad here, with no
		// good copy: verifySource), shipped the entries it sent; first is
		// why the first was held.
		var held, shipped int64
		var first error
		next := func() (*session.Pending, func(), error) {
			for {
				start, n, ok := p.bm.NextRun(cursor, resyncRunBlocks)
				if !ok {
					return nil, nil, nil
				}
				off := start * replication.BlockSize
				length := min(n*replication.BlockSize, v.size.Load()-off)
				hold, err := v.iopath.locks.Lock(ctx, off, length)
				if err != nil {
					return nil, nil, err
				}
				unlock := hold.Release
				pd, covered, err := p.resyncEntry(s, off, length, csums)
				if err != nil {
					unlock()
					return nil, nil, err
				}
				cursor = start + (covered+replication.BlockSize-1)/replication.BlockSize
				if pd == nil || pd.Kind != session.EntryResync && pd.Kind != session.EntryCsums {
					// Blocks held back: they stay marked. The target
					// records them as unrecoverable when pd says so.
					held += (covered + replication.BlockSize - 1) / replication.BlockSize
					if first == nil {
						first = fmt.Errorf("resync to %s: the block at byte %d: %w", p.name, off, errSourceUnrecoverable)
					}
					if pd == nil {
						unlock()
						continue
					}
					return pd, unlock, nil
				}
				shipped++
				if !csums {
					p.resyncSent.Add(covered)
				}
				if pd.Entry.Op == replication.OpResyncData {
					wire += covered
				}
				flight.add(pd)
				return pd, unlock, nil
			}
		}
		if err := w.Runs(ctx, pace, next); err != nil {
			return err
		}
		if p.bm.Count() == 0 {
			break
		}
		if held > 0 && shipped == 0 {
			// Only blocks no replica holds good are left: the peer
			// stays out of sync in them, and the link's back-off tries
			// again (a write to them, or a replica back in sync that
			// holds them good, lets them through).
			return first
		}
	}
	// Everything marked is on the peer: hand it the current generation,
	// once this node holds one. A primary that pulls newer data from
	// another peer holds none until its pull ends (its disk is
	// Inconsistent meanwhile, and what it pulls follows in the peer's
	// stream: forwardPulled); a target given none would drop the
	// generation its resync resumes from (volstate's ErrNoGeneration).
	// The sync-done is built, and what the peer may hold from here
	// recorded, on the volume's loop, which owns the peer's state; in
	// the stream in the same critical section under v.stateMu as the
	// look at the generation, so that a generation a write moves on to
	// later (trackLocked) is announced after it. (Enqueue waits only
	// while s's inbox is full, for s's loop, which never waits for the
	// volume's loop: its news is told.)
	var pd *session.Pending
	ok := false
	for pd == nil {
		changed := v.changed.wait()
		v.loop.Ask(func() {
			v.stateMu.Lock()
			defer v.stateMu.Unlock()
			if gen := v.currentGeneration(); !gen.IsZero() {
				pd = p.syncDone(gen)
				ok = s.Enqueue(pd)
			}
		})
		if pd != nil {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
	if !ok {
		return session.ErrEnded
	}
	select {
	case <-pd.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	total := p.resyncTotal.Load()
	secs := p.v.clock.Since(began).Seconds()
	v.log.Info("resync finished", "peer", p.name, "bytes", total, "seconds", secs)
	p.resyncFinished(total, secs)
	v.node.peerEvent(v.name, "resync-done", p.name, fmt.Sprintf("resync to %s finished: %s in %.1fs", p.name, human.Bytes(total), secs))
	return nil
}

// resyncEntry reads one run and builds its entry: checksums (csums),
// a zero range, or the data; covered is how much of [off, off+length)
// the entry is about, from off. Its ack clears the bits of what it
// ships. A block that fails its checksum here and that no replica holds
// good is held back (verifySource): the entry ships the run's blocks
// before it, or, when the run starts with it, pd is the entry that tells
// the peer the block is unrecoverable (OpResyncLost; nil when the peer
// does not take it, or this node cannot tell), which clears no bit.
func (p *peer) resyncEntry(s *session.Session, off, length int64, csums bool) (pd *session.Pending, covered int64, err error) {
	v := p.v
	pd = session.NewPending(replication.Entry{})
	switch hf, isHF := v.disk.(backing.HoleFinder); {
	case csums:
		bp, err := readBlock(v.disk, off, length)
		if err != nil {
			return nil, 0, fmt.Errorf("resync: %w", err)
		}
		pd.Entry = replication.Entry{Op: replication.OpVerify, Off: off, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])}
		resyncBufs.Put(bp)
		// Its reply lists the blocks that differ; its ack clears the
		// others (Session.complete).
		pd.Kind = session.EntryCsums
		return pd, length, nil
	case isHF && hf.IsHole(off, length):
		pd.Entry = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
	default:
		bp, err := readBlock(v.disk, off, length)
		if err != nil {
			return nil, 0, fmt.Errorf("resync: %w", err)
		}
		bad, lost, err := p.verifySource((*bp)[:length], off)
		if err != nil {
			resyncBufs.Put(bp)
			return nil, 0, err
		}
		if bad > 0 {
			resyncBufs.Put(bp)
			return p.heldBack(off, bad, lost), bad, nil
		}
		if bad < 0 {
			// The run's good blocks before the bad one go now.
			length = -bad
		}
		if buf := (*bp)[:length]; bytes.Equal(buf, zeroBlock[:length]) {
			pd.Entry = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
			resyncBufs.Put(bp)
		} else {
			// The blocks' sums go with them: the target verifies them
			// before it writes, and stores them.
			pd.Entry = replication.Entry{Op: replication.OpResyncData, Off: off, Length: length, Data: buf,
				Sums: v.durable.integ.sumsOf(nil, off, buf, v.size.Load())}
			pd.Buf = bp
		}
	}
	// Its ack clears the run's bits but those marked again while it was
	// in flight (Session.clearRun).
	pd.Kind = session.EntryResync
	return pd, pd.Entry.Length, nil
}

// heldBack is the entry that tells the peer the blocks [off, off+length),
// held back, are unrecoverable (lost: no replica holds them good), or nil
// when there is none to send: the peer does not take it (a node of the
// release before), or this node, a secondary, cannot tell whether
// another replica holds them good. It clears no bit: the peer stays out
// of sync in them.
func (p *peer) heldBack(off, length int64, lost bool) *session.Pending {
	if !lost || !p.takesLost.Load() {
		return nil
	}
	pd := session.NewPending(replication.Entry{Op: replication.OpResyncLost, Off: off, Length: length})
	pd.Kind = session.EntryPlain
	return pd
}

// verify compares the peer's copy with the local one, a run at a time
// through the session's window: each run is read under the range lock,
// checked against the stored sums (verifySource: a bad block is repaired
// first, one no replica holds good is marked out of sync uncompared), and
// its checksums queued in order with the writes, so both sides compare
// the same state. Differing blocks are marked out of sync; with repair
// the session restarts at the end, and the reconnection resyncs them.
func (p *peer) verify(s *session.Session, repair bool) {
	v := p.v
	p.verifyTotal.Store(v.size.Load())
	p.verifyDone.Store(0)
	p.verifyFound.Store(0)
	began := p.v.clock.Now()
	p.verifyStart.Store(began.UnixNano())
	run := int64(resyncRunBlocks * replication.BlockSize)
	ctx, cancel := v.untilStopping(s.Context())
	defer cancel()
	off := int64(0)
	next := func() (*session.Pending, func(), error) {
		for {
			if off >= v.size.Load() {
				return nil, nil, nil
			}
			runOff, length := off, min(run, v.size.Load()-off)
			hold, err := v.iopath.locks.Lock(ctx, runOff, length)
			if err != nil {
				return nil, nil, err
			}
			unlock := hold.Release
			bp, err := readBlock(v.disk, runOff, length)
			if err != nil {
				unlock()
				return nil, nil, fmt.Errorf("verify: local %w", err)
			}
			// The run is checked against this node's own sums first, as
			// a resync's is: a bad block is repaired from a replica that
			// holds it good, and one none does is never compared as if
			// good: it is out of sync for the peer (which a resync then
			// holds back, telling the peer it is unrecoverable).
			bad, _, err := p.verifySource((*bp)[:length], runOff)
			if err != nil {
				resyncBufs.Put(bp)
				unlock()
				return nil, nil, fmt.Errorf("verify: %w", err)
			}
			if bad > 0 {
				resyncBufs.Put(bp)
				p.bm.SetBits(runOff, bad)
				p.verifyFound.Add(bad)
				p.verifyDone.Add(bad)
				unlock()
				off = runOff + bad
				continue
			}
			if bad < 0 {
				length = -bad
			}
			off = runOff + length
			pd := session.NewPending(replication.Entry{Op: replication.OpVerify, Off: runOff, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])})
			resyncBufs.Put(bp)
			// Its reply marks the blocks that differ (Session.readReply).
			pd.Kind = session.EntryVerify
			return pd, unlock, nil
		}
	}
	if err := s.Window(resyncWindow).Runs(ctx, nil, next); err != nil {
		v.log.Warn("verify stopped", "peer", p.name, "err", err)
		v.node.peerEvent(v.name, "verify-stopped", p.name, fmt.Sprintf("verify of %s stopped after %s: %v", p.name, human.Bytes(p.verifyDone.Load()), err))
		return
	}
	found := p.verifyFound.Load()
	msg := fmt.Sprintf("verify of %s finished in %.1fs: %s out of sync", p.name, p.v.clock.Since(began).Seconds(), human.Bytes(found))
	v.log.Info("verify finished", "peer", p.name, "out_of_sync", found)
	if found > 0 && repair {
		msg += "; resyncing them"
		s.Cancel() // the reconnection resyncs the marked blocks
	}
	v.node.peerEvent(v.name, "verify-done", p.name, msg)
}

// untilStopping is a context of parent that also ends when the volume
// stops; cancel ends it, and its watcher, sooner.
func (v *Volume) untilStopping(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-v.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// errSourceUnrecoverable: a resync reached a block this node, its
// source, holds bad, and no replica holds it good.
var errSourceUnrecoverable = errors.New("the resync source holds a block bad that no replica holds good")

// verifySource checks a run the resync read from this node's disk, at
// off, against the stored sums BEFORE it is shipped: a resync never
// ships a block that fails its checksum as good (the target would store
// it with a sum computed from it, and take it for good from then on).
// The primary repairs a bad block as a client's read does, from a
// replica in sync that holds it good (the run then holds the good copy);
// a secondary, the source of its primary's pull, cannot (its repair asks
// the primary, the target here) and only checks. A block lost here (no
// replica held it good) is bad whatever it reads; the primary asks the
// replicas in sync for it again, reporting it once, not at every retry.
//
// bad says what goes: 0, the whole run; -n, its first n bytes, good,
// before a bad block; n > 0, the run starts with n bytes of bad blocks,
// held back (lost: no replica holds them good, so the peer is told).
// The peer stays out of sync in what is held back and the resync is
// retried, until a write to the blocks lets them through.
func (p *peer) verifySource(buf []byte, off int64) (bad int64, lost bool, err error) {
	v := p.v
	in := v.durable.integ
	if !in.on() {
		return 0, false, nil
	}
	length := int64(len(buf))
	size := v.size.Load()
	var badBlocks map[int64]bool
	if v.state().role() == replication.Primary {
		t := blockTally{quietLost: true}
		if err := v.verifyBlocks(context.Background(), buf, off, &t); err != nil {
			return 0, false, fmt.Errorf("resync to %s: %w", p.name, err)
		}
		badBlocks, lost = t.lost, true
	} else if b, ok := in.firstBad(off, buf, size); ok {
		badBlocks = map[int64]bool{b: true}
	}
	if len(badBlocks) == 0 {
		return 0, false, nil
	}
	first := off / blocksum.BlockSize
	b := first
	for !badBlocks[b] {
		b++
	}
	if b > first {
		return -(b - first) * blocksum.BlockSize, false, nil
	}
	e := b
	for badBlocks[e] {
		e++
	}
	return min(length, (e-first)*blocksum.BlockSize), lost, nil
}
