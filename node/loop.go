package node

import (
	"errors"
	"sync"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/node/volstate"
)

// The volume's loop: the one goroutine that drives the volume's state
// machine (drive). A caller posts its event, with the effects of its drive
// (the volume's, with the caller's texts and notices: volumeSteps), on
// the loop's inbox and waits for the result of the event and of what
// follows it (Quiesced). The loop runs each drive by volstate's order in
// its resumable form (volstate.Driving): the pre-step, the Take under
// v.stateMu and the follow-ups on the loop, the waits off it.
//
// What the loop must never do is wait for a goroutine that may itself
// post to the loop and wait for its reply: the senders (StopPeers), the
// incoming stream (DetachIncoming), the IO in flight (WaitIO, DrainIO)
// and the cluster (ReleaseLease) are waited for on a goroutine of their
// own, counted (off), whose end comes back to the inbox as a message that
// continues the drive where it stood: rule 1 (the event taken again on the
// state as it is by then) and rule 8 (Quiesced once the actions are done)
// hold across the wait. Meanwhile the loop takes the messages that
// arrive, in their order: another drive, or the end of another wait.
//
// The loop starts when the volume opens (newVolume) and ends at close
// (shutdown, closeVolumes) once every drive it took is over: a drive
// posted from then on gets errVolumeClosed at once, never a wait.
//
// The loop also owns the peers' replication states (peerView: the state,
// the stream it belongs to, the peer's disk, why): only code on the loop
// changes them (peer.update checks it in the deadlock build). News from
// a goroutine the loop may wait for without taking its messages (a
// session's loop, which the volume's loop hands entries to) is told
// (tell): queued without a wait, and run on the loop BEFORE the next
// message of the inbox, so that a drive posted after some news steps on
// the state that news left. The peer's link, which the loop never waits
// for, calls (call) and waits.

// errVolumeClosed is what a drive posted to a volume that closes gets:
// its state changes no more.
var errVolumeClosed = errors.New("the volume is closing: its state changes no more")

// loopEffects is a drive's effects as the loop runs them: volstate's, and
// which of the waiting preparations and actions it does off the loop.
type loopEffects interface {
	volstate.Effects
	// offLoop reports whether a (a waiting preparation or an action) may
	// wait for a goroutine that posts to the loop, or for long: it is
	// then done off the loop.
	offLoop(a volstate.Action) bool
}

// volumeLoop is a volume's loop.
type volumeLoop struct {
	// inbox takes the drives posted and the ends of the waits. It holds
	// nothing (unbuffered): a post is taken by the running loop, or the
	// poster sees quit.
	inbox chan loopMessage
	// quit is closed by close: the loop takes no new drive.
	quit      chan struct{}
	closeOnce sync.Once
	// done is closed when the loop has ended.
	done chan struct{}
	// off counts the waits running off the loop.
	off sync.WaitGroup
	// owner is the loop's goroutine, the only one that changes what the
	// loop owns (the peers' views).
	owner lockorder.Owner

	// newsMu guards news and ended; newsMu is a leaf.
	newsMu mutex
	// news is what was told and not yet run, in the order told; a wake
	// on newsReady (buffered: tell never waits) says there is some.
	news      []func()
	newsReady chan struct{}
	// ended: the loop has ended; news told from now on runs at once, on
	// the teller's goroutine (nothing else changes the state any more).
	ended bool
}

// loopDrive is one drive the loop runs: its effects, where it stands,
// and where its result goes (buffered: the loop never waits on it).
type loopDrive struct {
	fx    loopEffects
	d     *volstate.Driving
	reply chan error
}

// loopMessage is a drive posted (resumed false), the end of a wait of
// one the loop runs (resumed, with the wait's error), or a call (fn).
type loopMessage struct {
	drive   *loopDrive
	resumed bool
	err     error
	fn      func()
}

// startLoop starts a volume's loop.
func startLoop() *volumeLoop {
	l := &volumeLoop{inbox: make(chan loopMessage), quit: make(chan struct{}), done: make(chan struct{}), newsReady: make(chan struct{}, 1)}
	claimed := make(chan struct{})
	go l.run(claimed)
	<-claimed // the loop owns what it owns from the start
	return l
}

// tell runs fn on the loop, after the news told before it and BEFORE
// the next message of the inbox the loop takes, without waiting for it:
// news from a goroutine the loop may wait for (a session's loop, whose
// inbox the volume's loop hands entries to). Once the loop has ended, fn
// runs at once, here. fn must not wait.
func (l *volumeLoop) tell(fn func()) {
	l.newsMu.Lock()
	if l.ended {
		l.newsMu.Unlock()
		fn()
		return
	}
	l.news = append(l.news, fn)
	l.newsMu.Unlock()
	select {
	case l.newsReady <- struct{}{}:
	default: // a wake is pending already
	}
}

