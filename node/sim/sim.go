package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// Timing of the simulated cluster, in virtual time.
const (
	tick            = 50 * time.Millisecond
	leaseDuration   = 2 * time.Second
	renewEvery      = 500 * time.Millisecond
	electionTimeout = time.Second
	decideEvery     = 250 * time.Millisecond
	deadAfter       = time.Second // gossip declares an unreachable node dead
	dialEvery       = 300 * time.Millisecond
	connTimeout     = time.Second // a connection to a paused node breaks
	redeliverEvery  = time.Second // the authority is told again
	writeTimeout    = 4 * time.Second
	handoverTimeout = 3 * time.Second
	blocks          = 64
	volume          = "vol"
	witness         = "witness"
)

// mutation is a bug planted on purpose (set only by tests), to show that
// an invariant check fails when the rule it guards is broken.
type mutation uint8

const (
	noMutation mutation = iota
	// mutAckWithoutPeer acknowledges a write without waiting for the
	// peers that take it (invariant 1).
	mutAckWithoutPeer
	// mutSkipLeaseFence promotes without waiting out the old primary's
	// lease (invariant 2).
	mutSkipLeaseFence
	// mutBypassOutdated has the leader promote an Outdated candidate
	// Decide refused, forcing it past the authority (invariant 3).
	mutBypassOutdated
	// mutSkipResyncCopy finishes a resync without copying the marked
	// blocks (invariant 4).
	mutSkipResyncCopy
	// mutAnnounceNotAwaited completes a write a peer missed before the
	// peers in sync took the new generation it announced: the node did
	// so until the sim found it (sim-finding-generation-announce-not-
	// awaited, fixed in Volume.track).
	mutAnnounceNotAwaited
	// mutMayHoldIgnored moves no generation when a write misses a peer
	// the primary tracks already, even when that peer may hold the
	// current one (a sync-done or announcement it took whose ack never
	// came, a resync between equal generations cut off): the node did so
	// until the sim found it (sim-finding-lost-sync-done-ack, fixed in
	// Volume.trackLocked with peer.mayHold).
	mutMayHoldIgnored
	// mutPromotionClearsMarks clears the blocks a node marked for its
	// peers when it is promoted at a new epoch (a handover, raft's
	// choice, a forced promotion): the node did so until the sim found
	// it (sim-finding-promotion-clears-marks, fixed in volstate's
	// becomePrimary and force).
	mutPromotionClearsMarks
	// mutResyncNotOutdated starts a resync at a connection without
	// raft recording the peer Outdated first (node's outdateBeforeResync):
	// a primary forced without quorum, its writes waiting for the
	// reclaim (unmarked, unshipped), resyncs a peer and hands it its
	// generation, so that the peer counts in sync without them (seed
	// 3468).
	mutResyncNotOutdated
	// mutFlushNotAwaited completes a FLUSH without waiting for the peers'
	// flush acknowledgements (invariant 1, durable).
	mutFlushNotAwaited
	// mutFlushSkipsLocal completes a FLUSH without syncing the local disk
	// (invariant 1, durable).
	mutFlushSkipsLocal
	// mutForceLocally has the operator's --force take the node's own path
	// (OpenWithoutLease) though the node reaches raft (one writer).
	mutForceLocally
	// mutFullResync copies every block at a resync the rules planned from
	// the bitmaps (invariant 4).
	mutFullResync
	// mutApplyReordered has a secondary apply the frames that arrive
	// together in the reverse order (invariant 5).
	mutApplyReordered
	// mutBadWriteWraps writes a write past the volume's end at its
	// offset modulo the size instead of refusing it (invariant 6).
	mutBadWriteWraps
	// mutResyncResumesFromNothing: a resync target records no generation
	// its resync resumes from (invariant 4: interrupted, it comes back
	// with no data by generations, and is copied whole).
	mutResyncResumesFromNothing
	// mutHandoverKeepsLease: a switchover does not hand the old
	// primary's lease back (HandoverCostsNoLeaseWait).
	mutHandoverKeepsLease
	// mutFlushSkipsUnstreamedPeer completes a FLUSH without tracking a
	// peer the primary has had no stream to since it became primary:
	// node's submit did so until issue 28's finding flush-skips-peer-cache
	// ("a flush the peer misses changes no block of it"), and the peer
	// then held in its cache only, counted UpToDate by raft, writes of an
	// earlier primary the FLUSH declared durable (invariant 1).
	mutFlushSkipsUnstreamedPeer
	// mutCacheNotTracked ends a stream without tracking what its peer
	// acknowledged from its cache since its last flush ack: node's
	// session end did so until the sim found it (flush-skips-peer-cache,
	// fixed in node/session's cached set), and a FLUSH then completed
	// over writes a promotable peer held in its cache only (invariant 1).
	// Planted at the session's end (settleEnds): it marks without the
	// peer tracked.
	mutCacheNotTracked
	// mutAckBeforeCacheTracked completes a write that a peer acknowledged
	// from its cache once its other copies answered, though the peer's
	// stream ended since and its end has not tracked the peer: node did
	// so until the sim's finding ack-after-peer-cache-lost (fixed by
	// session.AwaitCacheLoss), and raft, with no leader to record the peer
	// Outdated, could then promote it without the write (invariant 2).
	// Planted in the write's looks (cacheLoss), at the Wait and the Lease
	// stages both.
	mutAckBeforeCacheTracked
	// mutRetakeRemembersOutdated keeps, across a handover that raft did
	// not record and the old primary's retake, its memory of raft's
	// Outdated records, though the switchover had raft record the peer
	// UpToDate: node did so until the sim's seed 14488, and a write the
	// peer then missed completed without raft recording it Outdated
	// (invariant 1).
	mutRetakeRemembersOutdated
	// mutCacheLossOnlyAtWait looks for a stream that lost a write's ack
	// from its peer's cache only at the Wait stage: node did so until
	// seed 30879 showed a stream ending between that look and the
	// write's completion (invariant 2).
	mutCacheLossOnlyAtWait
	// mutAcceptKeepsCache has a secondary take a new stream with writes
	// of an earlier one in its disk's cache only: node did so until
	// seed 39814 showed a pull's source counted in sync (and recorded
	// UpToDate in raft) holding an acknowledged write in its cache only,
	// which its disk then never took (invariant 1).
	mutAcceptKeepsCache
	// mutPullNotForwarded keeps what a primary pulls from a peer with
	// newer data from its other peers: node did so until this model's
	// seed 459 (run as node ran) showed a peer counted in sync without
	// it (invariant: replicas equal in sync).
	mutPullNotForwarded
	// mutFailedWriteKept leaves on the peers a write that failed after it
	// went to their streams and that the primary's disk does not hold:
	// node did so until this model's known finding failed-write-diverges
	// (replicas that count each other in sync differ in the block).
	mutFailedWriteKept
	// mutEvictionSkipsSums gives a block away from the activity log's
	// hot blocks without writing the pages of its sums first: a crash
	// then leaves its new data with its old sum, which no recovery
	// computes again (ChecksumsMatchData; metadata's
	// ActivityLog.commit writes them first).
	mutEvictionSkipsSums
	// mutRebuildSkipsOldest computes again after a crash the sums of
	// every hot block but the least recently used (an off-by-one over
	// the log's slots): its data and sum may differ (ChecksumsMatchData;
	// metadata's RebuildActivityLogChecksums takes every active extent).
	mutRebuildSkipsOldest
)

