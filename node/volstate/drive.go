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
// followed (a step-down whose Quiesced could not be written).
func Drive(fx Effects, e Event) ([]Action, error) {
	acts, err := driveOne(fx, e)
	if err != nil {
		return nil, err
	}
	for {
		f, ok := fx.Next()
		if !ok {
			return acts, err
		}
		if _, ferr := driveOne(fx, f); ferr != nil && err == nil {
			err = ferr
		}
	}
}

// driveOne is rules 1 to 8 for one event.
func driveOne(fx Effects, e Event) ([]Action, error) {
	_, rd := Step(fx.State(), e)
	if rd.Err != nil {
		return nil, rd.Err
	}
	for _, a := range rd.Prepare {
		if a.Kind.Waits() {
			if err := fx.Prepare(a); err != nil {
				return nil, err
			}
		}
	}
	fx.Lock()
	acts, err := Take(fx, e)
	fx.Unlock()
	if err != nil {
		return nil, err
	}
	quiesce := false
	for _, a := range acts {
		if err := fx.Perform(a); err != nil {
			return acts, err
		}
		quiesce = quiesce || a.Kind.quiesces()
	}
	if quiesce {
		fx.Follow(Quiesced{})
	}
	return acts, nil
}

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
