package volstate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/replvol/replvol/replication"
)

// Errors of refused operator commands (node wraps them in its own).
var (
	ErrNotPrimary      = errors.New("not primary")
	ErrAlreadyPrimary  = errors.New("already primary")
	ErrNotUpToDate     = errors.New("this copy is not up to date")
	ErrStaleEpoch      = errors.New("stale epoch")
	ErrMidResync       = errors.New("in the middle of a resync")
	ErrNotSplitBrain   = errors.New("not in a split brain")
	ErrStreaming       = errors.New("streams to a peer")
	ErrNoReplica       = errors.New("no such replica")
	ErrRaftNamesOther  = errors.New("raft names another primary")
	ErrCannotTakeBack  = errors.New("cannot take back the epoch")
	ErrNoPendingChange = errors.New("no role change pending")
	// ErrNoRaftLeader refuses raft's promotion of this node while no
	// raft leader answers it (State.NoRaftLeader): the promotion is
	// taken once one does, on raft's word as it is then.
	ErrNoRaftLeader = errors.New("no raft leader answers this node: raft may have named another primary since")
	// ErrNoGeneration refuses the end of a resync whose source named no
	// generation (it held none: a primary that pulls newer data from
	// another peer): the target would drop the generation its resync
	// resumes from, and be copied whole after the next interruption.
	ErrNoGeneration = errors.New("the resync's source named no generation")
	// ErrLocalMissing refuses the end of a copy into the local disk (a
	// re-attach's, LocalResyncFinished, or a pull's) while the disk still
	// misses blocks (State.LocalMissing): a write marked them after the
	// copy passed them, and the copy goes again.
	ErrLocalMissing = errors.New("the local disk still misses blocks")
	// ErrNotAttaching refuses the end of a re-attach when the disk is not
	// being re-attached (not Inconsistent): an IO failed meanwhile and
	// took it out of service again.
	ErrNotAttaching = errors.New("the disk is not being re-attached")
	// ErrNotInSync refuses the end of a resync as source when the peer is
	// not in sync as the step is taken: the stream that acknowledged is
	// no longer the peer's, the generation it acknowledged is not the
	// current one, or blocks are marked for it.
	ErrNotInSync = errors.New("the peer is not in sync")
)

// StreamsToPeer refuses a discard of a primary's data while it streams
// to Peer: it is not the victim of a split brain. It is ErrStreaming.
type StreamsToPeer struct{ Peer string }

func (e *StreamsToPeer) Error() string { return ErrStreaming.Error() + " " + e.Peer }

// Is makes a StreamsToPeer ErrStreaming.
func (e *StreamsToPeer) Is(target error) bool { return target == ErrStreaming }

// Step is the volume's rules: the state after e, and what must be
// written (BEFORE anything else) and done. It changes nothing in s.
func Step(s State, e Event) (State, Ready) {
	s = s.Clone()
	if s.Peers == nil {
		s.Peers = map[string]Peer{}
	}
	var rd Ready
	switch e := e.(type) {
	case Opened:
		rd = s.opened()
	case Started:
		rd = s.start()
	case ResyncStarted:
		rd.Persist = s.persist(func(d *Durable) { d.Gens, d.SyncGen = d.Gens.Inconsistent(), e.From })
		s.Disk = replication.Inconsistent
	case ReplicaWriteFailed:
		s.Disk, s.Why = replication.Failed, CauseDiskFailed
		rd.Actions = []Action{{Kind: Notify, Detail: "apply-failed"}}
	case IncomingEnded:
		if s.Disk != replication.Failed {
			s.Disk = s.IdleDisk()
		}
	case SplitBrainFound:
		if p, ok := s.Peers[e.Peer]; ok {
			p.SplitBrainRule = e.Rule
			if p.SplitBrainRule == "" {
				p.SplitBrainRule = RuleTwoPrimaries
			}
			s.Peers[e.Peer] = p
			s.Why = CauseSplitBrain
		}
	case PeerConnected:
		rd = s.peerConnected(e)
	case PrimaryReached:
		rd = s.primaryReached(e)
	case NewerPrimary:
		rd = s.fence(e.Epoch)
	case PeerAnswered:
		rd = s.peerAnswered(e.Peer, e.Pulling)
	case StreamEvent:
		name, _ := e.Stream()
		if p, ok := s.Peers[name]; ok {
			s.Peers[name] = p.Streamed(e, s.AdminDown || s.Stopping)
		}
	case LinkStarted:
		if p, ok := s.Peers[e.Peer]; ok {
			p.Repl, p.Pulling = replication.Connecting, false
			s.Peers[e.Peer] = p
		}
	case LinkDown:
		if p, ok := s.Peers[e.Peer]; ok {
			s.Peers[e.Peer] = p.Streamed(PeerLost{Peer: e.Peer, Session: p.Session}, e.ForGood)
		}
	case AuthorityChanged:
		rd = s.followAuthority(e)
	case LeaseRenewed:
		if s.LeaseEpoch == e.Epoch && e.Epoch == s.Durable.Epoch && e.Until.After(s.LeaseUntil) {
			s.LeaseUntil = e.Until
			if s.Serving == OpenWithoutLease {
				s.Serving = Open
			}
		}
	case DiskFailed:
		rd = s.detach()
	case AttachFailed:
		if s.Disk == replication.Inconsistent && s.Durable.LocalStale {
			s.Disk, s.Why = replication.Diskless, CauseDetached
		}
	case DiskWorks:
		if s.Disk == replication.Diskless {
			s.Disk, s.Why = replication.Inconsistent, CauseDetached
			rd.Actions = []Action{{Kind: Notify, Detail: "attaching"}, {Kind: CopyMissing}}
		}
	case LocalResyncFinished:
		rd = s.localResyncFinished()
	case WriteMissed:
		rd = s.writeMissed(e)
	case ResyncFinished:
		rd = s.resyncFinished(e)
	case Quiesced:
		rd = s.quiesced()
	case HandedOver:
		rd = s.handedOver()
	case HandoverAborted:
		if p := s.Pending; p != nil && p.Kind == PendingHandover {
			s.Pending = nil
			if s.Serving == Stopped {
				// Unless a newer primary fenced it meanwhile.
				s.Serving = p.Was
			}
		}
	case Promote:
		rd = s.promote(e)
	case Retake:
		rd = s.retake(e)
	case Force:
		rd = s.force(e)
	case Demote:
		rd = s.demote(e)
	case DiscardMyData:
		rd = s.discardMyData()
	case Disconnect:
		rd = s.setAdminDown(true)
	case Connect:
		rd = s.setAdminDown(false)
	case Stop:
		// The lease runs out by itself: requests in flight complete
		// under it while the export drains.
		s.Stopping, s.Serving = true, Stopped
		if e.Removed {
			// The export drains its clients under the lease.
			s.Why = CauseRemoved
			break
		}
		rd.Actions = []Action{{Kind: StopLease}}
	default:
		panic(fmt.Sprintf("volstate: unknown event %T", e))
	}
	return s, rd
}

