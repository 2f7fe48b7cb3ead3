package volstate

// The driver of the machine: the order in which a step's preparations,
// writes, install and actions happen, written once. Node's volume
// (node/drive.go) and the simulation (node/sim) both run it, each over its
// own Effects: node over its disks, metadata, senders and locks, the
// simulation over its models of them on one goroutine. A change to the
// order is a change to both.
//
// The order's rules, for one event e:
//
//  1. The waiting preparations (Waits: StopPeers, DetachIncoming, which
//     wait for the senders or the incoming stream to end) of e's step on
//     the state as it is are done first, BEFORE Lock: those loops step the
//     volume themselves and must not wait behind the lock. A step that
//     refuses e (Ready.Err) does nothing at all.
//  2. Under Lock, e is stepped again on the state as it is by then (Take),
//     since it may have changed meanwhile.
//  3. The other preparations (MarkActivityLog) are done BEFORE any write:
//     the state that needs them must not be durable without them.
//  4. The primary indicator, when the step sets it, is on stable storage
//     BEFORE the durable state is written (and so BEFORE the first write
//     of a new primary).
//  5. The durable state is written, and the new state installed in the
//     same step (Commit), no other step between them; a step that writes
//     nothing is installed as is (Install).
//  6. When a preparation or a write fails, nothing is installed but what
//     the failure itself changes (a primary that cannot record that a peer
//     misses writes stops its IO: Apply), and no action is performed.
//  7. Only then, after Unlock, are the step's actions performed, in order.
//     An action that fails (a drain that could not flush the bitmaps)
//     ends the drive with its error: the actions after it are not
//     performed, and nothing follows.
//  8. A WaitIO or a DrainIO is followed by Quiesced, once the step's
//     actions are all performed: the change that waited for the IO
//     completes with it. Quiesced, and any event the effects queued
//     meanwhile (Follow), is driven after the step the same way, from
//     rule 1, until none is left.

// StepEffects is what a step does around the rules (Take): the state to
// step, the preparations, the writes and the install. Its methods are
// called from the goroutine that steps, one at a time; they may block.
type StepEffects interface {
	// State is the volume as the rules must see it now: a copy that
	// shares nothing with what the driver keeps (the step's rules take it
	// by value).
	State() State
	// Prepare does one preparation: a waiting one (Waits) before Lock,
	// the others under it, BEFORE the writes.
	Prepare(a Action) error
	// SetIndicator sets the primary indicator on stable storage.
	SetIndicator() error
	// Commit writes c.Ready.Persist on stable storage, THEN installs
	// c.Next, in the same step. When the write fails it installs nothing
	// and returns the error (Install is called next with it).
	Commit(c Change) error
	// Install takes c.Next as the volume's state: a step that wrote
	// nothing (c.Ready holds its actions), or one whose preparation or
	// write failed or that the rules refused (c.Err; c.Next is then what
	// the failure changed, c.Ready empty).
	Install(c Change)
}

// NoWaitingPreparations is a StepEffects whose steps may ask for no
// waiting preparation (StopPeers, DetachIncoming): a step taken under a
// lock those need, by a caller that did not do them first. Take tells it
// of each one it leaves undone (AskedToWait), so that such a step is a
// loud bug, not a preparation skipped in silence.
type NoWaitingPreparations interface {
	AskedToWait(a Action)
}

// Effects is what a driver of the volume does around its steps (Drive):
// node's volume, or the simulation's model of one. Lock and Unlock
// bracket a step (Take) and nothing else.
type Effects interface {
	StepEffects
	// Lock and Unlock hold off other steps of the volume while Take runs
	// (node: the volume's state lock); the actions run without it.
	Lock()
	Unlock()
	// Perform does one action of a step; an error ends the drive.
	Perform(a Action) error
	// Follow queues an event to be driven once the current one is done
	// (Quiesced after a WaitIO or a DrainIO; the simulation's own
	// follow-ups); Next takes the oldest queued event, if any.
	Follow(e Event)
	Next() (Event, bool)
}

// Refresher is Effects whose events may be given anew when a drive takes
// its event again after its waiting preparations (rule 1): an event that
// carries a view of the world as of its post (raft's authority,
// AuthorityChanged) is taken on the view as of its step, or a node that
// waited (for its incoming stream to end, say) while raft named another
// primary at a newer epoch would take the older view's word. Refresh
// returns the event to take, and whether it differs from e.
type Refresher interface {
	Refresh(e Event) (Event, bool)
}

