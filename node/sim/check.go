package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Invariant names one of DESIGN.md §2's invariants as the sim checks it.
type Invariant uint8

const (
	// NoAckedWriteLost (§2.1), two checks:
	//
	// Durable: a write is durable once it is acknowledged FUA, or once a
	// FLUSH the client sent after its acknowledgement completed (it
	// "protects" it). Every replica raft counts UpToDate (the nodes the
	// authority could promote without force, the primary among them)
	// holds on stable storage, in each block, the last protected write or
	// a later one (a later write that tore the block counts as later: a
	// write in flight may tear what it overwrites), after every step,
	// whether it is up or down. A forced promotion of X (--force, through
	// raft or without quorum) accepts X's data: each block's protected
	// write becomes what X holds on stable storage where X holds less
	// (what the operator's command says may be lost); later protections
	// count as before, except during a forced split (below), when no
	// write or flush is counted.
	//
	// Readable: the current serving primary reads, in every block, the
	// last acknowledged write or a later one, but a write acknowledged
	// and not yet protected may be lost by a crash of any node that held
	// it in its cache only: a crash forgets those blocks' unprotected
	// acknowledgements.
	NoAckedWriteLost Invariant = iota + 1
	// OneWriter (§2.3): never two nodes serving under leases at once;
	// and a node serving without a lease (OpenWithoutLease) serves
	// beside another only as the split DESIGN.md allows: the operator
	// forced it while it reached no raft leader (the node alone could not
	// ask raft), and it has not been told since that raft names another
	// primary at its epoch or later. A node that opens without a lease in
	// any other way, or keeps serving once told, is a second writer.
	OneWriter
	// NoStalePromotion: a node that lacks an acknowledged write is never
	// promoted without force. And a disk that holds part of a resync (it
	// applied resync data it has not recorded a sync-done for since) is
	// durably Inconsistent, on stable storage, whether its node is up or
	// down: after a crash or a restart it comes up Inconsistent, no
	// promotion takes it, and a forced one is refused (ErrMidResync) or
	// takes it as holding no data; never as holding the generation it
	// had before the resync began, which its blocks no longer are
	// (DESIGN.md: no stale promotion).
	NoStalePromotion
	// ReplicasEqualInSync: a primary and a peer it counts in sync (no
	// marked blocks, nothing in flight) hold the same blocks.
	ReplicasEqualInSync
	// CatchUpCostsWhatChanged (§2.4): a resync (or a pull) copies only
	// blocks written on either side since the two were last in sync
	// (a write attempted, applied from a stream, resynced, or a cache a
	// crash lost), plus the activity log's blocks a reconciliation or a
	// restart marked, and the blocks a stream's end marked because its
	// peer acknowledged them from its cache after its last flush ack;
	// every block only when the rules chose a full resync (unrelated
	// generations, or a split brain's victim discarding its data, which
	// the sim always copies whole). A resync that copies more, or a full
	// copy where the rules chose a bitmap one, fails.
	CatchUpCostsWhatChanged
	// SecondaryIsAPrefix (§2.5, protocol C): a secondary applies its
	// primary's stream in the order it was sent, each entry once, so that
	// what reads see on it is always the primary's stream up to some
	// entry (checked at each entry applied: every block holds what the
	// stream's prefix up to it holds). A flush entry makes that prefix
	// durable; what a crash leaves is then the state at the last FLUSH
	// boundary plus some of the writes after it, as a local disk's cache
	// does, and those blocks are the activity log's.
	SecondaryIsAPrefix
	// BadInputChangesNothing (§2.6): a request the node refuses (a write
	// past the end, an entry of a stream that is not its own) changes
	// no byte of any replica, in cache or on stable storage.
	BadInputChangesNothing
	// HandoverCostsNoLeaseWait (liveness): a switchover hands the lease
	// back (ReleaseLease), so the new primary need not wait it out. When
	// raft took a switchover from X to Y at time T (Y's promotion at the
	// epoch E proposed, applied at once or after the lease fence), and from T on X and Y both run, both reach the raft
	// leader that recorded it, which has led for a lease at T, and
	// neither disk fails, Y serves IO (volstate.Admit: Serve, primary at
	// E or later) before T + handoverBound, half a lease; a switchover
	// that waits out the old primary's lease breaks it.
	HandoverCostsNoLeaseWait
	// EpochsNeverGoBack (§2.3, fencing): the epoch a node agreed to, on
	// stable storage, never decreases: a node that saw a primary's epoch
	// follows no primary of an older one (which is cut off, or crashed,
	// and would overwrite the newer primary's writes). The one exception
	// is a split brain's victim discarding its data (DiscardMyData): it
	// follows the next primary that connects, whatever epoch it saw.
	EpochsNeverGoBack
	// ChecksumsMatchData (issue 29): a verified read never takes a block
	// that nothing damaged for corruption (no false block-repaired or
	// block-unrecoverable), and so never returns other data than the
	// disk's. On every running data node, after every step: each block
	// with a known sum (the one in memory, else the one on stable
	// storage) reads the data that sum describes; and each block outside
	// the activity log's hot blocks holds no data not yet durable, no sum
	// not yet durable, and on stable storage a sum of the data on stable
	// storage: what a crash now would leave there, where recovery
	// computes no sum again (sums.go).
	ChecksumsMatchData
	// DrainedChangesComplete (liveness): a role change that waits for
	// the IO (volstate's Pending: a step-down, a fence's drain, a discard;
	// not a handover, which waits for its peer) completes once the IO
	// drained, because the driver feeds Quiesced back after a WaitIO or a
	// DrainIO (volstate.Drive). The sim's state writes do not fail, so no
	// such change is pending once a drive of the volume is over and none
	// of its drives waits off the loop (Config.Interleave; without it
	// every drain is done at once).
	DrainedChangesComplete
)