// persist makes d the durable state and returns it for Ready.Persist.
func (s *State) persist(change func(*Durable)) *Durable {
	d := s.Durable.Clone()
	change(&d)
	s.Durable = d
	c := d.Clone()
	return &c
}

// opened takes the durable state the node loaded: a disk that was
// detached and missed writes comes back Inconsistent and Secondary,
// whatever its role was (durably, before anything else), and the disk
// state is an idle one.
func (s *State) opened() Ready {
	var rd Ready
	if s.Durable.LocalStale {
		rd.Persist = s.persist(func(d *Durable) {
			d.Gens = d.Gens.Inconsistent()
			if d.Primary == s.Self {
				d.Primary = ""
			}
		})
		rd.Actions = []Action{{Kind: Notify, Detail: "stale-disk"}}
	}
	s.Disk = s.IdleDisk()
	return rd
}

// start begins serving the role the node woke up with. A node that was
// primary before this start serves no IO until a peer (or raft) has
// compared generations and epochs with it: a newer primary may have
// taken over while it was away.
func (s *State) start() Ready {
	if s.Role() != replication.Primary {
		return Ready{}
	}
	rd := Ready{Indicator: SetIndicator, Actions: []Action{{Kind: StartPeers}}}
	s.linksStarted()
	switch {
	case s.Durable.Gens.Current.IsZero():
		s.Serving, s.Why = Stopped, CauseWaitingForPeer
	case s.Auth && !s.Fresh:
		s.Serving, s.Why = Waiting, CauseWaitingForPeer
		rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: "waiting-for-peer"})
	case !s.Fresh && len(s.Peers) > 0:
		s.Serving, s.Why = Waiting, CauseWaitingForPeer
		rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: "waiting-for-peer"})
	default:
		s.Serving = Open
	}
	return rd
}

// servable reports whether nothing but waiting or fencing keeps this
// primary from serving.
func (s *State) servable() bool {
	return s.Role() == replication.Primary && !s.Discard && s.Why != CauseStateWriteFailed && !s.Stopping
}

// fence stops this primary's IO because a primary of a newer epoch
// exists (one writer). It stays primary until that primary reaches it.
func (s *State) fence(epoch uint64) Ready {
	s.KnownEpoch = max(s.KnownEpoch, epoch)
	if s.Role() != replication.Primary || s.Serving == Fenced {
		return Ready{}
	}
	s.Serving, s.Why = Fenced, CauseFenced
	return Ready{Actions: []Action{{Kind: Notify, Detail: "fenced", Epoch: epoch}}}
}

// peerConnected is a primary's handshake decided (replication.CompareUUIDs,
// DRBD's table): the peer's state, what the resync starts from, durably,
// or a refusal (a RefusePeer action with its cause). The peer's answer that
// lifts a wait or a fence is PeerAnswered, which the driver steps once the
// stream carries writes.
func (s *State) peerConnected(e PeerConnected) Ready {
	if s.Role() != replication.Primary {
		return Ready{}
	}
	p := s.Peers[e.Peer]
	p.Session, p.Pulling = e.Session, false
	refuse := func(rule string, why Cause) Ready {
		p.Repl = replication.StandAlone
		s.Peers[e.Peer] = p
		return Ready{Actions: []Action{{Kind: RefusePeer, Detail: rule, Peer: e.Peer, Cause: why}}}
	}
	if e.PeerPrimary && e.PeerEpoch > s.Durable.Epoch {
		// A primary of a newer epoch: this one stops its IO and waits
		// for it to connect (then steps down), split brain or not.
		d := replication.CompareUUIDs(s.UUIDs(e.Peer), e.UUIDs, replication.Secondary, replication.Primary)
		if d.Outcome.IsSplitBrain() {
			p.SplitBrainRule = d.Rule
		}
		rd := refuse("newer-epoch", CauseFenced)
		rd.Actions = append(rd.Actions, s.fence(e.PeerEpoch).Actions...)
		return rd
	}
	d := replication.CompareUUIDs(s.UUIDs(e.Peer), e.UUIDs, replication.Primary, replication.Secondary)
	if e.PeerOutdated {
		d = d.TowardOutdated()
	}
	var rd Ready
	switch {
	case e.DiscardFrom:
		if s.Durable.Gens.Current.IsZero() {
			return refuse("no-source", CauseNoSource)
		}
		p.Repl = replication.SyncSource
		rd = s.startResync(e)
	case d.Outcome == replication.UnrelatedData:
		return refuse(d.Rule, CauseUnrelated)
	case d.Outcome.IsSplitBrain():
		p.SplitBrainRule = d.Rule
		return refuse(d.Rule, CauseSplitBrain)
	case s.pullsFrom(e.Peer):
		// One pull at a time: while this primary copies from another
		// peer it holds no generation to hand a peer, and every peer
		// would look newer (just-created-self, a second pull). The peer
		// is decided once that pull ends (node connects it again).
		return refuse(d.Rule, CausePulling)
	case d.Outcome.IsTarget():
		if e.PeerDisk != replication.UpToDate && e.PeerDisk != replication.Consistent {
			return refuse(d.Rule, CauseNoSource)
		}
		p.Repl, p.Pulling = replication.Connected, true
		rd.Persist = s.persist(func(x *Durable) {
			if !x.Gens.Current.IsZero() {
				x.SyncGen = x.Gens.Current
				x.Gens = x.Gens.Inconsistent()
			}
			delete(x.Gens.Bitmaps, e.Peer)
		})
		s.Disk, s.Why = replication.Inconsistent, CausePulling
		rd.Actions = []Action{{Kind: StartPull, Peer: e.Peer}}
	case s.Durable.Gens.Current.IsZero() && s.LocalMissing:
		// A pull cut off: this primary misses blocks of the newer data it
		// copies from a peer that is not here, and holds no generation
		// until that pull ends. The peer is decided then (node connects
		// it again), never taken for the source of what it may have
		// missed meanwhile.
		return refuse(d.Rule, CausePulling)
	case s.Durable.Gens.Current.IsZero():
		return refuse(d.Rule, CauseNoSource)
	case d.Outcome == replication.NoResync && e.PeerDisk == replication.Inconsistent:
		// The peer's disk holds part of a copy no generation accounts
		// for (a pull or a resync cut off whose plan is gone: a node
		// that pulled reports the generation it pulled from, equal to
		// this one's): nothing says which blocks it misses, so it is
		// copied whole, never counted in sync by generations alone
		// (DRBD: an Inconsistent peer is a sync target).
		p.Repl = replication.SyncSource
		rd = s.startResync(e)
		rd.Actions[0].Detail = FullResync
	case d.Outcome.IsSource() || e.Marked:
		p.Repl = replication.SyncSource
		if d.Rule == replication.RuleCrashedPrimary {
			s.crashedPrimaryCopies(e.NextGen)
		}
		rd = s.startResync(e)
	default:
		p.Repl = replication.Connected
	}
	s.Peers[e.Peer] = p
	return rd
}

