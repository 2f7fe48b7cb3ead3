package sim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/node/applier/apply"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/node/writepath"
	"github.com/replvol/replvol/replication"
)

// node is one simulated node: a data node's volume (its real volstate
// State, what its metadata holds durably, its disk) and the mechanism
// node's driver would run around it; the witness has only liveness.
type node struct {
	name    string
	id      uint32 // its node ID (volstate.State.SelfID)
	witness bool
	peers   []string // the other data nodes, sorted

	up          bool
	restartAt   time.Time
	pausedAt    time.Time
	pausedUntil time.Time

	st        volstate.State
	durable   volstate.Durable // the metadata: written BEFORE a state that holds it is installed
	indicator bool             // the primary indicator
	disk      *disk
	sums      *sumStore               // the checksums at rest (sums.go)
	marks     map[string]map[int]bool // durable bitmaps, per peer
	al        map[int]int             // the activity log: blocks with writes in flight
	// logged is the activity log's working set: the alExtents blocks
	// written here last, as primary or applied from a primary's stream or
	// resync (alOrder: least recently used first). A block with a write in
	// flight (al) is never evicted; a write waits for an evictable one
	// (node's Admit). It survives a crash, as the log does.
	logged  map[int]bool
	alOrder []int

	outdated map[string]uint64 // peers raft recorded Outdated, at which epoch (ensureOutdated's memo)
	// outdatedRetry: ensureOutdated proposes again no sooner.
	outdatedRetry time.Time
	sessions      map[string]uint64 // this primary's streams, per peer
	incoming      streamOf          // the stream of a primary applied here
	// in is the applier's end of the incoming stream (node's
	// applier.Stream), made for session inSession; applied is the volume
	// as the applier writes to it (applied.go).
	in        *apply.Stream
	inSession uint64
	applied   *apply.Volume
	// resyncing: per peer, the blocks a resync under way copies;
	// resyncLate: those of them it reads once the write in flight on
	// each is over.
	resyncing  map[string]map[int]bool
	resyncLate map[string]resyncLate
	syncDone   map[string]syncDue // sync-done entries to send, per peer
	// announcing: peers sent a new generation that did not take it yet.
	announcing map[string]bool
	// mayHold: per peer, the generation it may hold while tracked (node's
	// peer.mayHold): the one it reported in the last handshake, or that
	// of the latest sync-done (or announcement) sent to it, acknowledged
	// or not; mayHoldUnknown: no handshake since the volume opened (it
	// may hold the current one).
	mayHold        map[string]replication.Generation
	mayHoldUnknown map[string]bool
	// streams: this primary's sessions, per peer (wire.go); ending: per
	// peer, the last that ended, whose end may wait for the peer's
	// tracking (settleEnds), until a new one starts: a FLUSH and the
	// peer's next connection wait for it. shipped: what the entries in
	// the sessions stand for.
	streams map[string]*stream
	ending  map[string]*stream
	shipped map[*session.Pending]shipped
	// cacheAnnounce: the tracking of a session's end, or of a peer a FLUSH
	// found never streamed to, moved the generation on; a FLUSH waits
	// until the peers in sync took it, as node's Volume.track does.
	cacheAnnounce bool
	// streamed: the peers this node had a stream to since its peers were
	// last new (node's peer.ending: a volume's open, ResetPeers).
	streamed map[string]bool
	writes   []*write
	// later: the parts of writes' Ship stages that settled with steps
	// left, run at a later step (node: on a goroutine of their own); a
	// crash loses them.
	later   []laterShip
	flushes []*flushOp       // the client's FLUSHes in flight
	follow  []volstate.Event // events the actions feed back (Quiesced)
	// pulls: per peer, a pull of newer data from it under way (node's
	// pull copies while the stream lasts): when it ends, and whether it
	// copies every block (a full resync as target).
	pulls map[string]pullDue
	// leftToPull are blocks of a failed write a pull under way copies:
	// their revert was left to it, and it passes them on to the other
	// peers whether they changed here or not (node's forwardPulled passes
	// on every run it copies).
	leftToPull map[int]bool
	// missing are the blocks the local disk misses, to be copied from a
	// peer (node's durable.localMissing; the rules read it as
	// State.LocalMissing): a pull's plan, marked at the handshake BEFORE
	// the rules take it (markPull), cleared as the pull copies them,
	// kept when the pull is cut off until the next pull copies them, and
	// cleared by ClearLocalMissing. Node keeps it in memory: a crash
	// loses it (boot).
	missing map[int]bool
	// driving: a step of this node's volume is under way (its actions
	// run); an event they cause here waits in follow.
	driving bool
	// loop is the volume's loop as production's runs it (node/volloop's
	// Core): every drive of the volume is taken by it; new at each boot.
	loop *volloop.Core
	// offLoop counts the drives of loop that wait off it (Sim.offLoop).
	offLoop int

	renewing    bool
	lastRenew   time.Time
	authVersion int
	// authEpoch is the volume's epoch in what raft told n last (node's
	// view of raft's state, which a forced promotion passes on).
	authEpoch     uint64
	authAt        time.Time
	nextDial      map[string]time.Time
	handoverUntil time.Time
	reattachAt    time.Time
}

// pullDue is a pull under way on stream session, done at at.
type pullDue struct {
	session uint64
	at      time.Time
	full    bool
}

// syncDue is a sync-done entry to send on stream session at at.
type syncDue struct {
	session uint64
	at      time.Time
}

type streamOf struct {
	from string
	id   uint64
}

