package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/node/applier"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volloop"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Volume is one node's copy of one replicated volume. On the primary it is
// the NBD export: every write goes to the local disk and to each peer.
// On a secondary it applies the primary's replication stream.
type Volume struct {
	node *Node
	cfg  VolumeConfig
	name string
	// size is the volume's size here, published once on stable storage
	// (commit; an online resize grows it: resize.go). It is durable with
	// st.Durable, but not the state machine's.
	size atomic.Int64
	self string
	disk Disk
	mp   *multipath.Device // nil for a single-path disk
	// durable is the volume's metadata and what it keeps on stable
	// storage here (durable.go).
	durable durableState
	// scrub is the volume's scrub on this node (scrub.go).
	scrub scrubber
	log   *slog.Logger
	// clock is the node's (Node.clock).
	clock clock.Clock

	// iopath is the state of the IO path: the NBD reads, writes and
	// flushes and what waits for them (iopath.go).
	iopath ioPath
	// set holds the settings replctl adjust changes (protocol.go).
	set atomic.Pointer[settings]

	// stateMu serialises changes of the durable state (commit) with their
	// persistence; v.mu is not held while the state is written.
	stateMu mutex
	// resizeMu serialises online resizes of the volume (resize.go).
	resizeMu mutex

	mu mutex
	// st is the volume's state, the value its state machine (node/volstate)
	// steps: the durable state (epoch, primary, generations; it changes
	// only through commit), the serving and disk states, the cause of why
	// (whyText is its words), the split brains (st.Peers[name].SplitBrainRule),
	// the epochs heard of, a pending role change, the authority mode and the
	// lease. Only a step's install (installLocked, commitMirror) writes it
	// (TestOnlyTheStepsWriteTheVolumesState). st.Peers holds every other
	// node of the volume; their Repl, Session and Pulling are empty here:
	// those are the peers' views' (peer.snapshot, peer.pulling), which
	// modelLocked reads into the model a step takes, as it does
	// st.Stopping (v.stopping's). The role is st.Role(): Primary exactly
	// when st.Durable.Primary is this node.
	st volstate.State
	// whyText is the words of st.Why (reason.text): why the volume is not
	// doing its usual job.
	whyText string
	// pub is st and its why as the last install left them, published
	// (publishLocked) in the same critical section as each change of st,
	// BEFORE v.changed is notified: readers that only look (status, the
	// metrics, the events' words, the NBD export list, the claims) load
	// it without v.mu. Never nil once newVolume returned; never changed
	// once published.
	pub atomic.Pointer[published]
	// handedOver: this primary's term began with a handover (a
	// switchover); its hellos say so (replication.Hello.HandedOver). Set
	// BEFORE the promotion, so that no hello of the new term goes out
	// without it.
	handedOver atomic.Bool
	// settingDiffs holds, per peer, how the settings that must agree
	// differ from its (settingscheck.go); absent while they agree.
	settingDiffs map[string]string
	// settingsChecks counts the checks after an online change that ran
	// to the end (tests wait on it).
	settingsChecks atomic.Int64
	// peers is the volume's senders, one per other node (peerset.go).
	peers peerSet
	// dw is what the volume keeps of its disk's failures, for the
	// re-attach (detach.go).
	dw diskWatch
	// discard is set on a node that gives up its data after a split brain
	// (exactly while st.Discard).
	discard *discardInfo
	// stopping is closed at shutdown; bg tracks background goroutines.
	stopping chan struct{}
	bg       sync.WaitGroup
	// loop is the volume's loop (node/volloop), which runs every drive: started
	// at the end of newVolume, closed at shutdown (or closeVolumes).
	loop     *volloop.Loop
	incoming *applier.Stream
	// lastRefusal is the last reason this secondary refused a stream for
	// (logged once per reason).
	lastRefusal string
	// forcedOver is this node's last forced promotion over another
	// primary, for status where raft does not record it (in memory).
	forcedOver *transport.Failover

	// authority is the lease and the cluster's records of a volume in
	// authority mode (authority.go).
	authority authorityState
	// tasks: background tasks running, by kind.
	tasks map[string]bool

	// counters counts the volume's IO here, for status and /metrics
	// (metrics.go).
	counters ioCounters
	// changed is notified at each change of the volume's state or of a
	// peer's (its view, its lag, its resync paused or pulling): what a
	// waiter for a peer's or the volume's state waits on (waitUntil).
	changed changes
}