// crashedPrimaryCopies: this primary went down as primary and is about
// to copy its activity log's blocks to a peer of the same generation (the
// rule crashed-primary). That copy changes the peer's data, and another
// peer may miss it (its copy fails at the start, it is away): were the
// generation kept, two peers would hold it with different data, and once
// this node is gone nothing would say what the one that missed the copy
// lacks (the sim's crashed-primary-fork). So the data moves on to next
// first, as a write that misses its peers does, durably with the resync's
// start (startResync's write holds it): every peer not tracked yet gets a
// bitmap generation of the old one (Generations.CrashedPrimaryCopies),
// and the copy is the resync of that bitmap (bitmap-self), after which
// the peer holds next. The crash is then accounted for by the generations:
// it no longer counts in a comparison (nor moves the data on again).
func (s *State) crashedPrimaryCopies(next replication.Generation) {
	peers := slices.Sorted(maps.Keys(s.Peers))
	s.persist(func(d *Durable) { d.Gens = d.Gens.CrashedPrimaryCopies(peers, next) })
	s.CrashedPrimary = false
}

// pullsFrom reports whether this primary copies newer data from a peer
// other than except.
func (s *State) pullsFrom(except string) bool {
	for name, p := range s.Peers {
		if p.Pulling && name != except {
			return true
		}
	}
	return false
}

// startResync records, durably, the generation the peer's copy will be
// (its bitmap generation, or a fresh one), so that an interrupted resync
// resumes from the bitmap.
func (s *State) startResync(e PeerConnected) Ready {
	g, ok := s.Durable.Gens.Bitmaps[e.Peer]
	if !ok || g.IsZero() {
		g = e.NextGen
	}
	return Ready{
		Persist: s.persist(func(x *Durable) { x.Gens = x.Gens.ResyncStartedAsSource(e.Peer, g) }),
		Actions: []Action{{Kind: StartResync, Peer: e.Peer}},
	}
}

// peerAnswered: a peer took this primary's stream, so no primary of a
// newer epoch holds that peer: a primary waiting for a peer, or fenced,
// serves again; in authority mode raft, not a peer, says so.
func (s *State) peerAnswered(peer string, pulling bool) Ready {
	p := s.Peers[peer]
	p.SplitBrainRule = ""
	s.Peers[peer] = p
	if s.Role() != replication.Primary || (s.Auth && (s.Serving == Waiting || s.Serving == Fenced)) {
		return Ready{}
	}
	held := s.Serving == Waiting || s.Serving == Fenced
	if held {
		s.Serving = Stopped
	}
	if s.Why == CauseWaitingForPeer || s.Why == CauseFenced || s.Why == CauseSplitBrain {
		s.Why = CauseNone
		if pulling {
			s.Why = CausePulling
		}
	}
	if !s.Serving.IsOpen() && (held || pulling) && s.servable() {
		s.Serving = Open
		if held {
			return Ready{Actions: []Action{{Kind: Notify, Detail: "serving", Peer: peer}}}
		}
	}
	return Ready{}
}

// primaryReached is the receiving side of a handshake with the primary
// From. An older primary reached by a primary of a newer epoch follows it
// (steps down) when nothing is lost by that, and stops its IO at once when
// the data diverged; a secondary records the newer epoch BEFORE it
// applies the first write of that primary.
func (s *State) primaryReached(e PrimaryReached) Ready {
	switch {
	case e.Misdirected:
		return s.refuseStream(e.From, replication.RefusedWrongNode, "", CauseRefused)
	case s.AdminDown:
		// The operator's disconnect stays the why.
		return Ready{Actions: []Action{{Kind: RefuseStream, Peer: e.From, Refusal: replication.RefusedAdminDown}}}
	case e.SizeDiffers:
		return s.refuseStream(e.From, replication.RefusedSize, "", CauseRefused)
	}
	if s.Role() == replication.Primary {
		if s.Discard {
			return Ready{}
		}
		if e.Epoch <= s.Durable.Epoch {
			return s.refuseOlderPrimary(e)
		}
		d := replication.CompareUUIDs(s.UUIDs(e.From), e.UUIDs, replication.Secondary, replication.Primary)
		if d.Outcome.IsSplitBrain() || d.Outcome == replication.UnrelatedData {
			// The newer epoch wins: this primary stops its IO, and
			// refuses the stream of data that diverged from its own.
			rd := s.fence(e.Epoch)
			refusal, why := replication.RefusedSplitBrain, CauseSplitBrain
			if d.Outcome == replication.UnrelatedData {
				refusal, why = replication.RefusedUnrelated, CauseUnrelated
			}
			rd.Actions = append(rd.Actions, s.refuseStream(e.From, refusal, d.Rule, why).Actions...)
			return rd
		}
		serving := s.Serving
		if serving.IsOpen() {
			serving = Stopped
		}
		return s.beginStepDown(e.From, e.Epoch, serving, s.Why, true, e.UUIDs)
	}
	if !s.Discard {
		d := replication.CompareUUIDs(s.UUIDs(e.From), e.UUIDs, replication.Secondary, replication.Primary)
		switch {
		case d.Outcome == replication.UnrelatedData:
			return s.refuseStream(e.From, replication.RefusedUnrelated, d.Rule, CauseUnrelated)
		case d.Outcome.IsSplitBrain():
			return s.refuseStream(e.From, replication.RefusedSplitBrain, d.Rule, CauseSplitBrain)
		case e.Epoch < s.Durable.Epoch:
			return s.refuseStream(e.From, replication.RefusedStaleEpoch, "", CauseRefused)
		case e.Epoch == s.Durable.Epoch && s.Durable.Primary != "" && s.Durable.Primary != e.From:
			return s.refuseStream(e.From, replication.RefusedOtherPrimary, "", CauseRefused)
		}
	}
	var rd Ready
	newTerm := s.Discard || e.Epoch > s.Durable.Epoch || s.Durable.Primary != e.From
	if newTerm && e.Epoch > s.Durable.Epoch && !e.HandedOver {
		rd.Prepare = s.reconcileWith(e.From)
	}
	if newTerm || s.Durable.Gens.TracksBesides(e.From) {
		// The stream's epoch and primary, and only the bitmap generation
		// toward it (Generations.Following), BEFORE its first write is
		// applied. (Not a new term: the same epoch and primary.)
		rd.Persist = s.persist(func(x *Durable) {
			x.Epoch, x.Primary = e.Epoch, e.From
			x.Gens = x.Gens.Following(e.From)
		})
	}
	// The stream is taken: nothing keeps this node from following it (a
	// split brain with From is over, and an earlier refusal too).
	p := s.Peers[e.From]
	p.SplitBrainRule = ""
	s.Peers[e.From] = p
	s.Why = CauseNone
	return rd
}

