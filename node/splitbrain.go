package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errSplitBrain: the peer is primary too.
var errSplitBrain = errors.New("split brain")

// splitBrainError carries what the other side said of itself.
type splitBrainError struct {
	reason string
	// rule is the generation rule that found it ("" when only the roles
	// did: both nodes primary in one epoch).
	rule string
	// peerPrimary: the other side is primary too (an after-sb policy can
	// make either side the victim only then).
	peerPrimary bool
	peer        replication.SplitBrainSide
}

func (e *splitBrainError) Error() string { return "split brain: " + e.reason }
func (e *splitBrainError) Unwrap() error { return errSplitBrain }

// refusedError: the generations forbid syncing either way (unrelated data,
// or newer data on a peer that cannot be copied); reason, when set, says
// why in full.
type refusedError struct{ rule, reason string }

func (e *refusedError) Error() string {
	if e.reason != "" {
		return "refused to sync: " + e.reason
	}
	return "refused to sync: " + e.rule
}

// splitBrainVictim applies the volume's after-split-brain policy.
func (v *Volume) splitBrainVictim(p *peer, them replication.SplitBrainSide) (replication.SplitBrainVictim, replication.AfterSplitBrain) {
	policy, _ := replication.ParseAfterSplitBrain(v.cfg.AfterSB)
	v.mu.Lock()
	me := replication.SplitBrainSide{Changes: p.bm.Bytes(), PrimarySince: v.primarySince}
	v.mu.Unlock()
	return replication.ResolveSplitBrain(policy, me, them), policy
}

// autoDiscard is the policy's resolution on the node it names: discard
// this node's changes, then have the other node connect.
func (v *Volume) autoDiscard(other string, policy replication.AfterSplitBrain) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bytes, err := v.discardMyData(ctx, true)
	if err != nil {
		v.log.Error("automatic split-brain resolution failed", "err", err)
		return
	}
	v.node.event(v.name, "split-brain-resolved", fmt.Sprintf("policy %s: %s discards its %d bytes of changes and resyncs from %s", policy, v.self, bytes, other))
	if api, err := v.node.peerAPI(other); err == nil {
		if _, err := api.Connect(ctx, &transport.ConnectRequest{Volume: v.name, Node: other}); err != nil {
			v.log.Warn("ask the other node to connect", "node", other, "err", err)
		}
	}
}

// adoptDisk makes this node's disk, which holds no consistent generation
// (its metadata was created afresh), the volume's data: DRBD's initial
// "primary --force". It starts a new generation; every peer then gets a
// full resync from this node.
func (v *Volume) adoptDisk() error {
	v.stopPeers()
	v.detachIncoming()
	v.genMu.Lock()
	defer v.genMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen, v.syncGen = replication.NewGeneration(), replication.Generation{}
	v.localMissing.ClearRange(0, v.size)
	if err := v.takeOverLocked(); err != nil {
		return err
	}
	v.log.Warn("disk adopted as the volume's data", "epoch", v.epoch, "generation", v.gen)
	v.node.event(v.name, "forced-primary", fmt.Sprintf("%s made its disk the data of %s (new generation %s, epoch %d): the other nodes get a full resync", v.self, v.name, v.gen, v.epoch))
	return nil
}

// takeOverLocked makes this node primary, at a new epoch unless it is
// primary already, with every peer counted in sync until a write misses
// it, and starts serving. The primary indicator and the epoch are durable
// BEFORE the first write. Callers hold v.genMu and v.mu.
func (v *Volume) takeOverLocked() error {
	if err := v.md.SetPrimary(true); err != nil {
		return err
	}
	clear(v.bitmapGens)
	if v.role != replication.Primary {
		v.epoch++
		v.primary, v.role = v.self, replication.Primary
		v.primarySince = time.Now().UnixNano()
	}
	v.discard = nil
	if err := v.persistLocked(false); err != nil {
		return err
	}
	v.diskState = replication.UpToDate
	v.reason, v.fenced = "", false
	v.resetPeersLocked()
	v.ioOpen = true
	return nil
}

// discardInfo is what a node that discards its data hands its next
// primary: its changes since the split, to be overwritten.
type discardInfo struct {
	from replication.Generation
	runs [][2]int64
}