// write is a client write in flight on a primary.
type write struct {
	id      int64 // also the value written
	block   int
	fua     bool
	epoch   uint64
	started time.Time
	waiting map[string]bool // peers whose ack it waits for
	missed  map[string]bool // peers it misses, not yet recorded
	acked   bool            // a peer acknowledged it
	ackedBy map[string]bool // which
	// streamed: it went to a peer's stream; written: to the local disk;
	// localFailed: the local disk failed it; inLog: its Log stage holds
	// its block in the activity log (al) until it finishes.
	streamed, written, localFailed, inLog bool
	// flow is the write's way through node's stages (node/writepath);
	// shipping: its Ship stage started (it went to the streams, or its
	// misses are being recorded).
	flow     writepath.Write
	shipping bool
	// ships: each peer's part of its Ship stage (node/writepath's Peer),
	// in the order of the node's peers; shipAt: the part that runs now;
	// shipErr: the first tracking of a part that failed.
	ships   []writepath.Peer
	shipAt  int
	shipErr error
	// pds: its entries in the peers' sessions; peerErr: a session's end
	// could not track the peer it left the write to (Pending.Err).
	pds     []*session.Pending
	peerErr error
}

// resyncLate is what a resync on session reads once the writes in flight
// on blocks are over.
type resyncLate struct {
	session uint64
	blocks  map[int]bool
}

// syncGens is a sync-done entry's generations: the source's current one
// and its history.
type syncGens struct {
	current replication.Generation
	history []replication.Generation
}

var startedEvent = volstate.Started{}

func newNode(name string, data []string, gen replication.Generation) *node {
	n := &node{name: name, id: uint32(slices.Index(data, name) + 1), up: true, disk: newDisk(blocks), sums: newSumStore(), marks: map[string]map[int]bool{}, al: map[int]int{}, logged: map[int]bool{}}
	for _, p := range data {
		if p != name {
			n.peers = append(n.peers, p)
			n.marks[p] = map[int]bool{}
		}
	}
	history := make([]replication.Generation, replication.HistorySlots)
	n.durable = volstate.Durable{Epoch: 1, Primary: data[0], Gens: replication.Generations{Current: gen, History: history}}
	n.boot()
	return n
}

// boot is the volume opened with its durable state (a start or restart).
func (n *node) boot() {
	n.st = volstate.State{Self: n.name, SelfID: n.id, Durable: n.durable.Clone(), Auth: true, CrashedPrimary: n.indicator, Peers: map[string]volstate.Peer{}}
	for _, p := range n.peers {
		n.st.Peers[p] = volstate.Peer{Repl: replication.Connecting}
	}
	n.outdated, n.sessions, n.nextDial = map[string]uint64{}, map[string]uint64{}, map[string]time.Time{}
	n.streams, n.ending, n.shipped = map[string]*stream{}, map[string]*stream{}, map[*session.Pending]shipped{}
	n.resyncing, n.syncDone = map[string]map[int]bool{}, map[string]syncDue{}
	n.resyncLate = map[string]resyncLate{}
	n.announcing, n.pulls, n.leftToPull, n.missing = map[string]bool{}, map[string]pullDue{}, map[int]bool{}, map[int]bool{}
	n.cacheAnnounce, n.streamed = false, map[string]bool{}
	n.mayHold, n.mayHoldUnknown = map[string]replication.Generation{}, map[string]bool{}
	for _, p := range n.peers {
		n.mayHoldUnknown[p] = true
	}
	n.incoming, n.writes, n.flushes, n.follow = streamOf{}, nil, nil, nil
	n.loop = &volloop.Core{}
	n.renewing, n.authVersion, n.handoverUntil, n.reattachAt = false, -1, time.Time{}, time.Time{}
}

func (n *node) running(now time.Time) bool { return n.up && !now.Before(n.pausedUntil) }

func (n *node) paused(now time.Time) bool { return n.up && now.Before(n.pausedUntil) }

// drive steps the volume with e through the driver node runs
// (volstate.Drive's order, on node's volume loop: volloop's Core): the
// step's preparations, then its writes (the indicator, the durable state)
// BEFORE the new state is installed, then its actions, then what follows
// them. Its waits off the loop are done at once: the caller reads the
// result.
func (s *Sim) drive(n *node, e volstate.Event) error {
	_, err := s.driveActs(n, e)
	return err
}

// post steps n's volume with e as drive does, for a caller that does not
// read the result (a refusal is traced): a wait the drive hands back may
// be left off the loop (leaveWait), the scheduler doing it at a later
// step (resumeWaits), and the drive then ends later.
func (s *Sim) post(n *node, e volstate.Event) {
	s.take(n, e, true)
}

// driveActs is drive, and returns the step's actions (a RefuseStream
// among them is the answer a primary's stream gets).
func (s *Sim) driveActs(n *node, e volstate.Event) ([]volstate.Action, error) {
	acts, over, err := s.take(n, e, false)
	if !over {
		panic(fmt.Sprintf("sim: %s: the drive of %s waits for nothing and is not over", n.name, eventName(e)))
	}
	if err != nil {
		return nil, err
	}
	return acts, nil
}

