package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/status"
)

// Online resize (replctl resize, DRBD's drbdadm resize). The operator
// grows every node's backing disk first (a file, a LUN), then asks any
// node; that node asks every node of the volume whether it can hold the
// new size (its disk with the metadata, or the external metadata file),
// and only when all can does it grow them: the secondaries first, the
// primary last. Each node grows alone (Volume.grow): its metadata covers
// the range gained (metadata.MD.Grow, which moves internal metadata to
// the end of a grown disk), the range gained is made to read as zeroes
// on its own disk (a hole punched, nothing copied: every replica holds
// zeroes there, so they agree without a resync), and then the new size is
// recorded. A primary exposes the new size (to new NBD connections, to
// writes past the old end) only once every peer it streams to has grown,
// so no write reaches a peer past its end. A node that was down during a
// resize comes back at its old size; its peers refuse it, naming the
// sizes, until it is grown alone (replctl resize VOL SIZE --node N).

// Refusals of a resize, checked with errors.Is. Each changes nothing.
var (
	// ErrShrink: the size asked for is below the volume's.
	ErrShrink = errors.New("a volume only grows")
	// ErrNoRoom: a disk, or an external metadata file, cannot hold the
	// size with the metadata.
	ErrNoRoom = errors.New("no room to grow")
	// ErrPeerNotGrown: a primary was to grow while a peer it streams to
	// is still smaller.
	ErrPeerNotGrown = errors.New("a peer has not grown yet")
	// ErrDiskDetached: the node's disk is out of service.
	ErrDiskDetached = errors.New("the disk is detached")
)

// growCommitTries bounds the tries of a primary to record its new size
// while peers (re)connect: each new stream is checked again.
const growCommitTries = 5

// grow makes this node's copy of the volume size bytes (or, with check,
// says whether it can, changing nothing).
//
// Order: the metadata covers the range gained (MD.Grow), then that range
// reads as zeroes on the disk, synced, BEFORE the new size is recorded
// (commit: the node's store, the superblock); the new size is on stable
// storage BEFORE anything uses it (the export's size, writes past the old
// end, the handshake). A crash before the record leaves the old size, the
// metadata grown past it (unused); after, the new size.
func (v *Volume) grow(ctx context.Context, size int64, check bool) (transport.ResizedNode, error) {
	v.resizeMu.Lock()
	defer v.resizeMu.Unlock()
	role := v.state().role()
	old := v.size.Load()
	out := transport.ResizedNode{Node: v.self, Role: string(role), OldSize: old, Size: size}
	if size == old {
		out.Action, out.Text = transport.ResizeAlready, fmt.Sprintf("%s is %s on %s already", v.name, human.Bytes(size), v.self)
		if role == replication.Primary && v.cfg.FromAPI() && !check {
			v.recordCreatedSize(ctx, size)
		}
		return out, nil
	}
	var moves bool
	refused := v.growPoolImage(size, check)
	if refused == nil {
		// A check of a pool's volume found the room in the pool: its
		// file is grown only when the volume is.
		moves, refused = v.canGrow(size, old, check && v.cfg.FromAPI())
	}
	out.MaxSize = v.growLimit()
	if refused != nil {
		if check {
			// A check's refusal is its answer: the node's words and the
			// largest size it holds, which whoever asked every node sums
			// up once.
			out.Action, out.Text = transport.ResizeCannot, refused.words
			return out, nil
		}
		return out, refused
	}
	var (
		seen map[string]*session.Session
		err  error
	)
	if role == replication.Primary && !check {
		// (A check comes before the secondaries grow: they are asked
		// when the primary grows.)
		if seen, err = v.peersGrown(ctx, size); err != nil {
			return out, err
		}
	}
	if check {
		out.Action = transport.ResizeCan
		out.Text = fmt.Sprintf("%s can grow %s from %s to %s", v.self, v.name, human.Bytes(old), human.Bytes(size))
		if moves {
			out.Text += "; its metadata moves to the end of " + v.diskName()
		}
		return out, nil
	}

	rep, err := v.durable.md.Grow(metadata.GrowOptions{VolumeSize: size, DeviceSize: v.disk.Size()})
	if err != nil {
		if room := v.roomWords(size, err); room != err {
			return out, room
		}
		return out, fmt.Errorf("grow the metadata: %w; %s stays %s", err, v.name, human.Bytes(old))
	}
	if err := v.disk.Zero(old, size-old); err != nil {
		return out, fmt.Errorf("make the %s gained read as zeroes on %s: %w; %s stays %s", human.Bytes(size-old), v.diskName(), err, v.name, human.Bytes(old))
	}
	if err := v.disk.Sync(); err != nil {
		return out, fmt.Errorf("sync %s: %w; %s stays %s", v.diskName(), err, v.name, human.Bytes(old))
	}
	for try := 1; ; try++ {
		// On the volume's loop, the one writer of its state, and under
		// stateMu, as a step: a primary records its size only while every
		// stream it has is one it found grown (a peer that connected
		// meanwhile is asked again: the handshake decides on the loop,
		// under stateMu too).
		var reconnected bool
		if cerr := v.loop.Call(func() {
			v.stateMu.Lock()
			defer v.stateMu.Unlock()
			if role == replication.Primary && !sameSessions(seen, v.sessions()) {
				reconnected = true
				return
			}
			v.mu.Lock()
			d := v.st.Durable.Clone()
			v.mu.Unlock()
			err = v.commit(d, size, func() {
				v.durable.localMissing.Grow(size)
				v.size.Store(size)
			})
		}); cerr != nil {
			err = cerr
		}
		if !reconnected || err != nil {
			break
		}
		if try == growCommitTries {
			return out, fmt.Errorf("%w: %s's peers kept reconnecting while it grew; run the resize again", ErrPeerNotGrown, v.self)
		}
		if seen, err = v.peersGrown(ctx, size); err != nil {
			return out, err
		}
	}
	if err != nil {
		return out, fmt.Errorf("record the new size of %s: %w; it stays %s", v.name, err, human.Bytes(old))
	}
	out.Action, out.ZeroedBytes = transport.ResizeGrew, size-old
	if role == replication.Primary && v.cfg.FromAPI() {
		v.recordCreatedSize(ctx, size)
	}
	out.MetadataMoved, out.MetadataFrom, out.MetadataTo = rep.Moved, rep.OldOffset, rep.Offset
	out.Text = fmt.Sprintf("%s grew %s from %s to %s: the %s gained reads as zeroes (nothing copied, nothing to resync)",
		v.self, v.name, human.Bytes(old), human.Bytes(size), human.Bytes(size-old))
	switch {
	case rep.Moved && v.durable.md.Placement() == metadata.Internal:
		out.Text += fmt.Sprintf("; its metadata moved to the end of %s (%s)", v.diskName(), human.Bytes(rep.DeviceSize))
	case rep.Moved:
		out.Text += "; its bitmaps were laid out again in " + v.cfg.Disks[v.self].Meta
	}
	if role == replication.Primary {
		out.Text += fmt.Sprintf("; new NBD connections see %s, connected clients keep %s until they reconnect", human.Bytes(size), human.Bytes(old))
	}
	v.log.Info("volume grown", "from", old, "to", size, "metadata_moved", rep.Moved)
	v.node.event(v.name, "resized", out.Text)
	return out, nil
}