func (m mutation) String() string {
	switch m {
	case noMutation:
		return "none"
	case mutAckWithoutPeer:
		return "ack-without-peer"
	case mutSkipLeaseFence:
		return "skip-lease-fence"
	case mutBypassOutdated:
		return "bypass-outdated"
	case mutSkipResyncCopy:
		return "skip-resync-copy"
	case mutAnnounceNotAwaited:
		return "announce-not-awaited"
	case mutMayHoldIgnored:
		return "may-hold-ignored"
	case mutPromotionClearsMarks:
		return "promotion-clears-marks"
	case mutResyncNotOutdated:
		return "resync-not-outdated"
	case mutFlushNotAwaited:
		return "flush-not-awaited"
	case mutFlushSkipsLocal:
		return "flush-skips-local"
	case mutForceLocally:
		return "force-locally"
	case mutFullResync:
		return "full-resync"
	case mutApplyReordered:
		return "apply-reordered"
	case mutBadWriteWraps:
		return "bad-write-wraps"
	case mutResyncResumesFromNothing:
		return "resync-resumes-from-nothing"
	case mutHandoverKeepsLease:
		return "handover-keeps-lease"
	case mutFlushSkipsUnstreamedPeer:
		return "flush-skips-unstreamed-peer"
	case mutCacheNotTracked:
		return "cache-not-tracked"
	case mutAckBeforeCacheTracked:
		return "ack-before-cache-tracked"
	case mutRetakeRemembersOutdated:
		return "retake-remembers-outdated"
	case mutCacheLossOnlyAtWait:
		return "cache-loss-only-at-wait"
	case mutAcceptKeepsCache:
		return "accept-keeps-cache"
	case mutPullNotForwarded:
		return "pull-not-forwarded"
	case mutFailedWriteKept:
		return "failed-write-kept"
	case mutEvictionSkipsSums:
		return "eviction-skips-sums"
	case mutRebuildSkipsOldest:
		return "rebuild-skips-oldest"
	}
	return "mutation(?)"
}