// take posts the drive of e to n's loop (the Core production's loop
// runs), which runs it as far as it goes and hands back what production
// does off the loop (a Wait: the waits for the senders, the incoming
// stream, the IO, the cluster, the disk). The sim does each wait here, at
// once, and hands its end back to the loop, unless mayLeave: then each
// wait of a drive posted from outside n's drives may be left pending
// (leaveWait, with Config.Interleave), and take returns before the drive
// is over (over false).
//
// The rule of the call sites: a caller that reads the drive's result (its
// actions, a refusal) or the state it leaves before it goes on (the
// handshake, the operator's forced promotion, a switchover's HandedOver
// and Retake, the applier's sync start and end, a write's WriteMissed)
// uses drive or driveActs, whose waits are done at once, as node's
// callers that wait for their drive; one that posts an event and goes on
// (post) may leave them. A drive of n while one of it runs (an effect of
// its actions reaching back, on the loop or in a wait) is posted to the
// same loop and runs to its end at once (production's loop takes another
// drive while one waits off it); what follows either waits in n.follow
// for the outer one (node's loop takes its events one at a time).
//
// While a drive of n waits off the loop, the rest of the simulation goes
// on: other drives of n are posted to the same Core and taken (node's
// loop takes them while the wait runs), writes complete, acks arrive,
// links fail, raft decides; a crash of n drops its Core with the waits
// (crash, dropWaits) and the restart boots a new one. The sim never
// closes a volume's loop (volloop.Close): a node only crashes.
func (s *Sim) take(n *node, e volstate.Event, mayLeave bool) (acts []volstate.Action, over bool, err error) {
	outer := !n.driving
	n.driving = true
	defer func() { n.driving = !outer }()
	loop := n.loop
	d := volloop.NewDrive(simVolume{s: s, n: n, outer: outer}, e, func(a []volstate.Action, derr error) {
		acts, err, over = a, derr, true
		s.driveOver(n, e, outer, derr)
	})
	s.doWaits(n, loop, e, loop.Take(volloop.Post(d)), mayLeave && outer)
	return acts, over, err
}

// driveOver is the end of the drive of e on n (outer: posted from outside
// n's drives), when its result comes: at once, or at a later step once
// the waits it was left with are done.
func (s *Sim) driveOver(n *node, e volstate.Event, outer bool, err error) {
	if p := n.st.Pending; outer && n.offLoop == 0 && p != nil && p.Kind != volstate.PendingHandover {
		s.fail(DrainedChangesComplete, "%s: the change %s (to %s at epoch %d) that waited for the IO is still pending once the drive of %s is over (its drain was done)", n.name, p.Kind, p.To, p.Epoch, eventName(e))
	}
	if err != nil {
		s.tracef("%s: %s refused: %v", n.name, eventName(e), err)
	}
}

// offLoopWait is a wait of a drive of n (of event e) left off n's loop
// (the Core loop): the scheduler hands its end back to that Core at step
// due, or later while n is paused. begun: it was done when it was left
// (beginsAtOnce), with err; else it is done then.
type offLoopWait struct {
	n     *node
	loop  *volloop.Core
	w     volloop.Wait
	e     volstate.Event
	due   int
	begun bool
	err   error
}

// beginsAtOnce reports whether a wait left off the loop does its work
// when it is left, its end alone coming back later: the waits that stop
// what runs when they begin and wait for its end (node's stopPeers and
// detachIncoming stop the senders and the stream they find, not one the
// loop starts meanwhile) and the lease's release (raft may take it before
// the drive goes on). The others wait for what goes on meanwhile, and are
// done when their end comes: the IO in flight (WaitIO, DrainIO: the
// writes go on, and those left are answered then) and the disk's sync of
// ClearPrimaryIndicator (a crash meanwhile leaves the indicator set).
func beginsAtOnce(k volstate.ActionKind) bool {
	switch k {
	case volstate.StopPeers, volstate.DetachIncoming, volstate.ReleaseLease:
		return true
	}
	return false
}

// Waits left off the loop (post, with Config.Interleave): each wait is
// left with probability pWaitOffLoop, for 1 to maxWaitSteps steps.
const (
	pWaitOffLoop = 0.5
	maxWaitSteps = 8
)

// doWaits does the waits of a drive of n (of e) that n's loop handed
// back, handing each end back to loop, until the drive is over or,
// mayLeave, one of them is left off the loop (leaveWait).
func (s *Sim) doWaits(n *node, loop *volloop.Core, e volstate.Event, waits []volloop.Wait, mayLeave bool) {
	for len(waits) > 0 {
		w := waits[0]
		waits = waits[1:]
		if mayLeave && s.leaveWait() {
			ow := offLoopWait{n: n, loop: loop, w: w, e: e, due: s.step + 1 + s.waitRng.IntN(maxWaitSteps)}
			kind := w.Need().Action.Kind
			if ow.begun = beginsAtOnce(kind); ow.begun {
				ow.err = w.Do()
			}
			n.offLoop++
			s.offLoop = append(s.offLoop, ow)
			s.tracef("%s: the drive of %s waits off the loop for %s until step %d", n.name, eventName(e), kind, ow.due)
			continue
		}
		waits = append(waits, loop.Take(w.Resumed(w.Do()))...)
	}
}

// leaveWait draws whether a wait is left off the loop: never unless
// Config.Interleave; then from the Sim's third source (waitRng), so that
// the draws change nothing else until a wait is left.
func (s *Sim) leaveWait() bool {
	return s.cfg.Interleave && s.waitRng.Float64() < pWaitOffLoop
}

// resumeWaits does the waits left off the loop whose step has come, of
// nodes that run, in the order they were left, and hands each end back
// to its node's loop: the drive goes on where it stood (and may be left
// waiting again).
func (s *Sim) resumeWaits() {
	var now []offLoopWait
	keep := s.offLoop[:0]
	for _, ow := range s.offLoop {
		if ow.due <= s.step && ow.n.running(s.now) {
			now = append(now, ow)
		} else {
			keep = append(keep, ow)
		}
	}
	s.offLoop = keep
	for _, ow := range now {
		n := ow.n
		if ow.loop != n.loop {
			panic(fmt.Sprintf("sim: %s: a wait of the drive of %s outlived its loop", n.name, eventName(ow.e)))
		}
		s.tracef("%s: the drive of %s is done waiting for %s", n.name, eventName(ow.e), ow.w.Need().Action.Kind)
		n.offLoop--
		n.driving = true
		err := ow.err
		if !ow.begun {
			err = ow.w.Do()
		}
		s.doWaits(n, ow.loop, ow.e, ow.loop.Take(ow.w.Resumed(err)), true)
		n.driving = false
	}
}

