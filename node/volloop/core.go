package volloop

import (
	"errors"

	"github.com/replvol/replvol/node/volstate"
)

// The step of the volume's loop: what it does with each message it takes,
// on whichever goroutine takes them (production's Loop, the simulation's
// one). A drive runs by volstate's order in its resumable form
// (volstate.Driving): the pre-step, the Take under the effects' lock and
// the follow-ups on the loop, each waiting preparation or action that
// Effects.OffLoop names off it: the Core hands it back as a Wait, which
// its runner does wherever it may wait and hands back, once done, as the
// message Wait.Resumed makes with the wait's error. The drive then goes on
// where it stood: rule 1 (the event taken again on the state as it is by
// then) and rule 8 (Quiesced once the actions are done) hold across the
// wait. Meanwhile the Core takes the messages that arrive, in their order:
// another drive, a call, news, or the end of another wait.
//
// What the loop must never do is wait for a goroutine that may itself
// post to the loop and wait for its reply: the senders (StopPeers), the
// incoming stream (DetachIncoming), the IO in flight (WaitIO, DrainIO)
// and the cluster (ReleaseLease) are such waits (OffLoop).
//
// Once the Core has taken the close, a drive posted gets ErrClosed, never
// a wait; the drives it took before run to their end, their waits
// included, and a call or news it takes still runs (its caller waits for
// it all the same). Over reports when the close was taken and no drive is
// left.

// ErrClosed is what a drive posted to a volume that closes gets: its
// state changes no more.
var ErrClosed = errors.New("the volume is closing: its state changes no more")

// Effects is a drive's effects as the loop runs them: volstate's, and
// which of the waiting preparations and actions it does off the loop.
type Effects interface {
	volstate.Effects
	// OffLoop reports whether a (a waiting preparation or an action) may
	// wait for a goroutine that posts to the loop, or for long: it is
	// then done off the loop (a Wait).
	OffLoop(a volstate.Action) bool
}

// OffLoop is the one list of the waiting preparations and actions that a
// volume does off its loop, node's and the simulation's: the waits for
// the senders and the incoming stream (whose goroutines drive the volume
// themselves), for the IO in flight (whose writers step it), for the
// cluster (ReleaseLease) and for the disk (ClearPrimaryIndicator's sync).
func OffLoop(a volstate.Action) bool {
	switch a.Kind {
	case volstate.StopPeers, volstate.DetachIncoming, volstate.WaitIO, volstate.DrainIO, volstate.ReleaseLease, volstate.ClearPrimaryIndicator:
		return true
	}
	return false
}

// Drive is one drive the loop runs: its effects, where it stands, and
// where its result goes (done, called once, on the loop: it must not
// wait).
type Drive struct {
	fx   Effects
	d    *volstate.Driving
	done func([]volstate.Action, error)
}

// NewDrive is the drive of e with its effects, whose result (volstate's
// Driving.Result: e's actions and the first error, or ErrClosed) goes to
// done. Nothing is done until a Core takes Post of it.
func NewDrive(fx Effects, e volstate.Event, done func([]volstate.Action, error)) *Drive {
	return &Drive{fx: fx, d: volstate.Begin(e), done: done}
}

// Message is what a Core takes: a drive posted (Post), the end of a wait
// of one it runs (Wait.Resumed), a call (Call), news (News) or the close
// (Close).
type Message struct {
	news    []func()
	drive   *Drive
	resumed bool
	err     error
	call    func()
	close   bool
}

// Post is d posted to the loop.
func Post(d *Drive) Message { return Message{drive: d} }

// Call is fn to run on the loop, between its drives' steps.
func Call(fn func()) Message { return Message{call: fn} }

// News is news to run on the loop, in order, before what it takes next.
func News(fns ...func()) Message { return Message{news: fns} }

// Close is the loop's close: it takes no new drive.
func Close() Message { return Message{close: true} }

// Wait is a need of a drive to be done off the loop: a waiting
// preparation or an action its effects' OffLoop names.
type Wait struct {
	drive *Drive
	need  volstate.Need
}

// Need is what the wait does.
func (w Wait) Need() volstate.Need { return w.need }

// Do does it with the drive's effects, and returns its error; it may
// block, and runs wherever its runner does it (production: a goroutine of
// its own).
func (w Wait) Do() error { return do(w.drive.fx, w.need) }

// Resumed is the message that continues the drive with the wait's end:
// err is its error.
func (w Wait) Resumed(err error) Message {
	return Message{drive: w.drive, resumed: true, err: err}
}

// Core is the loop's step: the drives it took and not yet ended, and
// whether it took the close. The zero Core is ready.
type Core struct {
	running int
	closing bool
}

// Take takes m and runs what it can on the calling goroutine: the news,
// the call, or the drive as far as it goes, and returns what the drive
// needs done off the loop (at most one Wait: a drive waits for one thing
// at a time), each to be handed back with Resumed once done. It never
// blocks (but for what the effects, a call or news do) and starts no
// goroutine. An effect of a drive may take a drive of its own on the same
// Core (the simulation's, whose drives of a node reach back into it): it
// runs as far as it goes meanwhile.
func (c *Core) Take(m Message) []Wait {
	for _, fn := range m.news {
		fn()
	}
	switch {
	case m.close:
		c.closing = true
		return nil
	case m.call != nil:
		// Taken, so run (the loop may be closing: its caller waits for
		// it all the same).
		m.call()
		return nil
	case m.drive == nil: // news alone
		return nil
	case m.resumed:
		m.drive.d.Done(m.err)
	case c.closing:
		// Posted as the loop closes.
		m.drive.done(nil, ErrClosed)
		return nil
	default:
		c.running++
	}
	return c.advance(m.drive)
}

// Over reports whether the Core took the close and every drive it took
// before is over: the loop may end.
func (c *Core) Over() bool { return c.closing && c.running == 0 }

// advance runs d as far as it goes on the loop: the wait it needs, if
// any, is returned (the drive goes on when its end is taken), the rest
// done here. Once the drive is over its result is sent.
func (c *Core) advance(d *Drive) []Wait {
	for {
		n := d.d.Next(d.fx)
		if n.Kind == volstate.NeedNothing {
			c.running--
			d.done(d.d.Result())
			return nil
		}
		if !d.fx.OffLoop(n.Action) {
			d.d.Done(do(d.fx, n))
			continue
		}
		return []Wait{{drive: d, need: n}}
	}
}

// do does what a drive needs: a waiting preparation or an action.
func do(fx Effects, n volstate.Need) error {
	if n.Kind == volstate.NeedPrepare {
		return fx.Prepare(n.Action)
	}
	return fx.Perform(n.Action)
}