// handoverBound is how long after raft recorded a switchover its target
// may take to serve when no fault hit it (HandoverCostsNoLeaseWait):
// shorter than a lease, longer than the ticks the target takes to learn
// of its promotion and get its first lease.
const handoverBound = leaseDuration / 2

// switchover is a switchover raft recorded, watched until its target
// serves (HandoverCostsNoLeaseWait).
type switchover struct {
	from, to string
	leader   string
	epoch    uint64
	at       time.Time
}

func (i Invariant) String() string {
	switch i {
	case NoAckedWriteLost:
		return "no-acknowledged-write-lost"
	case OneWriter:
		return "one-writer"
	case NoStalePromotion:
		return "no-stale-promotion"
	case ReplicasEqualInSync:
		return "replicas-equal-in-sync"
	case CatchUpCostsWhatChanged:
		return "catch-up-costs-what-changed"
	case SecondaryIsAPrefix:
		return "secondary-is-a-prefix"
	case BadInputChangesNothing:
		return "bad-input-changes-nothing"
	case HandoverCostsNoLeaseWait:
		return "handover-costs-no-lease-wait"
	case EpochsNeverGoBack:
		return "epochs-never-go-back"
	case ChecksumsMatchData:
		return "checksums-match-data"
	case DrainedChangesComplete:
		return "drained-changes-complete"
	}
	return "invariant(?)"
}

// Finding is a defect of production the sim found, which a check
// tolerates in the exact situation it describes (and reports), so that
// every seed still runs every check.
type Finding uint8

const (
	// FindingHistoryFullResync: a source whose generations hold the
	// peer's current in their history, with no bitmap generation toward
	// the peer older than it, resyncs the peer in full by the rule
	// history-self (and a primary that pulls from such a peer pulls in
	// full by history-peer), though its bitmap may hold every block
	// written since: the shapes forced promotions and their activity logs
	// leave. (The shape of a sync-done whose ack never came, followed by
	// a write that missed the peer, TrackedPeerMayHoldCurrent, resyncs
	// from the bitmap since the rules bitmap-self-history and
	// bitmap-peer-history.) Invariant 4 (catch-up costs what changed)
	// tolerates those full copies, traced; any other full resync of a
	// disk that held data (an interrupted resync whose target did not
	// record the generation it resumes from comes back with none:
	// just-created-peer) breaks it.
	FindingHistoryFullResync Finding = iota + 1
	// FindingPullCopiesLeftovers: a primary's pull copies every block
	// its disk misses (node's copyMissingFromPeer over localMissing),
	// the blocks an earlier pull cut off left among them, from whichever
	// peer it pulls from next, though that peer's plan (and the marks
	// forwardPulled left for it) may already cover every block that
	// differs: the leftovers hold the data of the generation before the
	// first pull, which the next source's plan is counted from.
	// Invariant 4 (catch-up costs what changed) tolerates those copies,
	// traced.
	FindingPullCopiesLeftovers
)

