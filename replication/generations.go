package replication

import "maps"

// HistorySlots is how many older generations a node keeps (the on-disk
// superblock has room for this many).
const HistorySlots = 4

// Generations is one node's generation state toward all of its peers
// (DRBD's UUIDs): the generation of the data on its disk, the generation
// each out-of-sync peer's bitmap tracks changes from, and the older
// generations. Its methods are the only transitions node/ makes; each
// returns a new value and leaves the receiver untouched, so the caller can
// write the result to stable storage BEFORE it takes it.
type Generations struct {
	// Current names the data on the disk; zero while it is Inconsistent.
	Current Generation
	// Bitmaps holds, for every peer that is not in sync, the generation
	// its bitmap tracks changes from (the peer's data is that generation
	// plus the marked blocks). A peer in sync has no entry.
	Bitmaps map[string]Generation
	// History holds older generations, newest first, HistorySlots long
	// (zero entries are unused).
	History []Generation
}

// Clone returns a copy that shares nothing with g.
func (g Generations) Clone() Generations {
	c := Generations{Current: g.Current, History: make([]Generation, HistorySlots)}
	copy(c.History, g.History)
	if len(g.Bitmaps) > 0 {
		c.Bitmaps = make(map[string]Generation, len(g.Bitmaps))
		for p, b := range g.Bitmaps {
			c.Bitmaps[p] = b
		}
	}
	return c
}

// Toward returns the set this node sends peer in a handshake (the flags are
// the caller's to fill in).
func (g Generations) Toward(peer string) UUIDSet {
	return UUIDSet{Current: g.Current, Bitmap: g.Bitmaps[peer], History: append([]Generation(nil), g.History...)}
}

// Tracking reports whether peer's changes are tracked in a bitmap.
func (g Generations) Tracking(peer string) bool {
	_, ok := g.Bitmaps[peer]
	return ok
}

// PeerMisses is the primary starting to write without peer, which holds
// held (the generation it last acknowledged): peer's bitmap starts from
// held and the primary moves to next, so that peer can never again look as
// up to date as the primary. The old current generation goes into the
// history, where a third node that held it still finds it. A peer already
// tracked changes nothing.
func (g Generations) PeerMisses(peer string, held, next Generation) Generations {
	if g.Tracking(peer) || g.Current.IsZero() {
		return g.Clone()
	}
	c := g.Clone()
	if c.Bitmaps == nil {
		c.Bitmaps = map[string]Generation{}
	}
	if held.IsZero() {
		held = g.Current
	}
	c.Bitmaps[peer] = held
	c.History = pushHistory(c.History, g.Current)
	c.Current = next
	return c
}

// CrashedPrimaryCopies is a primary that went down as primary copying
// its activity log's blocks (writes it may hold and its peers not) to a
// peer: a change of data that another peer may miss (its copy fails, it
// is away), so the data moves on to next as a write that misses every
// peer would (DRBD's new current generation of a primary that resumes).
// Every peer not tracked yet, each of which held the current generation
// at best, gets a bitmap generation of it; those blocks are marked for
// every peer already (the crash's recovery marked them). A peer tracked
// already keeps its bitmap (it marks those blocks too). Equal
// generations then mean equal data again: a peer that took the copy
// holds next, one that missed it the old generation, behind by the
// rules of bitmaps and history. An Inconsistent node changes nothing.
func (g Generations) CrashedPrimaryCopies(peers []string, next Generation) Generations {
	c := g.Clone()
	if g.Current.IsZero() {
		return c
	}
	if c.Bitmaps == nil {
		c.Bitmaps = make(map[string]Generation, len(peers))
	}
	for _, p := range peers {
		if _, ok := c.Bitmaps[p]; !ok {
			c.Bitmaps[p] = g.Current
		}
	}
	c.History, c.Current = pushHistory(c.History, g.Current), next
	return c
}

// TrackedPeerMayHoldCurrent is the primary starting to write without
// peer, whose changes it tracks already, but which may hold its current
// generation all the same: the peer committed a sync-done (or a generation
// announcement) whose acknowledgement never came, or a resync between
// equal generations was cut off before the peer took it. The primary
// moves to next, so that peer can never again look as up to date as the
// primary, and keeps the peer's bitmap (it marks every block the peer may
// miss); the old current generation goes into the history. An untracked
// peer, or an Inconsistent primary, changes nothing (PeerMisses is theirs).
func (g Generations) TrackedPeerMayHoldCurrent(peer string, next Generation) Generations {
	if !g.Tracking(peer) || g.Current.IsZero() {
		return g.Clone()
	}
	c := g.Clone()
	c.History = pushHistory(c.History, g.Current)
	c.Current = next
	return c
}