// refuseOlderPrimary is a primary's answer to the stream of a primary of
// its own epoch or an older one. The sender of an older epoch is a
// primary no longer (it crashed or was cut off, and this node took over):
// it compares as the Secondary it is about to be, and only a divergence
// of the data is a split brain, not two nodes that each remember being
// primary. A sender of the same epoch is a second primary: refused as a
// split brain.
func (s *State) refuseOlderPrimary(e PrimaryReached) Ready {
	older := e.Epoch < s.Durable.Epoch
	sender := replication.Primary
	if older {
		sender = replication.Secondary
	}
	d := replication.CompareUUIDs(s.UUIDs(e.From), e.UUIDs, replication.Primary, sender)
	switch {
	case older && !d.Outcome.IsSplitBrain():
		// This node reaches the old primary itself, which follows it.
		return Ready{Actions: []Action{{Kind: RefuseStream, Peer: e.From, Refusal: replication.RefusedNewerEpoch, Detail: RuleNewerEpoch}}}
	case d.Outcome == replication.UnrelatedData:
		return s.refuseStream(e.From, replication.RefusedUnrelated, d.Rule, CauseUnrelated)
	}
	return s.refuseStream(e.From, replication.RefusedSplitBrain, d.Rule, CauseSplitBrain)
}

// FullResync is the Detail of a StartResync that copies every block: the
// peer's disk is Inconsistent and the generations say nothing is to be
// copied (peerConnected).
const FullResync = "full"

// RuleTwoPrimaries is the split brain of two nodes that both took writes
// as primary, when the peer that found it named no generation rule.
const RuleTwoPrimaries = "two-primaries"

// RuleNewerEpoch names the refusal a primary of a newer epoch gives an
// older primary: the older one is fenced.
const RuleNewerEpoch = "newer-epoch"

// refuseStream refuses the stream of the primary from, by rule, and
// records why: a split brain with from is known until it connects.
func (s *State) refuseStream(from string, refusal replication.Refusal, rule string, why Cause) Ready {
	if why == CauseSplitBrain {
		p := s.Peers[from]
		p.SplitBrainRule = rule
		s.Peers[from] = p
	}
	s.Why = why
	return Ready{Actions: []Action{{Kind: RefuseStream, Peer: from, Refusal: refusal, Detail: rule, Cause: why}}}
}

// beginStepDown stops this primary's IO (serving: Stopped, or Fenced when
// raft named another) and has the driver drain it; Quiesced completes the
// step down. With recheck the requests in flight are answered first and
// the generations compared again, then the rest drains.
func (s *State) beginStepDown(to string, epoch uint64, serving Serving, why Cause, recheck bool, uuids replication.UUIDSet) Ready {
	s.Serving, s.Why = serving, why
	s.Pending = &Pending{Kind: PendingStepDown, To: to, Epoch: epoch, Recheck: recheck, UUIDs: uuids}
	if recheck {
		return Ready{Actions: []Action{{Kind: WaitIO}}}
	}
	return Ready{Actions: []Action{{Kind: DrainIO}}}
}

// quiesced completes the role change that waited for IO to drain.
func (s *State) quiesced() Ready {
	p := s.Pending
	if p == nil || p.Kind == PendingHandover {
		return Ready{}
	}
	if p.Kind == PendingDiscard {
		s.Pending = nil
		rd := Ready{Persist: s.persist(func(d *Durable) { d.Primary = "" })}
		s.becomeDiscarding()
		rd.Actions = []Action{{Kind: ClearPrimaryIndicator}, {Kind: RunHook, Detail: "on_demote", Epoch: s.Durable.Epoch}, {Kind: Notify, Detail: "discard-my-data"}}
		return rd
	}
	if p.Recheck {
		// A write that completed since the handshake may have started a
		// new generation: compare again; a divergence now is a split
		// brain, and the newer epoch wins. Otherwise the rest drains.
		d := replication.CompareUUIDs(s.UUIDs(p.To), p.UUIDs, replication.Secondary, replication.Primary)
		if d.Outcome.IsSplitBrain() || d.Outcome == replication.UnrelatedData {
			s.Pending = nil
			return s.fence(p.Epoch)
		}
		s.Pending = &Pending{Kind: PendingStepDown, To: p.To, Epoch: p.Epoch}
		return Ready{Actions: []Action{{Kind: DrainIO}}}
	}
	s.Pending = nil
	rd := Ready{Prepare: s.reconcileWith(p.To), Persist: s.persist(func(d *Durable) { d.Primary, d.Epoch = p.To, p.Epoch })}
	s.Serving, s.Why = Stopped, CauseNone
	s.stopPeers()
	if s.InSplitBrain() {
		// A step-down does not resolve a split brain.
		s.Why = CauseSplitBrain
	}
	s.Disk = s.IdleDisk()
	rd.Actions = []Action{{Kind: ClearPrimaryIndicator}, {Kind: Notify, Detail: "stepped-down", Peer: p.To, Epoch: p.Epoch}, {Kind: RunHook, Detail: "on_demote", Epoch: p.Epoch}}
	return rd
}

