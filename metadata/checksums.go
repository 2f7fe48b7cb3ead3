package metadata

import (
	"container/list"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"unsafe"

	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/lockorder"
)

// Refusals of Checksums. Each changes nothing.
var (
	// ErrBlockOutOfRange: a block past the volume's end.
	ErrBlockOutOfRange = errors.New("block past the volume's end")
	// ErrNoDataDevice: external metadata was opened without
	// MDOptions.DataDevice, so the data cannot be made durable BEFORE the
	// checksums that describe it; give it to store checksums.
	ErrNoDataDevice = errors.New("checksums of external metadata need MDOptions.DataDevice")
)

// Syncer makes every completed write of a device durable.
type Syncer interface{ Sync() error }

// DefaultChecksumCachePages bounds the checksum pages a volume keeps in
// memory when MDOptions.ChecksumCachePages is zero: 1 MiB, the sums of
// 3.9 GiB of data.
const DefaultChecksumCachePages = 256

// sumPage is one checksum page in memory.
type sumPage struct {
	index int64
	known [sumKnownWords]uint64
	sums  [SumsPerPage]uint32
	// version counts the changes since load: a flush marks the page clean
	// only if it wrote the version the page still has.
	version uint64
	dirty   bool
	// lru is a clean page's place in the LRU list (nil: not in it).
	lru *list.Element
}

// ChecksumStats counts what the checksum store did since open.
type ChecksumStats struct {
	// Loads are pages read from the metadata device; Unknown those of
	// them that held no known sum (never written since create-md, or
	// torn: they failed their page checksum).
	Loads, Unknown int64
	// Evictions are clean pages dropped from memory to keep the bound.
	Evictions int64
	// PagesWritten are pages written by flushes (and a Grow's move);
	// Flushes the syncs after them; DataSyncs the syncs of the data
	// device an activity-log eviction made first.
	PagesWritten, Flushes, DataSyncs int64
}

// Checksums is the block checksums at rest of one volume (issue 29):
// one CRC-32C per 4 KiB block of the volume (internal/blocksum computes
// them; this store keeps what it is given), in pages of 990 blocks on the
// metadata device (layout.go), loaded on demand. At most
// MDOptions.ChecksumCachePages clean pages stay in memory, least recently
// used dropped first; a dirty page stays until a flush wrote it, so the
// memory is the bound plus the pages of the blocks written since the last
// flush. A block has a known sum or none: none until it is Set, after
// Forget, and when its page failed its checksum on load.
//
// Durability order: a dirty page reaches stable storage at Flush (the
// node calls it at FLUSH and FUA, after the data is synced) and, for the
// pages covering an extent the activity log evicts, BEFORE the AL
// transaction that gives the extent's slot away, after the data device
// is synced: data, then checksum page, then AL eviction
// (ActivityLog.commit). So after a crash only the blocks of the activity
// log's extents may hold data newer or older than their stored sum;
// recovery recomputes those (or takes them with a resync), and never
// calls them corrupt. Set only blocks of extents admitted to the
// activity log (every write the node applies, as primary or secondary),
// and BEFORE the write's ActivityLog.Done, or the rule does not cover
// them.
//
// It is safe for concurrent use. A Get or Set of a page not in memory
// reads it (one 4 KiB read) holding the store's lock.
type Checksums struct {
	md       *MD
	seed     uint64
	data     Syncer // syncs the data device; nil for external metadata opened without one
	capacity int

	// flushMu serialises the writers of pages on the device (flushes and
	// a Grow's move), so that a page's writes land in order.
	flushMu lockorder.Mutex

	mu             lockorder.Mutex
	offset         int64 // where the area lives; a Grow's move changes it holding flushMu and mu
	volume, blocks int64
	pages          map[int64]*sumPage
	dirty          map[int64]*sumPage
	lru            *list.List // the clean pages, least recently used first
	stats          ChecksumStats
}

