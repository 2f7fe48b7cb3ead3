package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// stopPeers cancels the senders and waits for them, without v.mu held
// (the senders take it).
func (v *Volume) stopPeers() {
	v.mu.Lock()
	cancel := v.peers.cancel
	v.peers.cancel = nil
	peers := make([]*peer, 0, len(v.peers.byName))
	for _, p := range v.peers.byName {
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

// clientsError refuses a role change while the export is used here,
// naming what uses it: the mount that holds the volume's claim (its host
// and directory, and how to unmount it) and the NBD clients. A mounted
// file system would get I/O errors (DRBD refuses to demote a device held
// open).
func (v *Volume) clientsError(what string) error {
	return v.clientsErrorFor(what, false)
}

// switchoverClientsError is clientsError for a switchover, which a mount
// that follows the primary does not hold up (clientWordsFor).
func (v *Volume) switchoverClientsError(to string) error {
	return v.clientsErrorFor("switchover to "+to, true)
}

func (v *Volume) clientsErrorFor(what string, followersMayStay bool) error {
	words := v.node.clientWordsFor(v, followersMayStay)
	if words == "" {
		return nil
	}
	return fmt.Errorf("%w: %s refused: %s", ErrHasClients, what, words)
}

// waitBudget is how long a request may wait for something: timeout, but
// ending a little before ctx's deadline (the caller's, over gRPC), so that
// the caller gets the reason rather than its own timeout.
// ctx's deadline is read on clk (the node's: real but in tests).
func waitBudget(ctx context.Context, clk clock.Clock, timeout time.Duration) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return timeout
	}
	left := clk.Until(d)
	return max(min(timeout, left-min(time.Second, left/4)), 0)
}

