package node

import (
	"fmt"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/applier"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// detachIncoming stops the current stream from the primary, if any.
func (v *Volume) detachIncoming() {
	v.mu.Lock()
	in := v.incoming
	v.mu.Unlock()
	if in == nil {
		return
	}
	v.endIncoming(in)
}

// endIncoming stops the stream in and, if it is still the volume's
// current one, drops it: the disk state goes back to what an idle
// secondary's is (a Failed disk stays Failed). The step is taken on the
// volume's loop, with the check that in is the current stream.
func (v *Volume) endIncoming(in *applier.Stream) {
	in.Stop()
	if err := v.loop.Call(func() { v.incomingEnded(in) }); err != nil {
		// The loop closed: the volume's state changes no more, and the
		// stream is dropped all the same.
		v.mu.Lock()
		if v.incoming == in {
			v.incoming = nil
		}
		v.mu.Unlock()
	}
}

// incomingEnded drops in if it is still the volume's current stream, and
// steps the volume's rules with its end (volstate.IncomingEnded: a Failed
// disk stays Failed), both under v.stateMu, which a new stream takes to
// replace it (serveStream): the end of an old stream is never stepped
// after a new one took its place.
func (v *Volume) incomingEnded(in *applier.Stream) {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	v.mu.Lock()
	current := v.incoming == in
	if current {
		v.incoming = nil
	}
	v.mu.Unlock()
	if !current {
		return
	}
	if _, err := v.stepLocked(volstate.IncomingEnded{}, nil, nil); err != nil {
		// The step writes nothing; only a closing volume refuses it.
		v.log.Warn("the end of the stream from the primary", "err", err)
	}
}

// handleStream serves one replication stream opened by a primary.
func (n *Node) handleStream(s *transport.ReplStream) error {
	hello, err := recvHello(s)
	if err != nil {
		return err
	}
	if err := replication.CheckWireVersion(n.name, hello.From, hello.Wire); err != nil {
		return sendHelloReply(s, replication.HelloReply{Refused: replication.RefusedWireVersion, Reason: err.Error()})
	}
	v, ok := n.volumes()[hello.Volume]
	if !ok {
		// Its file does not list the volume (yet): the primary tries again,
		// so the nodes may be reloaded in any order.
		return sendHelloReply(s, replication.HelloReply{
			Refused: replication.RefusedNoVolume,
			Reason: fmt.Sprintf("%s runs no volume %q: its cluster file does not list it (add it there and run systemctl reload replnode on %s), or lists no disk of it for %s",
				n.name, hello.Volume, n.name, n.name),
		})
	}
	// Only a node's certificate gets here (with tls:): the one that
	// names the sender, and a node that holds the volume.
	if reply, accepted := n.streamIdentity(s, hello); !accepted {
		return sendHelloReply(s, reply)
	}
	if reply, accepted := v.streamSender(hello); !accepted {
		return sendHelloReply(s, reply)
	}
	return v.serveStream(s, hello)
}

// refusalLocked is a refusal's answer. Callers hold v.mu.
func (v *Volume) refusalLocked(code replication.Refusal, format string, a ...any) replication.HelloReply {
	return replication.HelloReply{Refused: code, Reason: fmt.Sprintf(format, a...), Epoch: v.st.Durable.Epoch, Primary: v.roleLocked() == replication.Primary}
}

// streamRefusalLocked puts the rules' refusal of h's stream (a
// RefuseStream action) into the answer the primary gets. Callers hold
// v.mu.
func (v *Volume) streamRefusalLocked(h replication.Hello, a volstate.Action) replication.HelloReply {
	var r replication.HelloReply
	switch a.Refusal {
	case replication.RefusedWrongNode:
		r = v.refusalLocked(a.Refusal, "stream for %s reached %s", h.To, v.self)
	case replication.RefusedAdminDown:
		r = v.refusalLocked(a.Refusal, "%s is disconnected from %s by the operator (replctl connect %s --node %s)", v.self, v.name, v.name, v.self)
	case replication.RefusedSize:
		r = v.sizeRefusalLocked(h)
	case replication.RefusedNewerEpoch:
		r = v.refusalLocked(a.Refusal, "%s is primary for %s at epoch %d; %s's epoch %d is older: it follows %s once %s reaches it", v.self, v.name, v.st.Durable.Epoch, h.From, h.Epoch, v.self, v.self)
	case replication.RefusedUnrelated:
		r = v.refusalLocked(a.Refusal, "unrelated data: %s and %s share no generation; if %s's data should go, run replctl create-md %s --force --yes on it (a full resync follows)", v.self, h.From, v.self, v.name)
	case replication.RefusedSplitBrain:
		r = v.refusalLocked(a.Refusal, "split-brain: %s and %s both changed %s since their last common generation (%s); resolve with replctl connect %s --discard-my-data --node VICTIM", v.self, h.From, v.name, replication.RuleWords(a.Detail), v.name)
		if v.roleLocked() == replication.Primary && h.Epoch == v.st.Durable.Epoch {
			if d := replication.CompareUUIDs(v.uuidsLocked(h.From), h.UUIDs, replication.Primary, replication.Primary); !d.Outcome.IsSplitBrain() {
				// Words only: the data did not diverge, two nodes serve.
				r.Reason = fmt.Sprintf("%s is Primary for %s itself at epoch %d; %s claims epoch %d too: two primaries, refusing (split brain)", v.self, v.name, v.st.Durable.Epoch, h.From, h.Epoch)
			}
		}
		r.PrimarySince = unixNano(v.st.Durable.PrimarySince)
		if bm, ok := v.durable.md.Bitmap(v.node.config().NodeID(h.From)); ok {
			r.Changes = bm.Bytes()
		}
	case replication.RefusedStaleEpoch:
		r = v.refusalLocked(a.Refusal, "stale epoch: %s sent epoch %d but %s has seen epoch %d (primary %s)", h.From, h.Epoch, v.self, v.st.Durable.Epoch, v.st.Durable.Primary)
	case replication.RefusedOtherPrimary:
		r = v.refusalLocked(a.Refusal, "epoch %d belongs to %s, not %s", h.Epoch, v.st.Durable.Primary, h.From)
	default:
		panic(fmt.Sprintf("volume %s: no words for the refusal %q", v.name, a.Refusal))
	}
	r.Rule = a.Detail
	return r
}

// sizeRefusalLocked words the refusal of a stream whose volume is not
// this node's size. Callers hold v.mu.
func (v *Volume) sizeRefusalLocked(h replication.Hello) replication.HelloReply {
	mine := v.size.Load()
	if v.durable.sizeMax {
		return v.refusalLocked(replication.RefusedSize, "volume %s is %d bytes on %s but %d on %s (size: max gave each node the largest size its own disk holds, and the disks differ): a volume has one size on every node. "+
			"Give size: %d (%s's) in the file on every node; then on %s stop replnode, make its disk hold that size, run replctl create-md %s --node %s --force --yes (its copy starts over: a full resync follows) and start it",
			v.name, mine, v.self, h.Size, h.From, h.Size, h.From, v.self, v.name, v.self)
	}
	// Most likely a resize left the smaller behind (it was down, or the
	// resize stopped half-way): growing it costs no copy.
	smaller, larger := v.self, h.Size
	if h.Size < mine {
		smaller, larger = h.From, mine
	}
	return v.refusalLocked(replication.RefusedSize, "volume %s is %d bytes on %s but %d on %s: a volume has one size on every node. "+
		"If a resize left %s behind, grow it: replctl resize %s %d --node %s (once its disk holds that size with its metadata); "+
		"or, to start %s's copy over at %s's size, give size: %d in the file on every node, then on %s stop replnode, make its disk hold that size, run replctl create-md %s --node %s --force --yes (a full resync follows) and start it",
		v.name, mine, v.self, h.Size, h.From, smaller, v.name, larger, smaller, v.self, h.From, h.Size, v.self, v.name, v.self)
}

// reached is the event of h's stream reaching this node.
func (v *Volume) reached(h replication.Hello) volstate.PrimaryReached {
	return volstate.PrimaryReached{From: h.From, Epoch: h.Epoch, UUIDs: h.UUIDs, HandedOver: h.HandedOver || v.handedOverAt(h.Epoch),
		Misdirected: h.To != v.self, SizeDiffers: h.Size != v.size.Load()}
}

// primaryReached takes h's stream through the volume's rules
// (volstate.PrimaryReached) on the volume's loop: they refuse it, or take
// it, the new epoch and primary durable BEFORE the first write of the
// primary, and, when another node took over, this node's activity log
// marked toward it BEFORE that (the reply reports the marks). It returns
// the refusal's answer (zero when taken), worded on the state the rules
// refused it on.
func (v *Volume) primaryReached(h replication.Hello) (replication.HelloReply, error) {
	var reply replication.HelloReply
	err := v.drive(v.reached(h), driveOptions{
		refused: func(a volstate.Action) { reply = v.streamRefusalLocked(h, a) },
		// The refusal's words are the why the step records.
		texts: func(volstate.Cause) reason {
			return reason{cause: causeOfRefusal(reply.Refused), text: reply.Reason}
		},
	})
	if err != nil {
		return replication.HelloReply{}, err
	}
	return reply, nil
}

// serveStream takes the primary's stream, or refuses it, and then applies
// it to the local disk, in order, acknowledging each batch after its last
// entry is written (node/applier).
func (v *Volume) serveStream(s *transport.ReplStream, h replication.Hello) error {
	if h.To == v.self {
		v.compareSettings(h.From, h.Settings)
	}
	v.mu.Lock()
	newer := v.roleLocked() == replication.Primary && h.Epoch > v.st.Durable.Epoch
	v.mu.Unlock()
	if newer {
		// A primary of a newer epoch took over while this one was away:
		// the rules step this one down (what it wrote meanwhile stays
		// marked, and the new primary copies it), or, when both changed
		// the data, stop its IO at once all the same (stepDown).
		if err := v.stepDown(h); err != nil {
			return err
		}
	}
	reply, err := v.primaryReached(h)
	if err != nil {
		return err
	}
	if reply.Refused != "" {
		v.mu.Lock()
		again := v.lastRefusal == reply.Reason
		v.lastRefusal = reply.Reason
		v.mu.Unlock()
		if !again {
			// Once per reason, not at every retry of the primary.
			v.log.Warn("refused replication stream", "from", h.From, "refusal", reply.Refused, "reason", reply.Reason)
			kind := "refused"
			if reply.Refused == replication.RefusedSplitBrain {
				kind = "split-brain"
			}
			v.node.emit(statefile.Event{Volume: v.name, Kind: kind, Peer: h.From, Reason: string(reply.Refused), Message: reply.Reason})
		}
		reply.Settings = v.agreedSettings()
		return sendHelloReply(s, reply)
	}
	v.mu.Lock()
	v.lastRefusal = ""
	v.mu.Unlock()
	// Under v.stateMu too: the end of the stream replaced is stepped
	// with the check that it is current, atomically (incomingEnded).
	v.stateMu.Lock()
	v.mu.Lock()
	select {
	case <-v.stopping:
		// The volume shuts down: its disk closes once the stream it had
		// is stopped, and no new one may touch it.
		v.mu.Unlock()
		v.stateMu.Unlock()
		return fmt.Errorf("%s on %s is stopping", v.name, v.self)
	default:
	}
	old := v.incoming
	in := applier.NewStreamAfter(h.From, old)
	in.SetState(replication.Connected)
	v.incoming = in
	v.mu.Unlock()
	v.stateMu.Unlock()
	if old != nil {
		old.Stop()
	}
	defer v.endIncoming(in)

	// WHAT EARLIER STREAMS LEFT IN THIS DISK'S CACHE ONLY IS ON THE DISK,
	// DURABLY, BEFORE THE NEW STREAM IS ACCEPTED. The primary counts this
	// node in sync from what the handshake says it holds (and raft records
	// it UpToDate), and marks only what the new stream leaves unflushed;
	// a write an earlier stream left in the page cache would be counted
	// as held, and lost to a power loss here. A disk that cannot sync
	// takes no stream, as one that fails a replicated write does.
	if !v.isDetached() {
		if err := v.disk.Sync(); err != nil {
			appliedState{v}.Failed(err)
			return fmt.Errorf("%s refuses the stream of %s: its disk could not sync what earlier streams wrote: %w", v.self, h.From, err)
		}
	}

	v.mu.Lock()
	reply = replication.HelloReply{Accepted: true, Generation: v.st.Durable.Gens.Current, Disk: v.st.Disk, Epoch: v.st.Durable.Epoch, UUIDs: v.uuidsLocked(h.From),
		Settings: v.agreedSettings()}
	if bm, ok := v.durable.md.Bitmap(v.node.config().NodeID(h.From)); ok && bm.Count() > 0 {
		// What this node changed, or may have (its activity log after a
		// crash as primary), that the primary does not have.
		reply.Changed, reply.Changes = bitmapRuns(bm), bm.Bytes()
	}
	if v.discard != nil {
		reply.DiscardFrom, reply.Discard = v.discard.from, v.discard.runs
	}
	v.mu.Unlock()
	// The reply fits one frame whatever the bitmaps hold: a long list
	// marks a few blocks more, which the resync copies once more.
	reply.Changed = replication.CoarsenRuns(reply.Changed, replication.MaxHandshakeRuns)
	reply.Discard = replication.CoarsenRuns(reply.Discard, replication.MaxHandshakeRuns)
	if err := sendHelloReply(s, reply); err != nil {
		return err
	}
	v.log.Info("replicating from primary", "primary", h.From, "epoch", h.Epoch)
	return in.Run(s, v.applied())
}

// handedOverAt reports whether this node knows that the promotion at
// epoch was a handover (raft's state machine here is at that epoch and
// recorded no failover at it). Not knowing (no raft, or its state machine
// here behind) counts as a failover: the activity log is reconciled.
func (v *Volume) handedOverAt(epoch uint64) bool {
	cl := v.node.cl
	if cl == nil {
		return false
	}
	va, ok := cl.c.Authority().Volume(v.name)
	return ok && va.Epoch == epoch && !va.FailedOverAt(epoch)
}

// raftOutdated reports whether this node's raft records peer Outdated
// under this node as primary (the record names it primary at its epoch):
// the promotion's Outdated set and its own marks since. The promotion of
// a term an operator forced does not count: it declared every other node
// Outdated, and one may hold the writes the forced primary lacks, which
// it then copies (the rules' pull); its own marks since do
// (VolumeAuthority.OutdatedOnRecord): a peer that missed writes
// acknowledged in the forced term, pulled from, would copy its older
// blocks over them. A node an operator forced without a quorum is ahead
// of the record: the record's term counts for it when it held this node
// UpToDate (VolumeAuthority.OutdatedUnder).
func (v *Volume) raftOutdated(peer string) bool {
	cl := v.node.cl
	if cl == nil {
		return false
	}
	va, ok := cl.c.Authority().Volume(v.name)
	if !ok {
		return false
	}
	v.mu.Lock()
	epoch := v.st.Durable.Epoch
	v.mu.Unlock()
	return va.OutdatedUnder(v.self, epoch, peer)
}

// markActivityLog marks the activity log's extents out of sync toward
// peer, durably (volstate.MarkActivityLog): the primary changed, and a
// write of the old one still in flight may be here and not on peer, or
// on peer and not here. The resync of the new term copies them from the
// new primary. Callers hold v.stateMu.
func (v *Volume) markActivityLog(peer string) error {
	bm, ok := v.durable.md.Bitmap(v.node.config().NodeID(peer))
	if !ok {
		return nil
	}
	marked, err := v.durable.md.MarkActivityLog(bm)
	if err != nil {
		return fmt.Errorf("mark the activity log toward %s: %w", peer, err)
	}
	if marked > 0 {
		v.log.Info("primary changed: the activity log's extents are marked for the new term's resync", "peer", peer, "bytes", marked)
		v.node.peerEvent(v.name, "reconcile", peer, fmt.Sprintf("the primary of %s changed: the %s %s wrote last (its activity log) are resynced between it and %s, in case a write of the old primary was in flight",
			v.name, human.Bytes(marked), v.self, peer))
	}
	return nil
}

// causeOfRefusal is the Cause a secondary records for refusing a stream.
func causeOfRefusal(r replication.Refusal) Cause {
	switch r {
	case replication.RefusedSplitBrain:
		return CauseSplitBrain
	case replication.RefusedUnrelated:
		return CauseUnrelated
	case replication.RefusedAdminDown:
		return CauseAdminDown
	}
	return CauseRefused
}

// applied is the volume as the applier writes a stream to it.
func (v *Volume) applied() *applier.Volume {
	return &applier.Volume{
		Name: v.name, Self: v.self,
		Disk: appliedDisk{v.disk}, ActivityLog: v.durable.md.ActivityLog(),
		Size: &v.size, Resynced: &v.counters.resynced, Buffers: &resyncBufs,
		PeerTimeout: v.cfg.PeerTimeoutOrDefault(), Stopping: v.stopping,
		Log: v.log, State: appliedState{v}, Clock: v.clock,
		Checksums: v.applierChecksums(),
	}
}

// appliedDisk is the volume's disk as the applier writes it: a write
// made durable by itself where the disk can (backing.WriteSync), holes
// found where it can tell them (backing.HoleFinder).
type appliedDisk struct{ Disk }

func (d appliedDisk) WriteSync(p []byte, off int64) error { return backing.WriteSync(d.Disk, p, off) }

func (d appliedDisk) IsHole(off, length int64) bool {
	hf, ok := d.Disk.(backing.HoleFinder)
	return ok && hf.IsHole(off, length)
}

// appliedState is what the volume decides while a stream is applied
// (applier.State): the applier calls it holding the stream's apply lock,
// which comes before v.stateMu and v.mu.
type appliedState struct{ v *Volume }

func (s appliedState) MarkReplica() error {
	v := s.v
	if !v.durable.replicaMarked.Load() {
		if err := v.durable.md.SetReplica(true); err != nil {
			return err
		}
		v.durable.replicaMarked.Store(true)
	}
	return nil
}

func (s appliedState) SyncStarted(from replication.Generation) error {
	v := s.v
	v.mu.Lock()
	primary := v.st.Durable.Primary
	v.mu.Unlock()
	return v.drive(volstate.ResyncStarted{Peer: primary, From: from}, driveOptions{})
}

func (s appliedState) SyncFinished(primary string, g replication.Generation, history []replication.Generation) error {
	v := s.v
	// The disk holds the primary's generation now, UpToDate; a discard is
	// over; and a crash of this node as primary is over too: what its
	// activity log held that the primary did not is the primary's data
	// now (its extents were marked, and resynced). Left set, every later
	// connection, a clean one too, was decided by the rule crashed-primary
	// and resynced the log's extents again (volstate.ResyncFinished).
	if err := v.drive(volstate.ResyncFinished{Peer: primary, AsTarget: true, Current: g, History: history}, driveOptions{}); err != nil {
		return err
	}
	// This node holds the primary's data now: whatever it marked toward
	// the primary (writes of an earlier term of its own, its activity log
	// after a crash as primary) is in. Left marked, it would be resynced
	// again at every reconnection.
	if bm, ok := v.durable.md.Bitmap(v.node.config().NodeID(primary)); ok {
		bm.ClearBits(0, v.size.Load())
	}
	return nil
}

func (s appliedState) Failed(err error) {
	v := s.v
	why := because(CauseDiskFailed, "a replicated write failed on %s (%v): the primary marks the blocks it sent and resyncs them once the disk takes writes again", v.self, err)
	if err := v.drive(volstate.ReplicaWriteFailed{}, driveOptions{texts: func(volstate.Cause) reason { return why }}); err != nil {
		v.log.Error("record the failed disk", "err", err)
	}
	v.node.event(v.name, "apply-failed", why.text)
}
