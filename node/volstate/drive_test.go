package volstate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/replvol/replvol/replication"
)

// recorder is a fake of a volume's effects that writes down every call
// of the driver, in order, and fails the ones it is told to.
type recorder struct {
	st     State
	log    []string
	locked bool
	follow []Event
	// failAt: the call (as logged, up to its first space) that fails.
	failAt string
	// states: the states State returns next, before st (a state that
	// changed between the pre-step and the step under the lock).
	states []State
}

var errInjected = errors.New("injected failure")

func (r *recorder) note(format string, args ...any) error {
	line := fmt.Sprintf(format, args...)
	if r.locked {
		line = "  " + line
	}
	r.log = append(r.log, line)
	if r.failAt != "" && strings.HasPrefix(strings.TrimSpace(line), r.failAt) {
		return errInjected
	}
	return nil
}

func (r *recorder) State() State {
	if len(r.states) > 0 {
		s := r.states[0]
		r.states = r.states[1:]
		return s.Clone()
	}
	return r.st.Clone()
}

func (r *recorder) Lock() {
	_ = r.note("lock")
	r.locked = true
}

func (r *recorder) Unlock() {
	r.locked = false
	_ = r.note("unlock")
}

func (r *recorder) Prepare(a Action) error { return r.note("prepare %s", a) }
func (r *recorder) SetIndicator() error    { return r.note("set-indicator") }

func (r *recorder) Commit(c Change) error {
	if err := r.note("commit epoch=%d primary=%s", c.Ready.Persist.Epoch, c.Ready.Persist.Primary); err != nil {
		return err
	}
	r.install(c)
	return nil
}

func (r *recorder) Install(c Change) {
	if c.Err != nil {
		_ = r.note("install-failed %s", c.Err)
	}
	r.install(c)
}

func (r *recorder) install(c Change) {
	r.st = c.Next
	_ = r.note("installed %T: %s %s epoch=%d primary=%s", c.Event, c.Next.Role(), c.Next.Serving, c.Next.Durable.Epoch, c.Next.Durable.Primary)
}

func (r *recorder) Perform(a Action) error { return r.note("perform %s", a) }
func (r *recorder) Follow(e Event)         { r.follow = append(r.follow, e) }

func (r *recorder) Next() (Event, bool) {
	if len(r.follow) == 0 {
		return nil, false
	}
	e := r.follow[0]
	r.follow = r.follow[1:]
	_ = r.note("next %T", e)
	return e, true
}

// index is where the first line starting with prefix is in the log
// (leading spaces ignored), -1 when none.
func (r *recorder) index(prefix string) int {
	return slices.IndexFunc(r.log, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), prefix) })
}

func (r *recorder) has(prefix string) bool { return r.index(prefix) >= 0 }

// before fails t unless every line starting with a comes before the
// first one starting with b, and both are there.
func (r *recorder) before(t *testing.T, a, b string) {
	t.Helper()
	ia, ib := r.index(a), r.index(b)
	if ia < 0 || ib < 0 {
		t.Fatalf("want %q and %q in the log:\n%s", a, b, strings.Join(r.log, "\n"))
	}
	for i, l := range r.log {
		if strings.HasPrefix(strings.TrimSpace(l), a) && i > ib {
			t.Errorf("%q at %d after %q at %d:\n%s", a, i, b, ib, strings.Join(r.log, "\n"))
		}
	}
}

func driveGen(name string) replication.Generation {
	var g replication.Generation
	copy(g[:], name)
	return g
}

// secondaryOf is node self, a secondary of primary at epoch, with peers.
func secondaryOf(self, primary string, epoch uint64, peers ...string) State {
	s := State{Self: self, Peers: map[string]Peer{}, Disk: replication.UpToDate}
	for _, p := range peers {
		s.Peers[p] = Peer{Repl: replication.Connecting}
	}
	s.Durable.Epoch, s.Durable.Primary = epoch, primary
	s.Durable.Gens.Current = driveGen("g1")
	s.Durable.Gens.History = make([]replication.Generation, replication.HistorySlots)
	return s
}

// primaryAt is node self, the serving primary at epoch, with peers (in
// authority mode: raft's word moves it).
func primaryAt(self string, epoch uint64, peers ...string) State {
	s := secondaryOf(self, self, epoch, peers...)
	s.Serving, s.Auth = Open, true
	return s
}