// newVolume opens volume cfg on node n; auth says the cluster decides its
// primary (authority mode).
func newVolume(n *Node, cfg VolumeConfig, disk Disk, md *metadata.MD, auth bool) (*Volume, error) {
	v := &Volume{
		node: n, cfg: cfg, name: cfg.Name, self: n.name, disk: disk,
		log:   n.log.With("volume", cfg.Name),
		clock: n.clock,
		peers: peerSet{byName: map[string]*peer{}},

		durable: durableState{
			md:           md,
			closeMD:      func() error { return nil },
			localMissing: replication.NewBitmap(int64(cfg.Size)),
			integ:        newIntegrity(md, cfg.VolumeUUID(), disk, cfg.BadBlocksMaxOrDefault()),
		},
		stopping: make(chan struct{}),
	}
	if cfg.Checksums == "off" {
		// checksums: off on metadata with a checksum area: the area
		// stays, unused (openMD recorded it; turning them on again
		// drops the sums and builds them).
		v.durable.integ.sums = nil
	}
	v.size.Store(int64(cfg.Size))
	v.durable.integ.size = &v.size
	v.set.Store(settingsOf(cfg))
	v.st = volstate.State{Self: v.self, SelfID: n.config().NodeID(v.self), Auth: auth, Peers: map[string]volstate.Peer{}}
	for name := range cfg.Disks {
		if name != v.self {
			v.st.Peers[name] = volstate.Peer{Repl: replication.StandAlone}
		}
	}
	st, ok, err := n.store.Volume(cfg.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok:
		// A new volume: the configured primary's data is the truth; every
		// other node needs a full sync.
		st = statefile.VolumeState{Epoch: 1, Primary: cfg.Primary, Size: v.size.Load()}
		if cfg.Primary == v.self {
			st.Generation = replication.NewGeneration()
		}
		v.st.Fresh = true
		v.node.event(v.name, "created", fmt.Sprintf("new volume, primary %s at epoch 1", cfg.Primary))
	case st.Size != v.size.Load():
		// The disk and metadata must be opened at the size this node
		// recorded (resolveSizes).
		return nil, fmt.Errorf("volume %s: opened at %d bytes, but this node recorded %d: open it at its recorded size", v.name, v.size.Load(), st.Size)
	}
	v.st.CrashedPrimary = md.CrashedPrimary()
	if md.CrashedPrimary() {
		// The node went down as primary: every extent in the activity log
		// may hold writes its peers never saw. Mark exactly those.
		marked, err := md.ApplyActivityLog()
		if err != nil {
			return nil, fmt.Errorf("volume %s: apply the activity log: %w", v.name, err)
		}
		v.node.event(v.name, "crashed-primary", fmt.Sprintf("went down as primary: the activity log's extents, %s, are marked out of sync for the peers", human.Bytes(marked)))
	}
	v.durable.replicaMarked.Store(md.CrashedReplica())
	if md.CrashedReplica() && !md.CrashedPrimary() && (st.BootID == "" || st.BootID != n.bootID) {
		// The node went down while applying a primary's writes, and the
		// machine booted since: writes it acknowledged from its page cache
		// may be gone, all within its activity log's extents. Marked
		// toward the primary, they are resynced from it at the next
		// connection (the secondary reports its marks). Without a reboot
		// (the process alone crashed) the page cache kept them.
		marked, err := md.ApplyActivityLog()
		if err != nil {
			return nil, fmt.Errorf("volume %s: apply the activity log: %w", v.name, err)
		}
		v.node.event(v.name, "crashed-secondary", fmt.Sprintf("went down while applying replicated writes: the activity log's extents, %s, are resynced from the primary", human.Bytes(marked)))
	}
	if md.CrashedPrimary() || md.CrashedReplica() {
		// The blocks of the activity log's extents may hold data newer or
		// older than their checksums: computed again from the data BEFORE
		// any read is verified, they are never taken for corruption.
		rec, err := md.RebuildActivityLogChecksums(disk)
		if err != nil {
			return nil, fmt.Errorf("volume %s: rebuild the checksums of the activity log: %w", v.name, err)
		}
		switch {
		case rec.ForgotAll:
			v.node.event(v.name, "checksums-rebuilt", "the activity log could not be read back: every block checksum was dropped; each block gets one again when it is next written")
		case rec.Blocks > 0:
			v.node.event(v.name, "checksums-rebuilt", fmt.Sprintf("the checksums of the activity log's %d extents (%s) were computed again from the data", rec.Extents, human.Bytes(rec.Blocks*metadata.MDBlockSize)))
		}
	}
	if rep := md.Report(); len(rep.CorruptBitmapPages) > 0 || rep.OtherSlot != "" {
		v.node.event(v.name, "metadata-repaired", fmt.Sprintf("metadata load: %d bitmap pages failed their checksum (their range is resynced in full); other superblock slot: %q", len(rep.CorruptBitmapPages), rep.OtherSlot))
	}
	d := loadDurable(st, md.Superblock())
	// Not clean from here on, durably, BEFORE anything else happens.
	if err := v.write(d, v.size.Load(), false, true); err != nil {
		return nil, err
	}
	v.st.Durable = d
	v.mu.Lock()
	v.publishLocked()
	v.mu.Unlock()
	// The rules take the loaded state (volstate.Opened): a disk that was
	// detached and missed writes comes back Inconsistent and Secondary,
	// whatever its role was, durably.
	// It is the first drive of the volume's loop.
	v.loop = volloop.Start()
	err = v.drive(volstate.Opened{}, driveOptions{notify: func(volstate.Action) {
		v.node.event(v.name, "stale-disk", "this disk missed writes while detached: it comes back Inconsistent and Secondary")
	}})
	if err != nil {
		v.loop.Close()
		return nil, err
	}
	return v, nil
}