// dropWaits drops the waits left off n's loop: n crashed, and its loop
// with them (the restart boots a new Core).
func (s *Sim) dropWaits(n *node) {
	keep := s.offLoop[:0]
	for _, ow := range s.offLoop {
		if ow.n == n {
			s.tracef("%s: the drive of %s, waiting off the loop for %s, is lost with the loop", n.name, eventName(ow.e), ow.w.Need().Action.Kind)
			continue
		}
		keep = append(keep, ow)
	}
	s.offLoop, n.offLoop = keep, 0
}

func eventName(e volstate.Event) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", e), "volstate.")
}

// simVolume is n's volume as volstate's driver and node's volume loop run
// it (volloop.Effects):
// its state, its metadata (written at once: the sim's state writes do not
// fail), and its actions on the sim's models. The sim is one goroutine:
// Lock and Unlock hold nothing.
type simVolume struct {
	s *Sim
	n *node
	// outer: this is the outermost drive of n, which takes what follows.
	outer bool
}

// State is n's state with the facts node's driver reads when it steps
// (modelLocked): a peer holds every write while it is connected and not
// tracked in a bitmap, and its bitmap holds bits while n marks blocks for
// it (Marked: the end of a resync with a block marked again since is
// refused, volstate.ErrNotInSync, as node refuses it), as node reads its
// peers; and whether the local disk misses blocks (LocalMissing: a pull's
// plan not yet copied, n.missing).
func (v simVolume) State() volstate.State {
	st := v.n.st.Clone()
	st.NoRaftLeader = !v.s.raft.reach(v.s, v.n)
	st.LocalMissing = len(v.n.missing) > 0
	for name, p := range st.Peers {
		p.InSync = p.Repl == replication.Connected && !st.Durable.Gens.Tracking(name)
		p.Marked = len(v.n.marks[name]) > 0
		st.Peers[name] = p
	}
	return st
}

func (v simVolume) Lock()   {}
func (v simVolume) Unlock() {}

func (v simVolume) Prepare(a volstate.Action) error {
	v.s.perform(v.n, a)
	return nil
}

func (v simVolume) SetIndicator() error {
	v.n.indicator = true
	return nil
}

func (v simVolume) Commit(c volstate.Change) error {
	v.n.durable = c.Ready.Persist.Clone()
	v.s.installed(v.n, c)
	return nil
}

func (v simVolume) Install(c volstate.Change) {
	if c.Err != nil {
		v.n.st = c.Next
		return
	}
	v.s.installed(v.n, c)
}

func (v simVolume) Perform(a volstate.Action) error {
	v.s.perform(v.n, a)
	return nil
}

// Refresh is node's (volumeSteps.Refresh): raft's word taken again after
// a wait is raft's as it is by then, when the node reaches raft and raft
// moved to a newer epoch (seed 827 of -interleave).
func (v simVolume) Refresh(e volstate.Event) (volstate.Event, bool) {
	ae, ok := e.(volstate.AuthorityChanged)
	if !ok || !ae.Known || !v.s.raft.reach(v.s, v.n) {
		return e, false
	}
	va, known := v.s.raft.auth.Volume(volume)
	if !known || va.Epoch <= ae.Epoch {
		return e, false
	}
	return volstate.AuthorityChanged{Known: true, Primary: va.Primary, Epoch: va.Epoch, Now: v.s.now, Failover: va.FailedOverAt(va.Epoch)}, true
}

// OffLoop is node's list (volloop.OffLoop): the sim does those waits at
// once all the same, as its loop hands them back.
func (v simVolume) OffLoop(a volstate.Action) bool { return volloop.OffLoop(a) }

func (v simVolume) Follow(e volstate.Event) { v.n.follow = append(v.n.follow, e) }

func (v simVolume) Next() (volstate.Event, bool) {
	if !v.outer || len(v.n.follow) == 0 {
		return nil, false
	}
	e := v.n.follow[0]
	v.n.follow = v.n.follow[1:]
	return e, true
}

// installed takes the state a step of n installs, and checks it.
func (s *Sim) installed(n *node, c volstate.Change) {
	old, next, acts := c.Old, c.Next, c.Ready.Actions
	name := eventName(c.Event)
	n.st = next
	if next.Durable.Epoch < old.Durable.Epoch && !old.Discard {
		s.fail(EpochsNeverGoBack, "%s went from epoch %d (primary %s) back to %d (primary %s) on %s", n.name, old.Durable.Epoch, old.Durable.Primary, next.Durable.Epoch, next.Durable.Primary, name)
	}
	if len(acts) > 0 || old.Serving != next.Serving || old.Role() != next.Role() || old.Durable.Epoch != next.Durable.Epoch ||
		old.Disk != next.Disk || !maps.Equal(old.Peers, next.Peers) {
		s.tracef("%s: %s -> %s %s epoch %d disk %s peers %s %v", n.name, name, next.Role(), next.Serving, next.Durable.Epoch, next.Disk, peerStates(next), acts)
	}
	if old.Role() != replication.Primary && next.Role() == replication.Primary {
		s.check.promoted(s, n, c.Event)
		if s.cfg.mutation == mutPromotionClearsMarks && next.Durable.Epoch > old.Durable.Epoch {
			for _, p := range n.peers {
				clear(n.marks[p])
			}
		}
	}
}

// stepNode has n's volume take e: now, or, while a step of it runs (e is an
// effect of its actions), once that step is done (node's loop takes its
// events one at a time).
func (s *Sim) stepNode(n *node, e volstate.Event) {
	if n.driving {
		n.follow = append(n.follow, e)
		return
	}
	s.post(n, e)
}

// bootVolume opens n's volume: the rules take the loaded state (volstate.Opened;
// a disk that was detached comes back Inconsistent and Secondary,
// durably), then it starts (volstate.Started), as node's open and start do.
func (s *Sim) bootVolume(n *node) {
	n.boot()
	stale := n.durable.LocalStale
	_ = s.drive(n, volstate.Opened{})
	if stale {
		s.check.staleOpened(s, n)
	}
	_ = s.drive(n, startedEvent)
}