// followAuthority does what raft's state machine says.
func (s *State) followAuthority(e AuthorityChanged) Ready {
	role, epoch := s.Role(), s.Durable.Epoch
	if !e.Known {
		// Nobody registered the volume yet: its primary does.
		if role == replication.Primary {
			return Ready{Actions: []Action{{Kind: Propose, Detail: "init", Epoch: epoch}}}
		}
		return Ready{}
	}
	if !s.Auth {
		return Ready{}
	}
	var rd Ready
	switch {
	case s.Serving == OpenWithoutLease && role == replication.Primary && e.Epoch < epoch:
		// Forced to primary without a quorum: now that raft answers,
		// it records this node.
		rd = Ready{Actions: []Action{{Kind: Propose, Detail: "reclaim", Epoch: e.Epoch}}}
	case e.Primary == s.Self && e.Epoch > epoch && s.NoRaftLeader:
		// No stale promotion: raft named this node while it reached a
		// leader, but the node may have been cut off or paused since
		// (a wait for the old primary's stream to end, say) while raft
		// named another at a newer epoch. It is promoted on raft's word
		// as it is once a leader answers (Refresher).
		return Ready{Err: ErrNoRaftLeader}
	case e.Primary == s.Self && e.Epoch > epoch:
		rd = s.becomePrimary(e.Epoch, e.Now, true, e.Failover)
		if rd.Err != nil {
			// No stale promotion: the disk does not hold the data.
			rd = Ready{Actions: []Action{{Kind: Notify, Detail: "promotion-refused", Epoch: e.Epoch}}}
		}
		return rd
	case e.Primary == s.Self && e.Epoch == epoch && role == replication.Primary:
		rd.Actions = s.ensureLease(epoch)
		if s.Serving == Waiting && s.servable() && !s.Durable.Gens.Current.IsZero() {
			s.Serving = Open
			if s.Why == CauseWaitingForPeer {
				s.Why = CauseNone
			}
		}
	case e.Primary != s.Self && role == replication.Primary && e.Epoch >= epoch:
		if p := s.Pending; p != nil && p.Kind == PendingStepDown && p.To == e.Primary && p.Epoch == e.Epoch {
			// Its last attempt failed: drain and write again.
			return Ready{Actions: []Action{{Kind: DrainIO}}}
		}
		rd = s.beginStepDown(e.Primary, e.Epoch, Fenced, CauseFenced, false, replication.UUIDSet{})
		rd.Actions = append([]Action{{Kind: StopLease}}, rd.Actions...)
		s.LeaseEpoch, s.LeaseUntil = 0, time.Time{}
	case e.Primary != s.Self && e.Epoch > epoch:
		if mark := s.reconcileWith(e.Primary); mark != nil && e.Failover {
			// The old primary's stream is ended first: a write of it
			// applied after the log is marked would be in no mark.
			rd.Prepare = append([]Action{{Kind: DetachIncoming}}, mark...)
		}
		rd.Persist = s.persist(func(d *Durable) { d.Primary, d.Epoch = e.Primary, e.Epoch })
	}
	return rd
}

// reconcileWith is what a node prepares when it learns that primary took
// over from another without a handover (a failover; or this node, a
// primary, steps down for a newer one): its activity
// log marked toward the new primary BEFORE it records the change, and so
// before the new primary's first handshake, which reports the marks and
// has the primary copy them. A write of the old primary still in flight
// may have reached this node and not the new primary; and a primary that
// steps down may hold, in its log, writes it applied as a secondary of
// an earlier primary that the new one never got.
func (s *State) reconcileWith(primary string) []Action {
	if !Reconciles(s.Durable.Primary, s.Self, primary, len(s.Peers)) {
		return nil
	}
	return []Action{{Kind: MarkActivityLog, Peer: primary}}
}

// Reconciles says whether self, whose durable state names old primary and
// which has peers other data nodes, marks its activity log toward primary
// when it learns of it (from raft, from the new primary's stream, or by
// stepping down): when another node than old and self took over, and
// there are three data nodes or more. With two, the old primary is the
// only other node: what it wrote in flight is its own log's, marked by
// the rules of a stepped-down or crashed primary, and what the new one
// applied as its secondary came from it.
func Reconciles(old, self, primary string, peers int) bool {
	return peers >= 2 && old != "" && old != primary && primary != self
}

// ensureLease starts the renewals of epoch's term unless they run.
func (s *State) ensureLease(epoch uint64) []Action {
	if s.LeaseEpoch == epoch {
		return nil
	}
	s.LeaseEpoch, s.LeaseUntil = epoch, time.Time{}
	return []Action{{Kind: StartLease, Epoch: epoch}}
}