// start begins serving the role the node woke up with. A node that was
// primary before this start serves no IO until a peer has compared
// generations and epochs with it: a primary of a newer epoch may have
// taken over while it was away (DRBD's wait-for-connection). An operator
// lifts that with replctl primary --force --yes. The primary indicator is
// on disk BEFORE the first write (volstate.Started).
func (v *Volume) start() {
	v.mu.Lock()
	copying, epoch := v.st.Durable.Gens.Current.IsZero(), v.st.Durable.Epoch
	v.mu.Unlock()
	waiting := func() reason {
		switch {
		case copying:
			// A primary that went down while copying newer data from its
			// peer serves again once the peer says which blocks it misses.
			return because(CauseWaitingForPeer, "waiting for a peer with the data this node was copying")
		case v.st.Auth:
			return because(CauseWaitingForPeer, "%s restarted as primary of %s and is waiting for the cluster: it serves no IO until raft confirms it is still the primary at epoch %d and grants it a lease", v.self, v.name, epoch)
		}
		return because(CauseWaitingForPeer, "%s restarted as primary of %s and is waiting for a peer: it serves no IO until a peer has compared generations and epochs with it (another node may have been promoted meanwhile); if every peer is gone for good, make it serve with replctl primary %s --node %s --force --yes", v.self, v.name, v.name, v.self)
	}
	err := v.drive(volstate.Started{}, driveOptions{
		texts: func(volstate.Cause) reason { return waiting() },
		notify: func(volstate.Action) {
			if v.st.Auth {
				v.log.Warn("restarted as primary: waiting for the cluster before serving IO")
			} else {
				v.log.Warn("restarted as primary: waiting for a peer before serving IO")
			}
			v.node.event(v.name, "waiting-for-peer", waiting().text)
		},
	})
	if err != nil {
		// The rules record why (volstate's persistFailed).
		v.log.Error("cannot set the primary indicator; not serving", "err", err)
	}
	// A scrub that ran when the node stopped goes on from its checkpoint.
	v.resumeScrubAtStart()
	v.startScrubSchedule()
}