// perform does one action: every kind volstate names is mapped; an
// unknown one panics, so that none is silently ignored.
func (s *Sim) perform(n *node, a volstate.Action) {
	switch a.Kind {
	case volstate.DrainIO:
		// Quiesced follows (volstate.Drive).
		s.failWrites(n, "drain")
		s.stopSenders(n)
	case volstate.WaitIO:
		s.failWrites(n, "wait-io")
	case volstate.HandOverIO:
		n.handoverUntil = s.now.Add(handoverTimeout)
	case volstate.ClearPrimaryIndicator:
		// node's: the local disk synced, THEN the indicator off; a
		// failed sync leaves it set (a crash then resyncs the log).
		// (Seeds 6961 and 6644 found this sync missing; since a
		// secondary syncs before it accepts a stream, which the new
		// primary's FLUSH needs to count this disk, no seed of 30,000
		// catches its absence: node's stepdown_test pins it.)
		// And only while the node is not primary again: a step taken
		// meanwhile (the operator's force) set the indicator for its own
		// writes (node's clearPrimary; seed 1095 of -interleave).
		if s.syncWithSums(n) && n.st.Role() != replication.Primary {
			n.indicator = false
		}
	case volstate.StartPeers, volstate.ResetPeers, volstate.StopPeers:
		s.stopSenders(n)
		clear(n.nextDial)
		if a.Kind == volstate.ResetPeers {
			clear(n.streamed) // fresh senders: no stream to any peer yet
		}
	case volstate.DetachIncoming:
		if in := n.incoming; in.from != "" {
			s.endStream(s.node(in.from), n.name)
		}
	case volstate.ClearLocalMissing:
		// The disk was adopted (a forced promotion of a node holding no
		// generation): it misses nothing.
		if len(n.missing) > 0 {
			s.tracef("%s: the %d blocks its disk missed are its own now", n.name, len(n.missing))
		}
		clear(n.missing)
	case volstate.StartLease:
		n.renewing, n.lastRenew = true, time.Time{}
	case volstate.StopLease:
		n.renewing = false
	case volstate.ReleaseLease:
		if s.cfg.mutation == mutHandoverKeepsLease {
			return
		}
		s.raft.release(s, n, a.Epoch)
	case volstate.Propose:
		switch a.Detail {
		case "init":
			_, _ = s.raft.apply(s, n, replication.InitCommand(volume, n.name, a.Epoch, s.data))
		case "reclaim":
			_ = s.raft.promote(s, n, replication.FailoverCommand(volume, a.Epoch, n.name, true, s.now, "forced by the operator while raft had no quorum"), true)
		default:
			panic("sim: no proposal " + a.Detail)
		}
	case volstate.StartResync:
		if a.Detail == volstate.FullResync {
			// node's decide: every block, the rules' choice for an
			// Inconsistent peer the generations say nothing of
			// (invariant 4 allows it).
			for b := range blocks {
				n.mark(a.Peer, b)
				s.check.allow(n.name, a.Peer, b)
			}
		}
		s.startResync(n, a.Peer)
	case volstate.StartPull:
		// node's decide: what was marked for the peer is copied back
		// from it (markPull marked it missing), not sent.
		clear(n.marks[a.Peer])
		s.startPull(n, a.Peer)
	case volstate.Reattach:
		n.reattachAt = s.now.Add(time.Second)
	case volstate.CopyMissing:
		n.follow = append(n.follow, volstate.LocalResyncFinished{})
	case volstate.MarkActivityLog:
		if s.cfg.noReconcile {
			return
		}
		for b := range n.logged {
			n.mark(a.Peer, b)
			s.check.allow(n.name, a.Peer, b)
		}
		s.tracef("%s: activity log %v marked toward %s", n.name, slices.Sorted(maps.Keys(n.logged)), a.Peer)
	case volstate.RunHook, volstate.Notify, volstate.RefusePeer, volstate.RefuseStream:
		// Traced with the step (a refused peer stays StandAlone).
	default:
		panic(fmt.Sprintf("sim: %s: no driver for the action %s", n.name, a))
	}
}

// tickNode is one pass of a running data node's loops.
func (s *Sim) tickNode(n *node) {
	if n.st.Disk == replication.Diskless && !n.reattachAt.IsZero() && !s.now.Before(n.reattachAt) && !s.now.Before(n.disk.failUntil) {
		n.reattachAt = time.Time{}
		s.post(n, volstate.DiskWorks{})
	}
	s.followAuthority(n)
	if n.renewing && n.st.LeaseEpoch != 0 && s.now.Sub(n.lastRenew) >= renewEvery {
		n.lastRenew = s.now
		if s.raft.grant(s, n, n.st.LeaseEpoch) {
			s.post(n, volstate.LeaseRenewed{Epoch: n.st.LeaseEpoch, Until: s.now.Add(leaseDuration)})
		}
	}
	if n.st.Role() == replication.Primary && !n.st.AdminDown {
		for _, p := range n.peers {
			repl := n.st.Peers[p].Repl
			if _, ok := n.sessions[p]; ok || (repl != replication.Connecting && repl != replication.StandAlone) || s.now.Before(n.nextDial[p]) || n.tracking(p) {
				continue
			}
			wait := dialEvery
			if repl == replication.StandAlone {
				wait *= 4
			}
			n.nextDial[p] = s.now.Add(wait)
			if q := s.node(p); s.reachable(n, q) {
				s.handshake(n, q)
			}
		}
	}
	if p := n.st.Pending; p != nil && p.Kind == volstate.PendingHandover {
		s.handover(n, p.To)
	}
	s.sendSyncDone(n)
	s.progressPulls(n)
	s.progressWrites(n)
	s.runLater(n)
	s.progressFlushes(n)
}

