package apply

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
)

// Volume is the volume a stream is applied to, as package node fills it
// in for each stream: what the applier reads and writes, and the volume's
// State for what only the volume decides.
type Volume struct {
	Name string // the volume's name, for errors
	Self string // this node's name, for errors and the ack's message
	Disk Disk
	// ActivityLog holds the extents of the writes being applied.
	ActivityLog ActivityLog
	// Size is the volume's size in bytes; an online resize grows it
	// while the stream runs.
	Size *atomic.Int64
	// Resynced counts the bytes this node received by resync.
	Resynced *atomic.Int64
	// Buffers holds *[]byte buffers for reads and verifies (the volume's
	// pool, shared with its resync).
	Buffers *sync.Pool
	// PeerTimeout is the primary's patience: while a batch is applied,
	// an empty ack goes out every quarter of it.
	PeerTimeout time.Duration
	// Stopping is closed when the volume stops: the stream ends then.
	Stopping <-chan struct{}
	Log      *slog.Logger
	State    State
	// Clock paces the empty acks of a long apply. Nil is clock.Real(); a
	// test sets a clock.Fake.
	Clock clock.Clock
	// Checksums keeps the checksums at rest of what the stream writes;
	// nil when the volume keeps none on this node.
	Checksums Checksums
}

// Checksums is the volume's checksums at rest (docs/integrity.md), as
// the applier keeps them. Its methods are called from the stream's
// goroutine only.
type Checksums interface {
	// Written records what a write of [off, off+length) left on the
	// disk, BEFORE the write's activity-log Done: for data, its blocks'
	// sums (the entry's, or computed from data when it carried none);
	// without data (zeroes, a trim), no known sum for the blocks it
	// touched.
	Written(off, length int64, data []byte, sums []uint32) error
	// Sync makes the data written so far, and the sums recorded for it,
	// durable; syncData syncs the data (one sync may cover both).
	Sync(syncData func() error) error
	// Listed reports whether [off, off+length) touches a block on this
	// node's bad-block list: such a range is not read from the disk.
	Listed(off, length int64) bool
	// Check checks data, read from the disk at off, against the sums
	// stored for its blocks (those that have one); an error names the
	// first that differs.
	Check(off int64, data []byte) error
	// Verify checks the blocks of data, to be written at off, against
	// the sums they came with; an error names the first that differs.
	Verify(off int64, data []byte, sums []uint32) error
	// Lost records the blocks of [off, off+length) as unrecoverable: the
	// resync source holds them bad and no replica holds them good
	// (OpResyncLost). Reads of them here fail until a write covers them;
	// the record is durable BEFORE it returns.
	Lost(off, length int64) error
}

// Disk is the local disk a stream is written to (package node's backing
// disk).
type Disk interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes every completed write durable.
	Sync() error
	// Zero makes [off, off+length) read as zeroes.
	Zero(off, length int64) error
	// WriteSync writes p at off and makes it durable BEFORE it returns.
	WriteSync(p []byte, off int64) error
	// IsHole reports whether [off, off+length) is known to hold no data
	// (false when the disk cannot tell).
	IsHole(off, length int64) bool
}

// ActivityLog is the volume's activity log (metadata.ActivityLog): the
// extents of a write are durably in it BEFORE the write is issued, and
// Done once it completed.
type ActivityLog interface {
	Admit(ctx context.Context, off, length int64) error
	Done(off, length int64)
}

// State is the volume's part in applying a stream: its durable state and
// its disk's state are the volume's to change (epochs, step-downs and
// fencing are decided before the stream is taken, in package node). The
// applier calls these methods from the stream's goroutine, holding the
// stream's apply lock; each may block while it writes to stable storage.
type State interface {
	// MarkReplica puts the replica indicator on stable storage, if it
	// is not there yet: it is there BEFORE the first replicated write.
	MarkReplica() error
	// SyncStarted makes the disk Inconsistent, durably, remembering the
	// generation the source's bitmap starts from (from), BEFORE any
	// resync data is written.
	SyncStarted(from replication.Generation) error
	// SyncFinished records that the disk holds the primary's
	// generation g (with its history): a resync from primary is done,
	// and what the volume had marked toward it is in. The resynced data
	// is durable BEFORE it is called.
	SyncFinished(primary string, g replication.Generation, history []replication.Generation) error
	// Failed records that a replicated entry failed on the disk (err).
	Failed(err error)
}