// peerAnswered is called when a peer took this primary's stream (the
// handshake decided): no primary of a newer epoch holds that peer, so a
// primary waiting for a peer, or fenced, serves again (in authority mode
// raft, not a peer, says who is primary). pulling: the blocks this node
// misses are known, so writes need wait no longer either
// (volstate.PeerAnswered).
func (v *Volume) peerAnswered(peer string, pulling bool) {
	err := v.drive(volstate.PeerAnswered{Peer: peer, Pulling: pulling}, driveOptions{
		texts: func(volstate.Cause) reason {
			return because(CausePulling, "copying %s of newer data from %s", human.Bytes(v.durable.localMissing.Bytes()), peer)
		},
		notify: func(volstate.Action) {
			v.log.Info("a peer answered: serving IO", "peer", peer)
			v.node.event(v.name, "serving", fmt.Sprintf("%s took %s's stream: %s serves IO", peer, v.self, v.self))
		},
	})
	if err != nil {
		v.log.Error("a peer answered", "err", err)
	}
}

// startPeersLocked starts one replication sender for every other node that
// holds this volume.
func (v *Volume) startPeersLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	v.peers.cancel, v.peers.ctx = cancel, ctx
	for name := range v.cfg.Disks {
		if name == v.self {
			continue
		}
		p, ok := v.peers.byName[name]
		if !ok {
			p = newPeer(v, name)
			v.peers.byName[name] = p
		}
		p.start(ctx)
	}
	v.peers.rebuildListLocked()
}

// Size implements nbd.Export.
func (v *Volume) Size() int64 { return v.size.Load() }

// Description implements nbd.Describer.
func (v *Volume) Description() string {
	return fmt.Sprintf("replvol volume %s on %s (protocol %c)", v.name, v.self, v.settings().protocol)
}

// errShutdown is what a client sees of IO the volume does not serve here.
var errShutdown = syscall.ESHUTDOWN

// enter admits one IO on the primary; every admitted IO must call
// v.iopath.io.Done. In authority mode it waits (IO freezes) while the
// primary's lease is not valid.
func (v *Volume) enter(ctx context.Context) error {
	for {
		v.mu.Lock()
		switch {
		case v.roleLocked() != replication.Primary:
			v.mu.Unlock()
			return fmt.Errorf("%s is not primary on %s any more: %w (%w)", v.name, v.self, ErrNotPrimary, errShutdown)
		case !v.st.Serving.IsOpen():
			why := v.whyText
			if why == "" {
				why = "switchover or shutdown in progress"
			}
			v.mu.Unlock()
			return fmt.Errorf("%s on %s: %w: %s (%w)", v.name, v.self, ErrNotServing, why, errShutdown)
		case v.leaseHeldLocked():
			v.iopath.io.Add(1)
			v.mu.Unlock()
			return nil
		}
		v.mu.Unlock()
		if err := v.holdLease(ctx); err != nil {
			return err
		}
	}
}

// streamingPeers returns the volume's peers; the slice must not be changed.
func (v *Volume) streamingPeers() []*peer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.peers.list
}