// followAuthority tells the volume what raft committed (when it changed,
// and again now and then, as node's loop does), and has a primary record
// its peers in sync UpToDate.
func (s *Sim) followAuthority(n *node) {
	if !s.raft.reach(s, n) {
		return
	}
	if s.raft.version == n.authVersion && s.now.Sub(n.authAt) < redeliverEvery {
		return
	}
	n.authVersion, n.authAt = s.raft.version, s.now
	va, known := s.raft.auth.Volume(volume)
	n.authEpoch = va.Epoch
	s.post(n, volstate.AuthorityChanged{Known: known, Primary: va.Primary, Epoch: va.Epoch, Now: s.now, Failover: va.FailedOverAt(va.Epoch)})
	if !known || va.Primary != n.name || n.st.Role() != replication.Primary {
		return
	}
	for _, p := range n.peers {
		if _, ok := n.sessions[p]; ok && n.st.Peers[p].Repl == replication.Connected && !n.durable.Gens.Tracking(p) &&
			len(n.marks[p]) == 0 && !va.IsUpToDate(p) {
			// Forget that raft has it Outdated BEFORE it may say otherwise.
			delete(n.outdated, p)
			_, _ = s.raft.apply(s, n, replication.MarkUpToDateCommand(volume, va.Epoch, p))
		}
	}
}

// handshake is primary p's stream reaching q: q's side (PrimaryReached),
// then p's side with q's answer (PeerConnected). It is atomic in the sim.
func (s *Sim) handshake(p, q *node) {
	// What q's raft knows of p's promotion (node's handedOverAt; the sim
	// has one view of raft).
	pe := p.st.Durable.Epoch
	va, known := s.raft.auth.Volume(volume)
	handedOver := known && va.Epoch == pe && !va.FailedOverAt(pe)
	reached := volstate.PrimaryReached{From: p.name, Epoch: pe, UUIDs: p.st.UUIDs(q.name), HandedOver: handedOver}
	if q.st.Role() == replication.Primary && pe > q.st.Durable.Epoch {
		// A primary of a newer epoch reaches an older one: the rules step
		// it down first, or fence it (node's serveStream and stepDown).
		_ = s.drive(q, reached)
	}
	// Then the rules take the stream or refuse it (node's primaryReached):
	// their RefuseStream action is the answer.
	acts, err := s.driveActs(q, reached)
	refusal := replication.Refusal("")
	var rule string
	for _, a := range acts {
		if a.Kind == volstate.RefuseStream {
			refusal, rule = a.Refusal, a.Detail
		}
	}
	if !p.running(s.now) || !q.running(s.now) || p.st.Role() != replication.Primary {
		return
	}
	if q.st.Role() != replication.Primary {
		// q's sessions of when it was primary ended before it takes a
		// stream (node's step-down waits for their ends): their tracking
		// fails, and what they left is marked for their peers.
		s.settleEnds(q)
	}
	qs := q.st
	epoch := p.st.Durable.Epoch
	s.nextSession++
	sid := s.nextSession
	switch {
	case err != nil:
		return
	case qs.Role() == replication.Primary:
		if qs.Durable.Epoch > epoch {
			_ = s.drive(p, volstate.PeerConnected{Peer: q.name, Session: sid, UUIDs: qs.UUIDs(p.name), PeerPrimary: true, PeerEpoch: qs.Durable.Epoch, PeerDisk: qs.Disk})
		}
		return
	case refusal == replication.RefusedSplitBrain:
		// The secondary found that both changed the data: the primary
		// records the split brain with it (node's peer.splitBrain).
		_ = s.drive(p, volstate.SplitBrainFound{Peer: q.name, Rule: rule})
		return
	case refusal != "":
		// A stale epoch, another primary's epoch, unrelated data, an
		// operator's disconnect: refused; the primary tries again (raft
		// tells a stale one it is no longer primary).
		return
	}
	if in := q.incoming; in.from != "" && in.from != p.name {
		s.endStream(s.node(in.from), q.name)
	}
	// node's serveStream: what earlier streams left in the secondary's
	// cache only is on its disk, durably, BEFORE it takes the new one
	// (whose primary counts it in sync from what it holds); a disk that
	// cannot sync takes no stream.
	if s.cfg.mutation != mutAcceptKeepsCache && !q.disk.flush(s.now) {
		s.tracef("%s: stream from %s refused: the disk could not sync what earlier streams left in its cache", q.name, p.name)
		// As a replicated write that failed (node's appliedState.Failed).
		_ = s.drive(q, volstate.ReplicaWriteFailed{})
		return
	}
	d := replication.CompareUUIDs(p.st.UUIDs(q.name), qs.UUIDs(p.name), replication.Primary, replication.Secondary)
	// A peer raft has Outdated under p is never copied onto p (node's
	// decide, volstate's PeerConnected).
	outdated := s.raftOutdated(p, q.name)
	if outdated {
		d = d.TowardOutdated()
	}
	// A connection that will resync the peer (its disk Inconsistent
	// meanwhile) has raft record it Outdated first, BEFORE the decision
	// (node's outdateBeforeResync): the handshake waits for raft as a
	// write that misses the peer does, and a primary raft does not know
	// at its epoch (forced without quorum, not yet reclaimed) resyncs
	// nobody. Until then the peer has no stream and takes nothing of it.
	resyncs := d.Outcome.IsSource() || len(p.marks[q.name]) > 0 || len(q.marks[p.name]) > 0 || qs.Discard
	if d.Outcome.IsTarget() && !qs.Discard {
		// A pull: the peer is the source, whose copy is kept (node's
		// outdateBeforeResync).
		resyncs = false
	}
	// A primary with no generation of its own is no source for an
	// Outdated peer, and one that pulls takes no other peer until the
	// pull ends: volstate refuses them, and nothing is marked.
	refusedOutdated := (outdated && p.st.Durable.Gens.Current.IsZero()) || s.pullsFrom(p, q.name)
	if resyncs && s.cfg.mutation != mutResyncNotOutdated {
		if err := s.recordOutdated(p, q.name); err != nil {
			if !errors.Is(err, errWait) {
				s.tracef("%s: handshake with %s: %v", p.name, q.name, err)
			}
			return
		}
	}
	p.sessions[q.name] = sid
	s.openStream(p, q.name, sid)
	q.incoming = streamOf{from: p.name, id: sid}
	if d.Outcome == replication.FullResyncTarget && !s.pullsFrom(p, q.name) {
		// node's handshake plan: a full resync as target copies every
		// block from the peer (one pull at a time: volstate refuses a
		// second).
		p.pulls[q.name] = pullDue{session: sid, full: true}
		if d.Rule == replication.RuleHistoryPeer {
			s.check.historyFullResync(s, q, p)
		}
	}
	// What the peer holds now (node's decide).
	p.mayHold[q.name] = qs.UUIDs(p.name).Current
	delete(p.mayHoldUnknown, q.name)
	// node's handshake plan marks what the rules do not: every block for
	// a full resync, and (the sim keeps no finer record) for a victim of
	// a split brain that discards its data.
	// Invariant 4 allows the discard's full copy; a full resync the
	// rules chose by generations is no excuse (an interrupted resync
	// resumes from the bitmap: its target recorded the generation it
	// resumes from), only what the checker knows changed is.
	if qs.Discard {
		for b := range blocks {
			p.mark(q.name, b)
			s.check.allow(p.name, q.name, b)
		}
	} else if d.Outcome == replication.FullResyncSource && !refusedOutdated {
		// (outdated-peer full: history-peer's full copy turned the other
		// way, the same known finding.)
		if d.Rule == replication.RuleHistorySelf || d.Rule == replication.RuleOutdatedPeer {
			s.check.historyFullResync(s, p, q)
		}
		for b := range blocks {
			p.mark(q.name, b)
		}
	} else if resyncs && s.cfg.mutation == mutFullResync {
		for b := range blocks {
			p.mark(q.name, b)
		}
	}
	// node's decide marks what a pull copies BEFORE the rules take the
	// connection (markPull), where it plans one.
	if sourceOK := qs.IdleDisk() == replication.UpToDate || qs.IdleDisk() == replication.Consistent; !qs.Discard && d.Outcome.IsTarget() && sourceOK && !refusedOutdated {
		s.markPull(p, q, d.Outcome == replication.FullResyncTarget)
	}
	marked := len(p.marks[q.name]) > 0 || len(q.marks[p.name]) > 0
	err = s.drive(p, volstate.PeerConnected{Peer: q.name, Session: sid, UUIDs: qs.UUIDs(p.name), PeerEpoch: qs.Durable.Epoch,
		PeerDisk: qs.IdleDisk(), Marked: marked, DiscardFrom: qs.Discard, NextGen: s.newGen(),
		PeerOutdated: outdated})
	repl := p.st.Peers[q.name].Repl
	if err == nil && p.sessions[q.name] == sid && (repl == replication.Connected || repl == replication.SyncSource) {
		// The stream carries writes: the peer's answer (node steps it
		// once the session runs).
		_ = s.drive(p, volstate.PeerAnswered{Peer: q.name, Pulling: p.st.Peers[q.name].Pulling})
	}
	if err != nil || p.sessions[q.name] != sid || (repl != replication.Connected && repl != replication.SyncSource) || p.st.Role() != replication.Primary {
		if p.sessions[q.name] == sid {
			delete(p.sessions, q.name)
			s.closeStream(p, q.name)
		}
		if q.incoming.id == sid {
			q.incoming = streamOf{}
			s.stepNode(q, volstate.IncomingEnded{})
		}
		return
	}
	p.streamed[q.name] = true
	s.tracef("%s: stream to %s session %d (%s; %s by %s)", p.name, q.name, sid, repl, d.Outcome, d.Rule)
}