// Config is one simulation run.
type Config struct {
	Seed  uint64
	Steps int
	// ThreeDataNodes: alpha, beta and gamma, no witness (else alpha,
	// beta and a witness).
	ThreeDataNodes bool

	// Interleave: a drive posted by a caller that does not read its
	// result (post) may leave a wait off its volume's loop, done at a
	// later step while the rest of the cluster goes on (resumeWaits).
	// TestSim runs its seeds so (-interleave), TestSimWaitsAtOnce
	// without.
	Interleave bool

	mutation mutation
	// noReconcile (tests only): a change of primary marks no activity
	// log (volstate.MarkActivityLog does nothing). That reconciliation
	// also repairs what some planted bugs break, so they are planted
	// without it.
	noReconcile bool
}

// Sim is the simulated cluster.
type Sim struct {
	cfg Config
	rng *rand.Rand
	// stateRng draws the applier's failed state writes alone
	// (stateWrite), apart from rng so that they change nothing else.
	stateRng *rand.Rand
	start    time.Time
	now      time.Time
	step     int

	// waitRng draws which waits of a drive are left off its loop, and
	// for how long (post), apart from rng as stateRng is.
	waitRng *rand.Rand
	// pullRng draws the runs a pull copies before its end (pullRuns),
	// apart from rng as stateRng is.
	pullRng *rand.Rand
	// offLoop are the waits left off the nodes' loops, in the order left
	// (resumeWaits).
	offLoop []offLoopWait

	nodes []*node // data nodes, then the witness
	data  []string
	links map[[2]string]*link
	raft  *raft

	nextSession uint64
	nextWrite   int64
	nextFlush   int64
	check       checker

	trace   []string
	failure *Failure

	// frameBuf holds the entries of the frame a secondary's applier
	// takes (wire.go), oneEntry the batch of one it applies (applied.go):
	// used again for each.
	frameBuf []replication.Entry
	oneEntry [1]replication.Entry
}

// New builds the cluster of cfg: alpha primary of a fresh volume that
// every data node holds (one generation), all connected.
func New(cfg Config) *Sim {
	s := &Sim{
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		stateRng: rand.New(rand.NewPCG(cfg.Seed^0x5851f42d4c957f2d, cfg.Seed)),
		waitRng:  rand.New(rand.NewPCG(cfg.Seed^0x2545f4914f6cdd1d, ^cfg.Seed)),
		pullRng:  rand.New(rand.NewPCG(cfg.Seed^0x4cf5ad432745937f, cfg.Seed+1)),
		start:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		links:    map[[2]string]*link{},
	}
	s.now = s.start
	s.data = []string{"alpha", "beta"}
	if cfg.ThreeDataNodes {
		s.data = append(s.data, "gamma")
	}
	gen := s.newGen()
	for _, name := range s.data {
		s.nodes = append(s.nodes, newNode(name, s.data, gen))
	}
	voters := slices.Clone(s.data)
	if !cfg.ThreeDataNodes {
		s.nodes = append(s.nodes, &node{name: witness, witness: true, up: true})
		voters = append(voters, witness)
	}
	for i, a := range s.nodes {
		for _, b := range s.nodes[i+1:] {
			s.links[[2]string{a.name, b.name}] = newLink()
		}
	}
	s.raft = newRaft(voters)
	s.check = newChecker()
	s.nodes[0].st.Fresh = true
	for _, n := range s.dataNodes() {
		_ = s.drive(n, volstate.Opened{})
		_ = s.drive(n, startedEvent)
	}
	return s
}

