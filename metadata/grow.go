package metadata

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Online growth of a volume's metadata (MD.Grow): the bitmaps cover the
// range the volume gains, and, where the metadata is laid out for a size
// that cannot hold the grown volume, the metadata moves to its new place
// as DRBD's resize moves it: written whole at the new place, durably,
// then switched to by the superblock.

// ErrShrink: Grow was asked for a smaller volume. Nothing changed.
var ErrShrink = errors.New("a volume only grows")

// NoRoomError is Grow's refusal of a size the device, or the external
// metadata file, cannot hold beside the metadata. Nothing changed. It is
// ErrVolumeTooLarge (errors.Is).
type NoRoomError struct {
	// MetadataFile: the external metadata file lacks room (otherwise the
	// backing device, which holds the internal metadata at its end).
	MetadataFile bool
	// Move: the device grew, but by too little for the internal metadata
	// to move clear of its old copy, which must stay whole until the new
	// one is in force (a crash finds one of the two).
	Move bool
	// Volume is the size asked for; Have the size of the device or file;
	// Need the smallest size that holds the volume with its metadata (0
	// when none does: see Limit).
	Volume, Have, Need int64
	// Holds is the largest volume the device or file holds as it is now
	// (the largest size Grow accepts).
	Holds int64
	// Limit, when not zero, is the largest volume the format holds with
	// this metadata: no device holds Volume (Need is 0).
	Limit int64
}

func (e *NoRoomError) Error() string {
	switch {
	case e.Limit != 0:
		return fmt.Sprintf("no device holds a %d-byte volume with its metadata: the format holds at most %d bytes; the device holds %d bytes, a volume of at most %d", e.Volume, e.Limit, e.Have, e.Holds)
	case e.MetadataFile:
		return fmt.Sprintf("the metadata file holds %d bytes; a %d-byte volume needs %d bytes of metadata: %d more", e.Have, e.Volume, e.Need, e.Need-e.Have)
	case e.Move:
		return fmt.Sprintf("the device holds %d bytes, too few for its metadata to move clear of its old copy for a %d-byte volume: it needs %d bytes, %d more", e.Have, e.Volume, e.Need, e.Need-e.Have)
	}
	return fmt.Sprintf("the device holds %d bytes; a %d-byte volume needs %d with its internal metadata: %d more", e.Have, e.Volume, e.Need, e.Need-e.Have)
}

// Is makes a NoRoomError ErrVolumeTooLarge.
func (e *NoRoomError) Is(target error) bool { return target == ErrVolumeTooLarge }

// GrowOptions say what MD.Grow grows to.
type GrowOptions struct {
	// VolumeSize is the volume's new size: at least MD.VolumeSize.
	VolumeSize int64
	// DeviceSize is, for internal metadata, the backing device's size now
	// (zero asks the device): larger than the metadata was laid out for
	// when the device grew. External metadata ignores it (its data device
	// is the volume).
	DeviceSize int64
}

// GrowReport says what MD.Grow did.
type GrowReport struct {
	// OldVolumeSize and VolumeSize are the sizes the bitmaps covered
	// before and cover now.
	OldVolumeSize, VolumeSize int64
	// Moved: the metadata moved (internal: to the end of the grown
	// device, from OldOffset to Offset; external: its bitmaps were laid
	// out again for the new size in the same file).
	Moved bool
	// OldDeviceSize and DeviceSize are the device sizes the metadata was
	// and is laid out for: open it with DeviceSize from now on.
	OldDeviceSize, DeviceSize int64
	OldOffset, Offset         int64
	// PagesWritten counts the bitmap pages written.
	PagesWritten int
}

