package node

import (
	"context"
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
)

// stopPeers cancels the senders and waits for them, without v.mu held
// (the senders take it).
func (v *Volume) stopPeers() {
	v.mu.Lock()
	cancel := v.peersCtx
	v.peersCtx = nil
	peers := make([]*peer, 0, len(v.peers))
	for _, p := range v.peers {
		peers = append(peers, p)
	}
	v.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, p := range peers {
		p.wait()
	}
}

// demote hands the primary role over to node to: IO stops (requests in
// flight are answered), everything is flushed on every replica, and to
// must be connected and in sync. Only then does this node become
// Secondary, durably. On any failure it goes on serving as primary.
func (v *Volume) demote(ctx context.Context, to string, timeout time.Duration) (uint64, replication.Generation, error) {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	v.mu.Lock()
	if v.role != replication.Primary {
		v.mu.Unlock()
		return 0, replication.Generation{}, fmt.Errorf("%s is not primary on %s", v.name, v.self)
	}
	p, ok := v.peers[to]
	v.mu.Unlock()
	if !ok {
		return 0, replication.Generation{}, fmt.Errorf("%s has no replica of %s", to, v.name)
	}
	inSync := func() bool {
		st := p.status()
		return st.Replication == string(replication.Connected) && st.OutOfSyncBytes == 0 && st.PeerDisk == string(replication.UpToDate)
	}
	// Wait for a resync under way before stopping IO.
	if !waitFor(ctx, timeout, inSync) {
		st := p.status()
		return 0, replication.Generation{}, fmt.Errorf("%s is not in sync with %s (replication %s, disk %s, %d bytes out of sync%s)",
			to, v.self, st.Replication, st.PeerDisk, st.OutOfSyncBytes, reasonSuffix(st.Reason))
	}
	v.mu.Lock()
	v.ioOpen = false
	v.mu.Unlock()
	v.node.nbd.CloseExport(v.name)
	v.io.Wait()
	reopen := func(err error) (uint64, replication.Generation, error) {
		v.mu.Lock()
		v.ioOpen = true
		v.mu.Unlock()
		return 0, replication.Generation{}, err
	}
	if err := v.flushAll(); err != nil {
		return reopen(err)
	}
	if !waitFor(ctx, 5*time.Second, inSync) {
		return reopen(fmt.Errorf("%s fell out of sync during the handover", to))
	}
	v.genMu.Lock()
	v.mu.Lock()
	gen, epoch := v.gen, v.epoch
	// Until the new primary's stream arrives, point NBD clients at it.
	v.role, v.primary, v.fenced = replication.Secondary, to, false
	if err := v.persistLocked(false); err != nil {
		v.role, v.primary = replication.Primary, v.self
		v.mu.Unlock()
		v.genMu.Unlock()
		return reopen(err)
	}
	v.diskState = v.idleDiskState()
	v.mu.Unlock()
	v.genMu.Unlock()
	v.stopPeers()
	// Every write is done and on both disks: no activity log to apply if
	// this node crashes from here on.
	if err := v.md.FlushBitmaps(); err == nil {
		if err := v.md.SetPrimary(false); err != nil {
			v.log.Error("clear the primary indicator", "err", err)
		}
	}
	v.log.Info("demoted", "to", to, "epoch", epoch)
	v.node.event(v.name, "demoted", fmt.Sprintf("%s handed %s over to %s at epoch %d", v.self, v.name, to, epoch))
	return epoch, gen, nil
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// promote makes this node primary at epoch. It must hold exactly the
// data the old primary handed over (gen); the epoch is durable BEFORE the
// first write is accepted.
func (v *Volume) promote(epoch uint64, gen replication.Generation) error {
	v.mu.Lock()
	if v.role == replication.Primary {
		defer v.mu.Unlock()
		if v.epoch == epoch && v.gen == gen {
			return nil
		}
		return fmt.Errorf("%s is already primary on %s at epoch %d", v.name, v.self, v.epoch)
	}
	if v.gen != gen || gen.IsZero() {
		defer v.mu.Unlock()
		return fmt.Errorf("%s on %s holds generation %s, the primary handed over %s: this copy is not up to date, refusing to promote it", v.name, v.self, v.gen, gen)
	}
	if epoch <= v.epoch {
		defer v.mu.Unlock()
		return fmt.Errorf("stale epoch %d: %s has seen epoch %d", epoch, v.self, v.epoch)
	}
	v.mu.Unlock()
	v.detachIncoming()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gen != gen {
		return fmt.Errorf("%s on %s changed generation during promotion", v.name, v.self)
	}
	// Bitmaps of an earlier term mean nothing now: this node held every
	// write, so it starts with every peer in sync.
	for _, id := range v.node.peerIDs(v.cfg) {
		if bm, ok := v.md.Bitmap(id); ok {
			bm.ClearBits(0, v.size)
		}
	}
	clear(v.bitmapGens)
	// The primary indicator and the epoch are durable BEFORE the first write.
	if err := v.md.SetPrimary(true); err != nil {
		return err
	}
	oldEpoch, oldPrimary := v.epoch, v.primary
	v.epoch, v.primary, v.role = epoch, v.self, replication.Primary
	v.primarySince = time.Now().UnixNano()
	if err := v.persistLocked(false); err != nil {
		v.epoch, v.primary, v.role = oldEpoch, oldPrimary, replication.Secondary
		return err
	}
	v.diskState = replication.UpToDate
	v.reason, v.fenced = "", false
	v.resetPeersLocked()
	v.ioOpen = true
	v.log.Info("promoted", "epoch", epoch)
	v.node.event(v.name, "promoted", fmt.Sprintf("%s is primary for %s at epoch %d", v.self, v.name, epoch))
	return nil
}

// setAdminDown disconnects (down) or reconnects this node's replication of
// the volume, as the operator asked.
func (v *Volume) setAdminDown(down bool) {
	v.mu.Lock()
	if v.adminDown == down {
		v.mu.Unlock()
		return
	}
	v.adminDown = down
	role := v.role
	if down {
		v.reason = "disconnected by operator"
	} else {
		v.reason = ""
	}
	if role == replication.Primary && !down {
		v.startPeersLocked()
	}
	v.mu.Unlock()
	if down {
		if role == replication.Primary {
			v.stopPeers()
			for _, p := range v.streamingPeers() {
				p.mu.Lock()
				p.reason = "disconnected by operator"
				p.mu.Unlock()
			}
		} else {
			v.detachIncoming()
		}
	}
	what := "connected"
	if down {
		what = "disconnected"
	}
	v.node.event(v.name, what, fmt.Sprintf("%s %s by the operator", v.self, what))
}

// resetPeersLocked gives a new primary fresh senders for every peer,
// started unless the operator disconnected this node (then they only
// track what the peers miss).
func (v *Volume) resetPeersLocked() {
	v.peers = map[string]*peer{}
	for name := range v.cfg.Disks {
		if name != v.self {
			v.peers[name] = newPeer(v, name)
		}
	}
	v.rebuildPeerListLocked()
	if !v.adminDown {
		v.startPeersLocked()
	}
}
