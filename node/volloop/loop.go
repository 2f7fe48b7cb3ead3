package volloop

import (
	"sync"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/node/volstate"
)

// The volume's loop as production runs it: the one goroutine that takes
// the volume's messages and hands them to its Core. A caller posts its
// event, with the effects of its drive (node's: the volume's, with the
// caller's texts and notices), on the loop's inbox and waits for the
// result of the event and of what follows it (Quiesced).
//
// Each Wait the Core returns runs on a goroutine of its own, counted
// (off), whose end comes back to the inbox as the message that continues
// the drive where it stood (Core).
//
// The loop starts when the volume opens (node's newVolume) and ends at
// close (node's shutdown, closeVolumes) once every drive it took is over:
// a drive posted from then on gets ErrClosed at once, never a wait.
//
// The loop also owns the peers' replication states (node's peerView: the
// state, the stream it belongs to, the peer's disk, why): only code on
// the loop changes them (node's peer.update checks it with Check in the
// deadlock build). News from a goroutine the loop may wait for without
// taking its messages (a session's loop, which the volume's loop hands
// entries to) is told (Tell): queued without a wait, and run on the loop
// BEFORE the next message of the inbox, so that a drive posted after some
// news steps on the state that news left. The peer's link, which the
// loop never waits for, calls (Call) and waits.

// Loop is a volume's loop.
type Loop struct {
	// inbox takes the drives posted, the calls and the ends of the waits.
	// It holds nothing (unbuffered): a post is taken by the running loop,
	// or the poster sees quit.
	inbox chan Message
	// quit is closed by Close: the loop takes no new drive.
	quit      chan struct{}
	closeOnce sync.Once
	// done is closed when the loop has ended.
	done chan struct{}
	// off counts the waits running off the loop.
	off sync.WaitGroup
	// owner is the loop's goroutine, the only one that changes what the
	// loop owns (the peers' views).
	owner lockorder.Owner
	// core is the loop's step; only the loop's goroutine uses it.
	core Core

	// newsMu guards news and ended; newsMu is a leaf.
	newsMu lockorder.Mutex
	// news is what was told and not yet run, in the order told; a wake
	// on newsReady (buffered: Tell never waits) says there is some.
	news      []func()
	newsReady chan struct{}
	// ended: the loop has ended; news told from now on runs at once, on
	// the teller's goroutine (nothing else changes the state any more).
	ended bool
}

// Start starts a volume's loop.
func Start() *Loop {
	l := &Loop{inbox: make(chan Message), quit: make(chan struct{}), done: make(chan struct{}), newsReady: make(chan struct{}, 1)}
	claimed := make(chan struct{})
	go l.run(claimed)
	<-claimed // the loop owns what it owns from the start
	return l
}

// Check panics, in the deadlock build, unless it is called on the loop
// (or once the loop has ended): a change of what the loop owns (what, of
// whose: a peer's state, the peer) made elsewhere.
func (l *Loop) Check(what, whose string) { l.owner.Check(what, whose) }

// Tell runs fn on the loop, after the news told before it and BEFORE
// the next message of the inbox the loop takes, without waiting for it:
// news from a goroutine the loop may wait for (a session's loop, whose
// inbox the volume's loop hands entries to). Once the loop has ended, fn
// runs at once, here. fn must not wait.
func (l *Loop) Tell(fn func()) {
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

// Ask runs fn on the loop as Tell does, and returns once it ran: for a
// goroutine the loop never waits for (a peer's link, the control API).
// Unlike Call, it never fails: once the loop has ended, fn runs here.
func (l *Loop) Ask(fn func()) {
	ran := make(chan struct{})
	l.Tell(func() { defer close(ran); fn() })
	<-ran
}

// runNews runs the news told so far, in order, on the loop (through the
// core, until none is left: news that news tells runs too); last: the
// loop ends, and news told from now on runs where it is told.
func (l *Loop) runNews(last bool) {
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
		l.core.Take(News(news...))
	}
}

// Drive posts e with its effects and waits for the drive's result
// (volstate.Drive's error): ErrClosed when the loop closes first.
func (l *Loop) Drive(fx Effects, e volstate.Event) error {
	return <-l.Post(fx, e)
}

// Post posts e with its effects and returns where its result comes, once
// the loop took it: the loop takes the drives in the order they are
// posted.
func (l *Loop) Post(fx Effects, e volstate.Event) <-chan error {
	reply := make(chan error, 1) // the loop never waits on it
	d := NewDrive(fx, e, func(_ []volstate.Action, err error) { reply <- err })
	select {
	case l.inbox <- Post(d):
	case <-l.quit:
		reply <- ErrClosed
	}
	return reply
}

// Call runs fn on the loop, between its drives' steps, and returns once
// it ran: ErrClosed, without running it, when the loop closes first. fn
// is a step that cannot be an event alone (node's handshake decision,
// which marks what the step needs on the state it is taken on, and
// switches the peer's writes to the stream with it): it steps the volume
// under the volume's state lock, which it takes. It must not wait for
// anything that posts to the loop.
func (l *Loop) Call(fn func()) error {
	ran := make(chan struct{})
	select {
	case l.inbox <- Call(func() { defer close(ran); fn() }):
	case <-l.quit:
		return ErrClosed
	}
	<-ran
	return nil
}

// Close ends the loop: the drives it took run to their end (their waits
// included), the ones posted from now on get ErrClosed, and Close
// returns once the loop and every wait it started are over.
func (l *Loop) Close() {
	l.closeOnce.Do(func() { close(l.quit) })
	<-l.done
	l.off.Wait()
}

// run is the loop: it takes the inbox's messages in order until it is
// closed and no drive it took is left.
func (l *Loop) run(claimed chan<- struct{}) {
	l.owner.Claim()
	close(claimed)
	defer close(l.done)
	defer l.runNews(true) // after Release: news told meanwhile may run here or at once
	defer l.owner.Release()
	quit := l.quit
	for !l.core.Over() {
		select {
		case <-l.newsReady:
			l.runNews(false)
		case m := <-l.inbox:
			// The news told before m was posted first: m steps on the
			// state it left.
			l.runNews(false)
			select {
			case <-quit:
				// Posted as the loop closes (the poster's select may
				// take the inbox though quit is closed): the core takes
				// the close first, and refuses a drive posted.
				l.core.Take(Close())
				quit = nil
			default: // not closed, or the close taken already (quit nil)
			}
			l.start(l.core.Take(m))
		case <-quit:
			l.core.Take(Close())
			quit = nil
		}
	}
}

// start runs each wait on a goroutine of its own, counted, whose end
// comes back to the inbox.
func (l *Loop) start(waits []Wait) {
	for _, w := range waits {
		l.off.Add(1)
		go func() {
			defer l.off.Done()
			l.inbox <- w.Resumed(w.Do())
		}()
	}
}
