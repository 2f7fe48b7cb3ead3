package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/multipath"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Errors of the volume's IO path.
var (
	// ErrNotPrimary: the volume is not served here (any more).
	ErrNotPrimary = errors.New("not primary")
)

// Volume is one node's copy of one replicated volume. On the primary it is
// the NBD export: every write goes to the local disk and to each peer.
// On a secondary it applies the primary's replication stream.
type Volume struct {
	node *Node
	cfg  VolumeConfig
	name string
	size int64
	self string
	disk Disk
	mp   *multipath.Device // nil for a single-path disk
	// md is the on-disk metadata: the peers' bitmaps and the activity log.
	md      *metadata.MD
	closeMD func() error
	log     *slog.Logger

	// locks orders overlapping writes and resync reads.
	locks replication.RangeLocks

	mu      sync.Mutex
	role    replication.Role
	epoch   uint64
	primary string // who holds epoch, as far as this node knows
	gen     replication.Generation
	// syncGen is, while gen is zero because a resync into this disk is
	// under way, the generation the SyncSource's bitmap for this node
	// starts from: reported as this node's current generation, it lets an
	// interrupted resync resume from that bitmap instead of starting over.
	syncGen replication.Generation
	// crashedPrimary: the primary indicator was set when the metadata was
	// attached (the node went down as primary); cleared once a peer is in
	// sync again.
	crashedPrimary bool
	// retiredGen is a bitmap generation retired since the last persist:
	// it goes into the superblock's history (DRBD keeps it there too).
	retiredGen replication.Generation
	// adoptHistory, when set, replaces the superblock's history at the
	// next persist: a SyncTarget takes its source's lineage (DRBD does).
	adoptHistory []replication.Generation
	// bitmapGens: per peer, the generation its bitmap starts from (absent
	// while the peer is in sync).
	bitmapGens map[string]replication.Generation
	diskState  replication.DiskState
	ioOpen     bool // primary serving IO
	fenced     bool // IO stopped: a primary of a newer epoch exists
	io         sync.WaitGroup
	peers      map[string]*peer
	// peerList is peers as a slice, replaced (never changed in place)
	// whenever peers changes: the IO path reads it without copying.
	peerList  []*peer
	peersCtx  context.CancelFunc
	adminDown bool // operator disconnected this node
	// detached: the local disk failed and is out of service; the primary
	// reads and writes through a peer. localStale: this disk misses writes
	// (persisted). localMissing marks the blocks it misses.
	detached     bool
	localStale   bool
	localMissing *replication.Bitmap
	// discard is set on a node that gives up its data after a split brain.
	discard *discardInfo
	// primarySince is when this node last became primary (unix ns).
	primarySince int64
	// peersCtxValue is the context the running senders were started with.
	peersCtxValue context.Context
	// stopping is closed at shutdown; bg tracks background goroutines.
	stopping chan struct{}
	bg       sync.WaitGroup
	incoming *incoming
	reason   string // why the link to the primary is down

	resynced atomic.Int64
	// lastWrite is when the last application write started (unix ns): the
	// resync controller yields while the volume is busy.
	lastWrite  atomic.Int64
	reads      atomic.Uint64
	readBytes  atomic.Uint64
	writes     atomic.Uint64
	writeBytes atomic.Uint64
	flushes    atomic.Uint64

	// genMu serialises generation changes with their persistence.
	genMu sync.Mutex
}