func (f Finding) String() string {
	switch f {
	case FindingHistoryFullResync:
		return "history-full-resync"
	case FindingPullCopiesLeftovers:
		return "pull-copies-leftovers"
	}
	return "finding(?)"
}

// findingHit is one time a run met a known finding.
type findingHit struct {
	finding Finding
	step    int
	detail  string
}

// checker holds what the invariants are checked against.
type checker struct {
	acked []int64 // the last acknowledged value of each block
	// ackedEpoch is, per block, the epoch of the primary that
	// acknowledged its last write: a FLUSH a primary of an older epoch
	// completes (a stale one, cut off) covers none of that primary's
	// writes, which its client never sent it.
	ackedEpoch []uint64
	// ackedIDs are, per block, every write acknowledged to it, oldest
	// first.
	ackedIDs map[int][]int64
	// protected: the last write to each block acknowledged FUA or before
	// a FLUSH that completed.
	protected []int64
	acks      int
	flushes   int
	// forced: the node's next promotion is an operator's forced one.
	forced map[string]bool
	// split: a forced promotion without raft may have left two primaries.
	split bool
	// mayDiffer are blocks invariant 4 skips until a write to them is
	// acknowledged: what a forced promotion leaves (forgetDifferences).
	mayDiffer map[int]bool
	// forcedAlone: nodes the operator forced while they reached no raft
	// leader (the split one-writer allows).
	forcedAlone map[string]bool
	findings    []findingHit
	// changed: per pair of data nodes, the blocks that may differ between
	// them since they were last in sync (invariant 4).
	changed map[[2]string]map[int]bool
	// streams: per session, what the primary sent on it (invariant 5).
	streams map[uint64]*streamLog
	// switched is the switchover watched until its target serves (nil:
	// none).
	switched *switchover
	// midResync: the data nodes whose disks hold part of a resync, and
	// from whom (NoStalePromotion): set when one applies resync data,
	// cleared when its volume records the source's generation.
	midResync map[string]string
}

// streamLog is one stream's data entries in the order sent, and how far
// its receiver applied them.
type streamLog struct {
	entries []streamEntry
	applied int
	// state is each block after the entries applied, where set says the
	// stream wrote it (arrays, not a map: checked at every entry applied).
	state [blocks]int64
	set   [blocks]bool
}

type streamEntry struct {
	block int
	value int64
}

func newChecker() checker {
	return checker{acked: make([]int64, blocks), ackedEpoch: make([]uint64, blocks), ackedIDs: map[int][]int64{}, protected: make([]int64, blocks), forced: map[string]bool{}, mayDiffer: map[int]bool{},
		forcedAlone: map[string]bool{}, midResync: map[string]string{},
		changed: map[[2]string]map[int]bool{}, streams: map[uint64]*streamLog{}}
}

func (c *checker) acknowledged(s *Sim, n *node, w *write) {
	if c.split {
		s.tracef("%s: write %d acknowledged during a forced split (not counted)", n.name, w.id)
		return
	}
	c.acked[w.block], c.ackedEpoch[w.block] = w.id, n.st.Durable.Epoch
	c.ackedIDs[w.block] = append(c.ackedIDs[w.block], w.id)
	c.acks++
	delete(c.mayDiffer, w.block)
	if w.fua {
		c.protected[w.block] = max(c.protected[w.block], w.id)
	}
	s.tracef("%s: write %d block %d acknowledged (fua %t)", n.name, w.id, w.block, w.fua)
}