// raftOutdated reports whether raft records peer Outdated under primary
// p: its record names p primary at p's epoch (node reads its own raft's
// applied record, which holds the promotion's Outdated set and p's own
// marks), not by a forced promotion's blanket record, only by p's own
// marks since (node's raftOutdated: VolumeAuthority.OutdatedOnRecord);
// or p is ahead of the record (forced without a quorum) and the record's
// term held p UpToDate (VolumeAuthority.OutdatedUnder).
func (s *Sim) raftOutdated(p *node, peer string) bool {
	va, ok := s.raft.auth.Volume(volume)
	return ok && va.OutdatedUnder(p.name, p.st.Durable.Epoch, peer)
}

// endStream ends primary p's stream to peer (both ends, and what it
// carried); p steps PeerLost and its writes waiting for peer miss it.
func (s *Sim) endStream(p *node, peer string) {
	sid, ok := p.sessions[peer]
	if !ok {
		return
	}
	s.dropStream(p, peer, sid)
	s.tracef("%s: stream to %s session %d ended", p.name, peer, sid)
	if p.up {
		s.post(p, volstate.PeerLost{Peer: peer, Session: sid})
	}
}

// breakConnection ends the streams between a and b either way.
func (s *Sim) breakConnection(a, b *node) {
	s.endStream(a, b.name)
	s.endStream(b, a.name)
	s.link(a.name, b.name).reset()
}

// stopSenders ends this node's streams (volstate set its peers' states).
func (s *Sim) stopSenders(n *node) {
	for _, p := range slices.Sorted(maps.Keys(n.sessions)) {
		s.dropStream(n, p, n.sessions[p])
	}
}