func newChecksums(md *MD, opts MDOptions) *Checksums {
	c := &Checksums{
		md: md, seed: md.sb.ChecksumSeed, capacity: opts.ChecksumCachePages,
		offset: md.geo.checksumOffset, volume: md.volumeSize, blocks: blocksOf(md.volumeSize),
		pages: map[int64]*sumPage{}, dirty: map[int64]*sumPage{}, lru: list.New(),
	}
	if c.capacity <= 0 {
		c.capacity = DefaultChecksumCachePages
	}
	switch {
	case opts.DataDevice != nil:
		c.data = opts.DataDevice
	case md.geo.placement == Internal:
		c.data = md.dev // the data shares the device
	}
	return c
}

// Checksums returns the volume's block checksums, or false when its
// metadata has no checksum area (format 1: checksums off).
func (md *MD) Checksums() (*Checksums, bool) { return md.sums, md.sums != nil }

// Blocks is the number of 4 KiB blocks the store covers: those of the
// volume, the last one possibly partial.
func (c *Checksums) Blocks() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocks
}

// Get returns the stored sum of block, and whether one is known.
func (c *Checksums) Get(block int64) (sum uint32, known bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.page(block)
	if err != nil {
		return 0, false, err
	}
	defer c.evictOverCapacity()
	i := int(block - p.index*SumsPerPage)
	return p.sums[i], p.known[i/64]&(1<<(i%64)) != 0, nil
}

// GetRange fills sums and known with the blocks from first on, one entry
// each (len(sums) blocks; known must be as long).
func (c *Checksums) GetRange(first int64, sums []uint32, known []bool) error {
	if len(known) != len(sums) {
		return fmt.Errorf("checksums: %d sums and %d known flags", len(sums), len(known))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range sums {
		p, err := c.page(first + int64(k))
		if err != nil {
			return err
		}
		i := int(first + int64(k) - p.index*SumsPerPage)
		sums[k], known[k] = p.sums[i], p.known[i/64]&(1<<(i%64)) != 0
		c.evictOverCapacity()
	}
	return nil
}

// Set stores sum for block, in memory; the page becomes durable at the
// next flush that covers it.
func (c *Checksums) Set(block int64, sum uint32) error { return c.SetRange(block, []uint32{sum}) }

// SetRange stores sums for the blocks from first on, in memory. On error
// nothing is stored.
func (c *Checksums) SetRange(first int64, sums []uint32) error {
	if c.data == nil {
		return ErrNoDataDevice
	}
	return c.setRange(first, sums)
}

// setRange is SetRange for a caller that ordered the data itself.
func (c *Checksums) setRange(first int64, sums []uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(first, int64(len(sums))); err != nil {
		return err
	}
	defer c.evictOverCapacity()
	// Load every page first, so that a failed read stores nothing.
	for pi := first / SumsPerPage; pi <= (first+int64(len(sums))-1)/SumsPerPage; pi++ {
		if _, err := c.page(pi * SumsPerPage); err != nil {
			return err
		}
	}
	// Page by page, not block by block: one lookup, one copy, the known
	// bits a word at a time and one change counted per page (a 1 MiB
	// write's 256 blocks touch one or two pages).
	for len(sums) > 0 {
		p := c.pages[first/SumsPerPage]
		i := int(first - p.index*SumsPerPage)
		n := copy(p.sums[i:], sums)
		setBits(p.known[:], i, i+n)
		c.markDirty(p)
		first += int64(n)
		sums = sums[n:]
	}
	return nil
}

// setBits sets bits [from, to) of words.
func setBits(words []uint64, from, to int) {
	for from < to {
		bit := from % 64
		n := min(64-bit, to-from)
		words[from/64] |= ^uint64(0) >> (64 - n) << bit
		from += n
	}
}

// Forget drops the sums of every block [off, off+length) touches: they
// become unknown (a trimmed range, or the extents of the activity log
// after a crash, BEFORE their sums are built again).
func (c *Checksums) Forget(off, length int64) error {
	if off < 0 || length <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	first := off / bytesPerBit
	last := min((off+length-1)/bytesPerBit, c.blocks-1)
	if first > last {
		return nil
	}
	defer c.evictOverCapacity()
	for pi := first / SumsPerPage; pi <= last/SumsPerPage; pi++ {
		if _, err := c.page(pi * SumsPerPage); err != nil {
			return err
		}
	}
	for block := first; block <= last; block++ {
		p := c.pages[block/SumsPerPage]
		i := int(block - p.index*SumsPerPage)
		if p.known[i/64]&(1<<(i%64)) != 0 {
			p.known[i/64] &^= 1 << (i % 64)
			p.sums[i] = 0
			c.markDirty(p)
		}
	}
	return nil
}

// check refuses blocks [first, first+n) unless they lie in the volume.
// c.mu is held.
func (c *Checksums) check(first, n int64) error {
	if first < 0 || n < 0 || first+n > c.blocks {
		return fmt.Errorf("%w: blocks [%d, %d) of %d", ErrBlockOutOfRange, first, first+n, c.blocks)
	}
	return nil
}

// page returns the page holding block, reading it if it is not in
// memory. It drops no page: the caller calls evictOverCapacity once it is
// done with the pages it holds. c.mu is held.
func (c *Checksums) page(block int64) (*sumPage, error) {
	if err := c.check(block, 1); err != nil {
		return nil, err
	}
	pi := block / SumsPerPage
	if p := c.pages[pi]; p != nil {
		if p.lru != nil { // most recently used
			c.lru.MoveToBack(p.lru)
		}
		return p, nil
	}
	buf := make([]byte, MDBlockSize)
	if _, err := c.md.dev.ReadAt(buf, c.offset+pi*MDBlockSize); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read checksum page %d: %w", pi, err)
	}
	p := &sumPage{index: pi}
	c.stats.Loads++
	if !c.decodePage(p, buf) {
		c.stats.Unknown++
	}
	c.pages[pi] = p
	p.lru = c.lru.PushBack(p)
	return p, nil
}