func newVolume(n *Node, cfg VolumeConfig, disk Disk, md *metadata.MD) (*Volume, error) {
	v := &Volume{
		node: n, cfg: cfg, name: cfg.Name, size: int64(cfg.Size), self: n.name, disk: disk, md: md,
		closeMD:    func() error { return nil },
		bitmapGens: map[string]replication.Generation{},
		log:        n.log.With("volume", cfg.Name),
		peers:      map[string]*peer{},

		localMissing: replication.NewBitmap(int64(cfg.Size)),
		stopping:     make(chan struct{}),
	}
	st, ok, err := n.store.Volume(cfg.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok:
		// A new volume: the configured primary's data is the truth; every
		// other node needs a full sync.
		st = metadata.VolumeState{Epoch: 1, Primary: cfg.Primary, Size: v.size}
		if cfg.Primary == v.self {
			st.Generation = replication.NewGeneration()
		}
		v.node.event(v.name, "created", fmt.Sprintf("new volume, primary %s at epoch 1", cfg.Primary))
	case st.Size != v.size:
		return nil, fmt.Errorf("volume %s: the config says size %d but this node's state says %d; resizing is not supported: restore the old size", v.name, v.size, st.Size)
	}
	v.crashedPrimary = md.CrashedPrimary()
	if md.CrashedPrimary() {
		// The node went down as primary: every extent in the activity log
		// may hold writes its peers never saw. Mark exactly those.
		marked, err := md.ApplyActivityLog()
		if err != nil {
			return nil, fmt.Errorf("volume %s: apply the activity log: %w", v.name, err)
		}
		v.node.event(v.name, "crashed-primary", fmt.Sprintf("went down as primary: the activity log's extents, %d bytes, are marked out of sync for the peers", marked))
	}
	if rep := md.Report(); len(rep.CorruptBitmapPages) > 0 || rep.OtherSlot != "" {
		v.node.event(v.name, "metadata-repaired", fmt.Sprintf("metadata load: %d bitmap pages failed their checksum (their range is resynced in full); other superblock slot: %q", len(rep.CorruptBitmapPages), rep.OtherSlot))
	}
	if st.LocalStale {
		// This disk was detached and missed writes: whatever its role was,
		// it holds no consistent data until a full resync.
		st.Generation = replication.Generation{}
		if st.Primary == v.self {
			st.Primary = ""
		}
		v.node.event(v.name, "stale-disk", "this disk missed writes while detached: it comes back Inconsistent and Secondary")
	}
	st.Clean = false
	if err := n.store.PutVolume(v.name, st); err != nil {
		return nil, err
	}
	v.epoch, v.primary, v.gen, v.localStale = st.Epoch, st.Primary, st.Generation, st.LocalStale
	if v.gen.IsZero() {
		v.syncGen = st.SyncGeneration
	}
	v.primarySince = st.PrimarySince
	for peer, g := range st.PeerBitmaps {
		v.bitmapGens[peer] = g
	}
	v.role = replication.Secondary
	if st.Primary == v.self {
		v.role = replication.Primary
	}
	v.diskState = v.idleDiskState()
	return v, nil
}

// idleDiskState is the disk state of a node that is not in a stream.
func (v *Volume) idleDiskState() replication.DiskState {
	switch {
	case v.gen.IsZero():
		return replication.Inconsistent
	case v.role == replication.Primary:
		return replication.UpToDate
	default:
		return replication.Consistent
	}
}

// persistLocked writes the volume's state durably: the node's store, and
// the generations mirrored into the metadata superblock. Callers hold v.mu.
func (v *Volume) persistLocked(clean bool) error {
	gens := map[string]replication.Generation{}
	for peer, g := range v.bitmapGens {
		gens[peer] = g
	}
	err := v.node.store.PutVolume(v.name, metadata.VolumeState{
		Epoch: v.epoch, Primary: v.primary, Generation: v.gen, Clean: clean, Size: v.size, LocalStale: v.localStale,
		PeerBitmaps: gens, PrimarySince: v.primarySince, SyncGeneration: v.syncGen,
	})
	if err != nil {
		return err
	}
	retired, adopt := v.retiredGen, v.adoptHistory
	v.retiredGen, v.adoptHistory = replication.Generation{}, nil
	return v.md.UpdateSuperblock(func(sb *metadata.Superblock) {
		switch {
		case adopt != nil:
			sb.History = [metadata.HistorySlots]replication.Generation{}
			copy(sb.History[:], adopt)
		case sb.Current != v.gen && !sb.Current.IsZero() && !v.gen.IsZero():
			// A new generation descends from the old one. A disk becoming
			// Inconsistent records nothing: what it will hold descends
			// from its source, whose history it adopts at the end.
			copy(sb.History[1:], sb.History[:])
			sb.History[0] = sb.Current
		}
		if !retired.IsZero() && sb.History[0] != retired {
			copy(sb.History[1:], sb.History[:])
			sb.History[0] = retired
		}
		sb.Current = v.gen
		for i := range sb.Peers {
			sb.Peers[i].Bitmap = gens[v.node.cfg.nodeName(sb.Peers[i].NodeID)]
		}
		if v.gen.IsZero() {
			sb.Flags &^= metadata.FlagConsistent | metadata.FlagUpToDate
		} else {
			sb.Flags |= metadata.FlagConsistent
		}
	})
}