// flushed: n completed flush f; the writes acknowledged before it was
// sent are protected. A peer that did not flush for it holds them
// durably, or is tracked (raft has it Outdated, it is never promoted
// without force): a peer whose stream from n ended before it
// acknowledged the flush was tracked, and what it acknowledged from its
// cache marked, by the stream's end (settleEnds), and one n had no
// stream to since it became primary by the flush itself
// (trackUnstreamed), BEFORE it completed. The durable check holds with
// no excuse.
func (c *checker) flushed(s *Sim, n *node, f *flushOp) {
	c.flushes++
	if f.covered == nil {
		s.tracef("%s: flush %d completed during a forced split (not counted)", n.name, f.id)
		return
	}
	for b, v := range f.covered {
		c.protected[b] = max(c.protected[b], v)
	}
	s.tracef("%s: flush %d completed", n.name, f.id)
}

// crashed: n's cache is about to be lost: the acknowledgements of its
// blocks that no FLUSH protected may be lost with it.
func (c *checker) crashed(s *Sim, n *node) {
	for b := range n.disk.cache {
		c.acked[b] = c.protected[b]
	}
}

// appliedEntry: n applied, from its incoming stream sid from primary
// from, a data entry writing value to block (resync: a resync's block):
// it must be the stream's next data entry, and n must hold the stream's
// prefix up to it (invariant 5).
func (c *checker) appliedEntry(s *Sim, n *node, from string, sid uint64, block int, value int64, resync bool) {
	l := c.streams[sid]
	if l == nil {
		return
	}
	if l.applied >= len(l.entries) || l.entries[l.applied] != (streamEntry{block, value}) {
		s.fail(SecondaryIsAPrefix, "%s applied block %d = %d of session %d after entry %d, not the stream's next entry", n.name, block, value, sid, l.applied)
		return
	}
	if resync {
		c.midResync[n.name] = from
	}
	l.state[block], l.set[block] = value, true
	l.applied++
	for b := range blocks {
		if !l.set[b] {
			continue
		}
		if v := n.disk.read(b); v != l.state[b] {
			s.fail(SecondaryIsAPrefix, "%s applied session %d up to entry %d: block %d holds %d, the stream %d", n.name, sid, l.applied, b, v, l.state[b])
			return
		}
	}
}

// syncFinished: n's volume recorded that its disk holds the generation
// of the resync's source: it holds no part of a resync any more.
func (c *checker) syncFinished(n *node) { delete(c.midResync, n.name) }

// checkMidResync checks NoStalePromotion's durable half: every data node
// whose disk holds part of a resync is durably Inconsistent.
func (s *Sim) checkMidResync() {
	for _, n := range s.dataNodes() {
		if from, ok := s.check.midResync[n.name]; ok && !n.durable.Gens.Current.IsZero() {
			s.fail(NoStalePromotion, "%s holds part of a resync from %s, but its durable state names generation %s as its data (up %t): a restart or a forced promotion would take the half-copied disk for that generation",
				n.name, from, n.durable.Gens.Current, n.up)
			return
		}
	}
}