// growRefusal is a resize this node refuses, changing nothing: its cause
// (ErrShrink, ErrNoRoom, ErrDiskDetached, or why the disk could not be
// measured), and words that name the disk and say what to do.
type growRefusal struct {
	cause error
	words string
}

func (r *growRefusal) Error() string { return r.words + "; nothing changed" }

// refuse is a refusal for cause, in the words of format and args after
// the cause's own.
func refuse(cause error, format string, args ...any) *growRefusal {
	return &growRefusal{cause, cause.Error() + ": " + fmt.Sprintf(format, args...)}
}

func (r *growRefusal) Unwrap() error { return r.cause }

// canGrow checks, changing nothing and costing no I/O beyond measuring
// the disk, that this node can grow the volume from old to size bytes;
// moves says the internal metadata must move to the disk's new end.
// With poolRoom, the room was found in the volume's pool (a check of a
// volume created from one, whose file grows with it): the disk is not
// measured, and the internal metadata moves.
func (v *Volume) canGrow(size, old int64, poolRoom bool) (moves bool, refused *growRefusal) {
	switch {
	case size < old:
		return false, refuse(ErrShrink, "%s is %d bytes (%s) on %s; %d (%s) is smaller, and shrinking would cut off data a filesystem may use",
			v.name, old, human.Bytes(old), v.self, size, human.Bytes(size))
	case v.isDetached():
		return false, refuse(ErrDiskDetached, "%s's disk of %s is out of service: it grows once it is attached again", v.self, v.name)
	case poolRoom:
		return !v.cfg.External(), nil
	}
	if r, ok := v.disk.(backing.Remeasurer); ok {
		if _, err := r.Remeasure(); err != nil {
			return false, &growRefusal{err, fmt.Sprintf("cannot measure %s on %s: %v", v.diskName(), v.self, err)}
		}
	}
	moves, err := v.checkRoom(size)
	if err != nil {
		var room *growRefusal
		if errors.As(err, &room) {
			return false, room
		}
		return false, &growRefusal{err, fmt.Sprintf("cannot check the room on %s on %s: %v", v.diskName(), v.self, err)}
	}
	return moves, nil
}

