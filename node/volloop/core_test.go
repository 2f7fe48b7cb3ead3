package volloop

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/replvol/replvol/node/volstate"
)

// The Core alone, on the test's one goroutine, as the simulation runs
// it: a drive's wait off the loop comes back as a Wait and nothing more
// is done until its end is taken; another drive (posted from the wait, as
// a sender's on its way out) and a call are taken meanwhile; the drive
// then goes on on the state they left; after the close a drive posted is
// refused at once and the Core is over once the drive under way ends.
func TestTheCoreHandsBackItsWaitsAndGoesOnWhenTheyEnd(t *testing.T) {
	lv := loopSecondary()
	var c Core
	type result struct {
		acts []volstate.Action
		err  error
	}
	var results []result
	done := func(acts []volstate.Action, err error) { results = append(results, result{acts, err}) }
	var waited []volstate.ActionKind
	fx := &loopFx{lv: lv, wait: func(a volstate.Action) error {
		waited = append(waited, a.Kind)
		if a.Kind == volstate.StopPeers {
			// A sender on its way out drives the volume: the Core takes
			// it while the force waits.
			if w := c.Take(Post(NewDrive(&loopFx{lv: lv}, raftSays(4), done))); len(w) != 0 {
				t.Errorf("raft's epoch 4 waits for %v, want nothing", w[0].Need())
			}
		}
		return nil
	}}
	waits := c.Take(Post(NewDrive(fx, force(), done)))
	if len(waits) != 1 || waits[0].Need().Kind != volstate.NeedPrepare || waits[0].Need().Action.Kind != volstate.StopPeers {
		t.Fatalf("the force's waits: %v, want its StopPeers", waits)
	}
	if len(results) != 0 || len(lv.lines()) != 0 {
		t.Fatalf("the force did something before its wait ended: results %v, writes %q", results, lv.lines())
	}
	called := false
	c.Take(Call(func() { called = true }))
	if !called {
		t.Fatal("a call taken while a drive waits did not run")
	}
	first := waits[0].Do() // the sender's drive is taken meanwhile
	c.Take(Close())
	if c.Over() {
		t.Fatal("the Core is over while the force it took waits")
	}
	waits = c.Take(waits[0].Resumed(first))
	for len(waits) > 0 {
		w := waits[0]
		waits = append(waits[1:], c.Take(w.Resumed(w.Do()))...)
	}
	if !c.Over() {
		t.Error("the Core is not over once its last drive ended after the close")
	}
	if len(results) != 2 || results[0].err != nil || results[1].err != nil || len(results[1].acts) == 0 {
		t.Fatalf("the drives' results: %v, want raft's epoch 4, then the force, both done", results)
	}
	want := []string{"commit volstate.AuthorityChanged epoch=4 primary=a", "commit volstate.Force epoch=5 primary=b"}
	if got := lv.lines(); !slices.Equal(got, want) {
		t.Errorf("the volume's writes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !slices.Contains(waited, volstate.StopPeers) {
		t.Errorf("the waits done: %v, want the force's StopPeers", waited)
	}
	if w := c.Take(Post(NewDrive(&loopFx{lv: lv}, raftSays(6), done))); len(w) != 0 || len(results) != 3 || !errors.Is(results[2].err, ErrClosed) {
		t.Errorf("a drive posted after the close: waits %v, results %v; want %v at once", w, results, ErrClosed)
	}
}

// TestAWaitsErrorEndsItsDrive: the error a wait off the loop ended with
// is the drive's (rule 7: the actions after it are not performed).
func TestAWaitsErrorEndsItsDrive(t *testing.T) {
	lv := loopSecondary()
	var c Core
	failed := errors.New("the senders would not stop")
	var got error
	over := false
	waits := c.Take(Post(NewDrive(&loopFx{lv: lv}, force(), func(_ []volstate.Action, err error) { got, over = err, true })))
	if len(waits) != 1 {
		t.Fatalf("the force's waits: %v, want one", waits)
	}
	if w := c.Take(waits[0].Resumed(failed)); len(w) != 0 || !over || !errors.Is(got, failed) {
		t.Errorf("the force after its wait failed: waits %v, over %t, error %v; want over with %v", w, over, got, failed)
	}
	if len(lv.lines()) != 0 {
		t.Errorf("a drive whose waiting preparation failed wrote %q", lv.lines())
	}
}
