package node

import (
	"fmt"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// The durable part of a volume's state (volstate.Durable, in v.st) is
// what survives a restart, with the volume's size (v.size, which is not
// the state machine's). It is written to the node's state store and
// mirrored into the metadata superblock, and it changes only through
// Volume.commit: no goroutine ever sees a value that is not on stable
// storage yet.

// commit changes the volume's durable state to d and its size to size:
// they are written to stable storage (the node's store, then the
// superblock); only once both writes returned does the volume take d, and
// install, when not nil, runs under v.mu in the same step (a resize's
// publishes the size). When a write fails, nothing changes in memory and
// the error is returned: whatever depends on the change must not happen.
// Callers hold v.stateMu and not v.mu, so IO goes on while the state is
// written, and run on the volume's loop (once it runs; the deadlock build
// checks it): the loop is the one writer of the volume's state.
func (v *Volume) commit(d volstate.Durable, size int64, install func()) error {
	return v.commitMirror(true, d, size, install)
}

// commitMirror is commit; with mirror false, a superblock that cannot be
// written does not fail it (the store alone is the truth at the next
// start): for a disk being detached, whose superblock lives on that disk.
func (v *Volume) commitMirror(mirror bool, d volstate.Durable, size int64, install func()) error {
	d = d.Clone()
	// As stable storage holds it (unix nanoseconds, no monotonic reading).
	d.PrimarySince = fromUnixNano(unixNano(d.PrimarySince))
	if err := v.write(d, size, false, mirror); err != nil {
		return err
	}
	v.mu.Lock()
	if v.loop != nil { // nil while the volume opens, before its loop starts
		v.loop.Check("a change of the durable state of volume", v.name)
	}
	v.st.Durable = d
	if install != nil {
		install()
	}
	v.publishLocked()
	v.mu.Unlock()
	v.changed.notify()
	return nil
}

// roleLocked is the volume's role: Primary exactly when the durable state
// names this node. Callers hold v.mu.
func (v *Volume) roleLocked() replication.Role { return v.st.Role() }

// unixNano is t in unix nanoseconds, 0 for the zero time (as the store
// keeps a primary's start).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromUnixNano is unixNano's inverse.
func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// write puts d, at size bytes, on stable storage: the node's store first,
// then the superblock (current generation, history, the peers' bitmap
// generations). clean is set only by a clean shutdown. With mirror false a
// superblock write error is logged, not returned.
func (v *Volume) write(d volstate.Durable, size int64, clean, mirror bool) error {
	bitmaps := map[string]replication.Generation{}
	for peer, g := range d.Gens.Bitmaps {
		bitmaps[peer] = g
	}
	var mdDevice int64
	if sb := v.durable.md.Superblock(); sb.Placement == metadata.Internal {
		mdDevice = sb.DeviceSize
	}
	err := v.node.store.PutVolume(v.name, statefile.VolumeState{
		Epoch: d.Epoch, Primary: d.Primary, Generation: d.Gens.Current, Clean: clean, Size: size,
		LocalStale: d.LocalStale, PeerBitmaps: bitmaps, PrimarySince: unixNano(d.PrimarySince), SyncGeneration: d.SyncGen,
		BootID: v.node.bootID, MDDeviceSize: mdDevice,
	})
	if err != nil {
		return fmt.Errorf("write the state of %s: %w", v.name, err)
	}
	err = v.durable.md.UpdateSuperblock(func(sb *metadata.Superblock) {
		sb.Current = d.Gens.Current
		sb.History = [metadata.HistorySlots]replication.Generation{}
		copy(sb.History[:], d.Gens.History)
		for i := range sb.Peers {
			sb.Peers[i].Bitmap = bitmaps[v.node.config().NodeName(sb.Peers[i].NodeID)]
		}
		if d.Gens.Current.IsZero() {
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

// loadDurable builds the durable state a volume starts with from the
// node's store and its superblock.
func loadDurable(st statefile.VolumeState, sb metadata.Superblock) volstate.Durable {
	d := volstate.Durable{
		Epoch: st.Epoch, Primary: st.Primary, LocalStale: st.LocalStale, PrimarySince: fromUnixNano(st.PrimarySince),
		Gens: replication.Generations{Current: st.Generation, History: append([]replication.Generation(nil), sb.History[:]...)},
	}
	if len(st.PeerBitmaps) > 0 {
		d.Gens.Bitmaps = map[string]replication.Generation{}
		for peer, g := range st.PeerBitmaps {
			d.Gens.Bitmaps[peer] = g
		}
	}
	if d.Gens.Current.IsZero() {
		d.SyncGen = st.SyncGeneration
	}
	return d
}

// published is the volume's state as an install left it (Volume.pub): a
// copy of v.st that shares nothing with it, and the why's words. It is
// never changed once published.
type published struct {
	st  volstate.State
	why reason
}

// role is the volume's role.
func (p *published) role() replication.Role { return p.st.Role() }

// serving reports whether this node serves the volume's IO as its primary
// (status's serving).
func (p *published) serving() bool {
	return p.st.Role() == replication.Primary && p.st.Serving.IsOpen()
}

// publishLocked publishes v.st (and its why) as it is now. Whoever changes
// v.st calls it in the same critical section. Callers hold v.mu.
func (v *Volume) publishLocked() {
	v.pub.Store(&published{st: v.st.Clone(), why: reason{cause: Cause(v.st.Why), text: v.whyText}})
}

// state is the volume's state as its last install published it; it must
// not be changed.
func (v *Volume) state() *published { return v.pub.Load() }
