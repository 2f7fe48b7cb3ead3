package volloop

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// The contract of the volume's loop (loop.go, core.go), on a fake volume: the
// rules are volstate's, the effects write down what they do. A drive
// whose waiting preparation waits for a goroutine that drives the volume
// itself completes; the drives are taken in the order posted; a drive
// posted while the loop closes gets an error, never a wait; and the
// close waits for the waits the loop started.

// loopVolume is the state a fake volume's drives share (the loop and the
// waits it runs off the loop both reach it).
type loopVolume struct {
	mu  sync.Mutex
	st  volstate.State
	log []string
}

func (lv *loopVolume) note(format string, args ...any) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	lv.log = append(lv.log, fmt.Sprintf(format, args...))
}

func (lv *loopVolume) lines() []string {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return slices.Clone(lv.log)
}

// loopFx is one drive's effects over a loopVolume: wait is called for
// each waiting preparation (off the loop, as node's are).
type loopFx struct {
	lv     *loopVolume
	wait   func(volstate.Action) error
	follow []volstate.Event
}

func (f *loopFx) State() volstate.State {
	f.lv.mu.Lock()
	defer f.lv.mu.Unlock()
	return f.lv.st.Clone()
}

func (f *loopFx) Lock()   {}
func (f *loopFx) Unlock() {}

func (f *loopFx) Prepare(a volstate.Action) error {
	if a.Kind.Waits() && f.wait != nil {
		return f.wait(a)
	}
	return nil
}

func (f *loopFx) SetIndicator() error { return nil }

func (f *loopFx) Commit(c volstate.Change) error {
	f.Install(c)
	f.lv.note("commit %T epoch=%d primary=%s", c.Event, c.Next.Durable.Epoch, c.Next.Durable.Primary)
	return nil
}

func (f *loopFx) Install(c volstate.Change) {
	f.lv.mu.Lock()
	defer f.lv.mu.Unlock()
	f.lv.st = c.Next
}

func (f *loopFx) Perform(volstate.Action) error { return nil }
func (f *loopFx) Follow(e volstate.Event)       { f.follow = append(f.follow, e) }

func (f *loopFx) Next() (volstate.Event, bool) {
	if len(f.follow) == 0 {
		return nil, false
	}
	e := f.follow[0]
	f.follow = f.follow[1:]
	return e, true
}

// OffLoop as node's volume and the simulation have it.
func (f *loopFx) OffLoop(a volstate.Action) bool { return OffLoop(a) }

// loopSecondary is node b, a secondary of a at epoch 3 in authority mode,
// with a third node c: a force of it stops its senders and its incoming
// stream first (waiting preparations), and raft's word of a newer epoch
// is written.
func loopSecondary() *loopVolume {
	var g replication.Generation
	copy(g[:], "g1")
	s := volstate.State{Self: "b", Auth: true, Disk: replication.UpToDate, Peers: map[string]volstate.Peer{"a": {}, "c": {}}}
	s.Durable.Epoch, s.Durable.Primary = 3, "a"
	s.Durable.Gens.Current = g
	s.Durable.Gens.History = make([]replication.Generation, replication.HistorySlots)
	return &loopVolume{st: s}
}

func raftSays(epoch uint64) volstate.Event {
	return volstate.AuthorityChanged{Known: true, Primary: "a", Epoch: epoch}
}

func force() volstate.Event {
	var g replication.Generation
	copy(g[:], "g2")
	return volstate.Force{NewGen: g}
}

// awaitLoop fails t unless ch yields within a generous deadline, and returns
// what it yields.
func awaitLoop[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case x := <-ch:
		return x
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer in 30 s (the loop is stuck)", what)
		panic("unreachable")
	}
}

// postHeldForce posts a force of lv to l whose StopPeers waits, off the
// loop, until release is closed; it returns once that wait began, with
// where the force's result comes.
func postHeldForce(t *testing.T, l *Loop, lv *loopVolume) (forced <-chan error, release chan struct{}) {
	t.Helper()
	entered := make(chan struct{})
	release = make(chan struct{})
	forced = l.Post(&loopFx{lv: lv, wait: func(a volstate.Action) error {
		if a.Kind == volstate.StopPeers {
			close(entered)
			<-release
		}
		return nil
	}}, force())
	awaitLoop(t, entered, "the force's wait")
	return forced, release
}