// markDirty notes a change of p, which stays in memory until a flush
// writes it. c.mu is held.
func (c *Checksums) markDirty(p *sumPage) {
	p.version++
	if p.dirty {
		return
	}
	if p.lru != nil {
		c.lru.Remove(p.lru)
		p.lru = nil
	}
	p.dirty = true
	c.dirty[p.index] = p
}

// evictOverCapacity drops the least recently used clean pages while more
// than the bound are in memory. c.mu is held.
func (c *Checksums) evictOverCapacity() {
	for len(c.pages) > c.capacity && c.lru.Len() > 0 {
		p := c.lru.Remove(c.lru.Front()).(*sumPage)
		p.lru = nil
		delete(c.pages, p.index)
		c.stats.Evictions++
	}
}

// pageCRC is the checksum of an encoded page: the volume's UUID and the
// area's seed, then the page.
func (c *Checksums) pageCRC(b []byte) uint32 {
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], c.seed)
	crc := crc32.Update(0, castagnoli, c.md.volume[:])
	crc = crc32.Update(crc, castagnoli, seed[:])
	return crc32.Update(crc, castagnoli, b[4:])
}

// encodePage renders p for disk.
func (c *Checksums) encodePage(p *sumPage) []byte {
	b := make([]byte, MDBlockSize)
	le := binary.LittleEndian
	le.PutUint32(b[4:], uint32(p.index))
	for w, v := range p.known {
		le.PutUint64(b[sumKnownOffset+8*w:], v)
	}
	for i, s := range p.sums {
		le.PutUint32(b[sumPageHeaderSize+4*i:], s)
	}
	le.PutUint32(b[0:], c.pageCRC(b))
	return b
}