// start begins serving the role the node woke up with.
func (v *Volume) start() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.role == replication.Primary {
		// The primary indicator is on disk BEFORE the first write.
		if err := v.md.SetPrimary(true); err != nil {
			v.log.Error("cannot set the primary indicator; not serving", "err", err)
			v.reason = "metadata write failed: " + err.Error()
			return
		}
		v.startPeersLocked()
		// A primary that went down while copying newer data from its peer
		// serves again once the peer says which blocks it misses.
		v.ioOpen = !v.gen.IsZero()
		if !v.ioOpen {
			v.reason = "waiting for a peer with the data this node was copying"
		}
	}
}

// startPeersLocked starts one replication sender for every other node that
// holds this volume.
func (v *Volume) startPeersLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	v.peersCtx, v.peersCtxValue = cancel, ctx
	for name := range v.cfg.Disks {
		if name == v.self {
			continue
		}
		p, ok := v.peers[name]
		if !ok {
			p = newPeer(v, name)
			v.peers[name] = p
		}
		p.start(ctx)
	}
	v.rebuildPeerListLocked()
}

// rebuildPeerListLocked publishes peers as a new slice; callers hold v.mu.
func (v *Volume) rebuildPeerListLocked() {
	list := make([]*peer, 0, len(v.peers))
	for _, p := range v.peers {
		list = append(list, p)
	}
	v.peerList = list
}

// Size implements nbd.Export.
func (v *Volume) Size() int64 { return v.size }

// Description implements nbd.Describer.
func (v *Volume) Description() string {
	return fmt.Sprintf("replvol volume %s on %s (protocol %s)", v.name, v.self, v.cfg.ProtocolOrDefault())
}

// enter admits one IO on the primary; every admitted IO must call v.io.Done.
func (v *Volume) enter() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.role != replication.Primary || !v.ioOpen {
		return fmt.Errorf("%s is not primary on %s any more: %w (%w)", v.name, v.self, ErrNotPrimary, syscall.ESHUTDOWN)
	}
	v.io.Add(1)
	return nil
}

// streamingPeers returns the volume's peers; the slice must not be changed.
func (v *Volume) streamingPeers() []*peer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.peerList
}

// ReadAt implements nbd.Export: reads are served from the local disk.
func (v *Volume) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := v.enter(); err != nil {
		return err
	}
	defer v.io.Done()
	v.reads.Add(1)
	v.readBytes.Add(uint64(len(p)))
	if v.needsPeer(off, int64(len(p))) {
		return v.readFromPeer(ctx, p, off)
	}
	_, err := v.disk.ReadAt(p, off)
	if err != nil {
		v.log.Error("local read failed", "off", off, "len", len(p), "err", err)
		if v.detach(err) {
			return v.readFromPeer(ctx, p, off)
		}
		return fmt.Errorf("local read: %w", syscall.EIO)
	}
	return nil
}

// WriteAt implements nbd.Export. It returns after the local disk AND every
// connected peer wrote p (protocol C); a peer that is not connected has the
// blocks marked out of sync instead, BEFORE this returns.
func (v *Volume) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	var flags uint8
	if fua {
		flags = replication.EntryFUA
	}
	e := replication.Entry{Op: replication.OpWrite, Flags: flags, Off: off, Length: int64(len(p)), Data: p}
	v.writes.Add(1)
	v.writeBytes.Add(uint64(len(p)))
	return v.replicate(ctx, e, func() error {
		if fua {
			return writeSync(v.disk, p, off)
		}
		_, err := v.disk.WriteAt(p, off)
		return err
	})
}

// WriteZeroes implements nbd.Export.
func (v *Volume) WriteZeroes(ctx context.Context, off, length int64, fua bool) error {
	e := replication.Entry{Op: replication.OpZero, Off: off, Length: length}
	if fua {
		e.Flags = replication.EntryFUA
	}
	return v.replicate(ctx, e, func() error {
		if err := v.disk.Zero(off, length); err != nil {
			return err
		}
		if fua {
			return v.disk.Sync()
		}
		return nil
	})
}

// Trim implements nbd.Export. Trimmed blocks read back as zeroes on every
// replica, so the replicas stay identical.
func (v *Volume) Trim(ctx context.Context, off, length int64) error {
	e := replication.Entry{Op: replication.OpTrim, Off: off, Length: length}
	return v.replicate(ctx, e, func() error { return v.disk.Zero(off, length) })
}