// closeLoop closes l, failing t if that does not end (a stuck loop).
func closeLoop(t *testing.T, l *Loop) {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	awaitLoop(t, closed, "the loop's close")
}

// TestTheLoopDrivesWhileAWaitingPreparationWaits: a force's preparation
// waits for a goroutine (a sender, say) that itself drives the volume and
// waits for that drive's result. The loop takes that drive while the
// preparation waits off the loop, and the force then steps on the state
// as that drive left it (rule 1). Done on the loop, the wait would
// deadlock: the goroutine's drive would never be taken.
func TestTheLoopDrivesWhileAWaitingPreparationWaits(t *testing.T) {
	lv := loopSecondary()
	l := Start()
	defer closeLoop(t, l)
	fx := &loopFx{lv: lv, wait: func(a volstate.Action) error {
		if a.Kind != volstate.StopPeers {
			return nil
		}
		// The sender, on its way out, drives the volume and waits.
		done := make(chan error, 1)
		go func() { done <- l.Drive(&loopFx{lv: lv}, raftSays(4)) }()
		return <-done
	}}
	if err := awaitLoop(t, l.Post(fx, force()), "the force"); err != nil {
		t.Fatalf("the force: %v", err)
	}
	want := []string{"commit volstate.AuthorityChanged epoch=4 primary=a", "commit volstate.Force epoch=5 primary=b"}
	if got := lv.lines(); !slices.Equal(got, want) {
		t.Errorf("the volume's writes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestTheLoopTakesDrivesInTheOrderPosted: drives posted one after
// another, their results not awaited, are taken in that order (raft's
// epochs 4 to 53 each written, none skipped as older than one taken
// before it), also while an earlier drive waits off the loop: those are
// taken meanwhile, in order, and the waiting one after its wait, on the
// state as they left it.
func TestTheLoopTakesDrivesInTheOrderPosted(t *testing.T) {
	lv := loopSecondary()
	l := Start()
	defer closeLoop(t, l)
	forced, release := postHeldForce(t, l, lv)
	var results []<-chan error
	var want []string
	for epoch := uint64(4); epoch < 54; epoch++ {
		results = append(results, l.Post(&loopFx{lv: lv}, raftSays(epoch)))
		want = append(want, fmt.Sprintf("commit volstate.AuthorityChanged epoch=%d primary=a", epoch))
	}
	for i, r := range results {
		if err := awaitLoop(t, r, fmt.Sprintf("raft's epoch %d", i+4)); err != nil {
			t.Fatalf("raft's epoch %d: %v", i+4, err)
		}
	}
	close(release)
	if err := awaitLoop(t, forced, "the force"); err != nil {
		t.Fatalf("the force: %v", err)
	}
	want = append(want, "commit volstate.Force epoch=54 primary=b")
	if got := lv.lines(); !slices.Equal(got, want) {
		t.Errorf("the volume's writes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestTheLoopClosesAfterItsWaitsAndRefusesWhatComesMeanwhile: a close
// waits for the drive under way, whose preparation waits off the loop; a
// drive posted meanwhile, or after, gets ErrClosed at once; the
// drive under way ends as it would have, and the loop's goroutine and its
// waits are over when close returns.
func TestTheLoopClosesAfterItsWaitsAndRefusesWhatComesMeanwhile(t *testing.T) {
	lv := loopSecondary()
	l := Start()
	forced, release := postHeldForce(t, l, lv)
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	awaitLoop(t, l.quit, "the close's start")
	if err := awaitLoop(t, l.Post(&loopFx{lv: lv}, raftSays(4)), "a drive posted while the loop closes"); !errors.Is(err, ErrClosed) {
		t.Errorf("a drive posted while the loop closes: %v, want %v", err, ErrClosed)
	}
	select {
	case <-closed:
		t.Fatal("the close returned while a drive's preparation still waits off the loop")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := awaitLoop(t, forced, "the force"); err != nil {
		t.Errorf("the drive under way at the close: %v, want its own result", err)
	}
	awaitLoop(t, closed, "the close")
	awaitLoop(t, l.done, "the loop's end")
	if err := awaitLoop(t, l.Post(&loopFx{lv: lv}, raftSays(5)), "a drive posted after the close"); !errors.Is(err, ErrClosed) {
		t.Errorf("a drive posted after the close: %v, want %v", err, ErrClosed)
	}
	want := []string{"commit volstate.Force epoch=4 primary=b"}
	if got := lv.lines(); !slices.Equal(got, want) {
		t.Errorf("the volume's writes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestACallRunsOnTheLoopBetweenItsDrives: a call posted behind drives is
// run after them, on the state they left, also while an earlier drive
// waits off the loop; once the loop closed a call is refused with
// ErrClosed and not run.
func TestACallRunsOnTheLoopBetweenItsDrives(t *testing.T) {
	lv := loopSecondary()
	l := Start()
	forced, release := postHeldForce(t, l, lv)
	first := l.Post(&loopFx{lv: lv}, raftSays(4))
	var seen []string
	called := make(chan error, 1)
	go func() { called <- l.Call(func() { seen = lv.lines() }) }()
	if err := awaitLoop(t, called, "the call"); err != nil {
		t.Fatalf("the call: %v", err)
	}
	if err := awaitLoop(t, first, "raft's epoch 4"); err != nil {
		t.Fatalf("raft's epoch 4: %v", err)
	}
	if want := []string{"commit volstate.AuthorityChanged epoch=4 primary=a"}; !slices.Equal(seen, want) {
		t.Errorf("the call saw the volume's writes %q, want those of the drive posted before it, %q", seen, want)
	}
	close(release)
	if err := awaitLoop(t, forced, "the force"); err != nil {
		t.Fatalf("the force: %v", err)
	}
	l.Close()
	ran := false
	if err := l.Call(func() { ran = true }); !errors.Is(err, ErrClosed) || ran {
		t.Errorf("a call on a closed loop: %v, ran %t; want %v, not run", err, ran, ErrClosed)
	}
}

// TestNewsToldRunsOnTheLoopBeforeWhatIsPostedAfterIt: news told while the
// loop is busy (a session's loop tells the peer's state and goes on) is
// run on the loop, in the order told, BEFORE a drive or a call posted
// after it, so that the drive steps on the state the news left; the
// teller never waits. Once the loop has ended, news runs at once where
// it is told, and ask returns once its news ran, either way.
func TestNewsToldRunsOnTheLoopBeforeWhatIsPostedAfterIt(t *testing.T) {
	lv := loopSecondary()
	l := Start()
	for round := range 50 {
		gate, busy := make(chan struct{}), make(chan struct{})
		go l.Call(func() { close(busy); <-gate })
		awaitLoop(t, busy, "the call that keeps the loop busy")
		var order []string // the loop's alone: each entry is written on it
		for i := range 3 {
			l.Tell(func() { order = append(order, fmt.Sprintf("news %d, %d writes", i, len(lv.lines()))) })
		}
		epoch := uint64(4 + round)
		drove := make(chan error, 1)
		go func() { drove <- <-l.Post(&loopFx{lv: lv}, raftSays(epoch)) }() // posted while the loop is busy
		called := make(chan error, 1)
		go func() { called <- l.Call(func() { order = append(order, "call") }) }()
		close(gate)
		if err := awaitLoop(t, drove, "the drive posted after the news"); err != nil {
			t.Fatalf("the drive: %v", err)
		}
		if err := awaitLoop(t, called, "the call posted after the news"); err != nil {
			t.Fatalf("the call: %v", err)
		}
		before := round // the writes of the rounds before this one
		want := []string{
			fmt.Sprintf("news 0, %d writes", before), fmt.Sprintf("news 1, %d writes", before), fmt.Sprintf("news 2, %d writes", before), "call",
		}
		if !slices.Equal(order, want) {
			t.Fatalf("round %d: the loop ran %q, want %q (the news, in order, before the drive posted after it)", round, order, want)
		}
	}
	asked := false
	l.Ask(func() { asked = true })
	if !asked {
		t.Error("ask returned before its news ran on the loop")
	}
	closeLoop(t, l)
	ranAt := ""
	l.Tell(func() { ranAt = "told" })
	if ranAt != "told" {
		t.Error("news told once the loop ended did not run at once")
	}
	l.Ask(func() { asked = false })
	if asked {
		t.Error("ask once the loop ended did not run its news")
	}
}