// decodePage fills p (its index set) from b; false, leaving p with no
// known sum, when b fails its checksum or names another page. Known
// bits past the volume's last block are dropped. c.mu is held.
func (c *Checksums) decodePage(p *sumPage, b []byte) bool {
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != c.pageCRC(b) || int64(le.Uint32(b[4:])) != p.index {
		return false
	}
	n := min(SumsPerPage, c.blocks-p.index*SumsPerPage)
	for i := range int(n) {
		if le.Uint64(b[sumKnownOffset+8*(i/64):])&(1<<(i%64)) != 0 {
			p.known[i/64] |= 1 << (i % 64)
			p.sums[i] = le.Uint32(b[sumPageHeaderSize+4*i:])
		}
	}
	return true
}

// Flush writes every dirty page and syncs the metadata device if it
// wrote any. Call it at FLUSH and FUA once the data is synced (and at a
// clean stop), so that the sums are durable with the data they describe.
func (c *Checksums) Flush() error {
	_, err := c.flushPages(0, -1, false)
	return err
}

// FlushRange writes the dirty pages covering the blocks that
// [off, off+length) touches, syncs if it wrote any, and returns how many
// it wrote.
func (c *Checksums) FlushRange(off, length int64) (int, error) {
	first, last, ok := c.pageRange(off, length)
	if !ok {
		return 0, nil
	}
	return c.flushPages(first, last, false)
}

// DirtyPagesCovering is the number of pages covering the blocks that
// [off, off+length) touches whose changes are not yet written: what an
// eviction of that range must make durable first.
func (c *Checksums) DirtyPagesCovering(off, length int64) int {
	first, last, ok := c.pageRange(off, length)
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.dirty {
		if i >= first && i <= last {
			n++
		}
	}
	return n
}

// pageRange is the pages covering the blocks [off, off+length) touches
// inside the volume.
func (c *Checksums) pageRange(off, length int64) (first, last int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if off < 0 || length <= 0 || off >= c.volume {
		return 0, 0, false
	}
	return off / bytesPerBit / SumsPerPage, min((off+length-1)/bytesPerBit, c.blocks-1) / SumsPerPage, true
}

// flushExtents makes the sums of the blocks of extents durable, for
// their eviction from the activity log: if a page covering them is
// dirty, the data device is synced FIRST (the sums must not describe
// data that a crash could still take back), then the pages are written
// and synced. It returns the pages written.
func (c *Checksums) flushExtents(extents []uint64) (int, error) {
	pages := map[int64]bool{}
	for _, e := range extents {
		if first, last, ok := c.pageRange(extentStart(e), ExtentSize); ok {
			for i := first; i <= last; i++ {
				pages[i] = true
			}
		}
	}
	if len(pages) == 0 {
		return 0, nil
	}
	return c.flush(func(i int64) bool { return pages[i] }, true)
}

// flushPages writes the dirty pages among [first, last] (last < 0: every
// page), syncing the data device first when syncData.
func (c *Checksums) flushPages(first, last int64, syncData bool) (int, error) {
	return c.flush(func(i int64) bool { return i >= first && (last < 0 || i <= last) }, syncData)
}

// FlushVia is Flush for internal metadata whose data and checksum pages
// one sync makes durable together: it writes every dirty page through w
// (the backing device, at the metadata's offsets, without making each
// write durable), then calls sync, and marks the pages clean only once
// sync returned. The order between the data and the pages does not
// matter here: a crash before sync returned leaves the blocks they
// describe in the activity log, whose sums recovery computes again
// (RebuildActivityLogChecksums). sync is called even when no page is
// dirty: it is the FLUSH's sync.
func (c *Checksums) FlushVia(w io.WriterAt, sync func() error) error {
	_, err := c.flushTo(func(int64) bool { return true }, false, w, sync)
	return err
}

// flush writes the dirty pages that want selects, in page order, syncing
// the data device BEFORE when syncData, and the metadata device after.
// A page changed meanwhile stays dirty.
func (c *Checksums) flush(want func(int64) bool, syncData bool) (int, error) {
	return c.flushTo(want, syncData, nil, nil)
}