// sent records a data entry (block, value) a primary sent on session sid;
// it returns its place in the stream.
func (c *checker) sent(sid uint64, block int, value int64) int {
	l := c.streams[sid]
	if l == nil {
		l = &streamLog{}
		c.streams[sid] = l
	}
	l.entries = append(l.entries, streamEntry{block, value})
	return len(l.entries)
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// allow records that block may differ between a and b (invariant 4).
func (c *checker) allow(a, b string, block int) {
	k := pair(a, b)
	if c.changed[k] == nil {
		c.changed[k] = map[int]bool{}
	}
	c.changed[k][block] = true
}

// historyFullResync: p's data goes to q in full by the rule
// history-self (a resync) or history-peer (q pulls)
// (FindingHistoryFullResync): traced, and allowed by invariant 4.
func (c *checker) historyFullResync(s *Sim, p, q *node) {
	for b := range blocks {
		c.allow(p.name, q.name, b)
	}
	hit := findingHit{finding: FindingHistoryFullResync, step: s.step,
		detail: fmt.Sprintf("%s's data goes to %s in full (history rule): %d blocks changed since they were last in sync", p.name, q.name, len(c.changed[pair(p.name, q.name)]))}
	c.findings = append(c.findings, hit)
	s.tracef("KNOWN FINDING %s: %s", hit.finding, hit.detail)
}

// pullLeftovers: q's pull into n copies blocks left, an earlier pull
// cut off, outside this pull's plan (FindingPullCopiesLeftovers): those
// invariant 4 does not allow already are allowed, traced.
func (c *checker) pullLeftovers(s *Sim, q, n *node, left []int) {
	var extra []int
	for _, b := range left {
		if !c.changed[pair(q.name, n.name)][b] {
			extra = append(extra, b)
			c.allow(q.name, n.name, b)
		}
	}
	if len(extra) == 0 {
		return
	}
	hit := findingHit{finding: FindingPullCopiesLeftovers, step: s.step,
		detail: fmt.Sprintf("%s's pull from %s copies blocks %v an earlier pull left, which neither changed since they were last in sync", n.name, q.name, extra)}
	c.findings = append(c.findings, hit)
	s.tracef("KNOWN FINDING %s: %s", hit.finding, hit.detail)
}

// staleOpened: n's volume opened with a disk that was detached
// (LocalStale): the rules make it Inconsistent with no generation
// (volstate's Opened), so that the next resync into it copies every
// block (the sim, like node, keeps no record across a restart of what a
// detached disk missed). Invariant 4 allows that copy whole.
func (c *checker) staleOpened(s *Sim, n *node) {
	for _, p := range n.peers {
		for b := range blocks {
			c.allow(n.name, p, b)
		}
	}
	s.tracef("check: %s opened with a stale disk: a full resync into it is allowed", n.name)
}

// copied checks invariant 4 when from copies blocks to to.
func (c *checker) copied(s *Sim, from, to string, blocks []int, how string) {
	for _, b := range blocks {
		if !c.changed[pair(from, to)][b] {
			s.fail(CatchUpCostsWhatChanged, "%s's %s to %s copies block %d, which neither changed since they were last in sync nor is in an activity log marked (%d blocks may differ, %d copied)",
				from, how, to, b, len(c.changed[pair(from, to)]), len(blocks))
			return
		}
	}
}

// diskImage is every data node's disk, cache and stable storage.
type diskImage []struct {
	durable []int64
	cache   map[int]int64
}

func (s *Sim) snapshot() diskImage {
	var im diskImage
	for _, n := range s.dataNodes() {
		im = append(im, struct {
			durable []int64
			cache   map[int]int64
		}{slices.Clone(n.disk.durable), maps.Clone(n.disk.cache)})
	}
	return im
}

// unchanged checks invariant 6: no replica changed since before.
func (c *checker) unchanged(s *Sim, before diskImage) {
	for i, n := range s.dataNodes() {
		if !slices.Equal(before[i].durable, n.disk.durable) || !maps.Equal(before[i].cache, n.disk.cache) {
			s.fail(BadInputChangesNothing, "a refused request changed %s's disk", n.name)
			return
		}
	}
}

// lacks returns the first block whose acknowledged value n does not read
// (nor a later one: a write that tore a block after it was acknowledged
// was not acknowledged itself, and counts as later).
func (c *checker) lacks(n *node) (block int, has int64, ok bool) {
	for b := range c.acked {
		if v := n.disk.read(b); max(v, -v) < c.acked[b] {
			return b, v, true
		}
	}
	return 0, 0, false
}

// promoted checks invariant 3 when n became primary by e.
func (c *checker) promoted(s *Sim, n *node, e volstate.Event) {
	if _, force := e.(volstate.Force); force {
		return // the operator's (forcedHere)
	}
	if c.forced[n.name] || c.split {
		delete(c.forced, n.name)
		return
	}
	if b, v, ok := c.lacks(n); ok {
		s.fail(NoStalePromotion, "%s promoted at epoch %d by %T holds %d in block %d, acknowledged %d", n.name, n.st.Durable.Epoch, e, v, b, c.acked[b])
	}
}

// forcedHere: the operator forced n to primary while raft had no
// quorum. The command may lose what n lacks (forgive); until one primary
// is left, named by raft, two sides may serve (a split brain the operator
// chose): writes acknowledged and flushes completed meanwhile count for
// neither, and the primary's readable check and invariant 3 start again
// once it is resolved. The forced node may serve beside another (one
// writer) only when it reached no raft leader.
func (c *checker) forcedHere(s *Sim, n *node) {
	c.split = true
	if !s.raft.reach(s, n) {
		c.forcedAlone[n.name] = true
	}
	c.forgive(s, n)
	c.forgetDifferences(s)
	s.tracef("check: forced primary %s: writes it lacks may be lost; invariants 1 (readable) and 3 wait for one primary", n.name)
}

// forgive: a forced promotion of n accepts n's data. Each block's
// protected write becomes what n holds on stable storage where n holds
// less, its acknowledged one what n reads where n reads less.
func (c *checker) forgive(s *Sim, n *node) {
	for b := range blocks {
		if v := n.disk.stable(b); max(v, -v) < c.protected[b] {
			c.protected[b] = max(v, -v)
		}
		if v := n.disk.read(b); max(v, -v) < c.acked[b] {
			// The newest acknowledged write n holds, not n's value: that
			// may be a write in flight when its primary crashed, never
			// acknowledged (seed 38283).
			c.acked[b] = 0
			for _, id := range c.ackedIDs[b] {
				if id <= max(v, -v) {
					c.acked[b] = id
				}
			}
		}
	}
}

// forgetDifferences: a forced promotion counts every peer in sync by
// generation and promises nothing of the blocks the copies differ in then
// (the blocks it marked for them are still resynced, but a peer's own
// changes it never saw are not); invariant 4 skips them until a write to
// them is acknowledged.
func (c *checker) forgetDifferences(s *Sim) {
	for b := range blocks {
		var seen []int64
		for _, n := range s.dataNodes() {
			seen = append(seen, n.disk.read(b))
		}
		if slices.Min(seen) != slices.Max(seen) {
			c.mayDiffer[b] = true
		}
	}
}

// resolved reports whether a forced split is over: one data node holds
// itself primary, the one raft names at its epoch.
func (s *Sim) resolved() bool {
	va, known := s.raft.auth.Volume(volume)
	primaries := 0
	for _, n := range s.dataNodes() {
		if n.durable.Primary == n.name {
			primaries++
			if !known || va.Primary != n.name || va.Epoch != n.durable.Epoch {
				return false
			}
		}
	}
	return primaries == 1
}

// forcedByRaft: raft applied an operator's forced promotion of n (after
// the lease fence): it may lose what n lacks.
func (c *checker) forcedByRaft(s *Sim, n *node) {
	c.forced[n.name] = n.st.Role() != replication.Primary
	c.forgive(s, n)
	c.forgetDifferences(s)
	s.tracef("check: raft forced %s: writes it lacks may be lost", n.name)
}

// switchedOver: raft took the switchover from n to to at epoch (its
// promotion applied, or waiting for the lease fence); it is watched when
// the leader has led for a lease (a new leader waits a lease from its
// office whatever the old primary did).
func (c *checker) switchedOver(s *Sim, n *node, to string, epoch uint64) {
	c.switched = nil
	if s.now.Before(s.raft.office.Add(leaseDuration)) {
		return
	}
	c.switched = &switchover{from: n.name, to: to, leader: s.raft.leader, epoch: epoch, at: s.now}
}

// checkHandover checks HandoverCostsNoLeaseWait: the watched
// switchover's target serves in time, unless a fault hit it.
func (s *Sim) checkHandover() {
	w := s.check.switched
	if w == nil {
		return
	}
	from, to := s.node(w.from), s.node(w.to)
	for _, n := range []*node{from, to} {
		if !n.running(s.now) || s.raft.leader != w.leader || !s.raft.reach(s, n) || s.now.Before(n.disk.failUntil) {
			s.check.switched = nil // a fault hit it: no promise
			return
		}
	}
	if to.st.Role() == replication.Primary && to.st.Durable.Epoch >= w.epoch && volstate.Admit(to.st, s.now) == volstate.Serve {
		s.check.switched = nil
		return
	}
	if p := to.st.Pending; p != nil && p.Kind == volstate.PendingHandover {
		// The operator switched over again, away from it: it stops its
		// IO for that handover, which is no wait of this one's.
		s.check.switched = nil
		return
	}
	if s.now.Sub(w.at) > handoverBound {
		s.check.switched = nil
		s.fail(HandoverCostsNoLeaseWait, "%s does not serve %v after raft recorded the switchover from %s at epoch %d, with no fault (serving %s, role %s epoch %d)",
			to.name, s.now.Sub(w.at), from.name, w.epoch, to.st.Serving, to.st.Role(), to.st.Durable.Epoch)
	}
}

// checkAll checks invariants 1, 2 and 4 and the checksums (3 is checked at promotions, 5
// at each entry applied, 6 at each bad request).
func (s *Sim) checkAll() {
	if s.check.split && s.resolved() {
		s.check.split = false
		s.tracef("check: the forced split is resolved")
	}
	va, known := s.raft.auth.Volume(volume)
	var leased, unleased []*node
	for _, n := range s.dataNodes() {
		if !n.up {
			continue
		}
		st := n.st
		if st.Serving != volstate.OpenWithoutLease {
			delete(s.check.forcedAlone, n.name)
		}
		if volstate.Admit(st, s.now) == volstate.Serve {
			switch st.Serving {
			case volstate.Open:
				leased = append(leased, n)
			case volstate.OpenWithoutLease:
				unleased = append(unleased, n)
			}
		}
		// The current primary: raft's, or one forced while raft had no
		// quorum that raft has not heard of yet.
		current := known && va.Primary == n.name && va.Epoch == st.Durable.Epoch && st.Serving.IsOpen() ||
			st.Serving == volstate.OpenWithoutLease && (!known || va.Epoch < st.Durable.Epoch)
		s.checkMissing(n)
		if st.Role() != replication.Primary || !current || st.Disk != replication.UpToDate {
			continue
		}
		if b, v, ok := s.check.lacks(n); ok && !s.check.split {
			s.fail(NoAckedWriteLost, "primary %s (epoch %d) reads %d in block %d, acknowledged %d", n.name, st.Durable.Epoch, v, b, s.check.acked[b])
		}
		s.checkInSync(n)
	}
	if len(leased) > 1 {
		s.fail(OneWriter, "%v serve with leases at once", names(leased))
	}
	if len(leased)+len(unleased) > 1 {
		for _, x := range unleased {
			told := known && va.Primary != x.name && va.Epoch >= x.st.Durable.Epoch && x.authVersion == s.raft.version
			if !s.check.forcedAlone[x.name] || told {
				others := slices.DeleteFunc(append(slices.Clone(leased), unleased...), func(m *node) bool { return m == x })
				s.fail(OneWriter, "%s serves without a lease beside %v (forced while it reached no raft leader: %t; told raft's primary %s at epoch %d since: %t)",
					x.name, names(others), s.check.forcedAlone[x.name], va.Primary, va.Epoch, told)
			}
		}
	}
	if known {
		s.checkDurable(va)
	}
	s.checkMidResync()
	s.checkSums()
	s.checkHandover()
}

// checkMissing checks invariant 1's readable half for the blocks n's
// disk misses (a pull's plan not yet copied): a node that holds a
// generation, or whose disk the rules call UpToDate, reads its own disk
// as the volume's data (and is a source of resyncs and a candidate for
// promotion), so its disk misses nothing. (Node reads a missing block
// from a peer meanwhile; the sim's reads of a primary's disk, and the
// resyncs it sources, happen only once it holds a generation.) A primary
// that stepped down before its pull ended misses them until a resync into
// it ends (volstate's ClearLocalMissing; seeds 405, 2268, 3489 and 3551
// held a generation with them still marked before).
func (s *Sim) checkMissing(n *node) {
	if len(n.missing) == 0 {
		return
	}
	if n.st.Disk != replication.UpToDate && n.durable.Gens.Current.IsZero() {
		return
	}
	s.fail(NoAckedWriteLost, "%s (%s, disk %s, generation %s) takes its disk for the volume's data, but it misses blocks %v (a pull's plan not yet copied)",
		n.name, n.st.Role(), n.st.Disk, n.durable.Gens.Current, slices.Sorted(maps.Keys(n.missing)))
}

func names(ns []*node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.name)
	}
	return out
}

