package node

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// incoming is a secondary's end of the stream from its primary.
type incoming struct {
	from string

	// applyMu is held while a batch is applied; once stopped is set no
	// further batch of this stream touches the disk.
	applyMu mutex
	stopped bool

	st atomic.Pointer[replication.ReplState]
}

func (in *incoming) state() replication.ReplState {
	if st := in.st.Load(); st != nil {
		return *st
	}
	return ""
}

func (in *incoming) setState(s replication.ReplState) { in.st.Store(&s) }

// stop ends the stream's effect on the disk: it returns after any batch
// being applied is done, and no later batch is applied. The stream itself
// ends when its handler next wakes up.
func (in *incoming) stop() {
	in.applyMu.Lock()
	in.stopped = true
	in.applyMu.Unlock()
}

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
// secondary's is (a Failed disk stays Failed).
func (v *Volume) endIncoming(in *incoming) {
	in.stop()
	v.mu.Lock()
	if v.incoming == in {
		v.incoming = nil
		if v.diskState != replication.Failed {
			v.diskState = v.idleDiskState()
		}
	}
	v.mu.Unlock()
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
	// names the sender.
	if reply, accepted := n.streamIdentity(s, hello); !accepted {
		return sendHelloReply(s, reply)
	}
	return v.serveStream(s, hello)
}

// refuseLocked says why this node will not take a stream, or returns a
// zero reply when it will. Callers hold v.mu.
func (v *Volume) refuseLocked(h replication.Hello) replication.HelloReply {
	refuse := func(code replication.Refusal, format string, a ...any) replication.HelloReply {
		return replication.HelloReply{Refused: code, Reason: fmt.Sprintf(format, a...), Epoch: v.d.epoch, Primary: v.role == replication.Primary}
	}
	if v.discard != nil && h.To == v.self && !v.adminDown && h.Size == v.size.Load() {
		// The operator told this node to give up its data: it follows the
		// next primary that connects, whatever epoch it saw before.
		return replication.HelloReply{}
	}
	switch {
	case h.To != v.self:
		return refuse(replication.RefusedWrongNode, "stream for %s reached %s", h.To, v.self)
	case v.adminDown:
		return refuse(replication.RefusedAdminDown, "%s is disconnected from %s by the operator (replctl connect %s --node %s)", v.self, v.name, v.name, v.self)
	case h.Size != v.size.Load():
		mine := v.size.Load()
		if v.sizeMax {
			return refuse(replication.RefusedSize, "volume %s is %d bytes on %s but %d on %s (size: max gave each node the largest size its own disk holds, and the disks differ): a volume has one size on every node. "+
				"Give size: %d (%s's) in the file on every node; then on %s stop replnode, make its disk hold that size, run replctl create-md %s --node %s --force --yes (its copy starts over: a full resync follows) and start it",
				v.name, mine, v.self, h.Size, h.From, h.Size, h.From, v.self, v.name, v.self)
		}
		// Most likely a resize left the smaller behind (it was down, or
		// the resize stopped half-way): growing it costs no copy.
		smaller, larger := v.self, h.Size
		if h.Size < mine {
			smaller, larger = h.From, mine
		}
		return refuse(replication.RefusedSize, "volume %s is %d bytes on %s but %d on %s: a volume has one size on every node. "+
			"If a resize left %s behind, grow it: replctl resize %s %d --node %s (once its disk holds that size with its metadata); "+
			"or, to start %s's copy over at %s's size, give size: %d in the file on every node, then on %s stop replnode, make its disk hold that size, run replctl create-md %s --node %s --force --yes (a full resync follows) and start it",
			v.name, mine, v.self, h.Size, h.From, smaller, v.name, larger, smaller, v.self, h.From, h.Size, v.self, v.name, v.self)
	}
	// A sender of an older epoch than this primary's is a primary no
	// longer (it crashed or was cut off, and this node took over): it
	// compares as the Secondary it is about to be. With equal generations,
	// what it wrote beyond them was never acknowledged (its activity log's
	// extents): this node's copy wins, as DRBD resyncs a crashed primary's
	// log from the new primary. Only a divergence of the data is a split
	// brain, not two nodes that each remember being primary.
	senderRole := replication.Primary
	if v.role == replication.Primary && h.Epoch < v.d.epoch {
		senderRole = replication.Secondary
	}
	d := replication.CompareUUIDs(v.uuidsLocked(h.From), h.UUIDs, v.role, senderRole)
	if v.role == replication.Primary && h.Epoch < v.d.epoch && !d.Outcome.IsSplitBrain() {
		// The sender is an old primary: this node took over at a newer
		// epoch and reaches it itself.
		r := refuse(replication.RefusedNewerEpoch, "%s is primary for %s at epoch %d; %s's epoch %d is older: it follows %s once %s reaches it", v.self, v.name, v.d.epoch, h.From, h.Epoch, v.self, v.self)
		r.Rule = ruleNewerEpoch
		return r
	}
	if d.Outcome == replication.UnrelatedData {
		r := refuse(replication.RefusedUnrelated, "unrelated data (%s): %s and %s share no generation; if %s's data should go, run replctl create-md %s --force --yes on it (a full resync follows)", d.Rule, v.self, h.From, v.self, v.name)
		r.Rule = d.Rule
		return r
	}
	if d.Outcome.IsSplitBrain() || v.role == replication.Primary {
		r := refuse(replication.RefusedSplitBrain, "split-brain (%s): %s and %s both changed %s since their last common generation; resolve with replctl connect %s --discard-my-data --node VICTIM", d.Rule, v.self, h.From, v.name, v.name)
		if v.role == replication.Primary && !d.Outcome.IsSplitBrain() {
			r.Reason = fmt.Sprintf("%s is Primary for %s itself at epoch %d; %s claims epoch %d too: two primaries, refusing (split brain)", v.self, v.name, v.d.epoch, h.From, h.Epoch)
		}
		r.Rule, r.PrimarySince = d.Rule, v.d.primarySince
		if bm, ok := v.md.Bitmap(v.node.config().NodeID(h.From)); ok {
			r.Changes = bm.Bytes()
		}
		return r
	}
	switch {
	case h.Epoch < v.d.epoch:
		return refuse(replication.RefusedStaleEpoch, "stale epoch: %s sent epoch %d but %s has seen epoch %d (primary %s)", h.From, h.Epoch, v.self, v.d.epoch, v.d.primary)
	case h.Epoch == v.d.epoch && v.d.primary != "" && h.From != v.d.primary:
		return refuse(replication.RefusedOtherPrimary, "epoch %d belongs to %s, not %s", h.Epoch, v.d.primary, h.From)
	}
	return replication.HelloReply{}
}