// flushTo is flush through w and sync (the metadata device's, when nil);
// with w, sync runs even when no page is dirty.
func (c *Checksums) flushTo(want func(int64) bool, syncData bool, w io.WriterAt, sync func() error) (int, error) {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	type out struct {
		p       *sumPage
		version uint64
		data    []byte
	}
	var outs []out
	c.mu.Lock()
	for i, p := range c.dirty {
		if want(i) {
			outs = append(outs, out{p, p.version, c.encodePage(p)})
		}
	}
	offset := c.offset
	c.mu.Unlock()
	if w == nil {
		w, sync = c.md.dev, c.md.dev.Sync
	} else if len(outs) == 0 {
		return 0, sync()
	}
	if len(outs) == 0 {
		return 0, nil
	}
	slices.SortFunc(outs, func(x, y out) int { return compareUint64(uint64(x.p.index), uint64(y.p.index)) })
	// Without a data device (external metadata opened without one) the
	// pages changed only by Forget and recovery, which need no data
	// synced first: an unknown sum, or one of data synced already.
	if syncData && c.data != nil {
		if err := c.data.Sync(); err != nil {
			return 0, fmt.Errorf("sync the data before its checksums: %w", err)
		}
		c.mu.Lock()
		c.stats.DataSyncs++
		c.mu.Unlock()
	}
	for _, o := range outs {
		if _, err := w.WriteAt(o.data, offset+o.p.index*MDBlockSize); err != nil {
			return 0, fmt.Errorf("write checksum page %d: %w", o.p.index, err)
		}
	}
	if err := sync(); err != nil {
		return 0, fmt.Errorf("sync checksum pages: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.PagesWritten += int64(len(outs))
	c.stats.Flushes++
	for _, o := range outs {
		if o.p.version != o.version || c.pages[o.p.index] != o.p {
			continue // changed meanwhile: the next flush writes it
		}
		o.p.dirty = false
		delete(c.dirty, o.p.index)
		o.p.lru = c.lru.PushBack(o.p)
	}
	c.evictOverCapacity()
	return len(outs), nil
}

// ResidentPages is the number of pages in memory; DirtyPages those of
// them not yet written.
func (c *Checksums) ResidentPages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pages)
}

// DirtyPages is the number of pages changed since they were last written.
func (c *Checksums) DirtyPages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.dirty)
}

// MemoryBytes is the heap the pages in memory hold.
func (c *Checksums) MemoryBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(len(c.pages)) * int64(unsafe.Sizeof(sumPage{}))
}

// Stats returns the counters since open.
func (c *Checksums) Stats() ChecksumStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// grow makes the store cover a volume of volume bytes: the blocks gained
// have no known sum (their pages were never written under this area's
// seed, or, for the last page, have those bits clear).
func (c *Checksums) grow(volume int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if volume > c.volume {
		c.volume, c.blocks = volume, blocksOf(volume)
	}
}

// copyPagesTo writes the pages of the volume into the area at offset,
// for a Grow's move, without syncing: those in memory as they are now
// (their dirty marks stay), the others as the device holds them. The
// caller holds c.flushMu.
func (c *Checksums) copyPagesTo(offset int64) (int, error) {
	c.mu.Lock()
	n := ceilDiv64(c.blocks, SumsPerPage)
	c.mu.Unlock()
	buf := make([]byte, MDBlockSize)
	for i := range n {
		c.mu.Lock()
		if p := c.pages[i]; p != nil {
			copy(buf, c.encodePage(p))
		} else if _, err := c.md.dev.ReadAt(buf, c.offset+i*MDBlockSize); err != nil && !errors.Is(err, io.EOF) {
			c.mu.Unlock()
			return int(i), fmt.Errorf("read checksum page %d: %w", i, err)
		}
		c.mu.Unlock()
		if _, err := c.md.dev.WriteAt(buf, offset+i*MDBlockSize); err != nil {
			return int(i), fmt.Errorf("write checksum page %d: %w", i, err)
		}
	}
	c.mu.Lock()
	c.stats.PagesWritten += n
	c.mu.Unlock()
	return int(n), nil
}