// ReadAt implements nbd.Export: reads are served from the local disk.
func (v *Volume) ReadAt(ctx context.Context, p []byte, off int64) error {
	defer v.observe(opRead, v.clock.Now())
	if err := v.enter(ctx); err != nil {
		return err
	}
	defer v.iopath.io.Done()
	v.counters.reads.Add(1)
	v.counters.readBytes.Add(uint64(len(p)))
	// A read never sees a write that has not completed: it could still
	// fail and be missing on the peer a failover promotes.
	hold, err := v.iopath.locks.LockShared(ctx, off, int64(len(p)))
	if err != nil {
		return err
	}
	defer hold.Release()
	// A block on the bad-block list is never read from this disk.
	if v.needsPeer(off, int64(len(p))) || v.durable.integ.listedIn(off, int64(len(p))) {
		if err := v.readFromPeer(ctx, p, off); err != nil {
			return err
		}
		return v.holdLease(ctx)
	}
	if pr := v.readTarget(off, int64(len(p))); pr != nil {
		if err := pr.readRemote(ctx, p, off); err == nil {
			return v.holdLease(ctx)
		}
		// The peer could not answer: the local disk can.
	}
	if err := v.readLocal(p, off); err != nil {
		// The blocks the disk cannot read are repaired from a peer
		// BEFORE the disk is taken for failed.
		if handled, rerr := v.repairUnreadable(ctx, p, off); handled {
			if rerr != nil {
				return rerr
			}
			return v.holdLease(ctx)
		}
		v.log.Error("local read failed", "off", off, "len", len(p), "err", err)
		if v.detach(diskFailure{op: diskRead, off: off, length: int64(len(p)), err: err}, 0, 0) {
			if err := v.readFromPeer(ctx, p, off); err != nil {
				return err
			}
			return v.holdLease(ctx)
		}
		return fmt.Errorf("local read: %w", syscall.EIO)
	}
	if err := v.verifyRead(ctx, p, off); err != nil {
		return err
	}
	// A read is answered only while this node still holds the volume: a
	// lease that ran out meanwhile may have let another primary write.
	return v.holdLease(ctx)
}

func (v *Volume) tracking(peer string) bool {
	return v.state().st.Durable.Gens.Tracking(peer)
}

func (v *Volume) epoch() uint64 { return v.state().st.Durable.Epoch }

// startTracking is called BEFORE a write completes without reaching peer
// p. The first time in a disconnected period it starts p's bitmap from the
// generation p holds and moves the primary to a new generation, durably,
// so that p can never again look as up to date as the primary. A peer
// tracked already moves it on too when it may hold the current generation
// (peer.mayHold: a sync-done whose ack never came), its bitmap kept. When
// that cannot be written, the volume stops serving IO and the error is
// returned: the write must fail.
func (v *Volume) startTracking(p *peer) error { return v.track(p, false) }

// track is startTracking; behind says the peer stays connected but is
// Behind (pull-ahead): it misses writes all the same.
func (v *Volume) track(p *peer, behind bool) error {
	// In authority mode raft records the peer Outdated first: it is never
	// promoted by itself once it misses a write.
	if err := v.ensureOutdated(p.name); err != nil {
		return err
	}
	announced, err := v.trackLocked(p, behind)
	// The peers still in sync hold the new generation, durably, BEFORE
	// the write that missed p completes: were this primary to crash right
	// after, a peer that took the write but not the generation would look
	// as up to date as p, which lacks it, and a resync between them would
	// copy nothing. (Once per disconnected period: the next writes find p
	// tracked, and not holding the current generation.)
	for _, pd := range announced {
		<-pd.Done()
	}
	return err
}

// trackLocked is track's part with the volume's rules: the new
// generation, and its announcement to the peers still in sync (the
// pendings to wait for). The write path's fast way out is taken under
// v.stateMu, which every step holds: a write that finds the peer tracked
// already posts nothing. The others drive WriteMissed on the volume's
// loop, whose rule decides again as the step is taken (a write that
// missed the same peer just before may have moved the generation on).
func (v *Volume) trackLocked(p *peer, behind bool) ([]*session.Pending, error) {
	v.stateMu.Lock()
	v.mu.Lock()
	current := v.st.Durable.Gens.Current
	mayHold := p.mayHoldNow()
	if p.mayHoldUnknown {
		mayHold = current
	}
	moves := volstate.MissMovesGeneration(v.st.Durable.Gens, p.name, mayHold)
	v.mu.Unlock()
	held := p.snapshot().held
	v.stateMu.Unlock()
	if !moves {
		// The peer is tracked already (and cannot hold the current
		// generation), or this node copies newer data from it.
		return nil, nil
	}
	// Without the new generation on disk a restart could take the peer
	// for up to date: when it cannot be written, IO stops rather than
	// risk it (volstate.WriteMissed).
	next := replication.NewGeneration()
	var from replication.Generation
	var announced []*session.Pending
	err := v.drive(volstate.WriteMissed{Peer: p.name, Held: held, Next: next, MayHold: mayHold, Behind: behind}, driveOptions{
		install: func(c volstate.Change) {
			if c.Next.Durable.Gens.Current == c.Old.Durable.Gens.Current {
				return
			}
			from = c.Next.Durable.Gens.Bitmaps[p.name]
			// The peer holds none of the generations from here on.
			p.mayHoldUnknown = false
			// Peers still in sync get the new generation in their
			// stream, in the same step: a write that misses p after it
			// finds p tracked and goes on, and the streams carry the
			// generation ahead of its data. (Enqueue waits only while a
			// session's inbox is full; a session's loop takes its
			// messages without the volume's locks.)
			for _, q := range v.peers.list {
				if q == p {
					continue
				}
				if pd := q.announceGenerationLocked(next); pd != nil {
					announced = append(announced, pd)
				}
			}
		},
		notify: func(volstate.Action) {
			v.log.Info("peer out of sync: new generation", "peer", p.name, "bitmap_generation", from, "generation", next)
			v.node.event(v.name, "new-generation", fmt.Sprintf("%s is not connected: writes are tracked in its bitmap from %s; current generation %s", p.name, from, next))
		},
	})
	if err != nil {
		v.log.Error("cannot persist a new generation; stopping IO", "peer", p.name, "err", err)
		v.node.event(v.name, "state-write-failed", v.state().why.text)
		return nil, fmt.Errorf("%w: %v", ErrStateWrite, err)
	}
	return announced, nil
}