// apply writes a batch's entries to the local disk in order and returns the
// ack for it. Entries flagged FUA, and flushes, are durable BEFORE the ack.
// OpRead entries are answered through readReply, BEFORE the ack.
func (in *Stream) apply(v *Volume, entries []replication.Entry, readReply func(seq uint64, st replication.AckStatus, data []byte) error) replication.Ack {
	if len(entries) == 0 {
		return replication.Ack{}
	}
	ack := replication.Ack{Seq: entries[len(entries)-1].Seq}
	fail := func(e *replication.Entry, err error) replication.Ack {
		v.Log.Error("applying replicated entry failed", "op", e.Op, "off", e.Off, "len", e.Length, "err", err)
		// The primary marks every entry of this batch for this node (it
		// gets no ack for them): this disk is its generation plus some of
		// them, applied in order, which a resync of those blocks repairs.
		// The generation stays, so that resync is of the marked blocks,
		// not a full one.
		v.State.Failed(err)
		return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: fmt.Sprintf("%s: %v", v.Self, err)}
	}
	if err := in.failed; err != nil {
		in.failed = nil
		return fail(&entries[0], err)
	}
	// Every block that came with a checksum matches it BEFORE anything
	// of the batch is applied: a block corrupted on its way is refused,
	// never written. The disk did not fail: the stream ends, and the
	// primary marks the batch's blocks for this node.
	for i := range entries {
		e := &entries[i]
		if e.Sums == nil || !e.Op.CarriesSums() || v.Checksums == nil {
			continue
		}
		if err := v.Checksums.Verify(e.Off, e.Data, e.Sums); err != nil {
			v.Log.Error("refused a replicated batch: a block does not match the checksum it came with; nothing of the batch was written", "op", e.Op, "off", e.Off, "len", e.Length, "err", err)
			return replication.Ack{Seq: ack.Seq, Status: replication.AckChecksum,
				Message: fmt.Sprintf("%s refused the batch, writing nothing of it: %v", v.Self, err)}
		}
	}
	needSync := false
	for i := range entries {
		e := &entries[i]
		if e.Off < 0 || e.Off+e.Length > v.Size.Load() {
			if e.Op != replication.OpFlush && e.Op != replication.OpSyncStart && e.Op != replication.OpSyncDone {
				return fail(e, fmt.Errorf("entry beyond the volume end (%d+%d > %d)", e.Off, e.Length, v.Size.Load()))
			}
		}
		var err error
		switch e.Op {
		case replication.OpWrite:
			if err = v.logApplied(e); err != nil {
				break
			}
			if e.Flags&replication.EntryFUA != 0 {
				err = v.Disk.WriteSync(e.Data, e.Off)
			} else {
				_, err = v.Disk.WriteAt(e.Data, e.Off)
			}
			if err == nil {
				err = v.written(e.Off, e.Length, e.Data, e.Sums)
			}
			v.ActivityLog.Done(e.Off, e.Length)
		case replication.OpZero, replication.OpTrim:
			err = v.zeroLogged(e)
			needSync = needSync || e.Flags&replication.EntryFUA != 0
		case replication.OpFlush:
			if v.Checksums != nil {
				err = v.Checksums.Sync(v.Disk.Sync)
			} else {
				err = v.Disk.Sync()
			}
		case replication.OpVerify:
			bp := v.Buffers.Get().(*[]byte)
			buf := *bp
			if int64(cap(buf)) < e.Length {
				buf = make([]byte, e.Length)
			}
			buf = buf[:e.Length]
			st, mism := replication.AckOK, []byte(nil)
			if _, rerr := v.Disk.ReadAt(buf, e.Off); rerr != nil {
				st = replication.AckIOError
			} else {
				mism = replication.EncodeMismatches(replication.Mismatches(buf, e.Data))
			}
			v.Buffers.Put(bp)
			if err = readReply(e.Seq, st, mism); err != nil {
				return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: err.Error()}
			}
		case replication.OpRead:
			bp := v.Buffers.Get().(*[]byte)
			buf := *bp
			if int64(cap(buf)) < e.Length {
				buf = make([]byte, e.Length)
			}
			buf = buf[:e.Length]
			st := replication.AckOK
			if v.Checksums != nil && v.Checksums.Listed(e.Off, e.Length) {
				// A block this node could not rewrite is never read
				// from its disk: the primary takes it elsewhere.
				v.Log.Warn("read for the primary: a block of it is on the bad-block list", "off", e.Off, "len", e.Length)
				st, buf = replication.AckIOError, nil
			} else if _, rerr := v.Disk.ReadAt(buf, e.Off); rerr != nil {
				v.Log.Error("read for the primary failed", "off", e.Off, "len", e.Length, "err", rerr)
				st, buf = replication.AckIOError, nil
			} else if v.Checksums != nil {
				// Never a block that fails its checksum as good data.
				if cerr := v.Checksums.Check(e.Off, buf); cerr != nil {
					v.Log.Error("read for the primary: a block does not match its checksum", "off", e.Off, "len", e.Length, "err", cerr)
					st, buf = replication.AckIOError, nil
				}
			}
			err = readReply(e.Seq, st, buf)
			v.Buffers.Put(bp)
			if err != nil {
				return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: err.Error()}
			}
		case replication.OpResyncData:
			// Resynced data goes through the activity log as a write
			// does: a later change of primary marks its extents toward
			// the third nodes (volstate.MarkActivityLog), which may
			// never have had it (the source's own unacknowledged writes
			// of before its crash), and a crash of this node resyncs
			// them again (the source cleared their bits at the ack,
			// which came from this node's cache).
			if err = v.logApplied(e); err != nil {
				break
			}
			_, err = v.Disk.WriteAt(e.Data, e.Off)
			if err == nil {
				err = v.written(e.Off, e.Length, e.Data, e.Sums)
			}
			v.ActivityLog.Done(e.Off, e.Length)
			v.Resynced.Add(e.Length)
		case replication.OpResyncZero:
			// A hole already reads as the zeroes sent: the disk does not
			// change, and the log need not know.
			if !v.Disk.IsHole(e.Off, e.Length) {
				if err = v.zeroLogged(e); err != nil {
					break
				}
			}
			v.Resynced.Add(e.Length)
		case replication.OpResyncLost:
			// The disk does not change: what it holds there is no
			// good copy either (the source would have taken it).
			if v.Checksums != nil {
				err = v.Checksums.Lost(e.Off, e.Length)
			}
		case replication.OpSyncStart:
			// From here until OpSyncDone this disk is Inconsistent, durably,
			// BEFORE any resync data is written. It remembers the
			// generation the source's bitmap starts from: a reconnection
			// resumes the resync from that bitmap.
			var g replication.Generation
			if len(e.Data) != len(g) {
				return fail(e, fmt.Errorf("sync-start entry with %d-byte generation", len(e.Data)))
			}
			copy(g[:], e.Data)
			err = v.State.SyncStarted(g)
			in.SetState(replication.SyncTarget)
		case replication.OpSyncDone:
			var g replication.Generation
			if len(e.Data) < len(g) || len(e.Data)%len(g) != 0 {
				return fail(e, fmt.Errorf("sync-done entry of %d bytes: want a generation and its history", len(e.Data)))
			}
			copy(g[:], e.Data)
			var history []replication.Generation
			for rest := e.Data[len(g):]; len(rest) > 0; rest = rest[len(g):] {
				var h replication.Generation
				copy(h[:], rest)
				history = append(history, h)
			}
			// The resynced data is durable BEFORE the generation says so.
			if err = v.Disk.Sync(); err != nil {
				break
			}
			if err = v.State.SyncFinished(in.from, g, history); err != nil {
				break
			}
			in.SetState(replication.Connected)
		default:
			err = fmt.Errorf("unknown op %d", e.Op)
		}
		if err != nil {
			return fail(e, err)
		}
	}
	if needSync {
		if err := v.Disk.Sync(); err != nil {
			return fail(&entries[len(entries)-1], err)
		}
	}
	return ack
}

