package node

import (
	"context"
	"sync/atomic"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// Read balancing (volumes[].read_balancing, replication.ReadPicker): a
// read may go to an UpToDate peer instead of the local disk, as a mirror
// reads both halves. A peer is a candidate only when it is connected and
// UpToDate, no block of the read is marked out of sync for it, and it
// holds every write acknowledged to clients (no lag: under protocols A and
// B a completed write may not be there yet). Writes in flight to the range
// hold its range lock, which the read waits for.

// readBalancer is a volume's picker and the pending counts it weighs.
type readBalancer struct {
	mu     mutex
	picker replication.ReadPicker
	// local counts reads in flight on the local disk.
	local atomic.Int64
}

// readTarget picks where a read of [off, off+length) goes: nil for the
// local disk, else a peer.
func (v *Volume) readTarget(off, length int64) *peer {
	policy := v.settings().reads
	if policy == replication.ReadPreferLocal {
		return nil
	}
	v.mu.Lock()
	local := replication.LocalReadView{Disk: v.st.Disk, Detached: v.detachedLocked(), Pending: int(v.iopath.rb.local.Load()), Congested: v.busy()}
	v.mu.Unlock()
	peers := v.streamingPeers()
	views := make([]replication.PeerReadView, len(peers))
	for i, p := range peers {
		pv := p.snapshot()
		views[i] = replication.PeerReadView{
			Repl: pv.state, Disk: replication.DiskState(pv.peerDisk), Pending: int(p.pendingReads.Load()),
			Congested: pv.sess != nil && pv.sess.Congested(),
		}
		lag, _ := p.lagOf(v.clock.Now())
		views[i].InSync = lag == 0 && !anySet(p.bm, off, length)
	}
	v.iopath.rb.mu.Lock()
	v.iopath.rb.picker.Policy = policy
	i, ok := v.iopath.rb.picker.Pick(local, views)
	v.iopath.rb.mu.Unlock()
	if !ok || i == replication.ReadLocal {
		return nil
	}
	return peers[i]
}

// readLocal reads from the local disk, counted for least-pending.
func (v *Volume) readLocal(p []byte, off int64) error {
	v.iopath.rb.local.Add(1)
	defer v.iopath.rb.local.Add(-1)
	_, err := v.disk.ReadAt(p, off)
	return err
}

// readRemote reads through peer pr, counted for least-pending.
func (pr *peer) readRemote(ctx context.Context, p []byte, off int64) error {
	pr.pendingReads.Add(1)
	defer pr.pendingReads.Add(-1)
	return pr.read(ctx, p, off)
}

// anySet reports whether bm marks a block of [off, off+length).
func anySet(bm *metadata.PeerBitmap, off, length int64) bool {
	first := off / replication.BlockSize
	last := (off + length - 1) / replication.BlockSize
	start, _, ok := bm.NextRun(first, 1)
	return ok && start <= last
}