// uuidsLocked returns this node's generation set toward peer, as the
// connection handshake sends it. Callers hold v.mu.
func (v *Volume) uuidsLocked(peer string) replication.UUIDSet {
	u := v.st.Durable.Gens.Toward(peer)
	if u.Current.IsZero() {
		u.Current = v.st.Durable.SyncGen
	}
	u.CrashedPrimary, u.NodeID = v.st.CrashedPrimary, v.node.config().NodeID(v.self)
	return u
}

func (v *Volume) currentGeneration() replication.Generation {
	return v.state().st.Durable.Gens.Current
}

// shutdown stops the volume for a node shutdown (or its removal). A
// primary drains its IO and flushes; the state is marked clean only when
// that all worked, and shutdown reports whether it was.
func (v *Volume) shutdown() bool {
	// The volume's rules stop its IO and its lease renewals (Stop).
	var wasOpen bool
	err := v.drive(volstate.Stop{}, driveOptions{install: func(c volstate.Change) {
		wasOpen = c.Old.Serving.IsOpen()
	}})
	if err != nil {
		// Only a shutdown closes the loop, and only once.
		v.log.Error("stop the volume's IO", "err", err)
	}
	v.iopath.io.Wait()
	clean := true
	if wasOpen {
		if err := v.flushAll(false); err != nil {
			clean = false
		}
	} else if err := v.disk.Sync(); err != nil {
		clean = false
	}
	// Under v.mu: no background task starts once it is closed (background).
	v.mu.Lock()
	close(v.stopping)
	v.mu.Unlock()
	// The stream from the primary ends BEFORE the loop closes: its
	// applier drives the volume (a resync's start and end), and a drive
	// refused because the volume closes would read as a failed disk. No
	// new stream is taken once v.stopping is closed (serveStream).
	v.detachIncoming()
	// The drives under way end (they may start background tasks); a
	// drive posted from now on is refused (volloop.ErrClosed), so a sender
	// or a stream that posts one ends without waiting for it.
	v.loop.Close()
	v.bg.Wait()
	v.stopPeers()
	v.detachIncoming()
	v.stateMu.Lock()
	v.mu.Lock()
	d := v.st.Durable.Clone()
	v.mu.Unlock()
	if err := v.write(d, v.size.Load(), clean, true); err != nil {
		v.log.Error("write state at shutdown", "err", err)
		clean = false
	}
	v.stateMu.Unlock()
	// Bitmaps out, THEN the primary indicator off: a clean stop leaves no
	// activity log to apply. The replica indicator goes off once the
	// writes applied as a secondary are synced (the stream from the
	// primary stopped above).
	if err := v.durable.md.Close(); err != nil {
		v.log.Error("flush bitmaps at shutdown", "err", err)
	} else if clean {
		if err := v.durable.md.SetPrimary(false); err != nil {
			v.log.Error("clear the primary indicator", "err", err)
		}
		if v.durable.replicaMarked.Load() {
			if err := v.disk.Sync(); err != nil {
				v.log.Error("sync at shutdown; the replica indicator stays set", "err", err)
			} else if err := v.durable.md.SetReplica(false); err != nil {
				v.log.Error("clear the replica indicator", "err", err)
			}
		}
	}
	v.durable.closeMD()
	v.disk.Close()
	return clean
}