// zeroLogged makes e's range read as zeroes (a discard, a write of
// zeroes, a resync's hole), its extent in the activity log while the disk
// changes, and records that the blocks have no known checksum.
func (v *Volume) zeroLogged(e *replication.Entry) error {
	if err := v.logApplied(e); err != nil {
		return err
	}
	err := v.Disk.Zero(e.Off, e.Length)
	if err == nil {
		err = v.written(e.Off, e.Length, nil, nil)
	}
	v.ActivityLog.Done(e.Off, e.Length)
	return err
}

// written records the checksums of a write applied to the disk
// (Checksums.Written), when the volume keeps them.
func (v *Volume) written(off, length int64, data []byte, sums []uint32) error {
	if v.Checksums == nil {
		return nil
	}
	if err := v.Checksums.Written(off, length, data, sums); err != nil {
		return fmt.Errorf("store the checksums: %w", err)
	}
	return nil
}

// logApplied readies a replicated write, or a resync's, the way the
// primary made it: the replica indicator and the write's activity log
// extents are on stable storage BEFORE the write is issued, which then
// ends with the activity log's Done. After a crash, those extents are
// what this node may have acknowledged and then lost with a volatile
// cache (a power loss), and they are resynced (metadata.MD.CrashedReplica);
// after a change of primary, they are what this node may hold and a
// third node not, and are resynced between them (volstate.MarkActivityLog).
func (v *Volume) logApplied(e *replication.Entry) error {
	if err := v.State.MarkReplica(); err != nil {
		return fmt.Errorf("set the replica indicator: %w", err)
	}
	if err := v.ActivityLog.Admit(context.Background(), e.Off, e.Length); err != nil {
		return fmt.Errorf("activity log: %w", err)
	}
	return nil
}