// ask runs fn on the loop as tell does, and returns once it ran: for a
// goroutine the loop never waits for (a peer's link, the control API).
// Unlike call, it never fails: once the loop has ended, fn runs here.
func (l *volumeLoop) ask(fn func()) {
	ran := make(chan struct{})
	l.tell(func() { defer close(ran); fn() })
	<-ran
}

// runNews runs the news told so far, in order, on the loop; last: the
// loop ends, and news told from now on runs where it is told.
func (l *volumeLoop) runNews(last bool) {
	for {
		l.newsMu.Lock()
		news := l.news
		l.news = nil
		if last && len(news) == 0 {
			l.ended = true
		}
		l.newsMu.Unlock()
		if len(news) == 0 {
			return
		}
		for _, fn := range news {
			fn()
		}
	}
}

// drive posts e with its effects and waits for the drive's result
// (volstate.Drive's error): errVolumeClosed when the loop closes first.
func (l *volumeLoop) drive(fx loopEffects, e volstate.Event) error {
	return <-l.post(fx, e)
}

// post posts e with its effects and returns where its result comes, once
// the loop took it: the loop takes the drives in the order they are
// posted.
func (l *volumeLoop) post(fx loopEffects, e volstate.Event) <-chan error {
	ld := &loopDrive{fx: fx, d: volstate.Begin(e), reply: make(chan error, 1)}
	select {
	case l.inbox <- loopMessage{drive: ld}:
	case <-l.quit:
		ld.reply <- errVolumeClosed
	}
	return ld.reply
}

// call runs fn on the loop, between its drives' steps, and returns once
// it ran: errVolumeClosed, without running it, when the loop closes
// first. fn is a step that cannot be an event alone (the handshake's
// decision, which marks what the step needs on the state it is taken
// on, and switches the peer's writes to the stream with it): it steps
// the volume with stepLocked under v.stateMu, which it takes. It must
// not wait for anything that posts to the loop.
func (l *volumeLoop) call(fn func()) error {
	ran := make(chan struct{})
	select {
	case l.inbox <- loopMessage{fn: func() { defer close(ran); fn() }}:
	case <-l.quit:
		return errVolumeClosed
	}
	<-ran
	return nil
}

// close ends the loop: the drives it took run to their end (their waits
// included), the ones posted from now on get errVolumeClosed, and close
// returns once the loop and every wait it started are over.
func (l *volumeLoop) close() {
	l.closeOnce.Do(func() { close(l.quit) })
	<-l.done
	l.off.Wait()
}

// run is the loop: it takes the inbox's messages in order until it is
// closed and no drive it took is left.
func (l *volumeLoop) run(claimed chan<- struct{}) {
	l.owner.Claim()
	close(claimed)
	defer close(l.done)
	defer l.runNews(true) // after Release: news told meanwhile may run here or at once
	defer l.owner.Release()
	running := 0
	quit := l.quit
	for quit != nil || running > 0 {
		select {
		case <-l.newsReady:
			l.runNews(false)
		case m := <-l.inbox:
			// The news told before m was posted first: m steps on the
			// state it left.
			l.runNews(false)
			switch {
			case m.fn != nil:
				// Taken, so run (the loop may be closing: its caller
				// waits for it all the same).
				m.fn()
				continue
			case m.resumed:
				m.drive.d.Done(m.err)
			case isClosed(l.quit):
				// Posted as the loop closes (the poster's select may
				// take the inbox though quit is closed).
				m.drive.reply <- errVolumeClosed
				continue
			default:
				running++
			}
			if l.advance(m.drive) {
				running--
			}
		case <-quit:
			quit = nil
		}
	}
}

// advance runs ld as far as it goes on the loop: the waits it needs are
// started off the loop (then it reports false: the drive goes on when the
// wait's end comes back), the rest done here. It reports whether the
// drive is over (its result sent).
func (l *volumeLoop) advance(ld *loopDrive) bool {
	for {
		n := ld.d.Next(ld.fx)
		if n.Kind == volstate.NeedNothing {
			_, err := ld.d.Result()
			ld.reply <- err
			return true
		}
		if !ld.fx.offLoop(n.Action) {
			ld.d.Done(do(ld.fx, n))
			continue
		}
		l.off.Add(1)
		go func() {
			defer l.off.Done()
			err := do(ld.fx, n)
			l.inbox <- loopMessage{drive: ld, resumed: true, err: err}
		}()
		return false
	}
}

// do does what a drive needs: a waiting preparation or an action.
func do(fx loopEffects, n volstate.Need) error {
	if n.Kind == volstate.NeedPrepare {
		return fx.Prepare(n.Action)
	}
	return fx.Perform(n.Action)
}