// forced is the operator's force of b, a secondary of a with a third
// node c: every preparation (StopPeers and DetachIncoming wait, the
// activity log marked toward c), the indicator, the durable state, and
// actions.
func forced() (*recorder, Event) {
	return &recorder{st: secondaryOf("b", "a", 3, "a", "c")}, Force{NewGen: driveGen("g2")}
}

// TestDriveOrder pins the order of volstate.Drive's rules on a step that
// asks for everything: the waiting preparations BEFORE the lock, the
// activity log's marks under it BEFORE any write, the indicator BEFORE
// the durable state, the install with the commit, and the actions only
// after the lock is released.
func TestDriveOrder(t *testing.T) {
	r, e := forced()
	acts, err := Drive(r, e)
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Join(r.log, "\n")
	want := `prepare stop-peers
prepare detach-incoming
lock
  prepare mark-activity-log peer=c
  set-indicator
  commit epoch=4 primary=b
  installed volstate.Force: Primary Open epoch=4 primary=b
unlock
perform reset-peers
perform run-hook on_promote epoch=4
perform notify forced-primary epoch=4`
	if log != want {
		t.Errorf("the driver's calls:\n%s\nwant:\n%s", log, want)
	}
	if len(acts) != 3 {
		t.Errorf("Drive returned the actions %v, want the step's 3", acts)
	}
	// Each rule on its own, so that a break says which.
	r.before(t, "prepare stop-peers", "lock")
	r.before(t, "prepare detach-incoming", "lock")
	r.before(t, "prepare mark-activity-log", "set-indicator")
	r.before(t, "set-indicator", "commit")
	r.before(t, "commit", "installed")
	r.before(t, "installed", "perform")
	r.before(t, "unlock", "perform")
}

// TestDriveFailedWriteInstallsNothingAndPerformsNothing pins rule 6: when
// a preparation, the indicator or the durable state fails, the step's
// state is not installed (only what the failure itself changes), no
// later write happens, and no action is performed.
func TestDriveFailedWriteInstallsNothingAndPerformsNothing(t *testing.T) {
	for _, fail := range []string{"prepare mark-activity-log", "set-indicator", "commit"} {
		t.Run(fail, func(t *testing.T) {
			r2, e2 := forced()
			was := r2.st.Clone()
			r2.failAt = fail
			_, err := Drive(r2, e2)
			if !errors.Is(err, errInjected) {
				t.Fatalf("Drive: %v, want the injected failure", err)
			}
			if r2.has("perform") {
				t.Errorf("an action was performed after %s failed:\n%s", fail, strings.Join(r2.log, "\n"))
			}
			if r2.has("installed volstate.Force: Primary") || r2.st.Role() == replication.Primary {
				t.Errorf("the new state was installed though %s failed:\n%s", fail, strings.Join(r2.log, "\n"))
			}
			if r2.st.Durable.Epoch != was.Durable.Epoch || r2.st.Durable.Primary != was.Durable.Primary {
				t.Errorf("the state after the failure is epoch %d primary %s, want it as it was (%d, %s)", r2.st.Durable.Epoch, r2.st.Durable.Primary, was.Durable.Epoch, was.Durable.Primary)
			}
			if !r2.has("install-failed") {
				t.Errorf("the failure was not installed (what it changes):\n%s", strings.Join(r2.log, "\n"))
			}
			after := map[string][]string{"prepare mark-activity-log": {"set-indicator", "commit"}, "set-indicator": {"commit"}}[fail]
			for _, w := range after {
				if r2.has(w) {
					t.Errorf("%s happened after %s failed:\n%s", w, fail, strings.Join(r2.log, "\n"))
				}
			}
			if len(r2.follow) != 0 {
				t.Errorf("events follow a failed step: %v", r2.follow)
			}
		})
	}
}

// TestDriveFailedWriteMissedStopsIO pins what a failure itself changes: a
// primary that cannot record that a peer misses writes stops its IO, and
// that is installed, nothing else.
func TestDriveFailedWriteMissedStopsIO(t *testing.T) {
	r := &recorder{st: primaryAt("a", 3, "b"), failAt: "commit"}
	_, err := Drive(r, WriteMissed{Peer: "b", Next: driveGen("g2")})
	if !errors.Is(err, errInjected) {
		t.Fatalf("Drive: %v, want the injected failure (log:\n%s)", err, strings.Join(r.log, "\n"))
	}
	if r.st.Serving != Stopped || r.st.Why != CauseStateWriteFailed {
		t.Errorf("after the failed write the primary is %s (%s), want Stopped for %s", r.st.Serving, r.st.Why, CauseStateWriteFailed)
	}
	if r.st.Durable.Gens.Current != driveGen("g1") {
		t.Errorf("the failed step's generation %s was installed", r.st.Durable.Gens.Current)
	}
}