// growLimit is the largest size this node's disk (and external metadata
// file) holds the volume at now, with its metadata; 0 when it cannot say.
func (v *Volume) growLimit() int64 {
	limit, err := v.durable.md.GrowLimit(v.disk.Size())
	if err != nil {
		return 0
	}
	if v.cfg.External() {
		limit = min(limit, v.disk.Size()&^(metadata.MDBlockSize-1))
	}
	return limit
}

// sessions returns the streams this node runs to its peers now.
func (v *Volume) sessions() map[string]*session.Session {
	out := map[string]*session.Session{}
	for _, p := range v.streamingPeers() {
		if s := p.session(); s != nil {
			out[p.name] = s
		}
	}
	return out
}

// sameSessions reports whether every stream in now was in seen.
func sameSessions(seen, now map[string]*session.Session) bool {
	for name, s := range now {
		if seen[name] != s {
			return false
		}
	}
	return true
}

// peersGrown checks that every peer this primary streams to holds size
// bytes already (the secondaries grow first): a write past a peer's end
// would fail there. It returns the streams it checked. A peer not
// connected is no obstacle: it misses writes in its bitmap, and the
// handshake refuses it until it grows.
func (v *Volume) peersGrown(ctx context.Context, size int64) (map[string]*session.Session, error) {
	seen := v.sessions()
	for _, name := range slices.Sorted(maps.Keys(seen)) {
		ns, err := v.node.askStatus(ctx, name, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: %s streams %s to %s, which did not say its size (%s); nothing changed",
				ErrPeerNotGrown, v.self, v.name, name, status.Convert(err).Message())
		}
		for _, lv := range ns.Volumes {
			if lv.Name == v.name && lv.Size < size {
				return nil, fmt.Errorf("%w: %s streams %s to %s, which is still %s: the secondaries grow before the primary exposes the new size; grow it first (replctl resize %s %d --node %s, or replctl resize %s %d for every node in that order); nothing changed",
					ErrPeerNotGrown, v.self, v.name, name, human.Bytes(lv.Size), v.name, size, name, v.name, size)
			}
		}
	}
	return seen, nil
}

// checkRoom checks, changing nothing, that this node's disk (and external
// metadata file) hold size bytes with the metadata; moves says the
// internal metadata must move to the disk's new end. A want of room is a
// *growRefusal.
func (v *Volume) checkRoom(size int64) (moves bool, err error) {
	if v.cfg.External() {
		if have := v.disk.Size(); have < size {
			return false, v.roomWords(size, &metadata.NoRoomError{Volume: size, Have: have, Need: size, Holds: v.growLimit()})
		}
	}
	moves, err = v.durable.md.CheckGrow(metadata.GrowOptions{VolumeSize: size, DeviceSize: v.disk.Size()})
	if err != nil {
		return false, v.roomWords(size, err)
	}
	return moves, nil
}

// roomWords puts a refusal for want of room into words naming the disk or
// file, how much it holds, needs and lacks, the largest size it holds the
// volume at, and how to grow it (a *growRefusal); other errors are
// returned as they are.
func (v *Volume) roomWords(size int64, err error) error {
	var room *metadata.NoRoomError
	if !errors.As(err, &room) {
		return err
	}
	lack := room.Need - room.Have
	what, how := v.diskName(), "grow it first"
	path := v.cfg.Disks[v.self].Paths[0].Path
	switch {
	case room.Limit != 0:
		how = fmt.Sprintf("no disk holds %s at %s with its metadata (the most one holds is %s): give a smaller size",
			v.name, human.Bytes(size), human.Bytes(room.Limit))
	case room.MetadataFile:
		how = fmt.Sprintf("grow it first (truncate -s %d %s)", room.Need, v.cfg.Disks[v.self].Meta)
	case v.mp != nil:
		how = "a multipath disk is measured when the node starts and replvol does not grow one online yet: it must hold the size from the start"
	default:
		if fi, serr := os.Stat(path); serr == nil && fi.Mode().IsRegular() {
			how = fmt.Sprintf("grow it first (truncate -s %d %s)", room.Need, path)
		} else {
			how = "grow the LUN first (on the storage, then rescan it)"
		}
	}
	if room.MetadataFile {
		what = "the metadata file " + v.cfg.Disks[v.self].Meta
	}
	var words string
	switch {
	case room.Limit != 0:
		words = fmt.Sprintf("%s holds %d bytes (%s)", what, room.Have, human.Bytes(room.Have))
	case room.MetadataFile:
		words = fmt.Sprintf("%s holds %d bytes (%s); %s at %s needs %d (%s) of metadata: it lacks %d bytes (%s)",
			what, room.Have, human.Bytes(room.Have), v.name, human.Bytes(size), room.Need, human.Bytes(room.Need), lack, human.Bytes(lack))
	case room.Move:
		words = fmt.Sprintf("%s holds %d bytes (%s): too little for the metadata at its end to move clear of its old copy for %s at %s; it needs %d (%s): it lacks %d bytes (%s)",
			what, room.Have, human.Bytes(room.Have), v.name, human.Bytes(size), room.Need, human.Bytes(room.Need), lack, human.Bytes(lack))
	case v.cfg.External():
		words = fmt.Sprintf("%s holds %d bytes (%s); %s at %s needs %d: it lacks %d bytes (%s)",
			what, room.Have, human.Bytes(room.Have), v.name, human.Bytes(size), room.Need, lack, human.Bytes(lack))
	default:
		words = fmt.Sprintf("%s holds %d bytes (%s); %s at %s needs %d (%s) with its internal metadata: it lacks %d bytes (%s)",
			what, room.Have, human.Bytes(room.Have), v.name, human.Bytes(size), room.Need, human.Bytes(room.Need), lack, human.Bytes(lack))
	}
	if room.Holds > 0 {
		words += fmt.Sprintf("; %s fits on it at up to %s (%d bytes) now", v.name, human.Bytes(room.Holds), room.Holds)
	}
	return &growRefusal{ErrNoRoom, fmt.Sprintf("%v on %s: %s; %s", ErrNoRoom, v.self, words, how)}
}

