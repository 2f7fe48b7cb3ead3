package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/replvol/replvol/node/applier/apply"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// A secondary applies what its primary ships through the applier that
// ships (node/applier/apply's Stream.Apply), as node's applier.Run does
// for each frame: the sim hands it the batch of a message and answers
// with its ack. Only the seams are the sim's: its disk (the volatile
// cache, FLUSH and FUA, a failing disk) as apply.Disk, its activity log
// as apply.ActivityLog, its checksums as apply.Checksums, and its
// volstate-driven node as apply.State, each doing what node's
// implementation does (appliedDisk, the metadata's ActivityLog,
// integrity.go's applier checksums, secondary.go's appliedState).
//
// A block of the sim's disk is blockBytes bytes on the applier's side:
// the little-endian value it holds (a write's number), in its first 8
// bytes.

// blockBytes is the size of a block as the applier sees it: a block of
// the replication rules (replication.BlockSize), so that an entry's
// extent is what the peer session counts in its cached set and marks in
// a peer's bitmap, a block for a block.
const blockBytes = replication.BlockSize

// errDiskFailed is the sim's disk failing an I/O (while it fails:
// disk.failUntil).
var errDiskFailed = errors.New("simulated disk error")

// errLogFull: the activity log holds no extent a write in flight does
// not; node's Admit would wait, the sim's applier fails the entry (the
// stream ends, as after a failed write).
var errLogFull = errors.New("activity log full of writes in flight")

// blocksOf returns the blocks of [off, off+length); it panics on a range
// that is not whole blocks, which the sim never ships.
func blocksOf(off, length int64) (first, n int) {
	if off%blockBytes != 0 || length%blockBytes != 0 {
		panic(fmt.Sprintf("sim: range %d+%d is not whole blocks", off, length))
	}
	return int(off / blockBytes), int(length / blockBytes)
}

// appliedDisk is n's disk as the applier writes it (apply.Disk).
type appliedDisk struct {
	s *Sim
	n *node
}

func (d appliedDisk) ReadAt(p []byte, off int64) (int, error) {
	first, count := blocksOf(off, int64(len(p)))
	for i := range count {
		binary.LittleEndian.PutUint64(p[i*blockBytes:], uint64(d.n.disk.read(first+i)))
	}
	return len(p), nil
}

// WriteAt writes to the cache, recording each block as changed between
// n and its peers (invariant 4), as the sim's writes do (diskWrite).
func (d appliedDisk) WriteAt(p []byte, off int64) (int, error) {
	first, count := blocksOf(off, int64(len(p)))
	for i := range count {
		d.s.touch(d.n, first+i)
		if !d.n.disk.write(first+i, int64(binary.LittleEndian.Uint64(p[i*blockBytes:])), d.s.now) {
			return i * blockBytes, errDiskFailed
		}
	}
	return len(p), nil
}

// WriteSync writes through the cache (FUA): durable BEFORE it returns.
func (d appliedDisk) WriteSync(p []byte, off int64) error {
	first, count := blocksOf(off, int64(len(p)))
	for i := range count {
		if !d.s.diskWrite(d.n, first+i, int64(binary.LittleEndian.Uint64(p[i*blockBytes:])), true) {
			return errDiskFailed
		}
	}
	return nil
}

func (d appliedDisk) Sync() error {
	if !d.n.disk.flush(d.s.now) {
		return errDiskFailed
	}
	return nil
}

func (d appliedDisk) Zero(off, length int64) error {
	_, err := d.WriteAt(make([]byte, length), off)
	return err
}

func (d appliedDisk) IsHole(off, length int64) bool { return false }

// appliedLog is n's activity log as the applier admits to it
// (apply.ActivityLog): alAdmit, and the block held in flight (al) until
// Done.
type appliedLog struct {
	s *Sim
	n *node
}

func (l appliedLog) Admit(_ context.Context, off, length int64) error {
	first, count := blocksOf(off, length)
	for b := first; b < first+count; b++ {
		ok, full := l.s.alAdmit(l.n, b)
		switch {
		case full:
			return errLogFull
		case !ok:
			return errDiskFailed
		}
		l.n.al[b]++
	}
	return nil
}

func (l appliedLog) Done(off, length int64) {
	first, count := blocksOf(off, length)
	for b := first; b < first+count; b++ {
		if l.n.al[b]--; l.n.al[b] <= 0 {
			delete(l.n.al, b)
		}
	}
}

// appliedSums is n's checksums as the applier keeps them
// (apply.Checksums): a block's sum is the value it holds.
type appliedSums struct{ n *node }

// Written stores each block's sum in memory, no page written (FUA or
// not): durable at the primary's next FLUSH.
func (c appliedSums) Written(off, length int64, data []byte, _ []uint32) error {
	first, count := blocksOf(off, length)
	for i := range count {
		v := int64(noSum)
		if data != nil {
			v = int64(binary.LittleEndian.Uint64(data[i*blockBytes:]))
		}
		c.n.sums.set(first+i, v)
	}
	return nil
}