// ResyncFinishedAsSource is the SyncSource after peer holds every block
// and the current generation: peer's bitmap generation retires into the
// history (DRBD keeps it there) and peer is in sync.
func (g Generations) ResyncFinishedAsSource(peer string) Generations {
	c := g.Clone()
	if b, ok := c.Bitmaps[peer]; ok {
		c.History = pushHistory(c.History, b)
		delete(c.Bitmaps, peer)
	}
	return c
}

// ResyncStartedAsSource is the SyncSource beginning a resync toward peer:
// the peer's copy will be from plus the blocks sent, so peer's bitmap
// generation is from (the peer records it too, and an interrupted resync
// resumes from that bitmap).
func (g Generations) ResyncStartedAsSource(peer string, from Generation) Generations {
	c := g.Clone()
	if c.Bitmaps == nil {
		c.Bitmaps = map[string]Generation{}
	}
	c.Bitmaps[peer] = from
	return c
}

// Inconsistent is the disk becoming a SyncTarget: until the resync ends it
// holds no consistent generation. The history is kept: what it will hold
// descends from the source, whose history it adopts at the end.
func (g Generations) Inconsistent() Generations {
	c := g.Clone()
	c.Current = Generation{}
	return c
}

// ResyncFinishedAsTarget is a SyncTarget after its source sent every block
// and its generation: it holds current, descends from the source's
// history, and owes source nothing (its own changes toward it are in).
func (g Generations) ResyncFinishedAsTarget(source string, current Generation, history []Generation) Generations {
	c := g.Clone()
	c.Current = current
	c.History = make([]Generation, HistorySlots)
	copy(c.History, history)
	delete(c.Bitmaps, source)
	return c
}

// PullFinishedWithout is a primary whose pull of newer data ended while
// peers were away (no stream): each held the generation this node held
// before the pull (held: its SyncGen) and what was marked for it since,
// every block the pull copied and every write made meanwhile, none of
// which moved a generation (this node held none to move on from). Each
// peer not tracked yet is tracked from held, as a write that misses a
// peer tracks it, so that it is resynced from its bitmap when it comes
// back (bitmap-self); untracked, its generation was in no lineage of this
// node's any more (the pull takes the source's), and it met this primary
// as a split brain.
func (g Generations) PullFinishedWithout(peers []string, held Generation) Generations {
	c := g.Clone()
	if held.IsZero() || c.Current.IsZero() {
		return c
	}
	for _, p := range peers {
		if c.Tracking(p) {
			continue
		}
		if c.Bitmaps == nil {
			c.Bitmaps = map[string]Generation{}
		}
		c.Bitmaps[p] = held
	}
	return c
}

// Following is a secondary taking primary's stream: of its bitmap
// generations it keeps only the one toward primary (an interrupted copy
// between them resumes from it). The writes it applies from now on are
// marked for no other peer, so a bitmap generation toward another, kept
// from a term in which this node was primary, no longer says how its data
// differs from that peer's: kept, it would make a later primary that holds
// the same generation as this node take it for a sync source whose finish
// it missed (rule sync-target-missed-finish), or whose bitmap tracks
// changes since its own generation (bitmap-peer), and copy this node's
// older blocks over its own.
func (g Generations) Following(primary string) Generations {
	c := g.Clone()
	maps.DeleteFunc(c.Bitmaps, func(peer string, _ Generation) bool { return peer != primary })
	return c
}

// TracksBesides reports whether g holds a bitmap generation toward a node
// other than primary (Following would drop it).
func (g Generations) TracksBesides(primary string) bool {
	for peer := range g.Bitmaps {
		if peer != primary {
			return true
		}
	}
	return false
}

// Adopted is a disk with no consistent generation made the volume's data
// by an operator (DRBD's initial primary --force): it starts generation
// next, and every peer is in sync until a write misses it.
func (g Generations) Adopted(next Generation) Generations {
	c := g.Clone()
	c.Current = next
	c.Bitmaps = nil
	return c
}

// Promoted is a node taking over as primary with every peer counted in
// sync by generation (a handover, raft's choice, or a forced promotion:
// the bitmap generations of an earlier term mean nothing now; a write
// that misses a peer starts its bitmap). The blocks the node marked for
// its peers stay marked: they are resynced all the same.
func (g Generations) Promoted() Generations {
	c := g.Clone()
	c.Bitmaps = nil
	return c
}

// pushHistory returns history with g in front, HistorySlots long; the
// oldest entry falls off. A zero g, or one already in the history, changes
// nothing: a generation listed twice says nothing more.
func pushHistory(history []Generation, g Generation) []Generation {
	n := max(len(history), 2)
	h := make([]Generation, n)
	copy(h, history)
	if g.IsZero() {
		return h
	}
	for _, x := range history {
		if x == g {
			return h
		}
	}
	h[0] = g
	copy(h[1:], history)
	return h
}