// diskName names this node's disk of the volume for people.
func (v *Volume) diskName() string {
	dc := v.cfg.Disks[v.self]
	if len(dc.Paths) == 1 {
		return "the disk " + dc.Paths[0].Path
	}
	var paths []string
	for _, p := range dc.Paths {
		paths = append(paths, p.Name+" ("+p.Path+")")
	}
	return "the multipath disk of " + strings.Join(paths, ", ")
}

// growPoolImage makes the sparse backing file of a volume created from a
// pool hold size bytes with its metadata, before the room is checked: a
// pool's file is the node's to size, as a disk of the cluster file is the
// operator's. It only extends the file (a sparse truncate, synced BEFORE
// the metadata may move into the gained range), and refuses when the
// pool's free space does not hold what the file may still take; a file
// that holds enough already is left as it is. A check (dryRun) only
// checks the pool's room. Volumes of the cluster file: nothing.
func (v *Volume) growPoolImage(size int64, dryRun bool) *growRefusal {
	if !v.cfg.FromAPI() || size <= v.size.Load() {
		return nil
	}
	vc := v.cfg
	vc.Size = VolumeSize(size)
	cfg := v.node.config()
	need, err := backing.RequiredSize(cfg, v.self, vc)
	if err != nil {
		return &growRefusal{err, fmt.Sprintf("cannot size %s's backing file on %s for %s: %v", v.name, v.self, human.Bytes(size), err)}
	}
	path := vc.Disks[v.self].Paths[0].Path
	fi, err := os.Stat(path)
	if err != nil {
		return &growRefusal{err, fmt.Sprintf("cannot measure %s on %s: %v", path, v.self, err)}
	}
	gain := need - fi.Size()
	if gain <= 0 {
		return nil
	}
	for _, p := range v.node.pools() {
		if p.Name == vc.Pool && p.Free < uint64(gain) {
			return refuse(ErrNoRoom, "%v on %s: pool %s has %s free, and %s at %s needs %s more there (its file %s with its metadata); free space in the pool or give a smaller size",
				ErrNoRoom, v.self, p.Name, human.Bytes(int64(p.Free)), v.name, human.Bytes(size), human.Bytes(gain), path)
		}
	}
	if dryRun {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		err = f.Truncate(need)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return &growRefusal{err, fmt.Sprintf("cannot grow %s on %s to %d bytes: %v", path, v.self, need, err)}
	}
	v.log.Info("pool file grown", "path", path, "bytes", need)
	return nil
}

// recordCreatedSize has raft record the size a volume created at run time
// grew to (the primary, which grows last, once it did), so that a node
// that opens it later runs it at that size. A failure is said, not
// returned: every node grew and recorded the size in its own metadata;
// only raft's definition lags, and the next resize to the same size
// records it.
func (v *Volume) recordCreatedSize(ctx context.Context, size int64) {
	cl := v.node.cl
	if cl == nil {
		return
	}
	if _, err := cl.c.Propose(ctx, replication.GrowVolumeCommand(v.name, uint64(size))); err != nil {
		v.log.Warn("raft does not record the new size yet; run the resize again", "size", size, "err", err)
		v.node.event(v.name, "size-not-recorded", fmt.Sprintf("%s grew to %s on every node, but raft still records its old size (%v): run replctl resize %s %d again", v.name, human.Bytes(size), err, v.name, size))
	}
}