// TestDriveWaitAndDrainFeedQuiescedBack pins rule 8: a WaitIO, and the
// DrainIO its recheck asks for, are each followed by Quiesced, stepped
// once the actions are performed, until the step-down is durable.
func TestDriveWaitAndDrainFeedQuiescedBack(t *testing.T) {
	s := primaryAt("a", 3, "b", "c")
	r := &recorder{st: s}
	_, err := Drive(r, PrimaryReached{From: "b", Epoch: 4, UUIDs: s.UUIDs("b"), HandedOver: true})
	if err != nil {
		t.Fatal(err)
	}
	r.before(t, "perform wait-io", "next volstate.Quiesced")
	wait, drain := r.index("perform wait-io"), r.index("perform drain-io")
	if wait < 0 || drain < 0 || drain < wait {
		t.Fatalf("want wait-io, then drain-io:\n%s", strings.Join(r.log, "\n"))
	}
	quiesced := 0
	for i, l := range r.log {
		if l == "next volstate.Quiesced" {
			quiesced++
			if i < wait || (quiesced == 2 && i < drain) {
				t.Errorf("Quiesced %d at %d, before the IO it waits for:\n%s", quiesced, i, strings.Join(r.log, "\n"))
			}
		}
	}
	if quiesced != 2 {
		t.Errorf("Quiesced followed %d times, want 2 (after the wait, after the drain):\n%s", quiesced, strings.Join(r.log, "\n"))
	}
	if r.st.Role() != replication.Secondary || r.st.Durable.Primary != "b" || r.st.Durable.Epoch != 4 {
		t.Errorf("after the drive the node is %s of %s at %d, want the secondary of b at 4:\n%s", r.st.Role(), r.st.Durable.Primary, r.st.Durable.Epoch, strings.Join(r.log, "\n"))
	}
}

// TestDriveFailedActionEndsTheDrive pins rule 7's end: a drain that
// failed ends the drive with its error, and no Quiesced follows it.
func TestDriveFailedActionEndsTheDrive(t *testing.T) {
	r := &recorder{st: primaryAt("a", 3, "b"), failAt: "perform drain-io"}
	_, err := Drive(r, AuthorityChanged{Known: true, Primary: "b", Epoch: 4})
	if !errors.Is(err, errInjected) {
		t.Fatalf("Drive: %v, want the drain's failure:\n%s", err, strings.Join(r.log, "\n"))
	}
	if r.has("next") || len(r.follow) != 0 {
		t.Errorf("an event followed a failed drain:\n%s", strings.Join(r.log, "\n"))
	}
	if r.st.Durable.Primary != "a" {
		t.Errorf("the step-down was written though its drain failed")
	}
}

// TestDriveRefusedEventDoesNothing: an event the rules refuse prepares,
// locks, writes, installs and performs nothing.
func TestDriveRefusedEventDoesNothing(t *testing.T) {
	r := &recorder{st: primaryAt("a", 3, "b")}
	_, err := Drive(r, DiscardMyData{})
	if !errors.Is(err, ErrNotSplitBrain) {
		t.Fatalf("Drive: %v, want %v", err, ErrNotSplitBrain)
	}
	if len(r.log) != 0 {
		t.Errorf("a refused event did:\n%s", strings.Join(r.log, "\n"))
	}
}

// TestDriveStepsAgainUnderTheLock pins rule 2: the step under the lock is
// taken on the state as it is then, not as the waiting preparations found
// it (another step may have run meanwhile).
func TestDriveStepsAgainUnderTheLock(t *testing.T) {
	before := secondaryOf("b", "a", 3, "a", "c")
	now := secondaryOf("b", "a", 5, "a", "c")
	r := &recorder{st: now, states: []State{before}}
	if _, err := Drive(r, Force{NewGen: driveGen("g2")}); err != nil {
		t.Fatal(err)
	}
	if !r.has("commit epoch=6") {
		t.Errorf("the step under the lock did not take the state as it was then (epoch 5, so the force takes 6):\n%s", strings.Join(r.log, "\n"))
	}
}