// replicate runs one write-type request: ordered behind earlier overlapping
// requests, sent to the peers, applied locally, complete when all are.
func (v *Volume) replicate(ctx context.Context, e replication.Entry, local func() error) error {
	if err := v.enter(); err != nil {
		return err
	}
	defer v.io.Done()
	v.lastWrite.Store(time.Now().UnixNano())
	release, err := v.locks.Lock(ctx, e.Off, e.Length)
	if err != nil {
		return err
	}
	defer release()
	// The extent is in the activity log, durably, BEFORE the data is
	// written anywhere: after a crash, only the log's extents can differ.
	// A detached disk gets no data, so it needs no log entry; a log that
	// cannot be written means the disk failed: detach it.
	al := v.md.ActivityLog()
	alFailed := false
	if !v.isDetached() {
		if err := al.Admit(ctx, e.Off, e.Length); err != nil {
			v.log.Error("activity log", "err", err)
			if !v.detach(err) {
				return fmt.Errorf("activity log: %w", syscall.EIO)
			}
			alFailed = true
		} else {
			defer al.Done(e.Off, e.Length)
		}
	}
	var waits []*pending
	for _, p := range v.streamingPeers() {
		if w := p.submit(e); w != nil {
			waits = append(waits, w)
		}
	}
	// A detached disk is skipped; what it misses is marked BEFORE the
	// write completes.
	v.mu.Lock()
	skipped := v.detached || alFailed
	if skipped {
		v.localMissing.SetRange(e.Off, e.Length)
	}
	// While this primary copies newer data from its peer, only the peer's
	// copy is whole: a write the peer did not take fails.
	pulling := v.gen.IsZero()
	v.mu.Unlock()
	var lerr error
	if !skipped {
		if lerr = local(); lerr != nil {
			v.log.Error("local write failed", "op", e.Op, "off", e.Off, "len", e.Length, "err", lerr)
			if skipped = v.detach(lerr); skipped {
				v.localMissing.SetRange(e.Off, e.Length)
			}
		}
	}
	acked := false
	for _, w := range waits {
		<-w.done
		acked = acked || w.acked
	}
	switch {
	case skipped && !acked:
		return fmt.Errorf("write at %d: %w (%w)", e.Off, errNoCopy, syscall.EIO)
	case pulling && !acked:
		return fmt.Errorf("write at %d: %s is copying newer data from its peer and the peer did not take the write; it completes again once the peer is back (%w)", e.Off, v.self, syscall.EIO)
	case !skipped && lerr != nil:
		return fmt.Errorf("local write: %w", syscall.EIO)
	}
	return nil
}

// Flush implements nbd.Export: every write completed before it is durable
// on the local disk AND on every connected peer when it returns.
func (v *Volume) Flush(ctx context.Context) error {
	if err := v.enter(); err != nil {
		return err
	}
	defer v.io.Done()
	v.flushes.Add(1)
	return v.flushAll()
}

func (v *Volume) flushAll() error {
	var waits []*pending
	for _, p := range v.streamingPeers() {
		if w := p.submit(replication.Entry{Op: replication.OpFlush}); w != nil {
			waits = append(waits, w)
		}
	}
	var err error
	if !v.isDetached() {
		if err = v.disk.Sync(); err != nil {
			v.log.Error("local flush failed", "err", err)
			if v.detach(err) {
				err = nil
			}
		}
	}
	acked := false
	for _, w := range waits {
		<-w.done
		acked = acked || w.acked
	}
	if err != nil {
		return fmt.Errorf("local flush: %w", syscall.EIO)
	}
	if v.isDetached() && !acked {
		return fmt.Errorf("flush: %w (%w)", errNoCopy, syscall.EIO)
	}
	return nil
}

// bitmapGen returns the generation peer's bitmap starts from; ok is false
// while the peer is in sync (no bitmap generation).
func (v *Volume) bitmapGen(peer string) (g replication.Generation, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	g, ok = v.bitmapGens[peer]
	return g, ok
}

