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
		next := func() (*session.Pending, func(), error) {
			start, n, ok := p.bm.NextRun(cursor, resyncRunBlocks)
			if !ok {
				return nil, nil, nil
			}
			cursor = start + n
			off := start * replication.BlockSize
			length := min(n*replication.BlockSize, v.size.Load()-off)
			hold, err := v.locks.Lock(ctx, off, length)
			if err != nil {
				return nil, nil, err
			}
			unlock := hold.Release
			pd, err := p.resyncEntry(s, off, length, csums)
			if err != nil {
				unlock()
				return nil, nil, err
			}
			if !csums {
				p.resyncSent.Add(length)
			}
			if pd.Entry.Op == replication.OpResyncData {
				wire += length
			}
			flight.add(pd)
			return pd, unlock, nil
		}
		if err := w.Runs(ctx, pace, next); err != nil {
			return err
		}
		if p.bm.Count() == 0 {
			break
		}
	}
	// Everything marked is on the peer: hand it the current generation,
	// once this node holds one. A primary that pulls newer data from
	// another peer holds none until its pull ends (its disk is
	// Inconsistent meanwhile, and what it pulls follows in the peer's
	// stream: forwardPulled); a target given none would drop the
	// generation its resync resumes from (volstate's ErrNoGeneration).
	var pd *session.Pending
	for {
		changed := v.changed.wait()
		v.stateMu.Lock()
		if gen := v.currentGeneration(); !gen.IsZero() {
			pd = p.syncDone(gen)
			break // with v.stateMu held
		}
		v.stateMu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
	ok := s.Enqueue(pd)
	v.stateMu.Unlock()
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
// a zero range, or the data. Its ack clears the run's bits.
func (p *peer) resyncEntry(s *session.Session, off, length int64, csums bool) (*session.Pending, error) {
	v := p.v
	pd := session.NewPending(replication.Entry{})
	switch hf, isHF := v.disk.(backing.HoleFinder); {
	case csums:
		bp, err := readBlock(v.disk, off, length)
		if err != nil {
			return nil, fmt.Errorf("resync: %w", err)
		}
		pd.Entry = replication.Entry{Op: replication.OpVerify, Off: off, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])}
		resyncBufs.Put(bp)
		// Its reply lists the blocks that differ; its ack clears the
		// others (Session.complete).
		pd.Kind = session.EntryCsums
		return pd, nil
	case isHF && hf.IsHole(off, length):
		pd.Entry = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
	default:
		bp, err := readBlock(v.disk, off, length)
		if err != nil {
			return nil, fmt.Errorf("resync: %w", err)
		}
		if err := p.verifySource((*bp)[:length], off); err != nil {
			resyncBufs.Put(bp)
			return nil, err
		}
		if buf := (*bp)[:length]; bytes.Equal(buf, zeroBlock[:length]) {
			pd.Entry = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
			resyncBufs.Put(bp)
		} else {
			// The blocks' sums go with them: the target verifies them
			// before it writes, and stores them.
			pd.Entry = replication.Entry{Op: replication.OpResyncData, Off: off, Length: length, Data: buf,
				Sums: v.integ.sumsOf(nil, off, buf, v.size.Load())}
			pd.Buf = bp
		}
	}
	// Its ack clears the run's bits but those marked again while it was
	// in flight (Session.clearRun).
	pd.Kind = session.EntryResync
	return pd, nil
}

// verify compares the peer's copy with the local one, a run at a time
// through the session's window: each run is read under the range lock and
// its checksums queued in order with the writes, so both sides compare the
// same state. Differing blocks are marked out of sync; with repair the
// session restarts at the end, and the reconnection resyncs them.
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
		if off >= v.size.Load() {
			return nil, nil, nil
		}
		runOff, length := off, min(run, v.size.Load()-off)
		off += length
		hold, err := v.locks.Lock(ctx, runOff, length)
		if err != nil {
			return nil, nil, err
		}
		unlock := hold.Release
		bp, err := readBlock(v.disk, runOff, length)
		if err != nil {
			unlock()
			return nil, nil, fmt.Errorf("verify: local %w", err)
		}
		pd := session.NewPending(replication.Entry{Op: replication.OpVerify, Off: runOff, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])})
		resyncBufs.Put(bp)
		// Its reply marks the blocks that differ (Session.readReply).
		pd.Kind = session.EntryVerify
		return pd, unlock, nil
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
// replica that holds it good (the run then holds the good copy); a
// secondary, the source of its primary's pull, cannot (its repair asks
// the primary, the target here) and only checks. A block no replica
// holds good fails the run with errSourceUnrecoverable, a block found so
// before at once (one block-unrecoverable event, not one per retry): the
// peer stays out of sync in it and the resync is retried, until a write
// to the block lets it through.
func (p *peer) verifySource(buf []byte, off int64) error {
	v := p.v
	in := v.integ
	if !in.on() {
		return nil
	}
	length := int64(len(buf))
	if b, ok := in.lostIn(off, length); ok {
		return fmt.Errorf("resync to %s: the block at byte %d: %w", p.name, b*blocksum.BlockSize, errSourceUnrecoverable)
	}
	if v.state().role() != replication.Primary {
		if err := in.check(off, buf, v.size.Load()); err != nil {
			return fmt.Errorf("resync to %s at %d: %w (%w)", p.name, off, errSourceUnrecoverable, err)
		}
		return nil
	}
	var t blockTally
	if err := v.verifyBlocks(context.Background(), buf, off, &t); err != nil {
		return fmt.Errorf("resync to %s: %w", p.name, err)
	}
	if t.unrecoverable > 0 {
		b, _ := in.lostIn(off, length)
		return fmt.Errorf("resync to %s: the block at byte %d: %w", p.name, b*blocksum.BlockSize, errSourceUnrecoverable)
	}
	return nil
}
