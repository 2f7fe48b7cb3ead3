package node

import (
	"context"
	"errors"
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
	me := replication.SplitBrainSide{Changes: p.bm.Bytes(), PrimarySince: unixNano(v.st.Durable.PrimarySince)}
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
		ctx := v.node.gate.OnBehalfOfPolicy(ctx, "the split-brain policy (after_sb)")
		if _, err := api.Connect(ctx, &transport.ConnectRequest{Volume: v.name, Node: other}); err != nil {
			v.log.Warn("ask the other node to connect", "node", other, "err", err)
		}
	}
}

// discardInfo is what a node that discards its data hands its next
// primary: its changes since the split, to be overwritten.
type discardInfo struct {
	from replication.Generation
	runs [][2]int64
}

// forcePromote makes this node primary without a handover (the old
// primary is gone, or this node restarted as primary and no peer answers),
// at a new epoch above every epoch it heard of (and raft's, when raft
// answers without a quorum: it then serves without a lease until raft
// records it). Its first write that a peer does not see starts a new
// generation, and the blocks it writes from then on are tracked against
// the one it held. So an old primary that comes back without writes of its
// own catches up by bitmap; one that wrote while this node has not is
// followed: it steps down and this node copies its writes (no acknowledged
// write is lost); if both wrote, that is a split brain, detected and not
// synced. A disk that holds no consistent generation (its metadata was
// created afresh) is made the volume's data: DRBD's initial "primary
// --force", a new generation, and a full resync of every peer.
func (v *Volume) forcePromote() error {
	v.handedOver.Store(false)
	v.mu.Lock()
	empty, from, disk := v.st.Durable.Gens.Current.IsZero(), v.st.Durable.Primary, v.st.Disk
	v.mu.Unlock()
	e := volstate.Force{Now: v.clock.Now(), NewGen: replication.NewGeneration()}
	if v.st.Auth {
		if va, ok := v.node.cl.c.Authority().Volume(v.name); ok {
			e.AuthorityEpoch = va.Epoch
		}
	}
	err := v.drive(e, driveOptions{notify: func(a volstate.Action) {
		if empty {
			v.log.Warn("disk adopted as the volume's data", "epoch", a.Epoch, "generation", e.NewGen)
			v.node.event(v.name, "forced-primary", fmt.Sprintf("%s made its disk the data of %s (new generation %s, epoch %d): the other nodes get a full resync", v.self, v.name, e.NewGen, a.Epoch))
			return
		}
		v.mu.Lock()
		gen := v.st.Durable.Gens.Current
		if from != "" && from != v.self {
			v.forcedOver = &transport.Failover{From: from, To: v.self, Epoch: a.Epoch, At: v.clock.Now().UTC(),
				Reason: "forced by the operator (replctl primary --force)", Forced: true}
		}
		v.mu.Unlock()
		v.log.Warn("forced to primary", "epoch", a.Epoch, "generation", gen)
		v.node.event(v.name, "forced-primary", fmt.Sprintf("%s forced to primary at epoch %d with generation %s", v.self, a.Epoch, gen))
	}})
	if errors.Is(err, volstate.ErrMidResync) {
		return fmt.Errorf("%s on %s is in the middle of a resync (disk %s): its data is part old, part new; it cannot be promoted, even by force", v.name, v.self, disk)
	}
	return err
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
	// The machine's rule refuses it (also when asked only for the bytes).
	if err := v.discardRefused(volstate.DiscardMyData{}); err != nil {
		return 0, err
	}
	// What this node changed since the split is what its bitmap toward
	// the other side marks (the largest, with three or more replicas).
	v.mu.Lock()
	var bytes int64
	var runs [][2]int64
	var from replication.Generation
	for name := range v.cfg.Disks {
		g, ok := v.st.Durable.Gens.Bitmaps[name]
		bm, held := v.durable.md.Bitmap(v.node.config().NodeID(name))
		if name != v.self && ok && held && bm.Bytes() >= bytes {
			bytes, from, runs = bm.Bytes(), g, bitmapRuns(bm)
		}
	}
	role := v.roleLocked()
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
	if role != replication.Primary {
		// A primary's drain flushes them (volstate's DrainIO).
		if err := v.durable.md.FlushBitmaps(); err != nil {
			return 0, err
		}
	}
	// A primary stops serving, answers the requests in flight, stops its
	// senders and flushes its bitmaps BEFORE it gives up the role.
	err := v.drive(volstate.DiscardMyData{}, driveOptions{
		texts: func(volstate.Cause) reason {
			return because(CauseDiscarding, "discarding its %s of changes: waiting for the primary to overwrite them", human.Bytes(bytes))
		},
		install: func(c volstate.Change) {
			// With the step that made this node discard its data (not
			// one that stepped it down meanwhile).
			if c.Next.Discard && !c.Old.Discard {
				v.discard = &discardInfo{from: from, runs: runs}
			}
		},
		notify: func(volstate.Action) {
			v.log.Warn("discarding my data", "bytes", bytes)
			v.node.event(v.name, "discard-my-data", fmt.Sprintf("%s gives up %s of changes made since the split brain", v.self, human.Bytes(bytes)))
		},
	})
	if err != nil {
		return 0, v.discardRefusal(err)
	}
	return bytes, nil
}