// ruleNewerEpoch names the refusal a primary of a newer epoch gives an
// older primary: the older one is fenced.
const ruleNewerEpoch = "newer-epoch"

// serveStream applies the primary's stream to the local disk, in order,
// acknowledging each batch after its last entry is written.
func (v *Volume) serveStream(s *transport.ReplStream, h replication.Hello) error {
	if h.To == v.self {
		v.compareSettings(h.From, h.Settings)
	}
	v.mu.Lock()
	if v.role == replication.Primary && h.To == v.self && !v.adminDown && h.Size == v.size.Load() && h.Epoch > v.d.epoch && v.discard == nil {
		// A primary of a newer epoch took over while this one was away.
		// Follow it unless both changed the data: what this node wrote
		// meanwhile stays marked, and the new primary copies it. If both
		// did, this older primary stops its IO at once all the same.
		d := replication.CompareUUIDs(v.uuidsLocked(h.From), h.UUIDs, replication.Secondary, replication.Primary)
		v.mu.Unlock()
		if d.Outcome.IsSplitBrain() || d.Outcome == replication.UnrelatedData {
			v.fence(h.Epoch, fmt.Sprintf("%s is primary at the newer epoch %d and the data diverged (%v)", h.From, h.Epoch, d))
		} else if err := v.stepDown(h); err != nil {
			return err
		}
		v.mu.Lock()
	}
	if reply := v.refuseLocked(h); reply.Refused != "" {
		if reply.Refused != replication.RefusedNewerEpoch {
			v.why = reason{cause: causeOfRefusal(reply.Refused), text: reply.Reason}
		}
		if reply.Refused == replication.RefusedSplitBrain {
			v.noteSplitBrainLocked(h.From, reply.Rule)
		}
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
	v.lastRefusal = ""
	adopt := v.discard != nil || h.Epoch > v.d.epoch || v.d.primary != h.From
	v.mu.Unlock()
	if adopt {
		// The new epoch is durable BEFORE the first write of its primary.
		v.stateMu.Lock()
		err := v.commit(func(d *durable) { d.epoch, d.primary = h.Epoch, h.From }, nil)
		v.stateMu.Unlock()
		if err != nil {
			return err
		}
	}
	v.mu.Lock()
	select {
	case <-v.stopping:
		// The volume shuts down: its disk closes once the stream it had
		// is stopped, and no new one may touch it.
		v.mu.Unlock()
		return fmt.Errorf("%s on %s is stopping", v.name, v.self)
	default:
	}
	old := v.incoming
	in := &incoming{from: h.From}
	in.setState(replication.Connected)
	v.incoming = in
	v.why = reason{}
	delete(v.splitBrain, h.From)
	v.mu.Unlock()
	if old != nil {
		old.stop()
	}
	defer v.endIncoming(in)

	v.mu.Lock()
	reply := replication.HelloReply{Accepted: true, Generation: v.d.gens.Current, Disk: v.diskState, Epoch: v.d.epoch, UUIDs: v.uuidsLocked(h.From),
		Settings: v.agreedSettings()}
	if bm, ok := v.md.Bitmap(v.node.config().NodeID(h.From)); ok && bm.Count() > 0 {
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
	return v.applyStream(s, in, h.From)
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

// applyStream applies the stream's batches in order. A reader goroutine
// keeps frames coming while this one applies them; when several frames
// are waiting, all are applied and one ack covers them. While a batch
// takes long to apply (a flush of much data), the peer is told every
// quarter of the peer timeout that this node is alive (an ack of nothing),
// so that a slow disk is not taken for a hung node. One goroutine
// (streamSender) alone writes to the stream: the receipts (protocol B),
// the heartbeats, the read replies and the acks reach it through one
// channel, each writer's frames in the order it queued them.
func (v *Volume) applyStream(s *transport.ReplStream, in *incoming, from string) error {
	out := newStreamSender(s)
	defer out.close()
	send := out.send
	frames := make(chan *transport.Frame, 8)
	free := make(chan *transport.Frame, 10)
	for range cap(free) {
		free <- &transport.Frame{}
	}
	rerr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			var f *transport.Frame
			select {
			case f = <-free:
			case <-done:
				return
			}
			if err := s.Recv(f); err != nil {
				rerr <- err
				return
			}
			// Protocol B: say so as soon as the batch is here, before it
			// is applied.
			if seq, receipt, err := replication.BatchReceipt(f.Bytes()); err == nil && receipt && seq != 0 {
				af := transport.NewFrame(32)
				af.SetBytes(replication.AppendAck(af.Bytes(), replication.Ack{Seq: seq, Status: replication.AckReceived}))
				if err := send(af); err != nil {
					rerr <- err
					return
				}
			}
			select {
			case frames <- f:
			case <-done:
				return
			}
		}
	}()
	// While a batch is applied (a slow disk may take long), an empty ack
	// every quarter of the timeout tells the primary this node is alive.
	// The ticker runs only from an apply's start until a tick finds none
	// running: an idle stream keeps no ticker.
	var applying atomic.Bool
	applyStarted := make(chan struct{}, 1)
	go func() {
		every := max(v.cfg.PeerTimeoutOrDefault()/4, 10*time.Millisecond)
		for {
			select {
			case <-done:
				return
			case <-applyStarted:
			}
			tick := time.NewTicker(every)
			for running := true; running; {
				select {
				case <-done:
					tick.Stop()
					return
				case <-tick.C:
					if running = applying.Load(); running {
						af := transport.NewFrame(32)
						af.SetBytes(replication.AppendAck(af.Bytes(), replication.Ack{}))
						if send(af) != nil {
							tick.Stop()
							return
						}
					}
				}
			}
			tick.Stop()
		}
	}()
	var entries []replication.Entry
	for {
		var f *transport.Frame
		select {
		case f = <-frames:
		case err := <-rerr:
			return err
		case <-out.failed:
			return out.err
		case <-v.stopping:
			// The volume stops (a removal, a node's shutdown): the
			// stream ends now, not at the primary's next frame.
			return fmt.Errorf("%s on %s is stopping", v.name, v.self)
		}
		var ack replication.Ack
		for f != nil {
			var err error
			entries, err = replication.DecodeBatch(f.Bytes(), entries[:0])
			if err != nil {
				return err
			}
			in.applyMu.Lock()
			if in.stopped {
				in.applyMu.Unlock()
				return fmt.Errorf("stream from %s replaced or stopped", from)
			}
			applying.Store(true)
			select {
			case applyStarted <- struct{}{}:
			default:
			}
			a := v.apply(in, entries, func(seq uint64, st replication.AckStatus, data []byte) error {
				rf := transport.NewFrame(replication.ReadReplyHeaderLen + len(data))
				rf.SetBytes(replication.AppendReadReply(rf.Bytes(), seq, st, data))
				return send(rf)
			})
			applying.Store(false)
			in.applyMu.Unlock()
			free <- f
			f = nil
			if a.Seq != 0 || a.Status != replication.AckOK {
				ack = a
			}
			if a.Status != replication.AckOK {
				break
			}
			select {
			case f = <-frames:
			default:
			}
		}
		af := transport.NewFrame(32)
		af.SetBytes(replication.AppendAck(af.Bytes(), ack))
		if err := send(af); err != nil {
			return err
		}
		if ack.Status != replication.AckOK {
			return fmt.Errorf("replication from %s stopped: %s", from, ack.Message)
		}
	}
}

// apply writes a batch's entries to the local disk in order and returns the
// ack for it. Entries flagged FUA, and flushes, are durable BEFORE the ack.
// OpRead entries are answered through readReply, BEFORE the ack.
func (v *Volume) apply(in *incoming, entries []replication.Entry, readReply func(seq uint64, st replication.AckStatus, data []byte) error) replication.Ack {
	if len(entries) == 0 {
		return replication.Ack{}
	}
	ack := replication.Ack{Seq: entries[len(entries)-1].Seq}
	fail := func(e *replication.Entry, err error) replication.Ack {
		v.log.Error("applying replicated entry failed", "op", e.Op, "off", e.Off, "len", e.Length, "err", err)
		// The primary marks every entry of this batch for this node (it
		// gets no ack for them): this disk is its generation plus some of
		// them, applied in order, which a resync of those blocks repairs.
		// The generation stays, so that resync is of the marked blocks,
		// not a full one.
		v.mu.Lock()
		v.diskState = replication.Failed
		v.why = because(CauseDiskFailed, "a replicated write failed on %s (%v): the primary marks the blocks it sent and resyncs them once the disk takes writes again", v.self, err)
		v.mu.Unlock()
		v.node.event(v.name, "apply-failed", v.why.text)
		return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: fmt.Sprintf("%s: %v", v.self, err)}
	}
	needSync := false
	for i := range entries {
		e := &entries[i]
		if e.Off < 0 || e.Off+e.Length > v.size.Load() {
			if e.Op != replication.OpFlush && e.Op != replication.OpSyncStart && e.Op != replication.OpSyncDone {
				return fail(e, fmt.Errorf("entry beyond the volume end (%d+%d > %d)", e.Off, e.Length, v.size.Load()))
			}
		}
		var err error
		switch e.Op {
		case replication.OpWrite:
			if err = v.logApplied(e); err != nil {
				break
			}
			if e.Flags&replication.EntryFUA != 0 {
				err = backing.WriteSync(v.disk, e.Data, e.Off)
			} else {
				_, err = v.disk.WriteAt(e.Data, e.Off)
			}
			v.md.ActivityLog().Done(e.Off, e.Length)
		case replication.OpZero, replication.OpTrim:
			if err = v.logApplied(e); err != nil {
				break
			}
			err = v.disk.Zero(e.Off, e.Length)
			v.md.ActivityLog().Done(e.Off, e.Length)
			needSync = needSync || e.Flags&replication.EntryFUA != 0
		case replication.OpFlush:
			err = v.disk.Sync()
		case replication.OpVerify:
			bp := resyncBufs.Get().(*[]byte)
			buf := *bp
			if int64(cap(buf)) < e.Length {
				buf = make([]byte, e.Length)
			}
			buf = buf[:e.Length]
			st, mism := replication.AckOK, []byte(nil)
			if _, rerr := v.disk.ReadAt(buf, e.Off); rerr != nil {
				st = replication.AckIOError
			} else {
				mism = replication.EncodeMismatches(replication.Mismatches(buf, e.Data))
			}
			resyncBufs.Put(bp)
			if err = readReply(e.Seq, st, mism); err != nil {
				return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: err.Error()}
			}
		case replication.OpRead:
			bp := resyncBufs.Get().(*[]byte)
			buf := *bp
			if int64(cap(buf)) < e.Length {
				buf = make([]byte, e.Length)
			}
			buf = buf[:e.Length]
			st := replication.AckOK
			if _, rerr := v.disk.ReadAt(buf, e.Off); rerr != nil {
				v.log.Error("read for the primary failed", "off", e.Off, "len", e.Length, "err", rerr)
				st, buf = replication.AckIOError, nil
			}
			err = readReply(e.Seq, st, buf)
			resyncBufs.Put(bp)
			if err != nil {
				return replication.Ack{Seq: ack.Seq, Status: replication.AckIOError, Message: err.Error()}
			}
		case replication.OpResyncData:
			_, err = v.disk.WriteAt(e.Data, e.Off)
			v.resynced.Add(e.Length)
		case replication.OpResyncZero:
			if hf, ok := v.disk.(backing.HoleFinder); !ok || !hf.IsHole(e.Off, e.Length) {
				err = v.disk.Zero(e.Off, e.Length)
			}
			v.resynced.Add(e.Length)
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
			v.stateMu.Lock()
			err = v.commit(func(d *durable) {
				d.gens, d.syncGen = d.gens.Inconsistent(), g
			}, func() { v.diskState = replication.Inconsistent })
			v.stateMu.Unlock()
			in.setState(replication.SyncTarget)
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
			if err = v.disk.Sync(); err != nil {
				break
			}
			v.stateMu.Lock()
			err = v.commit(func(d *durable) {
				d.gens, d.syncGen = d.gens.ResyncFinishedAsTarget(in.from, g, history), replication.Generation{}
			}, func() {
				if v.discard != nil {
					v.discard, v.why = nil, reason{}
				}
				v.diskState = replication.UpToDate
			})
			v.stateMu.Unlock()
			if err != nil {
				break
			}
			// This node holds the primary's data now: whatever it marked
			// toward the primary (writes of an earlier term of its own,
			// its activity log after a crash as primary) is in. Left
			// marked, it would be resynced again at every reconnection.
			if bm, ok := v.md.Bitmap(v.node.config().NodeID(in.from)); ok {
				bm.ClearBits(0, v.size.Load())
			}
			in.setState(replication.Connected)
		default:
			err = fmt.Errorf("unknown op %d", e.Op)
		}
		if err != nil {
			return fail(e, err)
		}
	}
	if needSync {
		if err := v.disk.Sync(); err != nil {
			return fail(&entries[len(entries)-1], err)
		}
	}
	return ack
}