// Grow makes the bitmaps cover a volume of opts.VolumeSize bytes, online:
// bits are set and cleared, and writes admitted to hot extents, while it
// runs. The range the volume gains is in sync (its bits clear): the
// caller makes it read as zeroes on every replica, and records the new
// size where it opens the metadata with (MDOptions.VolumeSize), both
// AFTER Grow returned. A smaller size is refused (ErrShrink); a size the
// device or the external metadata file cannot hold is refused with a
// *NoRoomError. Neither changes a byte.
//
// Order. Where the metadata's layout holds the new size already, the
// bitmap pages the volume gains are written clear, and synced, BEFORE the
// bitmaps cover them. Otherwise the metadata moves (internal metadata on
// a grown device, to its new end; external metadata, whose bitmaps are
// laid out for the volume's size): the activity log (internal: a zeroed
// ring, then transactions describing every slot) and every bitmap page
// are written at the new place and synced BEFORE the new superblock is
// written; the new superblock is synced BEFORE anything is written at the
// new place again; the old superblocks are invalidated only after that.
// A crash at any point leaves the old metadata or the new one, each
// whole: internal metadata that did not switch is found at the end of the
// device's old size (GrowReport.OldDeviceSize), which the caller must
// remember until it opened the new one (OpenMD with that DeviceSize).
//
// The new internal metadata area must lie past the old device end (a
// device grown by less is refused, NoRoomError.Move). External metadata
// moves within its file: with more than one peer slot, or a checksum
// area (which grows where it is, so the bitmaps after it move), a crash
// before the switch may leave bitmap pages overwritten; they then fail
// their checksums at the next open and their ranges are resynced in full
// (never taken as in sync).
//
// Checksums (format 2): the blocks the volume gains have no known sum.
// Internal metadata that moves copies the checksum pages of the volume
// to the new place with the bitmaps, BEFORE the switch; external
// metadata keeps its checksum area at its offset, grown at its end.
func (md *MD) Grow(opts GrowOptions) (GrowReport, error) {
	md.growMu.Lock()
	defer md.growMu.Unlock()
	cur, geo, target, grows, err := md.planGrow(opts)
	rep := GrowReport{OldVolumeSize: cur, VolumeSize: cur, OldDeviceSize: geo.deviceSize, DeviceSize: geo.deviceSize,
		OldOffset: geo.mdOffset, Offset: geo.mdOffset}
	if err != nil || !grows {
		return rep, err
	}
	if target == geo {
		rep.PagesWritten, err = md.extendBitmaps(opts.VolumeSize)
	} else {
		rep.Moved = true
		rep.PagesWritten, err = md.move(target, opts.VolumeSize, 0)
		md.mu.Lock()
		rep.DeviceSize, rep.Offset = md.geo.deviceSize, md.geo.mdOffset
		md.mu.Unlock()
	}
	if err != nil {
		return rep, err
	}
	for _, b := range md.bitmaps {
		b.grow(opts.VolumeSize)
	}
	if md.sums != nil {
		md.sums.grow(opts.VolumeSize)
	}
	md.mu.Lock()
	md.volumeSize = opts.VolumeSize
	md.mu.Unlock()
	rep.VolumeSize = opts.VolumeSize
	return rep, nil
}

// CheckGrow says, changing nothing, whether Grow to opts would succeed as
// far as room goes (ErrShrink, a *NoRoomError), and whether the metadata
// would move. It costs no I/O beyond measuring the device.
func (md *MD) CheckGrow(opts GrowOptions) (moves bool, err error) {
	md.growMu.Lock()
	defer md.growMu.Unlock()
	_, geo, target, grows, err := md.planGrow(opts)
	return err == nil && grows && target != geo, err
}

// GrowLimit is the largest volume Grow accepts now on a device of
// given bytes (zero asks the device; external metadata ignores it
// and measures its file): what the device, or the external metadata
// file, holds with the metadata. It changes nothing.
func (md *MD) GrowLimit(given int64) (int64, error) {
	md.growMu.Lock()
	defer md.growMu.Unlock()
	md.mu.Lock()
	geo := md.geo
	md.mu.Unlock()
	if geo.placement == External {
		given = 0
	}
	dev, err := deviceSize(md.dev, given)
	if err != nil {
		return 0, err
	}
	return holds(geo, dev), nil
}