// demote hands the primary role over to node to: IO stops (requests in
// flight are answered), everything is flushed on every replica, and to
// must be connected and in sync. Only then does this node become
// Secondary, durably. On any failure it goes on serving as primary. It is
// refused while NBD clients are connected here.
func (v *Volume) demote(ctx context.Context, to string, timeout time.Duration) (uint64, replication.Generation, error) {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	v.mu.Lock()
	if v.roleLocked() != replication.Primary {
		v.mu.Unlock()
		return 0, replication.Generation{}, fmt.Errorf("%s is not primary on %s", v.name, v.self)
	}
	p, ok := v.peers.byName[to]
	v.mu.Unlock()
	if !ok {
		return 0, replication.Generation{}, fmt.Errorf("%s has no replica of %s", to, v.name)
	}
	if err := v.switchoverClientsError(to); err != nil {
		return 0, replication.Generation{}, err
	}
	inSync := func() bool {
		st := p.status()
		return st.Replication == string(replication.Connected) && st.OutOfSyncBytes == 0 && st.PeerDisk == string(replication.UpToDate)
	}
	// Wait for a resync under way before stopping IO; not for what
	// waiting cannot bring (replication.JudgeSwitchover), and not past
	// the caller's deadline, so that it gets the reason. The verdict is
	// judged again at each change of the peer or the volume, and once
	// the link's grace has passed.
	began := v.clock.Now()
	var refusal string
	waitUntil(ctx, v.clock, waitBudget(ctx, v.clock, timeout), &v.changed, func() bool {
		st := p.status()
		v.mu.Lock()
		down := v.st.AdminDown
		v.mu.Unlock()
		verdict, why := replication.JudgeSwitchover(v.name, v.self, replication.SwitchoverPeer{
			Name: to, Replication: replication.ReplState(st.Replication), Disk: st.PeerDisk, OutOfSyncBytes: st.OutOfSyncBytes,
			Down: st.Reason, ByOperator: down || st.ReasonCode == string(CauseAdminDown),
		}, v.clock.Since(began))
		refusal = why
		return verdict != replication.SwitchoverWait
	}, replication.SwitchoverLinkGrace)
	if refusal != "" {
		v.log.Info("switchover refused", "to", to, "why", refusal)
		return 0, replication.Generation{}, errors.New(refusal)
	}
	if !inSync() {
		st := p.status()
		return 0, replication.Generation{}, fmt.Errorf("%s is not in sync with %s (replication %s, disk %s, %s out of sync%s)",
			to, v.self, st.Replication, st.PeerDisk, human.Bytes(st.OutOfSyncBytes), reasonSuffix(st.Reason))
	}
	// IO stops: the handover begins (volstate.Demote); it ends with
	// HandedOver, or HandoverAborted reopens IO as it was. The handover's
	// IO (HandOverIO) is done here.
	if err := v.drive(volstate.Demote{To: to}, driveOptions{}); err != nil {
		return 0, replication.Generation{}, fmt.Errorf("%s on %s: %w", v.name, v.self, err)
	}
	reopen := func(err error) (uint64, replication.Generation, error) {
		if aerr := v.drive(volstate.HandoverAborted{}, driveOptions{}); aerr != nil {
			v.log.Error("reopen IO after a failed handover", "err", aerr)
		}
		return 0, replication.Generation{}, err
	}
	// A client that attached just before IO stopped is refused too.
	if err := v.switchoverClientsError(to); err != nil {
		return reopen(err)
	}
	v.node.nbd.CloseExport(v.name)
	v.iopath.io.Wait()
	if err := v.flushAll(true); err != nil {
		return reopen(err)
	}
	if !waitUntil(ctx, v.clock, 5*time.Second, &v.changed, inSync) {
		return reopen(fmt.Errorf("%s fell out of sync during the handover", to))
	}
	// Until the new primary's stream arrives, point NBD clients at it.
	// The drive then stops the senders, gives the lease back (the new
	// primary need not wait it out), and, every write being on both
	// disks, clears the primary indicator: no activity log to apply
	// after a crash from here on.
	var gen replication.Generation
	var epoch uint64
	err := v.drive(volstate.HandedOver{}, driveOptions{
		notify: func(a volstate.Action) {
			v.log.Info("demoted", "to", a.Peer, "epoch", a.Epoch)
			v.node.event(v.name, "demoted", fmt.Sprintf("%s handed %s over to %s at epoch %d", v.self, v.name, a.Peer, a.Epoch))
		},
		install: func(c volstate.Change) {
			// What was handed over: the generation and the epoch this
			// node held as the step was taken.
			gen, epoch = c.Old.Durable.Gens.Current, c.Old.Durable.Epoch
			// The switchover has raft record the peer UpToDate next
			// (switchoverByRaft): what this node remembers of its
			// Outdated records no longer holds, should it take the
			// volume back (retake) and a peer miss a write again.
			v.authority.forgetAllLocked()
		},
	})
	if err != nil {
		return reopen(err)
	}
	return epoch, gen, nil
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// promote makes this node primary at epoch. It must hold exactly the
// data the old primary handed over (gen); the primary indicator and the
// epoch are durable BEFORE the first write is accepted (volstate.Promote).
func (v *Volume) promote(epoch uint64, gen replication.Generation) error {
	v.mu.Lock()
	held, seen := v.st.Durable.Gens.Current, v.st.Durable.Epoch
	v.mu.Unlock()
	v.handedOver.Store(true)
	err := v.drive(volstate.Promote{Epoch: epoch, Gen: gen, Now: v.clock.Now()}, driveOptions{notify: func(a volstate.Action) {
		v.log.Info("promoted", "epoch", a.Epoch)
		v.node.event(v.name, "promoted", fmt.Sprintf("%s is primary for %s at epoch %d", v.self, v.name, a.Epoch))
	}})
	switch {
	case errors.Is(err, volstate.ErrAlreadyPrimary):
		return fmt.Errorf("%s is already primary on %s at epoch %d", v.name, v.self, seen)
	case errors.Is(err, volstate.ErrNotUpToDate):
		return fmt.Errorf("%s on %s holds generation %s, the primary handed over %s: this copy is not up to date, refusing to promote it", v.name, v.self, held, gen)
	case errors.Is(err, volstate.ErrStaleEpoch):
		return fmt.Errorf("stale epoch %d: %s has seen epoch %d", epoch, v.self, seen)
	}
	return err
}

// fence stops this primary's IO because a primary of a newer epoch exists
// (one writer): requests in flight complete, new ones fail. It stays
// Primary until that primary reaches it, then steps down, or finds a split
// brain. A peer that takes this node's stream again lifts the fence.
func (v *Volume) fence(epoch uint64, why string) {
	err := v.drive(volstate.NewerPrimary{Epoch: epoch}, driveOptions{
		texts: func(volstate.Cause) reason { return because(CauseFenced, "fenced: %s", why) },
		notify: func(volstate.Action) {
			v.log.Warn("fenced: a primary of a newer epoch exists; IO stopped", "reason", why)
			v.node.event(v.name, "fenced", fmt.Sprintf("%s stops IO: %s", v.self, why))
		},
	})
	if err != nil {
		v.log.Error("fence", "err", err)
	}
}

// stepDown makes a primary Secondary because a primary of a newer epoch
// reached it (h) and the generations say no data is lost by following it:
// requests in flight are answered, new ones are refused, and what this
// node changed stays marked for the new primary to copy. A write that
// completed since that comparison may have started a new generation, so
// once no write is in flight the comparison is made again; if it now finds
// a split brain, this node stops its IO (the newer epoch wins) and stays
// primary, and the caller refuses the stream as a split brain. One
// transition with yieldTo (volstate.PrimaryReached, then Quiesced).
func (v *Volume) stepDown(h replication.Hello) error {
	if v.roleNow() != replication.Primary {
		return nil
	}
	return v.drive(v.reached(h), driveOptions{
		texts: func(c volstate.Cause) reason {
			if c == volstate.CauseUnrelated {
				return because(CauseUnrelated, "unrelated data: %s and %s share no generation; %s is primary at the newer epoch %d: this node's IO stopped", v.self, h.From, h.From, h.Epoch)
			}
			return because(CauseFenced, "fenced: %s is primary at the newer epoch %d and the data diverged", h.From, h.Epoch)
		},
		notify: func(a volstate.Action) {
			switch a.Detail {
			case "fenced":
				why := fmt.Sprintf("%s is primary at the newer epoch %d and the data diverged", h.From, h.Epoch)
				v.log.Warn("fenced: a primary of a newer epoch exists; IO stopped", "reason", why)
				v.node.event(v.name, "fenced", fmt.Sprintf("%s stops IO: %s", v.self, why))
			case "stepped-down":
				v.log.Warn("stepped down: a primary of a newer epoch took over", "primary", a.Peer, "epoch", a.Epoch)
				v.node.event(v.name, "stepped-down", fmt.Sprintf("%s is Secondary: %s is primary at epoch %d and nothing is lost by following it", v.self, a.Peer, a.Epoch))
			}
		},
	})
}

// roleNow is the volume's role.
func (v *Volume) roleNow() replication.Role { return v.state().role() }

// setAdminDown disconnects (down) or reconnects this node's replication of
// the volume, as the operator asked.
func (v *Volume) setAdminDown(down bool) {
	var e volstate.Event = volstate.Connect{}
	if down {
		e = volstate.Disconnect{}
	}
	err := v.drive(e, driveOptions{
		texts: func(volstate.Cause) reason { return because(CauseAdminDown, "disconnected by operator") },
		notify: func(a volstate.Action) {
			ev := statefile.Event{Volume: v.name, Kind: a.Detail, Message: fmt.Sprintf("%s %s by the operator", v.self, a.Detail)}
			if down {
				ev.Reason = string(CauseAdminDown)
			}
			v.node.emit(ev)
		},
	})
	if err != nil {
		v.log.Error("operator's connect or disconnect", "down", down, "err", err)
		return
	}
	if down {
		for _, p := range v.streamingPeers() {
			p.askUpdate(func(pv *peerView) { pv.why = because(CauseAdminDown, "disconnected by operator") })
		}
	}
}

// resetPeersLocked gives a new primary fresh senders for every peer,
// started unless the operator disconnected this node (then they only
// track what the peers miss).
func (v *Volume) resetPeersLocked() {
	old := v.peers.byName
	v.peers.byName = map[string]*peer{}
	for name := range v.cfg.Disks {
		if name != v.self {
			p := newPeer(v, name)
			if q := old[name]; q != nil {
				// Its streams number on from the old sender's: the rules
				// know a stream by its number alone (a sync-done's ack,
				// volstate.ResyncFinished), and one of the old sender's
				// may still end.
				p.sessions.Store(q.sessions.Load())
			}
			v.peers.byName[name] = p
		}
	}
	v.peers.rebuildListLocked()
	if !v.st.AdminDown {
		v.startPeersLocked()
	}
}

// noteSplitBrainLocked installs a split brain the rules found with peer
// (by rule). Callers hold v.mu.
func (v *Volume) noteSplitBrainLocked(peer, rule string) {
	p := v.st.Peers[peer]
	p.SplitBrainRule = rule
	v.st.Peers[peer] = p
}

// splitBrainReasonLocked is the reason a node in a split brain gives
// whatever its role (a zero reason when it is in none): a step-down does
// not resolve one. Callers hold v.mu.
func (v *Volume) splitBrainReasonLocked() reason {
	for peer, p := range v.st.Peers {
		rule := p.SplitBrainRule
		if rule == "" {
			continue
		}
		return because(CauseSplitBrain, "split-brain: %s and %s both changed %s since their last common generation (%s); resolve with replctl connect %s --discard-my-data --node VICTIM", v.self, peer, v.name, replication.RuleWords(rule), v.name)
	}
	return reason{}
}

// retake makes this node primary again at epoch after a switchover that
// raft did not record: it handed over gen, and raft still names it
// (volstate.Retake).
func (v *Volume) retake(epoch uint64, gen replication.Generation) error {
	v.handedOver.Store(false)
	e := volstate.Retake{Epoch: epoch, Gen: gen}
	if cl := v.node.cl; cl != nil {
		if va, ok := cl.c.Authority().Volume(v.name); ok {
			e.AuthorityKnown, e.AuthorityPrimary, e.AuthorityEpoch = true, va.Primary, va.Epoch
		}
	}
	v.mu.Lock()
	held, seen := v.st.Durable.Gens.Current, v.st.Durable.Epoch
	v.mu.Unlock()
	err := v.drive(e, driveOptions{notify: func(a volstate.Action) {
		v.node.event(v.name, "primary-again", fmt.Sprintf("%s took %s back at epoch %d: the switchover was not recorded", v.self, v.name, a.Epoch))
	}})
	switch {
	case errors.Is(err, volstate.ErrCannotTakeBack):
		return fmt.Errorf("%s on %s: cannot take back epoch %d generation %s (it holds epoch %d, generation %s)", v.name, v.self, epoch, gen, seen, held)
	case errors.Is(err, volstate.ErrRaftNamesOther):
		return fmt.Errorf("%s on %s: raft names %s primary at epoch %d: not taking it back", v.name, v.self, e.AuthorityPrimary, e.AuthorityEpoch)
	}
	return err
}

// quiesce is the first half of a step down: the NBD export closes (its
// clients have 10 s to finish), IO in flight drains, the peers stop, and
// the bitmaps are flushed, all BEFORE the state may name another primary.
// The error is the flush's.
func (v *Volume) quiesce() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	v.node.nbd.CloseExportContext(ctx, v.name)
	cancel()
	v.iopath.io.Wait()
	v.stopPeers()
	return v.durable.md.FlushBitmaps()
}