// status reports this node's view of the volume.
func (v *Volume) status() transport.LocalVolume {
	// The published state, loaded under v.mu (which status needs for the
	// peers and the incoming stream): the role agrees with the peers and
	// the stream it lists.
	v.mu.Lock()
	s := v.state()
	lv := transport.LocalVolume{
		Name: v.name, Size: v.size.Load(), Protocol: string(v.settings().protocol), ResyncRate: v.settings().resyncRate,
		OnCongestion: string(v.settings().congestion.Policy),
		Role:         string(s.role()), Disk: string(s.st.Disk), Epoch: s.st.Durable.Epoch, Primary: s.st.Durable.Primary,
		Generation: s.st.Durable.Gens.Current.String(), Reason: s.why.text, ReasonCode: string(s.why.cause),
		Serving:  s.serving(),
		Metadata: v.durable.md.Placement().String(), UsableBytes: v.durable.md.UsableSize(),
		AfterSB: string(v.agreedSettings().AfterSB),
	}
	if f := v.forcedOver; f != nil {
		c := *f
		lv.LastFailover = &c
	}
	for peer, p := range s.st.Peers {
		if rule := p.SplitBrainRule; rule != "" && (lv.SplitBrainRule == "" || peer < lv.SplitBrainPeer) {
			lv.SplitBrainPeer, lv.SplitBrainRule = peer, rule
		}
	}
	peers := make([]*peer, 0, len(v.peers.byName))
	for _, p := range v.peers.byName {
		peers = append(peers, p)
	}
	role, in, down := s.role(), v.incoming, s.st.AdminDown
	v.mu.Unlock()
	v.counters.report(&lv)
	lv.Paths = v.pathStatus()
	lv.LocalMissingBytes = v.durable.localMissing.Bytes()
	al := v.durable.md.ActivityLog()
	as := al.Stats()
	lv.Integrity = v.durable.integ.status()
	lv.Integrity.Scrub = v.scrubStatus()
	lv.Integrity.Build = v.buildStatus()
	lv.ActivityLog = &transport.ActivityLogStatus{Extents: al.Extents(), Hits: as.Hits, Misses: as.Misses, Transactions: as.Transactions, Evictions: as.Evictions}
	if v.mp != nil {
		lv.PathPolicy = v.mp.Policy().String()
	}
	if role == replication.Primary {
		if down && lv.Reason == "" {
			// A promotion clears the reason, not the operator's
			// disconnect: this primary replicates to nobody until a
			// connect.
			lv.Reason, lv.ReasonCode = "disconnected by operator", string(CauseAdminDown)
		}
		worst := replication.Connected
		for _, p := range peers {
			ps := p.status()
			lv.Peers = append(lv.Peers, ps)
			if rank(replication.ReplState(ps.Replication)) > rank(worst) {
				worst = replication.ReplState(ps.Replication)
			}
		}
		lv.Replication = string(worst)
		return lv
	}
	switch {
	case down:
		lv.Replication = string(replication.StandAlone)
		if lv.Reason == "" {
			lv.Reason, lv.ReasonCode = "disconnected by operator", string(CauseAdminDown)
		}
	case in != nil:
		lv.Replication = string(in.State())
	default:
		lv.Replication = string(replication.Connecting)
	}
	return lv
}

func rank(s replication.ReplState) int {
	switch s {
	case replication.Connected:
		return 0
	case replication.SyncSource, replication.SyncTarget, replication.PausedSyncS, replication.PausedSyncT, replication.VerifyS, replication.VerifyT:
		return 1
	case replication.Connecting:
		return 2
	default:
		return 3
	}
}