// TestDriveInstallsAStepThatWritesNothing: a step with no write is
// installed (Install, with its actions), then its actions performed.
func TestDriveInstallsAStepThatWritesNothing(t *testing.T) {
	r := &recorder{st: primaryAt("a", 3, "b")}
	if _, err := Drive(r, AuthorityChanged{Known: true, Primary: "b", Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	r.before(t, "installed volstate.AuthorityChanged: Primary Fenced", "perform stop-lease")
}

// noWaits is a recorder whose steps may ask for no waiting preparation.
type noWaits struct {
	*recorder
	asked []Action
}

func (n *noWaits) AskedToWait(a Action) { n.asked = append(n.asked, a) }

// TestTakeTellsOfTheWaitingPreparationsItLeaves: Take leaves the waiting
// preparations to Drive; a StepEffects that can take none (node's step
// under v.mu alone) is told of each, so that a step asking for one is a
// loud bug, not a preparation skipped in silence. One that can do
// without hears nothing.
func TestTakeTellsOfTheWaitingPreparationsItLeaves(t *testing.T) {
	r, e := forced()
	n := &noWaits{recorder: r}
	if _, err := Take(n, e); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range n.asked {
		got = append(got, a.String())
	}
	if want := []string{"stop-peers", "detach-incoming"}; !slices.Equal(got, want) {
		t.Fatalf("Take told of the waiting preparations %v, want %v", got, want)
	}
	if r.has("prepare stop-peers") || r.has("prepare detach-incoming") {
		t.Fatalf("Take did a waiting preparation itself:\n%s", strings.Join(r.log, "\n"))
	}
	n2 := &noWaits{recorder: &recorder{st: primaryAt("a", 3, "b")}}
	if _, err := Take(n2, Quiesced{}); err != nil {
		t.Fatal(err)
	}
	if len(n2.asked) != 0 {
		t.Fatalf("a step with no waiting preparation told of %v", n2.asked)
	}
}

// TestDrivingPausesAtEachWaitAndAction pins the resumable form of the
// driver (Driving), which node's volume loop runs: it hands out each
// waiting preparation and each action, one at a time, takes nothing and
// locks nothing while one is out, and takes the step on the state as it
// is when the last waiting preparation is reported done (another drive
// may have changed it meanwhile).
func TestDrivingPausesAtEachWaitAndAction(t *testing.T) {
	r, e := forced()
	d := Begin(e)
	var got []string
	for {
		n := d.Next(r)
		if n.Kind == NeedNothing {
			break
		}
		got = append(got, fmt.Sprintf("%d %s", n.Kind, n.Action))
		if r.locked || r.has("lock") && n.Kind == NeedPrepare {
			t.Fatalf("a waiting preparation handed out under, or after, the lock:\n%s", strings.Join(r.log, "\n"))
		}
		if n.Kind == NeedPrepare && n.Action.Kind == DetachIncoming {
			// Another step ran while this one waited.
			r.st.Durable.Epoch = 5
		}
		d.Done(nil)
	}
	want := []string{"1 stop-peers", "1 detach-incoming", "2 reset-peers", "2 run-hook on_promote epoch=6", "2 notify forced-primary epoch=6"}
	if !slices.Equal(got, want) {
		t.Errorf("the drive asked for %q, want %q", got, want)
	}
	if !r.has("commit epoch=6") {
		t.Errorf("the step was not taken on the state as it was after the waits:\n%s", strings.Join(r.log, "\n"))
	}
	if acts, err := d.Result(); err != nil || len(acts) != 3 {
		t.Errorf("Result: %v %v, want the step's 3 actions", acts, err)
	}
}

// refreshing is a recorder whose events are given anew after a wait
// (Refresher): raft's word as it is by then.
type refreshing struct {
	*recorder
	now       Event
	refreshed int
}

func (r *refreshing) Refresh(e Event) (Event, bool) {
	r.refreshed++
	_ = r.note("refresh %T", e)
	if r.now == nil || e == r.now {
		return e, false
	}
	return r.now, true
}

// TestADriveTakesRaftsWordAsItIsAfterItsWait: a promotion by raft waits
// for the old primary's stream to end (DetachIncoming) before its step;
// raft named another primary at a newer epoch meanwhile. The step under
// the lock takes the event as the effects give it anew (Refresher), from
// its pre-step: this node follows the newer primary and sets no
// indicator. Without a newer word, the event is taken as posted. (The
// simulation, with its waits interleaved, seed 827: a node recorded
// itself primary at the older epoch.)
func TestADriveTakesRaftsWordAsItIsAfterItsWait(t *testing.T) {
	st := secondaryOf("b", "a", 3, "a", "c")
	st.Auth = true
	promote := AuthorityChanged{Known: true, Primary: "b", Epoch: 4, Failover: true}

	r := &refreshing{recorder: &recorder{st: st.Clone()}, now: AuthorityChanged{Known: true, Primary: "c", Epoch: 5, Failover: true}}
	if _, err := Drive(r, promote); err != nil {
		t.Fatal(err)
	}
	log := strings.Join(r.log, "\n")
	// Asked after each wait: the promotion's, then the follow's own.
	if r.refreshed != 2 || !r.has("commit epoch=5 primary=c") || r.has("set-indicator") || r.has("commit epoch=4") {
		t.Fatalf("a promotion whose wait saw raft name c at epoch 5: refreshed %d times; want twice, c followed at 5, no indicator:\n%s", r.refreshed, log)
	}
	if i, j := r.index("prepare detach-incoming"), r.index("refresh"); i < 0 || j < i {
		t.Fatalf("the event refreshed before its wait was done:\n%s", log)
	}

	same := &refreshing{recorder: &recorder{st: st.Clone()}}
	if _, err := Drive(same, promote); err != nil {
		t.Fatal(err)
	}
	if same.refreshed != 1 || !same.has("set-indicator") || !same.has("commit epoch=4 primary=b") {
		t.Fatalf("a promotion raft still stands by: refreshed %d times; want once, and b primary at 4:\n%s", same.refreshed, strings.Join(same.log, "\n"))
	}
}

// TestRaftsPromotionWaitsForALeaderThatAnswers: raft's promotion of this
// node is refused while no raft leader answers it (State.NoRaftLeader), at
// once and with nothing written or done: the node may have been cut off or
// paused since raft named it, while raft named another primary at a newer
// epoch that its copy of the state machine has not heard of (the
// simulation, interleaved, seeds 1881 and 5217: a node promoted at the
// older epoch without the newer primary's writes). Once a leader answers,
// the same event promotes it.
func TestRaftsPromotionWaitsForALeaderThatAnswers(t *testing.T) {
	st := secondaryOf("b", "a", 3, "a", "c")
	st.Auth, st.NoRaftLeader = true, true
	promote := AuthorityChanged{Known: true, Primary: "b", Epoch: 4, Failover: true}

	cut := &recorder{st: st.Clone()}
	if _, err := Drive(cut, promote); !errors.Is(err, ErrNoRaftLeader) {
		t.Fatalf("raft's promotion with no leader answering: %v, want ErrNoRaftLeader", err)
	}
	if len(cut.log) != 0 || cut.st.Role() == replication.Primary || cut.st.Durable.Epoch != 3 {
		t.Fatalf("a refused promotion changed something: role %s epoch %d, did:\n%s", cut.st.Role(), cut.st.Durable.Epoch, strings.Join(cut.log, "\n"))
	}
	// Following another primary needs no leader: the node takes the
	// newer epoch whatever it reaches.
	follow := &recorder{st: st.Clone()}
	if _, err := Drive(follow, AuthorityChanged{Known: true, Primary: "c", Epoch: 5, Failover: true}); err != nil || !follow.has("commit epoch=5 primary=c") {
		t.Fatalf("following c at 5 with no leader answering: %v:\n%s", err, strings.Join(follow.log, "\n"))
	}

	st.NoRaftLeader = false
	answered := &recorder{st: st.Clone()}
	if _, err := Drive(answered, promote); err != nil || !answered.has("set-indicator") || !answered.has("commit epoch=4 primary=b") {
		t.Fatalf("raft's promotion with a leader answering: %v:\n%s", err, strings.Join(answered.log, "\n"))
	}
}

// TestAnInconsistentPeerTheGenerationsSayNothingOfIsCopiedWhole: a peer
// whose disk is Inconsistent (a pull or a resync of it was cut off and
// its plan is gone: a node that pulled reports the generation it pulled
// from) with generations equal to the primary's, nothing marked for it,
// is never counted in sync by generations alone: it becomes the
// primary's SyncTarget for every block (StartResync FullResync). The same
// peer Consistent is counted in sync, and an Inconsistent peer the
// generations give a bitmap resync keeps its bitmap.
func TestAnInconsistentPeerTheGenerationsSayNothingOfIsCopiedWhole(t *testing.T) {
	st := primaryAt("a", 3, "b")
	peer := secondaryOf("b", "a", 3, "a")
	connect := func(st State, disk replication.DiskState) (State, []Action) {
		t.Helper()
		next, rd := Step(st, PeerConnected{Peer: "b", Session: 1, UUIDs: peer.UUIDs("a"), PeerEpoch: 3, PeerDisk: disk, NextGen: driveGen("g2")})
		if rd.Err != nil {
			t.Fatal(rd.Err)
		}
		return next, rd.Actions
	}
	next, acts := connect(st, replication.Inconsistent)
	if next.Peers["b"].Repl != replication.SyncSource || len(acts) != 1 || acts[0].Kind != StartResync || acts[0].Detail != FullResync {
		t.Fatalf("an Inconsistent peer of equal generations: %s, %v; want SyncSource and a full resync", next.Peers["b"].Repl, acts)
	}
	if next, acts := connect(st, replication.Consistent); next.Peers["b"].Repl != replication.Connected || len(acts) != 0 {
		t.Fatalf("a Consistent peer of equal generations: %s, %v; want Connected, no resync", next.Peers["b"].Repl, acts)
	}
	// A resync under way: the primary's bitmap generation toward b is
	// the one b's copy resumes from (bitmap-self).
	st.Durable.Gens.Bitmaps = map[string]replication.Generation{"b": driveGen("g0")}
	peer.Durable.Gens.Current, peer.Durable.SyncGen = replication.Generation{}, driveGen("g0")
	if next, acts := connect(st, replication.Inconsistent); next.Peers["b"].Repl != replication.SyncSource || len(acts) != 1 || acts[0].Detail == FullResync {
		t.Fatalf("an Inconsistent peer mid-resync: %s, %v; want a resync from the bitmap", next.Peers["b"].Repl, acts)
	}
}

// TestAFollowerKeepsNoBitmapOfAnEarlierTerm: a node that was primary once
// keeps its bitmap generation toward a peer of that term (alpha toward
// beta). Once it takes another primary's stream (gamma's) the writes it
// applies are marked for no other peer, so that bitmap says nothing any
// more: the stream's acceptance drops every bitmap generation but the one
// toward gamma, durably, before a write is applied. Kept, a later primary
// beta on the same generation took alpha for a sync source whose finish it
// missed (sync-target-missed-finish) and pulled alpha's older blocks over
// its own acknowledged writes, where no raft Outdated mark turned the copy
// round (a forced promotion: the simulation's seed 3552, run over the
// production session; and under a raft Outdated mark the sim's earlier
// finding pull-from-outdated, seeds 4374 and 47568).
func TestAFollowerKeepsNoBitmapOfAnEarlierTerm(t *testing.T) {
	alpha := secondaryOf("alpha", "", 1, "beta", "gamma")
	alpha.Durable.Gens.Bitmaps = map[string]replication.Generation{"beta": driveGen("g0"), "gamma": driveGen("g0")}
	gamma := primaryAt("gamma", 2, "alpha", "beta")
	next, rd := Step(alpha, PrimaryReached{From: "gamma", Epoch: 2, UUIDs: gamma.UUIDs("alpha")})
	if rd.Err != nil || slices.ContainsFunc(rd.Actions, func(a Action) bool { return a.Kind == RefuseStream }) {
		t.Fatalf("alpha takes gamma's stream: %v, %v", rd.Actions, rd.Err)
	}
	if want := map[string]replication.Generation{"gamma": driveGen("g0")}; rd.Persist == nil || !maps.Equal(rd.Persist.Gens.Bitmaps, want) || rd.Persist.Primary != "gamma" {
		t.Fatalf("the stream's acceptance writes %+v; want primary gamma and only the bitmap generation toward gamma", rd.Persist)
	}
	// The same stream again (a reconnection): nothing more to write.
	if _, rd := Step(next, PrimaryReached{From: "gamma", Epoch: 2, UUIDs: gamma.UUIDs("alpha")}); rd.Persist != nil {
		t.Fatalf("gamma's stream again writes %+v; want nothing", rd.Persist)
	}
	// A term's primary that stepped down and takes the stream of the
	// primary it handed over to: the same, in the acceptance that follows.
	stepped := secondaryOf("alpha", "gamma", 2, "beta", "gamma")
	stepped.Durable.Gens.Bitmaps = map[string]replication.Generation{"beta": driveGen("g0")}
	if _, rd := Step(stepped, PrimaryReached{From: "gamma", Epoch: 2, UUIDs: gamma.UUIDs("alpha"), HandedOver: true}); rd.Persist == nil || len(rd.Persist.Gens.Bitmaps) != 0 {
		t.Fatalf("a stepped-down primary takes its successor's stream and writes %+v; want no bitmap generation", rd.Persist)
	}

	// beta, primary on alpha's generation with nothing marked, meets
	// alpha: no copy from alpha.
	beta := primaryAt("beta", 3, "alpha", "gamma")
	connect := func(peer State) State {
		t.Helper()
		after, rd := Step(beta, PeerConnected{Peer: "alpha", Session: 1, UUIDs: peer.UUIDs("beta"), PeerEpoch: 3, PeerDisk: replication.Consistent, NextGen: driveGen("g3")})
		if rd.Err != nil {
			t.Fatal(rd.Err)
		}
		return after
	}
	if after := connect(next); after.Peers["alpha"].Pulling || after.Peers["alpha"].Repl != replication.Connected {
		t.Fatalf("beta meets alpha: %s pulling %t; want Connected, no copy", after.Peers["alpha"].Repl, after.Peers["alpha"].Pulling)
	}
	// Had alpha kept its bitmap, the shape would be the one a primary
	// never pulls by either (equal currents, only the peer names a
	// bitmap generation: primary-missed-finish), the second guard.
	if after := connect(alpha); after.Peers["alpha"].Pulling || after.Peers["alpha"].Repl != replication.SyncSource {
		t.Fatalf("a kept bitmap generation: beta %s pulling %t; want its SyncSource (primary-missed-finish)", after.Peers["alpha"].Repl, after.Peers["alpha"].Pulling)
	}
}

// TestAPrimaryNeverCopiesFromAPeerRaftHasOutdated: a peer whose bitmap
// generation toward this primary equals the primary's current generation
// looks like a sync source (bitmap-peer: it holds changes the primary
// lacks), but when raft records it Outdated under this primary
// (PeerOutdated) it missed a write the cluster acknowledged: the primary
// is the source, of the blocks either side marked (outdated-peer), and
// copies nothing from it. The same peer not Outdated is pulled from.
func TestAPrimaryNeverCopiesFromAPeerRaftHasOutdated(t *testing.T) {
	st := primaryAt("a", 3, "b")
	peer := secondaryOf("b", "a", 3, "a")
	peer.Durable.Gens.Current = driveGen("g0")
	peer.Durable.Gens.Bitmaps = map[string]replication.Generation{"a": driveGen("g1")}
	connect := func(outdated bool) (State, []Action) {
		t.Helper()
		next, rd := Step(st, PeerConnected{Peer: "b", Session: 1, UUIDs: peer.UUIDs("a"), PeerEpoch: 3, PeerDisk: replication.Consistent, Marked: true, NextGen: driveGen("g2"), PeerOutdated: outdated})
		if rd.Err != nil {
			t.Fatal(rd.Err)
		}
		return next, rd.Actions
	}
	if next, acts := connect(false); !next.Peers["b"].Pulling || len(acts) != 1 || acts[0].Kind != StartPull {
		t.Fatalf("a peer not Outdated whose bitmap tracks from this primary's generation: %s pulling %t, %v; want a pull from it", next.Peers["b"].Repl, next.Peers["b"].Pulling, acts)
	}
	next, acts := connect(true)
	if next.Peers["b"].Pulling || next.Peers["b"].Repl != replication.SyncSource || len(acts) != 1 || acts[0].Kind != StartResync {
		t.Fatalf("the same peer Outdated: %s pulling %t, %v; want this primary its SyncSource", next.Peers["b"].Repl, next.Peers["b"].Pulling, acts)
	}
}