// logApplied readies a replicated write the way the primary made it: the
// replica indicator and the write's activity log extents are on stable
// storage BEFORE the write is issued, which then ends with the activity
// log's Done. After a crash, those extents are what this node may have
// acknowledged and then lost with a volatile cache (a power loss), and
// they are resynced from the primary (metadata.MD.CrashedReplica).
func (v *Volume) logApplied(e *replication.Entry) error {
	if !v.replicaMarked.Load() {
		if err := v.md.SetReplica(true); err != nil {
			return fmt.Errorf("set the replica indicator: %w", err)
		}
		v.replicaMarked.Store(true)
	}
	if err := v.md.ActivityLog().Admit(context.Background(), e.Off, e.Length); err != nil {
		return fmt.Errorf("activity log: %w", err)
	}
	return nil
}

// errStreamSenderEnded: a frame was queued after the stream's end.
var errStreamSenderEnded = errors.New("the stream to the primary has ended")

// streamSender is the one goroutine that writes a secondary's stream:
// send queues a frame for it, in order. After the first failed write it
// takes no more frames, and send returns that error.
type streamSender struct {
	s      *transport.ReplStream
	out    chan *transport.Frame
	stop   chan struct{} // closed by close: send what is queued, then end
	failed chan struct{} // closed once a write failed; err is then set
	ended  chan struct{} // closed when the goroutine has returned
	err    error
}