// checkDurable checks invariant 1's durable half: every replica raft
// counts UpToDate holds every protected write on stable storage, but a
// disk that durably knows itself stale (detached while its peers took
// writes: Durable.LocalStale), which no promotion takes (volstate's
// becomePrimary refuses it, and the promotion check would catch one
// that did) and which opens Inconsistent until a resync: raft's record
// of the node outlives its disk's detach, as DRBD's peers' view of a
// Diskless node does.
func (s *Sim) checkDurable(va replication.VolumeAuthority) {
	c := &s.check
	for _, n := range s.dataNodes() {
		if !va.IsUpToDate(n.name) || n.durable.LocalStale {
			continue
		}
		for b, want := range c.protected {
			if v := n.disk.stable(b); max(v, -v) < want {
				s.fail(NoAckedWriteLost, "%s, UpToDate in raft at epoch %d, holds %d in block %d on stable storage; write %d was acknowledged FUA or before a FLUSH that completed",
					n.name, va.Epoch, v, b, want)
				return
			}
		}
	}
}

// checkInSync checks invariant 4 for primary p and each peer it counts in
// sync: connected, no marks either side, nothing in flight. A pair found
// equal starts invariant 4's changed set again.
func (s *Sim) checkInSync(p *node) {
	// A block a write is in flight on may differ for now.
	inFlight := map[int]bool{}
	for _, w := range p.writes {
		inFlight[w.block] = true
	}
	var equal []string
	for _, name := range p.peers {
		q := s.node(name)
		sid, ok := p.sessions[name]
		if !ok || !q.up || q.incoming.id != sid || p.st.Peers[name].Repl != replication.Connected || p.durable.Gens.Tracking(name) ||
			len(p.marks[name]) > 0 || len(q.marks[p.name]) > 0 || !s.link(p.name, name).idle() {
			continue
		}
		// p counts q in sync, with nothing on their link: q has recorded,
		// durably, that its disk holds a generation of p's data (p's
		// current one, or one p's came from: a pull from q moves p on
		// from q's), no resync under way. A sync-done q's volume refused
		// to record is never acknowledged as taken.
		if g := q.durable.Gens.Current; g.IsZero() || !q.durable.SyncGen.IsZero() ||
			g != p.durable.Gens.Current && !slices.Contains(p.durable.Gens.History, g) {
			s.fail(ReplicasEqualInSync, "%s counts %s in sync at generation %s, but %s's durable state names generation %s, with a resync under way: %t: it has not recorded holding %s's data",
				p.name, name, p.durable.Gens.Current, name, g, !q.durable.SyncGen.IsZero(), p.name)
			return
		}
		same := len(inFlight) == 0
		for b := range blocks {
			if inFlight[b] {
				continue
			}
			if pv, qv := p.disk.read(b), q.disk.read(b); pv != qv {
				if !s.check.mayDiffer[b] {
					s.fail(ReplicasEqualInSync, "%s and %s in sync, block %d holds %d and %d", p.name, name, b, pv, qv)
					return
				}
				same = false
			}
		}
		if same {
			equal = append(equal, name)
			delete(s.check.changed, pair(p.name, name))
		}
	}
	if len(equal) == 2 {
		// Both equal to p: equal to each other, and what either marked
		// for the other is still to copy.
		if q, r := s.node(equal[0]), s.node(equal[1]); len(q.marks[r.name]) == 0 && len(r.marks[q.name]) == 0 {
			delete(s.check.changed, pair(q.name, r.name))
		}
	}
}