// forcePromote makes this node primary without a handover (the old
// primary is gone), at a new epoch. Its first write that a peer does not
// see starts a new generation, and the blocks it writes from then on are
// tracked against the one it held. So an old primary that comes back
// without writes of its own catches up by bitmap; one that wrote while
// this node has not is followed: it steps down and this node copies its
// writes (no acknowledged write is lost); if both wrote, that is a split
// brain, detected and not synced.
func (v *Volume) forcePromote() error {
	v.mu.Lock()
	if !v.syncGen.IsZero() {
		defer v.mu.Unlock()
		return fmt.Errorf("%s on %s is in the middle of a resync (disk %s): its data is part old, part new; it cannot be promoted, even by force", v.name, v.self, v.diskState)
	}
	empty := v.gen.IsZero()
	if v.role == replication.Primary && !empty {
		v.mu.Unlock()
		return nil
	}
	v.mu.Unlock()
	if empty {
		return v.adoptDisk()
	}
	v.detachIncoming()
	v.genMu.Lock()
	defer v.genMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, id := range v.node.peerIDs(v.cfg) {
		if bm, ok := v.md.Bitmap(id); ok {
			bm.ClearBits(0, v.size)
		}
	}
	// The generation moves on at the first write no peer sees (as after
	// any promotion): until then this node holds exactly the data it had,
	// and an old primary that comes back with writes of its own is
	// followed, not split from.
	if err := v.takeOverLocked(); err != nil {
		return err
	}
	v.log.Warn("forced to primary", "epoch", v.epoch, "generation", v.gen)
	v.node.event(v.name, "forced-primary", fmt.Sprintf("%s forced to primary at epoch %d with generation %s", v.self, v.epoch, v.gen))
	return nil
}

// discardMyData is the operator's resolution of a split brain on the
// victim: it reports the bytes this node changed since the split and, with
// yes, stops serving, becomes Secondary, and waits for the other node to
// connect and overwrite those blocks (and what it changed itself).
func (v *Volume) discardMyData(ctx context.Context, yes bool) (int64, error) {
	v.mu.Lock()
	var bytes int64
	var runs [][2]int64
	var from replication.Generation
	for _, p := range v.peers {
		if g, ok := v.bitmapGens[p.name]; ok && p.bm.Bytes() >= bytes {
			bytes, from, runs = p.bm.Bytes(), g, bitmapRuns(p.bm)
		}
	}
	role := v.role
	v.mu.Unlock()
	if role != replication.Primary {
		return 0, status.Errorf(codes.FailedPrecondition, "%s is Secondary on %s: nothing of its own to discard; use replctl connect", v.name, v.self)
	}
	if from.IsZero() {
		// No write since the split: its data is still the generation it
		// held, which the other node tracks its changes from.
		v.mu.Lock()
		from = v.gen
		v.mu.Unlock()
		if from.IsZero() {
			return 0, status.Errorf(codes.FailedPrecondition, "%s on %s holds no consistent data: use replctl resync from the other node", v.name, v.self)
		}
	}
	if !yes {
		return bytes, nil
	}
	// Stop serving: requests in flight are answered first.
	v.mu.Lock()
	v.ioOpen = false
	v.mu.Unlock()
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	v.node.nbd.CloseExportContext(closeCtx, v.name)
	cancel()
	v.io.Wait()
	v.stopPeers()
	if err := v.md.FlushBitmaps(); err != nil {
		return 0, err
	}
	v.mu.Lock()
	v.role, v.primary, v.fenced = replication.Secondary, "", false
	v.discard = &discardInfo{from: from, runs: runs}
	v.diskState = v.idleDiskState()
	v.reason = fmt.Sprintf("discarding its %d bytes of changes: waiting for the primary to overwrite them", bytes)
	err := v.persistLocked(false)
	v.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := v.md.SetPrimary(false); err != nil {
		return 0, err
	}
	v.log.Warn("discarding my data", "bytes", bytes)
	v.node.event(v.name, "discard-my-data", fmt.Sprintf("%s gives up %d bytes of changes made since the split brain", v.self, bytes))
	return bytes, nil
}

// resumePeers restarts senders that stopped (split brain) on a primary.
// A sender that is just stopping is waited for, then restarted.
func (v *Volume) resumePeers() {
	v.mu.Lock()
	if v.role != replication.Primary || v.adminDown || v.peersCtx == nil {
		v.mu.Unlock()
		return
	}
	peers := make([]*peer, 0, len(v.peers))
	for _, p := range v.peers {
		p.resumeSeq.Add(1)
		peers = append(peers, p)
	}
	ctx := v.peersCtxValue
	v.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		stopping := p.state == replication.StandAlone
		p.mu.Unlock()
		if stopping {
			p.wait()
		}
		if !p.running.Load() && ctx.Err() == nil {
			p.start(ctx)
		}
	}
}

// resolveSplitBrain runs connect --discard-my-data on the victim, then has
// every other node of the volume try again.
func (c *control) resolveSplitBrain(ctx context.Context, v *Volume, yes bool) (*transport.ConnectReply, error) {
	bytes, err := v.discardMyData(ctx, yes)
	if err != nil {
		return nil, grpcError(err)
	}
	reply := &transport.ConnectReply{Node: c.n.name, DiscardBytes: bytes, Done: yes}
	if !yes {
		reply.Replication = v.status().Replication
		return reply, nil
	}
	for name := range v.cfg.Disks {
		if name == c.n.name {
			continue
		}
		if api, err := c.n.peerAPI(name); err == nil {
			api.Connect(ctx, &transport.ConnectRequest{Volume: v.name, Node: name})
		}
	}
	reply.Replication = v.status().Replication
	return reply, nil
}
