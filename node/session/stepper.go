package session

import (
	"context"

	"github.com/replvol/replvol/transport/frame"
)

// Stepper drives a session's loop one step at a time on its caller's
// goroutine, with none of the session's goroutines running: the caller is
// the loop, and the sending and receiving goroutines too. Each method
// hands the loop's step (handle) one event, as the loop's select would
// take it, and when the step says the session ends runs finish, as the
// loop does: the same code as production's, in the order the caller
// chooses (a seeded order in a simulation or a test). The writers' side
// stays the session's own (Session.Enqueue, Do, MarkBehind's delivery):
// what they deliver waits in the inbox until Inbox takes it. The frames
// the loop builds wait for Frame; the entries it completes for Completed.
//
// Only what needs no goroutine of the session's runs so: a work handed to
// Run, a catch-up and a syncDone's commit start goroutines of their own
// (the commit's end is then taken by Synced). A Stepper is not safe for
// concurrent use.
type Stepper struct {
	s     *Session
	ended bool
	err   error
	// apart: the caller tracks the peer at the end (TrackApart);
	// tracking: the end waits for it (Tracked).
	apart, tracking bool
}

// NewStepper makes the session of a stream whose handshake is done, as New
// does, and readies its loop for its first step (begin: the ticker, the
// preloaded entries sent). Start and Run must not be called on it; its
// Stream's Send and Recv are never called (the caller takes the frames
// from Frame and hands the peer's to Received), its Close is, at the end.
func NewStepper(ctx context.Context, p Peer, st Stream, cfg Config) *Stepper {
	s := New(ctx, p, st, cfg)
	s.started, s.stepping = true, true
	t := &Stepper{s: s}
	s.begin()
	return t
}

// Session is the session the Stepper drives: its writers' side (Enqueue,
// Do, Fail, Cancel) and what it publishes (Finished, MarkErr, Context).
func (t *Stepper) Session() *Session { return t.s }

// Submit hands an application write under protocol A or B to the loop,
// as Session.Submit does without its wait: the answer comes once Inbox
// took it (nil: the session has ended, pd was not taken).
func (t *Stepper) Submit(pd *Pending) <-chan Admission { return t.s.submit(pd) }

// TrackApart has the session's end leave the peer's tracking to the
// caller instead of calling Peer.StartTracking, which may wait for
// what only the caller's later steps bring (raft's answer, other
// streams' acks): once a step ended the session, Tracking reports that
// its end waits, and Tracked hands it the tracking's outcome. Call it
// before the session's last step.
func (t *Stepper) TrackApart() { t.apart = true }

// step is one turn of the loop with ev, and its end when the step says so.
func (t *Stepper) step(ev event) {
	if t.ended {
		return
	}
	if stop, err := t.s.handle(t.s.idle(), ev); stop {
		t.ended, t.err = true, err
		if !t.apart {
			t.s.finish(err)
			return
		}
		// finish, in two parts around the caller's tracking.
		if t.s.stop(err) {
			t.tracking = true
			return
		}
		t.s.marked(nil)
	}
}

// Ended reports whether the session ended: its last step ran, and, unless
// it is Tracking, what the peer did not acknowledge is handed back and
// marked (Finished is closed).
func (t *Stepper) Ended() bool { return t.ended }

// Tracking reports whether the session's end waits for the caller to
// track the peer (TrackApart): the entries left, or what the peer holds
// in its cache only, need it. Nothing left is marked or completed yet.
func (t *Stepper) Tracking() bool { return t.tracking }

// Tracked hands the session's end, while it is Tracking, the outcome of
// the peer's tracking, which the caller made as Peer.StartTracking does
// (nil: the volume tracks the peer, durably): the end marks what the peer
// misses and may hold in its cache only, completes the entries left
// (with err) and closes Finished.
func (t *Stepper) Tracked(err error) {
	if !t.tracking {
		panic("session: Tracked while the end waits for no tracking")
	}
	t.tracking = false
	t.s.marked(err)
}

// Err is, once Ended, the error the session ended with (nil: cancelled).
func (t *Stepper) Err() error { return t.err }

// Poll is the loop's look at its first error (Fail) and its context's
// end: the session ends then. It reports whether it ended.
func (t *Stepper) Poll() bool {
	if t.ended {
		return true
	}
	select {
	case err := <-t.s.errc:
		t.step(event{kind: evFail, err: err})
	default:
		if t.s.ctx.Err() != nil {
			t.step(event{kind: evCanceled})
		}
	}
	return t.ended
}

// Inbox takes the oldest message delivered to the loop (an entry, a call,
// a mark, a completion), and what else was delivered meanwhile, as the
// loop does; it reports whether there was one.
func (t *Stepper) Inbox() bool {
	return stepOn(t, t.s.inbox, func(m inMsg) event { return event{kind: evInbox, in: m} })
}

// stepOn takes what c holds, if it holds one, and steps the loop with
// the event ev makes of it; it reports whether c held one.
func stepOn[T any](t *Stepper, c <-chan T, ev func(T) event) bool {
	if t.ended {
		return false
	}
	select {
	case v := <-c:
		t.step(ev(v))
		return true
	default:
		return false
	}
}

// Delivered is the number of messages delivered and not yet taken.
func (t *Stepper) Delivered() int { return len(t.s.inbox) }

// Tick takes the ticker's tick, or the end of a rest, when one came (the
// session's Config.Clock moves them); it reports whether one did.
func (t *Stepper) Tick() bool {
	if t.ended {
		return false
	}
	select {
	case <-t.s.tick.C():
		t.step(event{kind: evTick})
		return true
	case <-t.s.rest:
		t.step(event{kind: evRest})
		return true
	default:
		return false
	}
}

// Synced takes a syncDone whose commit (Peer.SyncDoneAcked, on a
// goroutine of its own) returned; it reports whether one did.
func (t *Stepper) Synced() bool {
	return stepOn(t, t.s.synced, func(pd *Pending) event { return event{kind: evSynced, synced: pd} })
}

// Received hands the loop a frame of the peer, as the receiving goroutine
// does: an ack or a read reply is the loop's next step; a heartbeat's ack
// only says the peer is alive. An error is the receiving goroutine's (a
// frame that does not decode, the peer's disk failed, a refused frame):
// the session fails with it, and ends at the next Poll. f is the
// caller's again once Received returns.
func (t *Stepper) Received(f *frame.Frame) error {
	if t.ended {
		return nil
	}
	m, news, err := t.s.received(f)
	if err != nil {
		t.s.Fail(err)
		return err
	}
	if !news {
		return nil
	}
	var verdict chan error
	if m.isReply {
		verdict = make(chan error, 1)
		m.reply.err = verdict
	}
	t.step(event{kind: evPeer, peer: m})
	if verdict != nil && !t.ended {
		if err := <-verdict; err != nil {
			t.s.Fail(err)
			return err
		}
	}
	return nil
}

// Frame takes the oldest frame the loop built for the peer, as the
// sending goroutine does (nil: none waits). The caller owns it: it
// Releases it once it is written, or dropped.
func (t *Stepper) Frame() *frame.Frame {
	select {
	case f := <-t.s.out:
		return f
	default:
		return nil
	}
}

// Completed takes the entries the loop completed since the last call, in
// the order it completed them (acknowledged, or handed back at the end:
// Pending.Acked, Err).
func (t *Stepper) Completed() []*Pending {
	done := t.s.completed
	t.s.completed = nil
	return done
}