// becomePrimary is the one promotion of a node that holds the volume's
// data: a handover (Promote), raft's choice (a failover or a switchover),
// the primary indicator and the epoch durable BEFORE the first write.
// byRaft: the disk must be consistent (no stale promotion); the lease
// loop of the new term starts. failover: raft promoted this node without a
// handover from the old primary (its activity log is reconciled).
func (s *State) becomePrimary(epoch uint64, now time.Time, byRaft, failover bool) Ready {
	d := s.Durable
	if byRaft {
		if s.Role() == replication.Primary && d.Epoch >= epoch {
			return Ready{}
		}
		if d.Gens.Current.IsZero() || !d.SyncGen.IsZero() || d.LocalStale {
			return Ready{Err: fmt.Errorf("%w: its disk holds no consistent data", ErrNotUpToDate)}
		}
	}
	rd := Ready{Indicator: SetIndicator, Persist: s.persist(func(x *Durable) {
		x.Epoch, x.Primary, x.PrimarySince = epoch, s.Self, now
		x.Gens = x.Gens.Promoted()
	})}
	// The bitmap generations of an earlier term are dropped (a write that
	// misses a peer starts a new one), but not the blocks marked toward
	// the peers: they are what a peer may lack of this node's data (its
	// activity log after a crash as primary, a write that failed after
	// the local write), and the new term's first resync to that peer
	// copies them, even between equal generations. Clearing them left a
	// peer in sync by generations with blocks this node changed (the
	// sim's promotion-clears-marks, seed 1460).
	rd.Prepare = []Action{{Kind: DetachIncoming}}
	if failover && d.Primary != "" && d.Primary != s.Self && len(s.Peers) >= 2 {
		// Raft's choice after another primary failed: a write of the old
		// one still in flight may have reached this node and not a peer. Its
		// activity log is marked toward every peer but the old primary
		// (what that one wrote, it holds) BEFORE the promotion is
		// durable, so that the first resync of the term copies it; the
		// peers mark theirs toward this node (reconcileWith).
		for _, p := range slices.Sorted(maps.Keys(s.Peers)) {
			if p != d.Primary {
				rd.Prepare = append(rd.Prepare, Action{Kind: MarkActivityLog, Peer: p})
			}
		}
	}
	s.Discard = false
	rd.Actions = s.serveAsPrimary(Open)
	if byRaft {
		rd.Actions = append(rd.Actions, s.ensureLease(epoch)...)
	}
	rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: "promoted", Epoch: epoch}, Action{Kind: RunHook, Detail: "on_promote", Epoch: epoch})
	return rd
}

// serveAsPrimary is what a node that has just recorded itself primary
// holds: its disk UpToDate, no cause, fresh senders, IO open.
func (s *State) serveAsPrimary(serving Serving) []Action {
	s.Disk, s.Why, s.Serving, s.Pending = replication.UpToDate, CauseNone, serving, nil
	repl := replication.Connecting
	if s.AdminDown {
		// The fresh senders start once the operator connects.
		repl = replication.StandAlone
	}
	for name, p := range s.Peers {
		s.Peers[name] = Peer{Repl: repl, SplitBrainRule: p.SplitBrainRule}
	}
	return []Action{{Kind: ResetPeers}}
}

// linksStarted: the links to every peer start (StartPeers), each Connecting
// until a stream is taken.
func (s *State) linksStarted() {
	for name, p := range s.Peers {
		p.Repl, p.Pulling = replication.Connecting, false
		s.Peers[name] = p
	}
}

// promote is a handover's promotion: this node must hold exactly the
// generation the old primary handed over, at a newer epoch.
func (s *State) promote(e Promote) Ready {
	d := s.Durable
	switch {
	case s.Role() == replication.Primary && d.Epoch == e.Epoch && d.Gens.Current == e.Gen:
		return Ready{}
	case s.Role() == replication.Primary:
		return Ready{Err: fmt.Errorf("%w at epoch %d", ErrAlreadyPrimary, d.Epoch)}
	case d.Gens.Current != e.Gen || e.Gen.IsZero():
		return Ready{Err: fmt.Errorf("%w: it holds generation %s, the primary handed over %s", ErrNotUpToDate, d.Gens.Current, e.Gen)}
	case e.Epoch <= d.Epoch:
		return Ready{Err: fmt.Errorf("%w %d: it has seen epoch %d", ErrStaleEpoch, e.Epoch, d.Epoch)}
	}
	return s.becomePrimary(e.Epoch, e.Now, false, false)
}

// retake makes this node primary again at its own epoch after a
// switchover raft did not record.
func (s *State) retake(e Retake) Ready {
	d := s.Durable
	if d.Epoch != e.Epoch || d.Gens.Current != e.Gen || s.Role() == replication.Primary {
		return Ready{Err: fmt.Errorf("%w %d generation %s (it holds epoch %d, generation %s)", ErrCannotTakeBack, e.Epoch, e.Gen, d.Epoch, d.Gens.Current)}
	}
	if e.AuthorityKnown && (e.AuthorityPrimary != s.Self || e.AuthorityEpoch != e.Epoch) {
		return Ready{Err: fmt.Errorf("%w: %s at epoch %d", ErrRaftNamesOther, e.AuthorityPrimary, e.AuthorityEpoch)}
	}
	rd := Ready{Indicator: SetIndicator, Persist: s.persist(func(x *Durable) { x.Primary = s.Self })}
	rd.Actions = s.serveAsPrimary(Open)
	if s.Auth {
		rd.Actions = append(rd.Actions, s.ensureLease(e.Epoch)...)
	}
	rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: "primary-again", Epoch: e.Epoch}, Action{Kind: RunHook, Detail: "on_promote", Epoch: e.Epoch})
	return rd
}

// force makes this node primary without a handover, at an epoch above
// every epoch it heard of; in authority mode it serves without a lease
// until raft records it.
func (s *State) force(e Force) Ready {
	d := s.Durable
	if !d.SyncGen.IsZero() {
		return Ready{Err: fmt.Errorf("%w: its data is part old, part new; it cannot be promoted, even by force", ErrMidResync)}
	}
	empty := d.Gens.Current.IsZero()
	if s.Role() == replication.Primary && s.Serving.IsOpen() && !empty {
		return Ready{}
	}
	wasPrimary := s.Role() == replication.Primary
	epoch := max(d.Epoch, s.KnownEpoch) + 1
	if s.Auth {
		epoch = max(epoch, e.AuthorityEpoch+1)
	}
	rd := Ready{Indicator: SetIndicator, Persist: s.persist(func(x *Durable) {
		if empty {
			x.Gens, x.SyncGen = x.Gens.Adopted(e.NewGen), replication.Generation{}
		}
		x.Epoch, x.Primary = epoch, s.Self
		if !wasPrimary {
			x.PrimarySince = e.Now
		}
		x.Gens = x.Gens.Promoted()
	})}
	rd.Prepare = []Action{{Kind: StopPeers}, {Kind: DetachIncoming}}
	if !wasPrimary && !empty && d.Primary != "" && d.Primary != s.Self && len(s.Peers) >= 2 {
		// As a failover (becomePrimary): a write of the old primary in
		// flight may have reached this node and not a third one, which
		// would then count in sync without it. The activity log is marked
		// toward every peer but the old primary BEFORE the promotion is
		// durable (the sim's forced-promotion-skips-reconcile, seed 3519
		// once its log held fewer blocks than the volume).
		for _, p := range slices.Sorted(maps.Keys(s.Peers)) {
			if p != d.Primary {
				rd.Prepare = append(rd.Prepare, Action{Kind: MarkActivityLog, Peer: p})
			}
		}
	}
	s.Discard = false
	serving := Open
	if s.Auth {
		serving = OpenWithoutLease
	}
	rd.Actions = s.serveAsPrimary(serving)
	rd.Actions = append(rd.Actions, Action{Kind: RunHook, Detail: "on_promote", Epoch: epoch})
	if empty {
		rd.Actions = append(rd.Actions, Action{Kind: ClearLocalMissing})
	}
	rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: "forced-primary", Epoch: epoch})
	return rd
}

