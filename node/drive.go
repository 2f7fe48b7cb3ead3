package node

import (
	"context"
	"fmt"
	"time"

	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// The driver of the volume's state machine (node/volstate): a role
// changes only through drive, which steps the machine with an event,
// writes what the step must make durable (the primary indicator when it
// is set, then the durable state, through commit) BEFORE the new state is
// installed, and only then performs the step's actions. When a write
// fails, nothing changes and no action is performed. The order is
// volstate's (Drive, Take), which the simulation runs too; this file is
// the volume's side of it (volumeSteps: its state, metadata, locks and
// actions), so a change to the order is made, and tested, there once.

// modelLocked is the volume as its state machine sees it: a copy of v.st
// that shares nothing with it (every peer's replication state, stream and
// pull among it), with the facts the rules read: whether the volume
// stops, whether each peer is in sync and whether its bitmap holds bits,
// whether a peer's stream ended already (its writes go to the bitmap from
// its end on, off the loop: route; the rules step its loss when the link
// tells it), whether the local disk misses blocks, and whether a raft
// leader answers this node. A step takes them under v.stateMu, so a
// check of them is the step's own: what a caller saw before it may have
// changed. Callers hold v.mu.
func (v *Volume) modelLocked() volstate.State {
	s := v.st.Clone()
	s.Stopping = isClosed(v.stopping)
	s.LocalMissing = v.durable.localMissing.Count() > 0
	s.NoRaftLeader = v.node.cl != nil && !v.node.cl.c.HasLeader()
	for name, mp := range s.Peers {
		mp.InSync, mp.Marked = false, false
		if p := v.peers.byName[name]; p != nil {
			if p.session() == nil && mp.Repl != replication.StandAlone {
				mp.Repl = replication.Connecting
			}
			mp.InSync, mp.Marked = p.inSync(), p.bm.Count() > 0
		}
		s.Peers[name] = mp
	}
	return s
}

// installLocked takes what the step from old to next changed (and only
// that: a field another goroutine changed meanwhile stays as it is), on
// the volume's loop, the one writer of its state (the deadlock build
// checks it), and publishes the peers' states to their views. The
// durable state is commit's to install, and the facts (modelLocked) are
// never installed. Callers hold v.mu.
func (v *Volume) installLocked(old, next volstate.State, rd volstate.Ready, texts func(volstate.Cause) reason) {
	v.loop.Check("a change of the state of volume", v.name)
	if next.Serving != old.Serving {
		v.st.Serving = next.Serving
	}
	if next.Disk != old.Disk {
		v.st.Disk = next.Disk
	}
	for name, p := range next.Peers {
		if rule := p.SplitBrainRule; rule != "" && rule != old.Peers[name].SplitBrainRule {
			v.noteSplitBrainLocked(name, rule)
		}
	}
	if next.Why != old.Why {
		var r reason
		switch {
		case next.Why == volstate.CauseNone:
		case next.Why == volstate.CauseSplitBrain:
			// The step's own words when it has some for it (a policy that
			// names a victim, a refusal's answer), else the usual ones.
			r = v.splitBrainReasonLocked()
			if texts != nil {
				if t := texts(next.Why); t.cause == CauseSplitBrain {
					r = t
				}
			}
		case texts != nil:
			r = texts(next.Why)
		default:
			panic(fmt.Sprintf("volume %s: a step set the cause %q and no text for it", v.name, next.Why))
		}
		// The cause is the words' (which name the step's cause).
		v.st.Why, v.whyText = volstate.Cause(r.cause), r.text
	}
	if next.CrashedPrimary != old.CrashedPrimary {
		v.st.CrashedPrimary = next.CrashedPrimary
	}
	if next.AdminDown != old.AdminDown {
		v.st.AdminDown = next.AdminDown
	}
	if next.LeaseEpoch != old.LeaseEpoch {
		v.st.LeaseEpoch = next.LeaseEpoch
	}
	if !next.LeaseUntil.Equal(old.LeaseUntil) {
		v.st.LeaseUntil = next.LeaseUntil
		v.authority.wakeLeaseWaitersLocked()
	}
	v.st.KnownEpoch = max(v.st.KnownEpoch, next.KnownEpoch)
	v.st.Pending = next.Pending
	if next.Discard != old.Discard {
		// A discard's words (v.discard) are its step's caller's to give
		// (driveOptions.install, which runs after this).
		v.st.Discard = next.Discard
		if !next.Discard {
			v.discard = nil
		}
	}
	for name, p := range next.Peers {
		q, ok := v.st.Peers[name]
		if !ok {
			continue
		}
		o := old.Peers[name]
		if o.SplitBrainRule != "" && p.SplitBrainRule == "" {
			q.SplitBrainRule = ""
		}
		if p.Repl != o.Repl || p.Session != o.Session || p.Pulling != o.Pulling {
			q.Repl, q.Session, q.Pulling = p.Repl, p.Session, p.Pulling
		}
		v.st.Peers[name] = q
	}
	for _, a := range rd.Actions {
		if a.Kind == volstate.ResetPeers {
			// Fresh senders in the same step as the new role.
			v.resetPeersLocked()
		}
	}
	v.publishPeersLocked()
	v.publishLocked()
	v.changed.notify()
}

// publishPeersLocked publishes each peer's state in the machine (v.st.Peers:
// its replication state, its stream, whether this primary pulls from it)
// to its view and its pulling flag, which the write path, status and the
// metrics read without a lock. It runs in a step's install (and where a
// peer is made, newPeer), the one writer of them. Callers hold v.mu.
func (v *Volume) publishPeersLocked() {
	for name, p := range v.peers.byName {
		st := v.st.Peers[name]
		if pv := p.snapshot(); pv.state != st.Repl || pv.sid != st.Session {
			p.update(func(pv *peerView) { pv.state, pv.sid = st.Repl, st.Session })
		}
		if p.pulling.Swap(st.Pulling) != st.Pulling {
			v.changed.notify()
		}
	}
}

// driveOptions says how a role function's steps read: the texts of the
// causes they set and of the events they record, and what a drain that
// failed means.
type driveOptions struct {
	// texts gives the reason for a cause the steps set, other than none
	// and a split brain (which have their usual reasons); nil when they
	// set no other.
	texts func(volstate.Cause) reason
	// notify logs and records a Notify action.
	notify func(volstate.Action)
	// drainFailed says whether a step-down goes on after its drain failed
	// (the bitmaps could not be flushed); it returns the error otherwise.
	drainFailed func(error) bool
	// install runs under v.mu right after the install of a step's new
	// state, whether the step wrote or not (not after a step whose write
	// failed): it sees the change the step made.
	install func(volstate.Change)
	// refused words, under v.mu and on the state as it was before the
	// step, a refusal (RefuseStream) the step decided, BEFORE the step's
	// cause is worded (texts may give those words).
	refused func(volstate.Action)
}

// drive runs e through the volume's state machine by the driver's order
// (volstate.Drive) on the volume's loop (node/volloop), and performs what it
// says, feeding Quiesced back once the IO a pending change waited for has
// drained. The steps' preparations that wait for the senders or the
// incoming stream are done first, off the loop and without v.stateMu
// (those take it); the step is then taken again on the loop under
// v.stateMu, on the state as it is by then (volstate.Take), and its
// actions are performed once v.stateMu is released, those that wait off
// the loop (volumeSteps.OffLoop). The caller gets the result of e and of
// what followed it, as volstate.Drive gives it; volloop.ErrClosed once the
// volume closes.
func (v *Volume) drive(e volstate.Event, opts driveOptions) error {
	return v.loop.Drive(&volumeSteps{v: v, opts: opts}, e)
}

// stepLocked steps the state machine with e (volstate.Take): the
// preparations that need no wait, then the writes (the indicator, then the
// state through commit, which installs the new state in the same step),
// and returns the actions. Callers hold v.stateMu.
func (v *Volume) stepLocked(e volstate.Event, texts func(volstate.Cause) reason, install func(volstate.Change)) ([]volstate.Action, error) {
	return volstate.Take(&volumeSteps{v: v, opts: driveOptions{texts: texts, install: install}}, e)
}

// volumeSteps is the volume as volstate's driver runs it
// (volstate.Effects): its state as the machine sees it (modelLocked), its
// metadata, its install, v.stateMu around a step, and the actions. One is
// made for each drive (which the volume's loop runs) or stepLocked (on
// the goroutine that calls it); its queue holds what follows the drive's
// event (Quiesced). The loop calls it from one goroutine at a time: its
// own, or the one a wait runs on (OffLoop), never both at once.
type volumeSteps struct {
	v      *Volume
	opts   driveOptions
	follow []volstate.Event
}

func (d *volumeSteps) State() volstate.State {
	d.v.mu.Lock()
	defer d.v.mu.Unlock()
	return d.v.modelLocked()
}

func (d *volumeSteps) Lock()   { d.v.stateMu.Lock() }
func (d *volumeSteps) Unlock() { d.v.stateMu.Unlock() }

// Prepare: the waiting preparations run before v.stateMu is taken (stopPeers
// and detachIncoming take it); the activity log's marks are written under
// it, BEFORE the state that needs them.
func (d *volumeSteps) Prepare(a volstate.Action) error {
	switch a.Kind {
	case volstate.StopPeers:
		d.v.stopPeers()
	case volstate.DetachIncoming:
		d.v.detachIncoming()
	case volstate.MarkActivityLog:
		return d.v.markActivityLog(a.Peer)
	default:
		panic(fmt.Sprintf("volume %s: no driver for the preparation %s", d.v.name, a))
	}
	return nil
}

func (d *volumeSteps) SetIndicator() error {
	if err := d.v.durable.md.SetPrimary(true); err != nil {
		return err
	}
	d.v.durable.primarySets.Add(1)
	return nil
}

func (d *volumeSteps) Commit(c volstate.Change) error {
	// A disk's failure is recorded in the node's store alone: the
	// superblock is on the failing disk, which may not take it.
	_, failing := c.Event.(volstate.DiskFailed)
	return d.v.commitMirror(!failing, *c.Ready.Persist, d.v.size.Load(), func() {
		d.installLocked(c, d.opts.texts)
	})
}

func (d *volumeSteps) Install(c volstate.Change) {
	v := d.v
	texts := d.opts.texts
	if err := c.Err; err != nil {
		// What the failure itself changes (a primary that cannot record
		// a new generation stops its IO); nothing else.
		texts = func(volstate.Cause) reason {
			return because(CauseStateWriteFailed, "metadata write failed: %v", err)
		}
		if w, ok := c.Event.(volstate.WriteMissed); ok {
			texts = func(volstate.Cause) reason {
				return because(CauseStateWriteFailed, "%s could not record durably that %s misses writes (%v): IO stopped; fix the node's state directory or disk, then restart it", v.self, w.Peer, err)
			}
		}
	}
	v.mu.Lock()
	if c.Err != nil {
		v.installLocked(c.Old, c.Next, c.Ready, texts)
	} else {
		d.installLocked(c, texts)
	}
	v.mu.Unlock()
}

// installLocked installs c's new state with the drive's hooks: the
// refusals worded first (on the state before the step), the install, then
// the caller's own. Callers hold v.mu.
func (d *volumeSteps) installLocked(c volstate.Change, texts func(volstate.Cause) reason) {
	if d.opts.refused != nil {
		for _, a := range c.Ready.Actions {
			if a.Kind == volstate.RefuseStream {
				d.opts.refused(a)
			}
		}
	}
	d.v.installLocked(c.Old, c.Next, c.Ready, texts)
	if d.opts.install != nil {
		d.opts.install(c)
	}
}

// Perform: WaitIO and DrainIO wait for the IO (Quiesced follows them); a
// drain that failed ends the drive unless the role function goes on
// (drainFailed).
func (d *volumeSteps) Perform(a volstate.Action) error {
	switch a.Kind {
	case volstate.WaitIO:
		d.v.iopath.io.Wait()
	case volstate.DrainIO:
		if err := d.v.quiesce(); err != nil {
			if d.opts.drainFailed == nil || !d.opts.drainFailed(err) {
				return err
			}
		}
	default:
		d.v.perform(a, d.opts)
	}
	return nil
}

// OffLoop: the waits for the senders and the incoming stream, for the IO
// in flight, for the cluster and for the disk run off the volume's loop,
// by the one list node and the simulation share (volloop.OffLoop).
func (d *volumeSteps) OffLoop(a volstate.Action) bool { return volloop.OffLoop(a) }

// Refresh gives raft's word on the volume anew when the drive takes it
// again after a wait and this node's state machine has applied a newer
// epoch meanwhile (volstate.Refresher): the drive follows raft as it is,
// not as it was when the event was posted (the simulation, interleaved,
// seed 827: a promotion taken after its wait while raft had promoted
// another node at a newer epoch).
func (d *volumeSteps) Refresh(e volstate.Event) (volstate.Event, bool) {
	ae, ok := e.(volstate.AuthorityChanged)
	v := d.v
	if !ok || !ae.Known || v.node.cl == nil {
		return e, false
	}
	va, known := v.node.cl.c.Authority().Volume(v.name)
	if !known || va.Epoch <= ae.Epoch {
		return e, false
	}
	return volstate.AuthorityChanged{Known: true, Primary: va.Primary, Epoch: va.Epoch, Now: v.clock.Now(), Failover: va.FailedOverAt(va.Epoch)}, true
}

func (d *volumeSteps) Follow(e volstate.Event) { d.follow = append(d.follow, e) }

func (d *volumeSteps) Next() (volstate.Event, bool) {
	if len(d.follow) == 0 {
		return nil, false
	}
	e := d.follow[0]
	d.follow = d.follow[1:]
	return e, true
}

// clearPrimary is a step-down's ClearPrimaryIndicator, off the loop:
// every write done is made durable (the disk synced, the bitmaps and the
// checksums out), THEN the indicator goes off. The loop takes other
// steps meanwhile: one that made this node primary again (the operator's
// force) set the indicator for its own writes, which this sync did not
// cover and a crash would leave without their activity log's resync, and
// their checksums not computed again. So the indicator goes off, under
// the steps' lock, only while no set came since the sync began and the
// node is not primary; else it stays, the next step-down's to clear.
func (v *Volume) clearPrimary() error {
	sets := v.durable.primarySets.Load()
	var err error
	if !v.isDetached() {
		err = v.disk.Sync()
	}
	if err == nil {
		err = v.durable.md.FlushBitmaps()
	}
	if err == nil {
		// Once the indicator is off a crash rebuilds no checksum.
		err = v.durable.integ.flush()
	}
	if err != nil {
		return err
	}
	return v.clearPrimaryUnlessSetSince(sets)
}

// clearPrimaryUnlessSetSince clears the primary indicator unless it was
// set again after the count sets was read, or the node is primary.
func (v *Volume) clearPrimaryUnlessSetSince(sets uint64) error {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	if v.durable.primarySets.Load() != sets || v.state().role() == replication.Primary {
		v.log.Info("the primary indicator stays set: this node was made primary again since it stepped down")
		return nil
	}
	return v.durable.md.SetPrimary(false)
}

// perform does one action of a step.
func (v *Volume) perform(a volstate.Action, opts driveOptions) {
	switch a.Kind {
	case volstate.ResetPeers:
		// Done with the install.
	case volstate.StartPeers:
		v.mu.Lock()
		v.startPeersLocked()
		v.mu.Unlock()
	case volstate.StopPeers:
		v.stopPeers()
	case volstate.DetachIncoming:
		v.detachIncoming()
	case volstate.Reattach:
		v.bg.Add(1)
		go func() {
			defer v.bg.Done()
			v.reattachLoop()
		}()
	case volstate.ClearLocalMissing:
		v.durable.localMissing.ClearRange(0, v.size.Load())
	case volstate.StartLease:
		v.ensureLeaseLoop(a.Epoch)
	case volstate.StopLease:
		v.stopLease()
	case volstate.ReleaseLease:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := v.node.cl.c.ReleaseLease(ctx, v.name, a.Epoch); err != nil {
			v.log.Warn("release the lease", "err", err)
		}
		cancel()
	case volstate.ClearPrimaryIndicator:
		// Every write is done: the data durable on the local disk and
		// the bitmaps out, THEN the indicator off. The new primary's
		// FLUSH counts this node's disk as holding what it wrote as
		// primary (a stream to it marks only what it acknowledges from
		// now on), so what this node's page cache still holds must not
		// be lost to a power loss once the indicator no longer says this
		// node's activity log needs a resync. The role changed already;
		// a failure leaves the indicator set, which costs a resync of
		// the activity log after a crash.
		if err := v.clearPrimary(); err != nil {
			v.log.Error("clear the primary indicator", "err", err)
		}
	case volstate.Propose:
		switch a.Detail {
		case "init":
			v.proposeOnce("init", replication.InitCommand(v.name, v.self, a.Epoch, v.dataNodes()))
		case "reclaim":
			v.proposeOnce("reclaim", replication.FailoverCommand(v.name, a.Epoch, v.self, true, v.clock.Now().UTC(), "forced by the operator while raft had no quorum"))
		}
	case volstate.RunHook:
		v.runHook(a.Detail, a.Epoch)
	case volstate.Notify:
		if opts.notify != nil {
			opts.notify(a)
		}
	case volstate.RefuseStream:
		// The stream's handler answers it (primaryReached).
	case volstate.HandOverIO:
		// demote, which drove Demote, hands the IO over.
	case volstate.CopyMissing:
		// The re-attach loop, which drove DiskWorks, copies it (copyBack).
	default:
		panic(fmt.Sprintf("volume %s: no driver for the action %s", v.name, a))
	}
}