// Change is one step as the driver writes and installs it.
type Change struct {
	Event     Event
	Old, Next State
	Ready     Ready
	// Err is the preparation or write that failed, or the rules' refusal
	// (Install only).
	Err error
}

// Waits reports whether a preparation waits for a loop that steps the
// volume itself (the senders, the incoming stream): Drive does it before
// Lock.
func (k ActionKind) Waits() bool { return k == StopPeers || k == DetachIncoming }

// quiesces reports whether an action's end feeds Quiesced back: the IO a
// pending change waited for is over.
func (k ActionKind) quiesces() bool { return k == WaitIO || k == DrainIO }

// Drive runs e through the machine in the order of this file's rules,
// then drives what follows it (fx.Next) the same way, each event in
// turn: one that fails does not keep the events queued after it from
// being driven. It returns e's own step's actions (not those of the events
// that followed) and the first error: e's refusal, a failed preparation
// or write, an action that failed, or the failure of an event that
// followed (a step-down whose Quiesced could not be written). It is
// Driving's order run on one goroutine: each waiting preparation and each
// action done at once, where it is asked for.
func Drive(fx Effects, e Event) ([]Action, error) {
	d := Begin(e)
	for {
		n := d.Next(fx)
		switch n.Kind {
		case NeedPrepare:
			d.Done(fx.Prepare(n.Action))
		case NeedPerform:
			d.Done(fx.Perform(n.Action))
		default:
			return d.Result()
		}
	}
}

// NeedKind is what a drive in progress waits for (Need).
type NeedKind int

const (
	// NeedNothing: the drive is over (Driving.Result).
	NeedNothing NeedKind = iota
	// NeedPrepare: a waiting preparation (Waits) of the event's step is
	// to be done, then reported with Done, BEFORE the step is taken.
	NeedPrepare
	// NeedPerform: an action of the step is to be performed, then
	// reported with Done; the next is asked for only after that.
	NeedPerform
)

// Need is what Driving.Next asks its driver for: a waiting preparation or
// an action to do (Action), or nothing more.
type Need struct {
	Kind   NeedKind
	Action Action
}

// Driving is one drive (Drive) in progress, held between the calls of its
// driver: where the event it drives stands in rules 1 to 8, and which
// events follow it. Next does what needs no wait (the pre-step of rule 1,
// the Take under Lock, the follow-ups) and says what the driver must do
// next: a waiting preparation or an action, each done by the driver and
// reported with Done before the next Next. So one order serves a driver
// that does each at once (Drive: the simulation's) and one that waits
// for them off the goroutine that steps, continuing the drive when they
// end while it steps other drives meanwhile (node's volume loop). A
// Driving is used by one goroutine at a time, and with the same Effects
// throughout.
type Driving struct {
	e     Event
	first bool
	phase drivePhase
	// waits are the waiting preparations of e's step not yet done.
	waits []Action
	// acts are e's step's actions, did how many are performed; quiesce:
	// one of those performed waits for the IO (rule 8).
	acts    []Action
	did     int
	quiesce bool
	// asked: a Need was handed out and Done has not reported it.
	asked bool
	// waited: a waiting preparation of e's step was done (the event is
	// then refreshed before its step under the lock: Refresher).
	waited bool
	// result and err are the drive's: e's actions, the first error.
	result []Action
	err    error
}

type drivePhase int

const (
	phaseStep drivePhase = iota
	phaseWait
	phaseAct
	phaseFollow
	phaseOver
)

// Begin starts the drive of e: nothing is done until Next.
func Begin(e Event) *Driving { return &Driving{e: e, first: true} }