// demote begins a switchover to e.To: IO stops; HandedOver completes it
// once the peer holds everything, HandoverAborted reopens IO.
func (s *State) demote(e Demote) Ready {
	if s.Role() != replication.Primary {
		return Ready{Err: ErrNotPrimary}
	}
	if _, ok := s.Peers[e.To]; !ok {
		return Ready{Err: fmt.Errorf("%w: %s", ErrNoReplica, e.To)}
	}
	s.Pending = &Pending{Kind: PendingHandover, To: e.To, Epoch: s.Durable.Epoch, Was: s.Serving}
	s.Serving = Stopped
	return Ready{Actions: []Action{{Kind: HandOverIO, Peer: e.To}}}
}

// handedOver completes a switchover: this node is Secondary under the new
// primary, durably, then releases its lease.
func (s *State) handedOver() Ready {
	p := s.Pending
	if p == nil || p.Kind != PendingHandover {
		return Ready{Err: ErrNoPendingChange}
	}
	s.Pending = nil
	rd := Ready{Persist: s.persist(func(d *Durable) { d.Primary = p.To })}
	s.Serving = Stopped
	s.Disk = s.IdleDisk()
	s.stopPeers()
	rd.Actions = []Action{{Kind: StopPeers}}
	if s.Auth {
		// The lease goes back: the new primary need not wait it out.
		rd.Actions = append(rd.Actions, Action{Kind: StopLease}, Action{Kind: ReleaseLease, Epoch: p.Epoch})
		s.LeaseEpoch, s.LeaseUntil = 0, time.Time{}
	}
	rd.Actions = append(rd.Actions, Action{Kind: ClearPrimaryIndicator}, Action{Kind: Notify, Detail: "demoted", Peer: p.To, Epoch: p.Epoch}, Action{Kind: RunHook, Detail: "on_demote", Epoch: p.Epoch})
	return rd
}

// discardMyData resolves a split brain with this node as the victim: it
// gives up its data and follows the next primary that connects. The
// victim may already be a Secondary (a step-down does not resolve a split
// brain); a primary that streams to a peer is never one.
func (s *State) discardMyData() Ready {
	if !s.InSplitBrain() {
		return Ready{Err: ErrNotSplitBrain}
	}
	if s.Role() == replication.Primary {
		for name, p := range s.Peers {
			if p.streaming() {
				return Ready{Err: &StreamsToPeer{Peer: name}}
			}
		}
		s.Serving = Stopped
		s.Pending = &Pending{Kind: PendingDiscard}
		return Ready{Actions: []Action{{Kind: DrainIO}}}
	}
	// A secondary keeps the primary it followed: what it applied of that
	// primary's stream (a stream it still takes, say, from a third node)
	// is in its activity log, reconciled toward whoever takes over next
	// (reconcileWith), as any follower's is. Forgetting it left a write
	// of a lost primary on this node alone, with a new primary counting
	// it in sync (the sim's seed 26778).
	s.becomeDiscarding()
	return Ready{Actions: []Action{{Kind: Notify, Detail: "discard-my-data"}}}
}

// stopPeers: a node that is no longer primary streams to nobody (a split
// brain found with a peer stays known).
func (s *State) stopPeers() {
	for name, p := range s.Peers {
		s.Peers[name] = Peer{Repl: replication.Connecting, SplitBrainRule: p.SplitBrainRule}
	}
}

func (s *State) becomeDiscarding() {
	s.Serving, s.Discard, s.Why = Stopped, true, CauseDiscarding
	s.stopPeers()
	s.Disk = s.IdleDisk()
}

// detach takes a failed local disk out of service: a primary goes on
// through a peer in sync (Peer.InSync); the mark is durable BEFORE any
// write skips the disk. Without such a peer nothing changes and the IO
// error stands.
func (s *State) detach() Ready {
	if s.Disk == replication.Diskless || s.Role() != replication.Primary || !s.peerInSync() {
		return Ready{}
	}
	rd := Ready{Persist: s.persist(func(d *Durable) { d.LocalStale = true })}
	s.Disk, s.Why = replication.Diskless, CauseDetached
	rd.Actions = []Action{{Kind: Notify, Detail: "detached"}, {Kind: Reattach}}
	return rd
}

// peerInSync reports whether a peer holds every write (Peer.InSync).
func (s *State) peerInSync() bool {
	for _, p := range s.Peers {
		if p.InSync {
			return true
		}
	}
	return false
}

// localResyncFinished puts a re-attached disk back in service once it
// holds every block again, durably (its stale mark cleared). It is
// refused while the disk is not being re-attached (it failed again
// meanwhile), and while it still misses blocks (the copy goes again).
func (s *State) localResyncFinished() Ready {
	switch {
	case s.Disk != replication.Inconsistent:
		return Ready{Err: fmt.Errorf("%w: the disk is %s", ErrNotAttaching, s.Disk)}
	case s.LocalMissing:
		return Ready{Err: ErrLocalMissing}
	case !s.Durable.LocalStale:
		return Ready{}
	}
	d := s.Durable.Clone()
	d.LocalStale = false
	s.Durable, s.Disk, s.Why = d, replication.UpToDate, CauseNone
	return Ready{Persist: &d, Actions: []Action{{Kind: Notify, Detail: "attached"}}}
}