// ensureRotated is called BEFORE a write is completed without reaching
// peer p. The first time in a disconnected period it starts p's bitmap from
// the current generation and moves the primary to a new generation,
// durably, so that p can never again look as up to date as the primary.
func (v *Volume) ensureRotated(p *peer) {
	v.genMu.Lock()
	defer v.genMu.Unlock()
	v.mu.Lock()
	if _, ok := v.bitmapGens[p.name]; ok || v.gen.IsZero() {
		// Already tracked, or this node is copying newer data from the
		// peer: it has no generation of its own to move on from (and its
		// writes complete only on both).
		v.mu.Unlock()
		return
	}
	old := v.gen
	v.gen = replication.NewGeneration()
	v.bitmapGens[p.name] = old
	err := v.persistLocked(false)
	if err != nil {
		// Without the new generation on disk a restart could take the peer
		// for up to date: stop accepting writes rather than risk it.
		v.log.Error("cannot persist new generation; stopping IO", "err", err)
		v.gen = old
		delete(v.bitmapGens, p.name)
		v.ioOpen = false
		v.mu.Unlock()
		return
	}
	gen := v.gen
	v.mu.Unlock()
	v.log.Info("peer out of sync: new generation", "peer", p.name, "bitmap_generation", old, "generation", gen)
	v.node.event(v.name, "new-generation", fmt.Sprintf("%s is not connected: writes are tracked in its bitmap from %s; current generation %s", p.name, old, gen))
	// Peers still in sync get the new generation in their stream.
	for _, q := range v.streamingPeers() {
		if q != p {
			q.announceGeneration(gen)
		}
	}
}

// uuidsLocked returns this node's generation set toward peer, as the
// connection handshake sends it. Callers hold v.mu.
func (v *Volume) uuidsLocked(peer string) replication.UUIDSet {
	cur := v.gen
	if cur.IsZero() {
		cur = v.syncGen
	}
	sb := v.md.Superblock()
	return replication.UUIDSet{
		Current: cur, Bitmap: v.bitmapGens[peer], History: append([]replication.Generation(nil), sb.History[:]...),
		CrashedPrimary: v.crashedPrimary, NodeID: v.node.cfg.NodeID(v.self),
	}
}

func (v *Volume) currentGeneration() replication.Generation {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gen
}

// shutdown stops the volume for a node shutdown. A primary drains its IO
// and flushes; the state is marked clean only when that all worked.
func (v *Volume) shutdown() {
	v.mu.Lock()
	wasOpen := v.ioOpen
	v.ioOpen = false
	v.mu.Unlock()
	v.io.Wait()
	clean := true
	if wasOpen {
		if err := v.flushAll(); err != nil {
			clean = false
		}
	} else if err := v.disk.Sync(); err != nil {
		clean = false
	}
	close(v.stopping)
	v.bg.Wait()
	v.stopPeers()
	v.detachIncoming()
	v.genMu.Lock()
	v.mu.Lock()
	if err := v.persistLocked(clean); err != nil {
		v.log.Error("persist state at shutdown", "err", err)
	}
	v.mu.Unlock()
	v.genMu.Unlock()
	// Bitmaps out, THEN the primary indicator off: a clean stop leaves no
	// activity log to apply.
	if err := v.md.Close(); err != nil {
		v.log.Error("flush bitmaps at shutdown", "err", err)
	} else if clean {
		if err := v.md.SetPrimary(false); err != nil {
			v.log.Error("clear the primary indicator", "err", err)
		}
	}
	v.closeMD()
	v.disk.Close()
}

// status reports this node's view of the volume.
func (v *Volume) status() transport.LocalVolume {
	v.mu.Lock()
	lv := transport.LocalVolume{
		Name: v.name, Size: v.size, Protocol: v.cfg.ProtocolOrDefault(),
		Role: string(v.role), Disk: string(v.diskState), Epoch: v.epoch, Primary: v.primary,
		Generation: v.gen.String(), Reason: v.reason,
		Metadata: v.md.Placement().String(), UsableBytes: v.md.UsableSize(),
	}
	peers := make([]*peer, 0, len(v.peers))
	for _, p := range v.peers {
		peers = append(peers, p)
	}
	role, in, down := v.role, v.incoming, v.adminDown
	v.mu.Unlock()
	lv.ResyncedBytes = v.resynced.Load()
	lv.Reads, lv.ReadBytes = v.reads.Load(), v.readBytes.Load()
	lv.Writes, lv.WriteBytes = v.writes.Load(), v.writeBytes.Load()
	lv.Flushes = v.flushes.Load()
	lv.Paths = v.pathStatus()
	lv.LocalMissingBytes = v.localMissing.Bytes()
	al := v.md.ActivityLog()
	as := al.Stats()
	lv.ActivityLog = &transport.ActivityLogStatus{Extents: al.Extents(), Hits: as.Hits, Misses: as.Misses, Transactions: as.Transactions, Evictions: as.Evictions}
	if v.mp != nil {
		lv.PathPolicy = v.mp.Policy().String()
	}
	if role == replication.Primary {
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
			lv.Reason = "disconnected by operator"
		}
	case in != nil:
		lv.Replication = string(in.state())
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

// waitFor polls cond until it holds or the timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
