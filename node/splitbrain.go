package node

import (
	"context"
	"fmt"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// splitBrainVictim applies the volume's after-split-brain policy.
func (v *Volume) splitBrainVictim(p *peer, them replication.SplitBrainSide) (replication.SplitBrainVictim, replication.AfterSplitBrain) {
	policy, _ := replication.ParseAfterSplitBrain(v.cfg.AfterSB)
	v.mu.Lock()
	me := replication.SplitBrainSide{Changes: p.bm.Bytes(), PrimarySince: v.d.primarySince}
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
	v.node.event(v.name, "split-brain-resolved", fmt.Sprintf("policy %s: %s discards its %s of changes and resyncs from %s", policy, v.self, human.Bytes(bytes), other))
	if api, err := v.node.peerAPI(other); err == nil {
		ctx := v.node.onBehalfOfPolicy(ctx, "the split-brain policy (after_sb)")
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
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	next := replication.NewGeneration()
	if err := v.takeOver(func(d *durable) {
		d.gens, d.syncGen = d.gens.Adopted(next), replication.Generation{}
	}); err != nil {
		return err
	}
	v.localMissing.ClearRange(0, v.size.Load())
	epoch := v.epoch()
	v.log.Warn("disk adopted as the volume's data", "epoch", epoch, "generation", next)
	v.node.event(v.name, "forced-primary", fmt.Sprintf("%s made its disk the data of %s (new generation %s, epoch %d): the other nodes get a full resync", v.self, v.name, next, epoch))
	return nil
}

// takeOver makes this node primary at a new epoch, above every epoch it
// heard of, with every peer counted in sync until a write misses it, and
// starts serving; change, when not nil, is committed with it. The primary
// indicator and the epoch are durable BEFORE the first write. Callers hold
// v.stateMu.
func (v *Volume) takeOver(change func(*durable)) error {
	if err := v.md.SetPrimary(true); err != nil {
		return err
	}
	v.mu.Lock()
	epoch := max(v.d.epoch, v.knownEpoch) + 1
	wasPrimary, auth := v.role == replication.Primary, v.auth
	v.mu.Unlock()
	if auth {
		// Forced without a quorum (with one, raft promotes): an epoch
		// above raft's too; it serves without a lease until raft records it.
		if va, ok := v.node.cl.c.Authority().Volume(v.name); ok {
			epoch = max(epoch, va.Epoch+1)
		}
	}
	err := v.commit(func(d *durable) {
		if change != nil {
			change(d)
		}
		d.epoch, d.primary = epoch, v.self
		if !wasPrimary {
			d.primarySince = time.Now().UnixNano()
		}
		d.gens = d.gens.Promoted()
	}, func() {
		v.discard = nil
		serving := volstate.Open
		if auth {
			serving = volstate.OpenWithoutLease
		}
		v.becomePrimaryLocked(serving)
	})
	if err == nil {
		v.runHook("on_promote", epoch)
	}
	return err
}

// discardInfo is what a node that discards its data hands its next
// primary: its changes since the split, to be overwritten.
type discardInfo struct {
	from replication.Generation
	runs [][2]int64
}

// forcePromote makes this node primary without a handover (the old
// primary is gone, or this node restarted as primary and no peer answers),
// at a new epoch. Its first write that a peer does not see starts a new
// generation, and the blocks it writes from then on are tracked against
// the one it held. So an old primary that comes back without writes of its
// own catches up by bitmap; one that wrote while this node has not is
// followed: it steps down and this node copies its writes (no acknowledged
// write is lost); if both wrote, that is a split brain, detected and not
// synced.
func (v *Volume) forcePromote() error {
	v.mu.Lock()
	if !v.d.syncGen.IsZero() {
		defer v.mu.Unlock()
		return fmt.Errorf("%s on %s is in the middle of a resync (disk %s): its data is part old, part new; it cannot be promoted, even by force", v.name, v.self, v.diskState)
	}
	empty := v.d.gens.Current.IsZero()
	serving := v.role == replication.Primary && v.serving.IsOpen()
	from := v.d.primary
	v.mu.Unlock()
	if serving && !empty {
		return nil
	}
	if empty {
		return v.adoptDisk()
	}
	v.stopPeers()
	v.detachIncoming()
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	v.clearPeerBitmaps()
	// The generation moves on at the first write no peer sees (as after
	// any promotion): until then this node holds exactly the data it had,
	// and an old primary that comes back with writes of its own is
	// followed, not split from.
	if err := v.takeOver(nil); err != nil {
		return err
	}
	v.mu.Lock()
	epoch, gen := v.d.epoch, v.d.gens.Current
	if from != "" && from != v.self {
		v.forcedOver = &transport.Failover{From: from, To: v.self, Epoch: epoch, At: time.Now().UTC(),
			Reason: "forced by the operator (replctl primary --force)", Forced: true}
	}
	v.mu.Unlock()
	v.log.Warn("forced to primary", "epoch", epoch, "generation", gen)
	v.node.event(v.name, "forced-primary", fmt.Sprintf("%s forced to primary at epoch %d with generation %s", v.self, epoch, gen))
	return nil
}

// discardMyData is the operator's resolution of a split brain on the
// victim: it reports the bytes this node changed since the split and, with
// yes, stops serving if it is primary, and waits as a Secondary for the
// other node to connect and overwrite those blocks (and what it changed
// itself). The victim may already be a Secondary: under raft an old
// primary steps down as soon as it learns of the newer one, split brain or
// not. It is refused unless this node is in a split brain, and never
// applies to a primary that streams to a peer: that would throw away good
// data and leave the volume without a primary.
func (v *Volume) discardMyData(ctx context.Context, yes bool) (int64, error) {
	if !v.inSplitBrain() {
		return 0, status.Errorf(codes.FailedPrecondition, "%v: %s on %s is not in a split brain with any peer: --discard-my-data only resolves one (it throws this node's changes away); nothing changed. See replctl status", ErrNotSplitBrain, v.name, v.self)
	}
	for _, p := range v.streamingPeers() {
		if p.session() != nil {
			return 0, status.Errorf(codes.FailedPrecondition, "%v: %s is primary of %s and streams to %s: it is not the victim of a split brain; nothing changed", ErrNotSplitBrain, v.self, v.name, p.name)
		}
	}
	// What this node changed since the split is what its bitmap toward
	// the other side marks (the largest, with three or more replicas).
	v.mu.Lock()
	var bytes int64
	var runs [][2]int64
	var from replication.Generation
	for name := range v.cfg.Disks {
		g, ok := v.d.gens.Bitmaps[name]
		bm, held := v.md.Bitmap(v.node.config().NodeID(name))
		if name != v.self && ok && held && bm.Bytes() >= bytes {
			bytes, from, runs = bm.Bytes(), g, bitmapRuns(bm)
		}
	}
	role := v.role
	v.mu.Unlock()
	if from.IsZero() {
		// No write since the split: its data is still the generation it
		// held, which the other node tracks its changes from.
		from = v.currentGeneration()
		if from.IsZero() {
			return 0, status.Errorf(codes.FailedPrecondition, "%s on %s holds no consistent data: use replctl resync from the other node", v.name, v.self)
		}
	}
	if !yes {
		return bytes, nil
	}
	if role == replication.Primary {
		// Stop serving: requests in flight are answered first.
		v.mu.Lock()
		v.serving = volstate.Stopped
		v.mu.Unlock()
		closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v.node.nbd.CloseExportContext(closeCtx, v.name)
		cancel()
		v.io.Wait()
		v.stopPeers()
	}
	if err := v.md.FlushBitmaps(); err != nil {
		return 0, err
	}
	v.stateMu.Lock()
	err := v.commit(func(d *durable) { d.primary = "" }, func() {
		v.serving = volstate.Stopped
		v.discard = &discardInfo{from: from, runs: runs}
		v.diskState = v.idleDiskState()
		v.why = because(CauseDiscarding, "discarding its %s of changes: waiting for the primary to overwrite them", human.Bytes(bytes))
	})
	v.stateMu.Unlock()
	if err != nil {
		return 0, err
	}
	if role == replication.Primary {
		if err := v.md.SetPrimary(false); err != nil {
			return 0, err
		}
		v.runHook("on_demote", v.epoch())
	}
	v.log.Warn("discarding my data", "bytes", bytes)
	v.node.event(v.name, "discard-my-data", fmt.Sprintf("%s gives up %s of changes made since the split brain", v.self, human.Bytes(bytes)))
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