// writeMissed moves the generation on when a write misses a peer, so the
// peer can never again look as up to date as this primary.
func (s *State) writeMissed(e WriteMissed) Ready {
	g := s.Durable.Gens
	mayHold := g.Tracking(e.Peer) && e.MayHold == g.Current
	if s.Role() != replication.Primary || !MissMovesGeneration(g, e.Peer, e.MayHold) {
		return Ready{}
	}
	if p := s.Peers[e.Peer]; p.streaming() && p.Repl != replication.Ahead && !e.Behind {
		// The write goes to its stream (the peer connected meanwhile:
		// moving the generation on would leave its UpToDate behind).
		return Ready{}
	}
	rd := Ready{Persist: s.persist(func(d *Durable) {
		if mayHold {
			d.Gens = d.Gens.TrackedPeerMayHoldCurrent(e.Peer, e.Next)
		} else {
			d.Gens = d.Gens.PeerMisses(e.Peer, e.Held, e.Next)
		}
	})}
	rd.Actions = []Action{{Kind: Notify, Detail: "new-generation", Peer: e.Peer}}
	return rd
}

// MissMovesGeneration is the generations' half of WriteMissed's rule
// (the other half is the peer's stream): whether a write peer misses
// moves the data on to a new generation. A tracked peer misses nothing
// new by generations, unless it may hold the current one (mayHold: it
// must never look as up to date as this primary); a node copying newer
// data from a peer (no current generation) has none to move on from. The
// write path asks it before it steps the machine, which asks it again.
func MissMovesGeneration(g replication.Generations, peer string, mayHold replication.Generation) bool {
	if g.Current.IsZero() {
		return false
	}
	return !g.Tracking(peer) || mayHold == g.Current
}

// resyncFinished ends a resync: as source the peer is in sync, as target
// this node holds the source's generation. A pull's end (a primary's) is
// refused while its disk still misses blocks; a source's while the peer
// is not in sync as the step is taken (its stream, the generation it
// acknowledged and its bitmap decide).
func (s *State) resyncFinished(e ResyncFinished) Ready {
	p, ok := s.Peers[e.Peer]
	if !ok {
		return Ready{}
	}
	var rd Ready
	switch {
	case e.AsTarget && e.Current.IsZero():
		return Ready{Err: fmt.Errorf("%w (from %s)", ErrNoGeneration, e.Peer)}
	case e.AsTarget && s.Role() == replication.Primary && s.LocalMissing:
		return Ready{Err: fmt.Errorf("%w (pulled from %s)", ErrLocalMissing, e.Peer)}
	case e.AsTarget:
	case e.Session != p.Session || !p.streaming():
		return Ready{Err: fmt.Errorf("%w: %s acknowledged on stream %d, which is not its stream now", ErrNotInSync, e.Peer, e.Session)}
	case e.Current != s.Durable.Gens.Current:
		return Ready{Err: fmt.Errorf("%w: %s acknowledged generation %s; this node holds %s", ErrNotInSync, e.Peer, e.Current, s.Durable.Gens.Current)}
	case p.Marked:
		return Ready{Err: fmt.Errorf("%w: blocks are marked for %s", ErrNotInSync, e.Peer)}
	}
	if e.AsTarget {
		history := e.History
		if e.OwnHistory {
			history = s.Durable.Gens.History
		}
		var away []string
		if s.Role() == replication.Primary {
			for _, name := range slices.Sorted(maps.Keys(s.Peers)) {
				// A peer in sync gets the generation in its stream,
				// and one being resynced at its resync's end.
				if r := s.Peers[name].Repl; name != e.Peer && r != replication.Connected && r != replication.SyncSource {
					away = append(away, name)
				}
			}
		}
		rd.Persist = s.persist(func(d *Durable) {
			d.Gens = d.Gens.ResyncFinishedAsTarget(e.Peer, e.Current, history).PullFinishedWithout(away, d.SyncGen)
			d.SyncGen = replication.Generation{}
			// A disk that came back stale (Opened) holds nothing of its
			// own; resynced in full, it misses nothing any more, and may
			// be promoted again.
			d.LocalStale = false
		})
		// This node holds the peer's data now, its activity log's
		// extents too (they were marked, and copied): a crash of it as
		// primary before no longer counts.
		s.CrashedPrimary = false
		p.Pulling = false
		s.Disk, s.Why = replication.UpToDate, CauseNone
		if s.Role() != replication.Primary {
			// In sync with the primary it follows, UpToDate while its
			// stream lasts; a copy from another node is Consistent.
			if e.Peer != s.Durable.Primary {
				s.Disk = replication.Consistent
			}
			if s.Discard {
				s.Discard = false
			}
			// Its disk holds the peer's data: what a pull it made as
			// primary, cut off before it stepped down, left missing is
			// missing no more (the simulation's known finding
			// missing-outlives-term: such a node held a generation and
			// read those blocks from peers).
			if s.LocalMissing {
				rd.Actions = append(rd.Actions, Action{Kind: ClearLocalMissing})
			}
		}
	} else {
		// The peer holds every write of this node's current generation:
		// its bitmap generation retires (when it was tracked), and a
		// crash of this primary before now no longer counts in the
		// comparison of generations.
		if s.Durable.Gens.Tracking(e.Peer) {
			rd.Persist = s.persist(func(d *Durable) { d.Gens = d.Gens.ResyncFinishedAsSource(e.Peer) })
		}
		s.CrashedPrimary = false
		p = p.inSync()
	}
	s.Peers[e.Peer] = p
	return rd
}

// setAdminDown disconnects or reconnects this node's replication.
func (s *State) setAdminDown(down bool) Ready {
	if !down && s.Why == CauseSplitBrain && !s.Discard {
		// A connect is also the operator's retry after a split brain
		// (found again if it still holds); a discard in progress keeps
		// its cause.
		s.Why = CauseNone
	}
	if s.AdminDown == down {
		return Ready{}
	}
	s.AdminDown = down
	primary := s.Role() == replication.Primary
	switch {
	case down:
		s.Why = CauseAdminDown
	case s.Why == CauseAdminDown:
		s.Why = CauseNone
	}
	var rd Ready
	switch {
	case down && primary:
		rd.Actions = []Action{{Kind: StopPeers}}
		for name, p := range s.Peers {
			p.Repl = replication.StandAlone
			s.Peers[name] = p
		}
	case down:
		rd.Actions = []Action{{Kind: DetachIncoming}}
	case primary:
		rd.Actions = []Action{{Kind: StartPeers}}
		s.linksStarted()
	}
	what := "connected"
	if down {
		what = "disconnected"
	}
	rd.Actions = append(rd.Actions, Action{Kind: Notify, Detail: what})
	return rd
}