// DataDevice is the volume's data as checksum recovery reads it.
type DataDevice interface {
	io.ReaderAt
	Sync() error
}

// ChecksumRecovery says what RebuildActivityLogChecksums did.
type ChecksumRecovery struct {
	// Extents and Blocks are the extents of the activity log whose sums
	// were computed again from the data, and their blocks.
	Extents int
	Blocks  int64
	// ForgotAll: the activity log could not be reconstructed
	// (LoadReport.ALIncomplete), so which blocks may be stale is unknown:
	// every sum was dropped (a new seed makes every page hold none), to
	// be built again by the full resync that follows or a scrub.
	ForgotAll bool
}

// RebuildActivityLogChecksums is checksum recovery after a crash: the
// blocks of the activity log's extents may hold data newer or older than
// their stored sums (every other block's sum is durable with its data,
// ActivityLog.commit), so their sums are computed again from the data
// and made durable. It syncs data FIRST, so that no sum describes data a
// power loss could still take back, and flushes the sums BEFORE it
// returns. Call it after opening the metadata of a node that went down
// as primary or applying writes (CrashedPrimary, CrashedReplica), BEFORE
// any read is verified and any write admitted. Without a checksum area
// it does nothing.
func (md *MD) RebuildActivityLogChecksums(data DataDevice) (ChecksumRecovery, error) {
	var rec ChecksumRecovery
	c := md.sums
	if c == nil {
		return rec, nil
	}
	if md.report.ALIncomplete {
		rec.ForgotAll = true
		return rec, md.forgetAllChecksums()
	}
	if err := data.Sync(); err != nil {
		return rec, fmt.Errorf("sync the data before its checksums: %w", err)
	}
	seed := blocksum.NewSeed(md.volume)
	volume := md.VolumeSize()
	buf := make([]byte, ExtentSize)
	sums := make([]uint32, 0, ExtentSize/bytesPerBit)
	for _, e := range md.al.ActiveExtents() {
		start := extentStart(e)
		if start >= volume {
			continue
		}
		n := min(int64(ExtentSize), volume-start)
		if _, err := data.ReadAt(buf[:n], start); err != nil && !errors.Is(err, io.EOF) {
			return rec, fmt.Errorf("read extent %d to rebuild its checksums: %w", e, err)
		}
		first := start / bytesPerBit
		sums = seed.Sums(sums[:0], uint64(first), buf[:n])
		if err := c.setRange(first, sums); err != nil {
			return rec, err
		}
		rec.Extents++
		rec.Blocks += int64(len(sums))
	}
	return rec, c.Flush()
}

// ForgetChecksums drops every stored sum at once, durably BEFORE it
// returns: every block then has no known sum until it is written or a
// scrub builds it. Without a checksum area it does nothing. The node
// calls it when checksums are turned on again after running with them
// off, when writes stored no sum: the sums from before would be stale.
func (md *MD) ForgetChecksums() error {
	if md.sums == nil {
		return nil
	}
	return md.forgetAllChecksums()
}

// forgetAllChecksums drops every stored sum at once: a superblock with a
// new seed, durable BEFORE it returns, under which no page on the device
// holds a known sum. Pages written meanwhile under either seed hold none
// under the other, so the order of the two does not matter.
func (md *MD) forgetAllChecksums() error {
	c := md.sums
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("checksum seed: %w", err)
	}
	seed := binary.LittleEndian.Uint64(b[:])
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	md.mu.Lock()
	defer md.mu.Unlock()
	next := md.sb.clone()
	next.Seq++
	next.ChecksumSeed = seed
	if err := md.writeSuperblock(&next); err != nil {
		return err
	}
	md.sb = next
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seed = seed
	c.pages, c.dirty = map[int64]*sumPage{}, map[int64]*sumPage{}
	c.lru.Init()
	return nil
}