// holds is the largest volume a Grow accepts in layout geo on a device
// (internal) or metadata file (external) of dev bytes.
func holds(geo geometry, dev int64) int64 {
	if geo.placement == External && geo.checksums {
		// The checksum area grows with the volume too: search the
		// largest multiple of 4 KiB whose metadata fits.
		fits := func(blocks int64) bool {
			g, err := computeGeometry(External, blocks*bytesPerBit, geo.alExtents, geo.peerSlots, true)
			return err == nil && g.bitmapOffset+int64(g.peerSlots)*g.bitmapPages*MDBlockSize <= dev
		}
		lo, hi := int64(0), int64(maxDataSize/bytesPerBit)
		for lo < hi {
			mid := lo + (hi-lo+1)/2
			if fits(mid) {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return lo * bytesPerBit
	}
	if geo.placement == External {
		fixed := int64(superblockSlots + geo.alBlocks)
		pages := (dev/MDBlockSize - fixed) / int64(geo.peerSlots)
		if pages <= 0 {
			return 0
		}
		return min(pages*BitsPerPage*bytesPerBit, maxDataSize)
	}
	best := geo.dataSize
	if dev > geo.deviceSize {
		g, err := computeGeometry(Internal, dev, geo.alExtents, geo.peerSlots, geo.checksums)
		if err == nil && g.mdOffset >= floorBlock(geo.deviceSize) {
			best = max(best, g.dataSize)
		}
	}
	return best
}

// formatLimit is the largest volume the format holds in a layout like
// geo: with internal metadata, what a device of the largest size leaves.
func formatLimit(geo geometry) int64 {
	if geo.placement == External {
		return maxDataSize
	}
	g, err := computeGeometry(Internal, maxDataSize, geo.alExtents, geo.peerSlots, geo.checksums)
	if err != nil {
		return 0
	}
	return g.dataSize
}

// planGrow is the metadata's volume size and geometry now (cur, geo) and
// the geometry a Grow to opts needs (target); grows is false when the
// size is the same. A smaller size is ErrShrink, one the disk cannot hold
// a *NoRoomError. Callers hold growMu.
func (md *MD) planGrow(opts GrowOptions) (cur int64, geo, target geometry, grows bool, err error) {
	md.mu.Lock()
	cur, geo = md.volumeSize, md.geo
	md.mu.Unlock()
	switch {
	case opts.VolumeSize < cur:
		return cur, geo, geo, false, fmt.Errorf("%w: the volume is %d bytes; %d is smaller", ErrShrink, cur, opts.VolumeSize)
	case opts.VolumeSize == cur:
		return cur, geo, geo, false, nil
	}
	if limit := formatLimit(geo); opts.VolumeSize > limit {
		room := &NoRoomError{Volume: opts.VolumeSize, Limit: limit}
		if geo.placement == Internal {
			room.Have, err = deviceSize(md.dev, opts.DeviceSize)
		} else {
			room.Have, err = deviceSize(md.dev, 0)
			room.MetadataFile = true
		}
		if err != nil {
			return cur, geo, geo, false, err
		}
		room.Holds = holds(geo, room.Have)
		return cur, geo, geo, false, room
	}
	target, err = md.grownGeometry(opts, geo)
	return cur, geo, target, err == nil, err
}

// grownGeometry is the layout that holds a volume of opts.VolumeSize
// bytes: geo itself when it does, or a refusal.
func (md *MD) grownGeometry(opts GrowOptions, geo geometry) (geometry, error) {
	if geo.placement == External {
		g, err := computeGeometry(External, opts.VolumeSize, geo.alExtents, geo.peerSlots, geo.checksums)
		if err != nil {
			return geo, err
		}
		need := g.bitmapOffset + int64(g.peerSlots)*g.bitmapPages*MDBlockSize
		have, err := deviceSize(md.dev, 0)
		if err != nil {
			return geo, err
		}
		if have < need {
			return geo, &NoRoomError{MetadataFile: true, Volume: opts.VolumeSize, Have: have, Need: need, Holds: holds(geo, have)}
		}
		return g, nil
	}
	if opts.VolumeSize <= geo.dataSize {
		return geo, nil
	}
	dev, err := deviceSize(md.dev, opts.DeviceSize)
	if err != nil {
		return geo, err
	}
	if dev < geo.deviceSize {
		return geo, errorf("the device holds %d bytes, less than the %d its metadata is laid out for", dev, geo.deviceSize)
	}
	oldEnd := floorBlock(geo.deviceSize)
	g, err := computeGeometry(Internal, dev, geo.alExtents, geo.peerSlots, geo.checksums)
	room := &NoRoomError{Volume: opts.VolumeSize, Have: dev, Holds: holds(geo, dev)}
	if err != nil || g.dataSize < opts.VolumeSize {
		room.Need = deviceFor(opts.VolumeSize, 0, 0, geo.alExtents, geo.peerSlots, geo.checksums)
		if room.Need <= dev {
			room.Need = deviceFor(opts.VolumeSize, 0, dev, geo.alExtents, geo.peerSlots, geo.checksums)
		}
	} else if g.mdOffset < oldEnd {
		room.Move = true
		room.Need = deviceFor(opts.VolumeSize, oldEnd, dev, geo.alExtents, geo.peerSlots, geo.checksums)
	} else {
		return g, nil
	}
	if room.Need == 0 {
		// No device of the format's largest size holds it (with its
		// metadata clear of the old copy).
		room.Move, room.Limit = false, formatLimit(geo)
	}
	return geo, room
}

// deviceFor is the smallest device, a multiple of 4 KiB and at least
// from bytes, whose internal metadata leaves volume bytes usable and
// starts at or past mdFrom; 0 when no device the format allows (at most
// maxDataSize) does. Each step grows the device by what it lacked, so it
// takes a few steps, never more than the format's size allows.
func deviceFor(volume, mdFrom, from int64, alExtents, peers int, checksums bool) int64 {
	dev := max(floorBlock(volume+MDBlockSize-1), floorBlock(from+MDBlockSize-1))
	for dev <= maxDataSize {
		g, err := computeGeometry(Internal, dev, alExtents, peers, checksums)
		if err != nil {
			if g.mdSize == 0 || floorBlock(dev) > g.mdSize {
				return 0 // not a question of size
			}
			dev = g.mdSize + MDBlockSize // too small for its metadata
			continue
		}
		short := max(volume-g.dataSize, mdFrom-g.mdOffset)
		if short <= 0 {
			return dev
		}
		dev += floorBlock(short + MDBlockSize - 1)
	}
	return 0
}

// pagesOf is the number of bitmap pages a volume of size bytes uses.
func pagesOf(size int64) int64 { return ceilDiv64(blocksOf(size), BitsPerPage) }

// extendBitmaps writes, in the layout in force, every peer's bitmap pages
// from the volume's last one (its bits past the old end written clear) to
// the last one a volume of size bytes uses, and syncs.
func (md *MD) extendBitmaps(size int64) (int, error) {
	pages := 0
	for _, b := range md.bitmaps {
		b.flushMu.Lock()
		b.mu.Lock()
		from := max(0, int64(len(b.pages))-1)
		b.mu.Unlock()
		n, err := b.writePagesAt(md.geo, from, pagesOf(size))
		b.flushMu.Unlock()
		pages += n
		if err != nil {
			return pages, err
		}
	}
	if err := md.dev.Sync(); err != nil {
		return pages, fmt.Errorf("sync bitmaps: %w", err)
	}
	return pages, nil
}

// move writes the metadata whole in layout g, for a volume of size
// bytes, and switches to it (Grow's order). It owns the activity log and
// every bitmap's flushes meanwhile. When g has a checksum area and the
// metadata in force has none (EnableChecksums), the new superblock is
// format 2 with seed as its area's seed.
func (md *MD) move(g geometry, size int64, seed uint64) (pages int, err error) {
	a := md.al
	if err := a.own(); err != nil {
		return 0, err
	}
	if md.sums != nil {
		md.sums.flushMu.Lock()
	}
	for _, b := range md.bitmaps {
		b.flushMu.Lock()
	}
	var failLog error
	defer func() {
		for _, b := range md.bitmaps {
			b.flushMu.Unlock()
		}
		if md.sums != nil {
			md.sums.flushMu.Unlock()
		}
		a.release(failLog)
	}()
	md.mu.Lock()
	old := md.geo
	md.mu.Unlock()
	undo := func() {
		// External pages of the first layout may be overwritten: the
		// next flush writes them all again where the old layout has them.
		if old.placement == External {
			for _, b := range md.bitmaps {
				b.markAllDirty()
			}
		}
	}

	// The activity log and the bitmaps at their new place, durably.
	seq, cursor := a.seq, a.cursor
	if g.alOffset != old.alOffset {
		if seq, cursor, err = a.writeRingAt(g.alOffset); err != nil {
			return 0, err
		}
	}
	for _, b := range md.bitmaps {
		n, err := b.writePagesAt(g, 0, pagesOf(size))
		pages += n
		if err != nil {
			undo()
			return pages, err
		}
	}
	if md.sums != nil && g.checksumOffset != old.checksumOffset {
		// Internal: the checksum pages of the volume, copied. External
		// metadata keeps its area where it is: it grows at its end, over
		// the old bitmaps, whose pages fail a checksum page's check.
		if _, err := md.sums.copyPagesTo(g.checksumOffset); err != nil {
			undo()
			return pages, err
		}
	}
	if err := md.dev.Sync(); err != nil {
		undo()
		return pages, fmt.Errorf("sync the moved metadata: %w", err)
	}

	// The new superblock: the switch.
	md.mu.Lock()
	defer md.mu.Unlock()
	next := md.sb.clone()
	next.Seq++
	if g.checksums && !next.HasChecksums() {
		next.withChecksums(g, seed)
	} else {
		next.setGeometry(g)
	}
	if err := md.writeSuperblockAt(g, &next); err != nil {
		// It may have reached the disk all the same: take it back, or
		// stop the log (the disk must be detached) rather than write on
		// at the old place under a superblock that may point elsewhere.
		if zerr := md.clearSlot(g.sbOffset[next.Seq%superblockSlots]); zerr != nil {
			failLog = err
		}
		undo()
		return pages, err
	}
	md.geo, md.sb = g, next
	a.ringOffset, a.seq, a.cursor = g.alOffset, seq, cursor
	if md.sums != nil {
		md.sums.mu.Lock()
		md.sums.offset = g.checksumOffset
		md.sums.mu.Unlock()
	}
	// The other slot holds this layout too (a failure leaves next in
	// force, and the next update writes that slot again).
	second := next.clone()
	second.Seq++
	if err := md.writeSuperblockAt(g, &second); err != nil {
		return pages, err
	}
	md.sb = second
	if old.placement == Internal {
		// The old copy, now outside the metadata, stops being one.
		if err := md.clearSlots(old.sbOffset[0]); err != nil {
			return pages, fmt.Errorf("invalidate the old superblocks: %w", err)
		}
	}
	return pages, nil
}

// clearSlot zeroes the superblock slot at off and syncs.
func (md *MD) clearSlot(off int64) error {
	if _, err := md.dev.WriteAt(make([]byte, MDBlockSize), off); err != nil {
		return err
	}
	return md.dev.Sync()
}

// clearSlots zeroes both superblock slots from off and syncs.
func (md *MD) clearSlots(off int64) error {
	if _, err := md.dev.WriteAt(make([]byte, superblockSlots*MDBlockSize), off); err != nil {
		return err
	}
	return md.dev.Sync()
}

// setGeometry puts layout g into the superblock's fields.
func (sb *Superblock) setGeometry(g geometry) {
	sb.DeviceSize, sb.DataSize, sb.MDOffset, sb.MDSize = g.deviceSize, g.dataSize, g.mdOffset, g.mdSize
	sb.ALOffset, sb.ALBlocks, sb.ALExtents = g.alOffset, uint32(g.alBlocks), uint32(g.alExtents)
	sb.BitmapOffset, sb.BitmapPages = g.bitmapOffset, uint32(g.bitmapPages)
	sb.ChecksumOffset, sb.ChecksumPages = g.checksumOffset, g.checksumPages
}

// writePagesAt writes pages [first, end) of this bitmap in layout g,
// without syncing: those the bitmap holds as they are in memory now
// (their dirty marks stay: a later flush writes them again), those past
// it clear. The caller holds b.flushMu.
func (b *PeerBitmap) writePagesAt(g geometry, first, end int64) (int, error) {
	buf := make([]byte, 0, loadBatch*MDBlockSize)
	written := 0
	for from := first; from < end; from += loadBatch {
		buf = buf[:0]
		b.mu.Lock()
		for i := from; i < min(from+loadBatch, end); i++ {
			if i < int64(len(b.pages)) {
				buf = append(buf, b.encodePage(i)...)
			} else {
				buf = append(buf, b.encodeClearPage(i)...)
			}
		}
		b.mu.Unlock()
		if _, err := b.md.dev.WriteAt(buf, pageOffsetIn(g, b.slot, from)); err != nil {
			return written, fmt.Errorf("write bitmap of peer %d: %w", b.node, err)
		}
		written += len(buf) / MDBlockSize
	}
	return written, nil
}

// encodeClearPage renders page i with no bit set.
func (b *PeerBitmap) encodeClearPage(i int64) []byte {
	out := make([]byte, MDBlockSize)
	binary.LittleEndian.PutUint32(out[4:], uint32(i))
	binary.LittleEndian.PutUint32(out[0:], b.pageCRC(out))
	return out
}

// markAllDirty makes the next flush write every page.
func (b *PeerBitmap) markAllDirty() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range int64(len(b.pages)) {
		b.markDirty(i)
	}
}

// grow makes the bitmap cover a volume of volume bytes; the blocks gained
// are in sync.
func (b *PeerBitmap) grow(volume int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if volume <= b.volume {
		return
	}
	blocks := blocksOf(volume)
	n := ceilDiv64(blocks, BitsPerPage)
	// A full last page stands for its blocks: once the page holds more,
	// it holds those set and the new ones clear.
	if last := int64(len(b.pages)) - 1; last >= 0 && b.pages[last] == fullPage && pageBlocks(blocks, last) != pageBlocks(b.blocks, last) {
		p := new(bitmapPage)
		fillPage(p, pageBlocks(b.blocks, last))
		b.pages[last] = p
	}
	for int64(len(b.pages)) < n {
		b.pages = append(b.pages, nil)
		b.counts = append(b.counts, 0)
	}
	for int64(len(b.dirty)) < ceilDiv64(n, 64) {
		b.dirty = append(b.dirty, 0)
	}
	b.blocks, b.volume = blocks, volume
}