// discardRefused asks the volume's rules, without changing anything,
// whether e (a discard of this node's data) may run now, and words their
// refusal.
func (v *Volume) discardRefused(e volstate.DiscardMyData) error {
	v.mu.Lock()
	_, rd := volstate.Step(v.modelLocked(), e)
	v.mu.Unlock()
	return v.discardRefusal(rd.Err)
}

// discardRefusal words the rules' refusal of a discard (nil: none).
func (v *Volume) discardRefusal(err error) error {
	var streams *volstate.StreamsToPeer
	switch {
	case err == nil:
		return nil
	case errors.As(err, &streams):
		return status.Errorf(codes.FailedPrecondition, "%v: %s is primary of %s and streams to %s: it is not the victim of a split brain; nothing changed", ErrNotSplitBrain, v.self, v.name, streams.Peer)
	case errors.Is(err, volstate.ErrNotSplitBrain):
		return status.Errorf(codes.FailedPrecondition, "%v: %s on %s is not in a split brain with any peer: --discard-my-data only resolves one (it throws this node's changes away); nothing changed. See replctl status", ErrNotSplitBrain, v.name, v.self)
	}
	return err
}

// resumePeers restarts senders that stopped (split brain) on a primary.
// A sender that is just stopping is waited for, then restarted.
func (v *Volume) resumePeers() {
	v.mu.Lock()
	if v.roleLocked() != replication.Primary || v.st.AdminDown || v.peers.cancel == nil {
		v.mu.Unlock()
		return
	}
	peers := make([]*peer, 0, len(v.peers.byName))
	for _, p := range v.peers.byName {
		p.resumeSeq.Add(1)
		peers = append(peers, p)
	}
	ctx := v.peers.ctx
	v.mu.Unlock()
	for _, p := range peers {
		stopping := p.snapshot().state == replication.StandAlone
		if stopping {
			p.wait()
		}
		// Started on the loop, which owns the peer's state: the rules
		// make it Connecting (LinkStarted), then its link starts.
		v.loop.Ask(func() {
			if !p.running.Load() && ctx.Err() == nil {
				p.takeNews(volstate.LinkStarted{Peer: p.name}, nil)
				p.start(ctx)
			}
		})
	}
}

// resolveSplitBrain runs connect --discard-my-data on the victim, then has
// every other node of the volume try again.
func (v *Volume) resolveSplitBrain(ctx context.Context, yes bool) (*transport.ConnectReply, error) {
	bytes, err := v.discardMyData(ctx, yes)
	if err != nil {
		return nil, grpcError(err)
	}
	reply := &transport.ConnectReply{Node: v.node.name, DiscardBytes: bytes, Done: yes}
	if !yes {
		reply.Replication = v.status().Replication
		return reply, nil
	}
	for name := range v.cfg.Disks {
		if name == v.node.name {
			continue
		}
		if api, err := v.node.peerAPI(name); err == nil {
			api.Connect(ctx, &transport.ConnectRequest{Volume: v.name, Node: name})
		}
	}
	reply.Replication = v.status().Replication
	return reply, nil
}