// dropStream ends p's stream sid to peer: the writes it held unanswered
// are marked for peer (they may have missed it), and the writes waiting
// for them miss the peer.
func (s *Sim) dropStream(p *node, peer string, sid uint64) {
	delete(p.sessions, peer)
	s.link(p.name, peer).reset()
	if q := s.node(peer); q.incoming.id == sid {
		q.incoming = streamOf{}
		if q.up {
			// node's endIncoming.
			s.stepNode(q, volstate.IncomingEnded{})
		}
	}
	// The session's end hands back what the peer did not acknowledge,
	// once the peer is tracked (settleEnds) when it must be: marked for
	// the peer, the writes and flushes waiting for it complete.
	s.closeStream(p, peer)
}

// handover waits until the peer holds every write, then completes the
// switchover through raft (or aborts it, or takes the volume back).
func (s *Sim) handover(n *node, to string) {
	if s.now.After(n.handoverUntil) {
		_ = s.drive(n, volstate.HandoverAborted{})
		return
	}
	q := s.node(to)
	if _, ok := n.sessions[to]; !ok || len(n.writes) > 0 || n.st.Peers[to].Repl != replication.Connected || n.durable.Gens.Tracking(to) ||
		len(n.marks[to]) > 0 || len(q.marks[n.name]) > 0 || !s.link(n.name, to).idle() || !s.raft.reach(s, n) {
		return
	}
	// node's switchover flushes (flushAll) BEFORE HandedOver: the local
	// disk and every streaming peer sync what they acknowledged, a stream
	// that ended has what its peer held in its cache tracked (settleEnds),
	// a peer never streamed to is tracked (trackUnstreamed), and the peers
	// in sync take a generation that moved; a flush that fails reopens IO.
	for _, p := range slices.Sorted(maps.Keys(n.sessions)) {
		if !s.link(n.name, p).idle() || !s.node(p).running(s.now) {
			return
		}
	}
	switch err := s.trackUnstreamed(n, s.unstreamed(n)); {
	case errors.Is(err, errWait):
		return
	case err != nil:
		s.tracef("%s: switchover to %s: a peer never streamed to could not be tracked: %v", n.name, to, err)
		_ = s.drive(n, volstate.HandoverAborted{})
		return
	}
	if n.trackingAny() || len(n.announcing) > 0 {
		return
	}
	if !s.syncWithSums(n) {
		_ = s.drive(n, volstate.HandoverAborted{})
		return
	}
	for _, p := range slices.Sorted(maps.Keys(n.sessions)) {
		if !s.syncWithSums(s.node(p)) {
			_ = s.drive(n, volstate.HandoverAborted{})
			return
		}
	}
	epoch, gen := n.durable.Epoch, n.durable.Gens.Current
	if s.drive(n, volstate.HandedOver{}) != nil {
		return
	}
	if s.cfg.mutation != mutRetakeRemembersOutdated {
		// node's handover: raft is told the peer is UpToDate next, so
		// what n remembers of its Outdated records no longer holds.
		clear(n.outdated)
	}
	_, err := s.raft.apply(s, n, replication.MarkUpToDateCommand(volume, epoch, to))
	if err == nil {
		err = s.raft.promote(s, n, replication.PromoteCommand(volume, epoch, to, false), false)
	}
	if err == nil {
		s.check.switchedOver(s, n, to, epoch+1)
	}
	if err != nil {
		s.tracef("%s: switchover to %s not recorded: %v", n.name, to, err)
		va, known := s.raft.auth.Volume(volume)
		_ = s.drive(n, volstate.Retake{Epoch: epoch, Gen: gen, AuthorityKnown: known, AuthorityPrimary: va.Primary, AuthorityEpoch: va.Epoch})
	}
}

// crash stops n at once: its cache is lost (and may tear), its streams
// break, its writes in flight are never answered.
func (s *Sim) crash(n *node) {
	n.up, n.restartAt = false, s.now.Add(s.duration(time.Second, 5*time.Second))
	n.pausedUntil = time.Time{}
	s.tracef("CRASH %s", n.name)
	if n.witness {
		return
	}
	// The activity log covers every write not known durable, because a
	// write's extent enters it BEFORE its data goes to the disk
	// (writepath's order): what the cache held is marked for every peer
	// at the restart, as far as the log holds it. A block in the cache
	// the log never held is a write whose data went first: not marked.
	for b := range n.disk.cache {
		if n.logged[b] {
			n.al[b]++
		}
		s.touch(n, b)
	}
	s.check.crashed(s, n)
	s.sumsCrashed(n)
	lost, tornBlocks := n.disk.crash(s.rng, s.chance(0.5))
	s.tracef("%s: cache lost %v, torn %v", n.name, lost, tornBlocks)
	for _, m := range s.dataNodes() {
		if m != n {
			s.breakConnection(n, m)
		}
	}
	n.writes, n.flushes, n.later = nil, nil, nil
	clear(n.ending)
	clear(n.shipped)
	s.dropWaits(n)
}

// restart opens the volume again from what survived: the activity log's
// blocks are marked for every peer (they may differ anywhere).
func (s *Sim) restart(n *node) {
	n.up = true
	s.tracef("RESTART %s", n.name)
	if n.witness {
		return
	}
	for b := range n.al {
		for _, p := range n.peers {
			n.mark(p, b)
			s.check.allow(n.name, p, b)
		}
	}
	clear(n.al)
	// BEFORE anything reads (node's newVolume).
	s.rebuildSums(n)
	s.bootVolume(n)
}

// peerStates says each peer's replication state, for the trace.
func peerStates(st volstate.State) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(st.Peers)) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%s", p, st.Peers[p].Repl)
	}
	return b.String()
}

// mark marks block for peer in the bitmap (durably); a resync under way
// does not clear it.
func (n *node) mark(peer string, block int) {
	n.marks[peer][block] = true
	delete(n.resyncing[peer], block)
}