// Failure is an invariant that broke.
type Failure struct {
	Seed      uint64
	Step      int
	At        time.Duration
	Invariant Invariant
	Detail    string
	Trace     []string
	// also lists every invariant broken in that step.
	also []Invariant
}

// Broke reports whether inv broke in the failing step.
func (f *Failure) Broke(inv Invariant) bool { return slices.Contains(f.also, inv) }

func (f *Failure) Error() string {
	return fmt.Sprintf("seed %d step %d (t=%v): invariant %s broken: %s", f.Seed, f.Step, f.At, f.Invariant, f.Detail)
}

// Run runs the steps, checking the invariants after each; it returns the
// first failure, nil when every check held.
func (s *Sim) Run() *Failure {
	for s.step = 1; s.step <= s.cfg.Steps && s.failure == nil; s.step++ {
		s.now = s.now.Add(tick)
		s.faults()
		s.raft.tick(s)
		s.pumpAll()
		s.deliver()
		s.resumeWaits()
		for _, n := range s.dataNodes() {
			if n.running(s.now) {
				s.tickNode(n)
			}
		}
		s.client()
		s.operator()
		s.checkAll()
	}
	return s.failure
}

// Trace is every line the run traced.
func (s *Sim) Trace() []string { return s.trace }

func (s *Sim) tracef(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf("%4d %8s ", s.step, s.now.Sub(s.start))+fmt.Sprintf(format, args...))
}

func (s *Sim) fail(inv Invariant, format string, args ...any) {
	detail := fmt.Sprintf(format, args...)
	s.tracef("INVARIANT %s BROKEN: %s", inv, detail)
	if s.failure != nil {
		s.failure.Detail += "; " + inv.String() + ": " + detail
		s.failure.also = append(s.failure.also, inv)
		return
	}
	s.failure = &Failure{Seed: s.cfg.Seed, Step: s.step, At: s.now.Sub(s.start), Invariant: inv, Detail: detail}
	s.failure.also = []Invariant{inv}
}

// newGen is a generation from the seeded source (replication's own
// NewGeneration reads the system's randomness).
func (s *Sim) newGen() replication.Generation {
	var g replication.Generation
	for i := range g {
		g[i] = byte(s.rng.UintN(256))
	}
	return g
}

func (s *Sim) node(name string) *node {
	for _, n := range s.nodes {
		if n.name == name {
			return n
		}
	}
	panic("sim: no node " + name)
}

func (s *Sim) dataNodes() []*node { return s.nodes[:len(s.data)] }

func (s *Sim) link(a, b string) *link {
	if a > b {
		a, b = b, a
	}
	return s.links[[2]string{a, b}]
}

// reachable reports whether a and b are running and no partition cuts
// them apart.
func (s *Sim) reachable(a, b *node) bool {
	if !a.running(s.now) || !b.running(s.now) {
		return false
	}
	return a == b || !s.link(a.name, b.name).cut
}

func (s *Sim) chance(p float64) bool { return s.rng.Float64() < p }

func (s *Sim) duration(min, max time.Duration) time.Duration {
	return min + time.Duration(s.rng.Int64N(int64(max-min)+1))
}

// Summary says in one line what the run did (for the trace's end).
func (s *Sim) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d steps, %d writes acknowledged, %d flushes completed, %d known findings met", s.cfg.Seed, s.step-1, s.check.acks, s.check.flushes, len(s.check.findings))
	va, _ := s.raft.auth.Volume(volume)
	fmt.Fprintf(&b, ", authority primary %s epoch %d", va.Primary, va.Epoch)
	return b.String()
}
