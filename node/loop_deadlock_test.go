//go:build deadlock

package node

import (
	"fmt"
	"strings"
	"testing"

	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// TestAPeersStateChangesOnlyOnTheVolumesLoop: in the checked build (the
// deadlock tag, which make test runs) a change of a peer's replication
// state off the volume's loop panics, naming the peer; told or asked, the
// same change runs on the loop and passes. Every other test of the
// package, run in this build, so checks each change it makes.
func TestAPeersStateChangesOnlyOnTheVolumesLoop(t *testing.T) {
	l := volloop.Start()
	defer l.Close()
	p := &peer{v: &Volume{loop: l}, name: "beta"}
	p.view.Store(&peerView{state: replication.Connecting})
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "peer beta") {
				t.Errorf("a change of beta's state off the loop: recovered %v, want a panic naming beta", r)
			}
		}()
		p.update(func(pv *peerView) { pv.state = replication.Connected })
	}()
	if got := p.snapshot().state; got != replication.Connecting {
		t.Fatalf("the refused change was made: %s", got)
	}
	if was := p.askUpdate(func(pv *peerView) { pv.state = replication.Connected }); was.state != replication.Connecting {
		t.Errorf("asked: replaced %s, want Connecting", was.state)
	}
	p.tellUpdate(func(pv *peerView) { pv.state = replication.SyncSource })
	l.Ask(func() {})
	if got := p.snapshot().state; got != replication.SyncSource {
		t.Errorf("told, then the loop asked past it: %s, want SyncSource", got)
	}
}

// TestTheVolumesStateChangesOnlyOnItsLoop: in the checked build an
// install of the volume's state (a step's, installLocked) off the volume's
// loop panics, naming the volume; the same install on the loop passes.
// The durable state's (commit) is checked the same way; every other test
// of the package, run in this build, so checks that each step it takes,
// and a resize's record of its size, runs on the loop (where the
// functions that may write the state are is TestOnlyTheStepsWriteTheVolumesState's).
func TestTheVolumesStateChangesOnlyOnItsLoop(t *testing.T) {
	l := volloop.Start()
	defer l.Close()
	v := &Volume{loop: l, name: "vol0"}
	old := volstate.State{Self: "alpha", Peers: map[string]volstate.Peer{}}
	next := old.Clone()
	next.AdminDown = true
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "volume vol0") {
				t.Errorf("an install off the loop: recovered %v, want a panic naming vol0", r)
			}
		}()
		v.installLocked(old, next, volstate.Ready{}, nil)
	}()
	if v.st.AdminDown {
		t.Fatal("the refused install was made")
	}
	l.Ask(func() { v.installLocked(old, next, volstate.Ready{}, nil) })
	if !v.st.AdminDown {
		t.Error("the install on the loop was not made")
	}
}
