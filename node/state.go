package node

import (
	"fmt"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
)

// durable is the part of a volume's state that survives a restart. It is
// written to the node's state store and mirrored into the metadata
// superblock, and it changes only through Volume.commit: no goroutine ever
// sees a value that is not on stable storage yet.
type durable struct {
	// epoch is the highest primary epoch this node agreed to, held by
	// primary ("" when unknown); this node is Primary when primary is
	// itself.
	epoch   uint64
	primary string
	// gens are the data generations (replication.Generations: current,
	// one bitmap generation per out-of-sync peer, history).
	gens replication.Generations
	// syncGen is, while gens.Current is zero because a resync into this
	// disk is under way, the generation the SyncSource's bitmap for this
	// node starts from: reported as this node's current generation, it
	// lets an interrupted resync resume from that bitmap.
	syncGen replication.Generation
	// localStale: this disk was detached and misses writes its peers hold.
	localStale bool
	// primarySince is when this node last became primary (unix ns).
	primarySince int64
	// size is the volume's size on this node (an online resize grows it).
	size int64
}

func (d durable) clone() durable {
	d.gens = d.gens.Clone()
	return d
}

// commit changes the volume's durable state. change edits a copy; the copy
// is written to stable storage (the node's store, then the superblock); only
// once both writes returned does the volume take it, and install, when not
// nil, runs under v.mu in the same step. When a write fails, nothing
// changes in memory and the error is returned: whatever depends on the
// change must not happen. Callers hold v.stateMu and not v.mu, so IO goes
// on while the state is written.
func (v *Volume) commit(change func(*durable), install func()) error {
	return v.commitMirror(true, change, install)
}

// commitMirror is commit; with mirror false, a superblock that cannot be
// written does not fail it (the store alone is the truth at the next
// start): for a disk being detached, whose superblock lives on that disk.
func (v *Volume) commitMirror(mirror bool, change func(*durable), install func()) error {
	v.mu.Lock()
	d := v.d.clone()
	v.mu.Unlock()
	change(&d)
	if err := v.write(d, false, mirror); err != nil {
		return err
	}
	v.mu.Lock()
	v.d = d
	v.role = roleOf(d.primary, v.self)
	if install != nil {
		install()
	}
	v.mu.Unlock()
	v.changed.notify()
	return nil
}

func roleOf(primary, self string) replication.Role {
	if primary == self {
		return replication.Primary
	}
	return replication.Secondary
}

// write puts d on stable storage: the node's store first, then the
// superblock (current generation, history, the peers' bitmap generations).
// clean is set only by a clean shutdown. With mirror false a superblock
// write error is logged, not returned.
func (v *Volume) write(d durable, clean, mirror bool) error {
	bitmaps := map[string]replication.Generation{}
	for peer, g := range d.gens.Bitmaps {
		bitmaps[peer] = g
	}
	var mdDevice int64
	if sb := v.md.Superblock(); sb.Placement == metadata.Internal {
		mdDevice = sb.DeviceSize
	}
	err := v.node.store.PutVolume(v.name, statefile.VolumeState{
		Epoch: d.epoch, Primary: d.primary, Generation: d.gens.Current, Clean: clean, Size: d.size,
		LocalStale: d.localStale, PeerBitmaps: bitmaps, PrimarySince: d.primarySince, SyncGeneration: d.syncGen,
		BootID: v.node.bootID, MDDeviceSize: mdDevice,
	})
	if err != nil {
		return fmt.Errorf("write the state of %s: %w", v.name, err)
	}
	err = v.md.UpdateSuperblock(func(sb *metadata.Superblock) {
		sb.Current = d.gens.Current
		sb.History = [metadata.HistorySlots]replication.Generation{}
		copy(sb.History[:], d.gens.History)
		for i := range sb.Peers {
			sb.Peers[i].Bitmap = bitmaps[v.node.config().NodeName(sb.Peers[i].NodeID)]
		}
		if d.gens.Current.IsZero() {
			sb.Flags &^= metadata.FlagConsistent | metadata.FlagUpToDate
		} else {
			sb.Flags |= metadata.FlagConsistent
		}
	})
	if err != nil {
		if !mirror {
			v.log.Warn("superblock not updated (the store holds the state)", "err", err)
			return nil
		}
		return fmt.Errorf("write the superblock of %s: %w", v.name, err)
	}
	return nil
}

// loadDurable builds the state a volume starts with from the node's store
// and its superblock.
func loadDurable(st statefile.VolumeState, sb metadata.Superblock) durable {
	d := durable{
		epoch: st.Epoch, primary: st.Primary, localStale: st.LocalStale, primarySince: st.PrimarySince,
		gens: replication.Generations{Current: st.Generation, History: append([]replication.Generation(nil), sb.History[:]...)},
	}
	if len(st.PeerBitmaps) > 0 {
		d.gens.Bitmaps = map[string]replication.Generation{}
		for peer, g := range st.PeerBitmaps {
			d.gens.Bitmaps[peer] = g
		}
	}
	if d.gens.Current.IsZero() {
		d.syncGen = st.SyncGeneration
	}
	return d
}