func newStreamSender(s *transport.ReplStream) *streamSender {
	ss := &streamSender{s: s, out: make(chan *transport.Frame, 16), stop: make(chan struct{}), failed: make(chan struct{}), ended: make(chan struct{})}
	go ss.run()
	return ss
}

func (ss *streamSender) run() {
	defer close(ss.ended)
	write := func(f *transport.Frame) bool {
		if err := ss.s.Send(f); err != nil {
			ss.err = err
			close(ss.failed)
			return false
		}
		return true
	}
	for {
		select {
		case f := <-ss.out:
			if !write(f) {
				return
			}
		case <-ss.stop:
			// What was queued before the stream's end still goes out
			// (an ack saying why the secondary stops).
			for {
				select {
				case f := <-ss.out:
					if !write(f) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// send queues f; it fails once a write to the stream failed.
func (ss *streamSender) send(f *transport.Frame) error {
	select {
	case ss.out <- f:
		return nil
	case <-ss.failed:
		return ss.err
	case <-ss.ended:
		return errStreamSenderEnded
	}
}

// close sends what is queued and waits for the goroutine to end (or for
// the stream's context to end, when a write cannot complete).
func (ss *streamSender) close() {
	close(ss.stop)
	select {
	case <-ss.ended:
	case <-ss.s.Context().Done():
	}
}