// Next advances the drive as far as it goes without a wait, and says what
// it needs next. Rule 1's pre-step and rule 2's Take (under fx.Lock) are
// done here; so is rule 8's Quiesced (fx.Follow) and the drive of what
// follows (fx.Next), each event in turn.
func (d *Driving) Next(fx Effects) Need {
	if d.asked {
		panic("volstate: Driving.Next before Done reported the last need")
	}
	for {
		switch d.phase {
		case phaseStep:
			// Rule 1: a step that refuses e does nothing at all.
			_, rd := Step(fx.State(), d.e)
			if rd.Err != nil {
				d.ended(nil, rd.Err)
				continue
			}
			d.waits = d.waits[:0]
			for _, a := range rd.Prepare {
				if a.Kind.Waits() {
					d.waits = append(d.waits, a)
				}
			}
			d.phase = phaseWait
		case phaseWait:
			if len(d.waits) > 0 {
				d.asked = true
				return Need{Kind: NeedPrepare, Action: d.waits[0]}
			}
			if d.waited {
				// Rule 1 across a wait: an event that carries a view of
				// the world as of its post is taken on the view as of now,
				// from its pre-step (its waits are those of the event
				// taken).
				d.waited = false
				if r, ok := fx.(Refresher); ok {
					if e, changed := r.Refresh(d.e); changed {
						d.e, d.phase = e, phaseStep
						continue
					}
				}
			}
			// Rules 2 to 6, under the lock.
			fx.Lock()
			acts, err := Take(fx, d.e)
			fx.Unlock()
			if err != nil {
				d.ended(nil, err)
				continue
			}
			d.acts, d.did, d.quiesce, d.phase = acts, 0, false, phaseAct
		case phaseAct:
			// Rule 7: the actions, in order, after Unlock.
			if d.did < len(d.acts) {
				d.asked = true
				return Need{Kind: NeedPerform, Action: d.acts[d.did]}
			}
			// Rule 8.
			if d.quiesce {
				fx.Follow(Quiesced{})
			}
			d.ended(d.acts, nil)
		case phaseFollow:
			f, ok := fx.Next()
			if !ok {
				d.phase = phaseOver
				continue
			}
			d.e, d.phase = f, phaseStep
		case phaseOver:
			return Need{}
		}
	}
}

// Done reports the end of what Next asked for last: err is the waiting
// preparation's or the action's failure, which ends the event's drive.
func (d *Driving) Done(err error) {
	if !d.asked {
		panic("volstate: Driving.Done with no need asked for")
	}
	d.asked = false
	switch d.phase {
	case phaseWait:
		if err != nil {
			d.ended(nil, err)
			return
		}
		d.waits, d.waited = d.waits[1:], true
	case phaseAct:
		if err != nil {
			d.ended(d.acts, err)
			return
		}
		d.quiesce = d.quiesce || d.acts[d.did].Kind.quiesces()
		d.did++
	}
}

// ended closes the drive of the current event with its actions and error.
// A failure of the drive's own event ends the drive there (what the
// effects queued stays queued); otherwise the next queued event, if any,
// is driven from rule 1, its failure kept when it is the first.
func (d *Driving) ended(acts []Action, err error) {
	if d.first {
		d.first = false
		if err != nil {
			d.result, d.err, d.phase = nil, err, phaseOver
			return
		}
		d.result = acts
	} else if err != nil && d.err == nil {
		d.err = err
	}
	d.phase = phaseFollow
}

// Result is the drive's outcome once Next needs nothing (Drive's).
func (d *Driving) Result() ([]Action, error) { return d.result, d.err }

// Take is rules 2 to 6 for one event, under the lock its caller holds: e
// stepped on fx.State(), the preparations that need no wait, the
// indicator, the durable state with the install (or the install alone),
// and the actions returned for the caller to perform. The waiting
// preparations are Drive's, before the lock; a caller of Take has done
// them or its event needs none.
func Take(fx StepEffects, e Event) ([]Action, error) {
	old := fx.State()
	committed := false
	next, acts, err := Apply(old, e, func(prep []Action) error {
		for _, a := range prep {
			if a.Kind.Waits() {
				if nw, ok := fx.(NoWaitingPreparations); ok {
					nw.AskedToWait(a)
				}
				continue
			}
			if err := fx.Prepare(a); err != nil {
				return err
			}
		}
		return nil
	}, func(rd Ready, next State) error {
		if rd.Indicator == SetIndicator {
			if err := fx.SetIndicator(); err != nil {
				return err
			}
		}
		if rd.Persist == nil {
			return nil
		}
		committed = true
		return fx.Commit(Change{Event: e, Old: old, Next: next, Ready: rd})
	})
	if err != nil {
		fx.Install(Change{Event: e, Old: old, Next: next, Err: err})
		return nil, err
	}
	if !committed {
		fx.Install(Change{Event: e, Old: old, Next: next, Ready: Ready{Actions: acts}})
	}
	return acts, nil
}