// Sync syncs the disk, THEN writes the checksum pages (syncWithSums).
func (c appliedSums) Sync(syncData func() error) error {
	if err := syncData(); err != nil {
		return err
	}
	c.n.sums.flushAll()
	return nil
}

func (c appliedSums) Listed(off, length int64) bool { return false }

func (c appliedSums) Check(off int64, data []byte) error {
	first, count := blocksOf(off, int64(len(data)))
	for i := range count {
		if sum, v := c.n.sums.get(first+i), int64(binary.LittleEndian.Uint64(data[i*blockBytes:])); sum != noSum && sum != v {
			return fmt.Errorf("block %d holds %d, its checksum describes %d", first+i, v, sum)
		}
	}
	return nil
}

// Verify: the sim ships no sums with its entries.
func (c appliedSums) Verify(off int64, data []byte, sums []uint32) error { return nil }

// Lost: the sim sends no OpResyncLost.
func (c appliedSums) Lost(off, length int64) error { return nil }

// appliedState is n's volume as the applier reaches it (apply.State), as
// node's appliedState steps it.
type appliedState struct {
	s *Sim
	n *node
}

func (st appliedState) MarkReplica() error {
	st.n.sums.replica = true
	return nil
}

// SyncStarted: Inconsistent, durably, with the generation the resync
// resumes from, BEFORE any resync data is written.
func (st appliedState) SyncStarted(from replication.Generation) error {
	if err := st.s.stateWrite(st.n, false); err != nil {
		return err
	}
	if st.s.cfg.mutation == mutResyncResumesFromNothing {
		from = replication.Generation{}
	}
	return st.s.drive(st.n, volstate.ResyncStarted{Peer: st.n.st.Durable.Primary, From: from})
}

// SyncFinished: the disk holds the primary's generation; what this node
// marked toward the primary is in.
func (st appliedState) SyncFinished(primary string, g replication.Generation, history []replication.Generation) error {
	if err := st.s.stateWrite(st.n, true); err != nil {
		return err
	}
	if err := st.s.drive(st.n, volstate.ResyncFinished{Peer: primary, AsTarget: true, Current: g, History: history}); err != nil {
		return err
	}
	clear(st.n.marks[primary])
	st.s.check.syncFinished(st.n)
	return nil
}

func (st appliedState) Failed(err error) {
	st.s.tracef("%s: a replicated entry failed: %v", st.n.name, err)
	_ = st.s.drive(st.n, volstate.ReplicaWriteFailed{})
}

// stateWrite is the write of n's volume state to its metadata that
// State.SyncStarted and SyncFinished make (node's drives). The
// metadata is on the data disk: the write fails while the disk fails.
// A sync end's write comes right after the data's sync succeeded, which
// a failing disk fails first, so it also fails now and then alone
// (afterSync, pStateWriteFails: an EIO of the metadata's sectors): a
// sync-done the volume refuses to record is a case the sim reaches. Those
// draws come from the Sim's second source (stateRng), so that a seed's
// run is the same as without them until one fails.
func (s *Sim) stateWrite(n *node, afterSync bool) error {
	if s.now.Before(n.disk.failUntil) {
		return errDiskFailed
	}
	if afterSync && s.stateRng.Float64() < pStateWriteFails {
		s.tracef("%s: the write of its volume state to the metadata fails", n.name)
		return errDiskFailed
	}
	return nil
}

// appliedVolume is n's volume as the applier writes a stream to it (node's
// Volume.applied), made once per node.
func (s *Sim) appliedVolume(n *node) *apply.Volume {
	if n.applied == nil {
		size := new(atomic.Int64)
		size.Store(blocks * blockBytes)
		n.applied = &apply.Volume{
			Name: volume, Self: n.name,
			Disk: appliedDisk{s, n}, ActivityLog: appliedLog{s, n},
			Size: size, Resynced: new(atomic.Int64),
			Buffers: &sync.Pool{New: func() any { b := make([]byte, blockBytes); return &b }},
			Log:     slog.New(slog.DiscardHandler),
			State:   appliedState{s, n}, Checksums: appliedSums{n},
		}
	}
	return n.applied
}

// applyBatch has n's applier take entry e of the stream of m (a batch of
// its own): the stream of its session (one per incoming stream, as node
// makes one per stream it takes). A batch that failed ends the stream,
// as applier.Run returns then.
func (s *Sim) applyBatch(n *node, m msg, e replication.Entry) bool {
	if n.in == nil || n.inSession != m.session {
		n.in, n.inSession = apply.NewStream(m.from), m.session
		n.in.SetState(replication.Connected)
	}
	s.oneEntry[0] = e
	ack, err := n.in.Apply(s.appliedVolume(n), apply.Batch{Entries: s.oneEntry[:]})
	s.oneEntry[0] = replication.Entry{}
	if err == nil && ack.Status == replication.AckOK {
		return true
	}
	if err == nil {
		err = errors.New(ack.Message)
	}
	s.tracef("%s: entry (op %d) from %s failed, connection dropped: %v", n.name, e.Op, m.from, err)
	s.breakConnection(s.node(m.from), n)
	return false
}
