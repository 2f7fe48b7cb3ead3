package metadata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"unsafe"

	"github.com/replvol/replvol/internal/lockorder"
)

// bitmapPage is the in-memory bits of one on-disk page (4088 bytes).
type bitmapPage [bitmapPageWords]uint64

// fullPage stands for every all-set page: it is shared and never written
// to, so a fully out-of-sync volume costs no page memory.
var fullPage = func() *bitmapPage {
	var p bitmapPage
	for i := range p {
		p[i] = ^uint64(0)
	}
	return &p
}()

// PeerBitmap is the out-of-sync bitmap kept for one peer: 1 bit per 4 KiB
// block of the volume (MD.VolumeSize, never a block past it), in pages of
// 32704 blocks. A page is allocated only when it holds both set and clear
// bits: an all-clear page is nil and an all-set page shares one read-only
// page. A sparse or a fully set 1 TiB bitmap holds 81 KiB (the page table,
// 10 bytes per 128 MiB page); the worst case, every page mixed, is 32.1 KiB
// per GiB.
//
// SetBits and ClearBits change memory only; Flush writes the dirty pages
// (the caller decides when: at AL eviction, periodically, at stop). It is
// safe for concurrent use; flushes are serialised among themselves but do
// not block SetBits.
type PeerBitmap struct {
	md   *MD
	slot int
	node uint32

	flushMu lockorder.Mutex // serialises Flush/FlushRange so writes land in order

	mu     lockorder.Mutex
	volume int64 // bytes covered: the volume's size (MD.Grow extends it)
	blocks int64
	pages  []*bitmapPage
	counts []uint16 // set bits per page
	dirty  []uint64 // bit per page
	set    int64

	corrupt []int64 // pages that failed their checksum at load
	written int64   // pages written since open
}

// newPeerBitmap returns a clear bitmap covering the volume: its pages are
// the first ones of the slot, those past the volume's last page are never
// touched.
func newPeerBitmap(md *MD, slot int, node uint32) *PeerBitmap {
	blocks := blocksOf(md.volumeSize)
	n := ceilDiv64(blocks, BitsPerPage)
	return &PeerBitmap{
		md: md, slot: slot, node: node,
		volume: md.volumeSize, blocks: blocks,
		pages:  make([]*bitmapPage, n),
		counts: make([]uint16, n),
		dirty:  make([]uint64, ceilDiv64(n, 64)),
	}
}

// Node is the peer this bitmap tracks.
func (b *PeerBitmap) Node() uint32 { return b.node }

// Blocks returns the number of 4 KiB blocks the bitmap covers: those of
// the volume, the last one possibly partial.
func (b *PeerBitmap) Blocks() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.blocks
}

// pageOffset is where page i of this slot lives on the metadata device.
// The geometry changes only in MD.Grow, which holds every flushMu: call it
// holding b.flushMu, or before the bitmap is shared.
func (b *PeerBitmap) pageOffset(i int64) int64 { return pageOffsetIn(b.md.geo, b.slot, i) }

// pageOffsetIn is where page i of slot lives in geometry g.
func pageOffsetIn(g geometry, slot int, i int64) int64 {
	return g.bitmapOffset + (int64(slot)*g.bitmapPages+i)*MDBlockSize
}

func (b *PeerBitmap) markDirty(i int64) { b.dirty[i/64] |= 1 << (i % 64) }

// blockRange returns the blocks [first, last] touched by the part of
// [off, off+length) inside the volume; b.mu is held.
func (b *PeerBitmap) blockRange(off, length int64) (first, last int64, ok bool) {
	if length <= 0 || off < 0 || off >= b.volume {
		return 0, 0, false
	}
	first = off / bytesPerBit
	last = min((off+length-1)/bytesPerBit, b.blocks-1)
	return first, last, first <= last
}

// SetBits marks every block touched by [off, off+length) out of sync,
// ignoring the part of the range past the volume's end.
func (b *PeerBitmap) SetBits(off, length int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if first, last, ok := b.blockRange(off, length); ok {
		b.setRange(first, last, true)
	}
}

// ClearBits marks in sync the blocks that lie wholly inside
// [off, off+length): a block partly outside keeps its bit, except the
// volume's partial last block, cleared by a range reaching the volume's
// end.
func (b *PeerBitmap) ClearBits(off, length int64) {
	if off < 0 || length <= 0 {
		return
	}
	end := off + length
	first := ceilDiv64(off, bytesPerBit)
	last := end/bytesPerBit - 1
	b.mu.Lock()
	defer b.mu.Unlock()
	if end >= b.volume { // a partial last block counts as whole
		last = b.blocks - 1
	}
	if first <= last {
		b.setRange(first, min(last, b.blocks-1), false)
	}
}

// SetAll marks the whole volume out of sync (a full resync).
func (b *PeerBitmap) SetAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.blocks > 0 {
		b.setRange(0, b.blocks-1, true)
	}
}

// setRange sets or clears blocks [first, last]; b.mu is held.
func (b *PeerBitmap) setRange(first, last int64, on bool) {
	for first <= last {
		pi := first / BitsPerPage
		pb := int64(pageBlocks(b.blocks, pi))
		lo := first - pi*BitsPerPage
		hi := min(last-pi*BitsPerPage, pb-1)
		b.setInPage(pi, int(lo), int(hi), int(pb), on)
		first = pi*BitsPerPage + hi + 1
	}
}

// setInPage sets or clears bits [lo, hi] of page pi, which holds pb blocks.
func (b *PeerBitmap) setInPage(pi int64, lo, hi, pb int, on bool) {
	count := int(b.counts[pi])
	if (on && count == pb) || (!on && count == 0) {
		return
	}
	if on && lo == 0 && hi == pb-1 {
		b.set += int64(pb - count)
		b.pages[pi], b.counts[pi] = fullPage, uint16(pb)
		b.markDirty(pi)
		return
	}
	if !on && lo == 0 && hi == pb-1 {
		b.set -= int64(count)
		b.pages[pi], b.counts[pi] = nil, 0
		b.markDirty(pi)
		return
	}
	p := b.pages[pi]
	switch p {
	case nil:
		p = new(bitmapPage)
	case fullPage:
		p = new(bitmapPage)
		fillPage(p, pb)
	}
	changed := 0
	for i := lo; i <= hi; {
		w, bit := i/64, i%64
		n := min(64-bit, hi-i+1)
		mask := ^uint64(0) >> (64 - n) << bit
		if on {
			changed += bits.OnesCount64(mask &^ p[w])
			p[w] |= mask
		} else {
			changed += bits.OnesCount64(mask & p[w])
			p[w] &^= mask
		}
		i += n
	}
	if changed == 0 {
		return
	}
	if on {
		count += changed
		b.set += int64(changed)
	} else {
		count -= changed
		b.set -= int64(changed)
	}
	b.counts[pi] = uint16(count)
	switch count {
	case 0:
		p = nil
	case pb:
		p = fullPage
	}
	b.pages[pi] = p
	b.markDirty(pi)
}

// fillPage sets the first pb bits of p.
func fillPage(p *bitmapPage, pb int) {
	for i := 0; i < pb; i += 64 {
		p[i/64] = ^uint64(0) >> (64 - min(64, pb-i))
	}
}

// Test reports whether block is out of sync.
func (b *PeerBitmap) Test(block int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.test(block)
}

// test reports whether block is out of sync; b.mu is held.
func (b *PeerBitmap) test(block int64) bool {
	if block < 0 || block >= b.blocks {
		return false
	}
	p := b.pages[block/BitsPerPage]
	i := block % BitsPerPage
	return p != nil && p[i/64]&(1<<(i%64)) != 0
}

// Count returns the number of out-of-sync blocks.
func (b *PeerBitmap) Count() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.set
}

// Bytes returns the out-of-sync amount in bytes, counting the volume's
// partial last block for the part inside the volume only.
func (b *PeerBitmap) Bytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.set * bytesPerBit
	if past := b.blocks*bytesPerBit - b.volume; past > 0 && b.test(b.blocks-1) {
		n -= past
	}
	return n
}

// NextRun finds the first out-of-sync block at or after block from and
// returns the run of consecutive set blocks starting there, at most max
// blocks long. ok is false when no block at or after from is set. A run
// never ends past Blocks(); the volume's end may lie inside its last
// block, so clamp a run's byte range to MD.VolumeSize.
func (b *PeerBitmap) NextRun(from, max int64) (start, n int64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.nextSet(from)
	if i < 0 {
		return 0, 0, false
	}
	for n < max && b.test(i+n) {
		n++
	}
	return i, n, true
}

// nextSet returns the first set block at or after from, or -1.
func (b *PeerBitmap) nextSet(from int64) int64 {
	for i := max(from, 0); i < b.blocks; {
		pi := i / BitsPerPage
		p := b.pages[pi]
		if p == nil {
			i = (pi + 1) * BitsPerPage
			continue
		}
		j := i % BitsPerPage
		w := p[j/64] >> (j % 64)
		if w != 0 {
			if k := i + int64(bits.TrailingZeros64(w)); k < b.blocks {
				return k
			}
			return -1
		}
		i += 64 - j%64
	}
	return -1
}

// MemoryBytes returns the heap the bitmap holds: the page table plus the
// allocated pages (a 4088-byte page takes a 4096-byte allocation).
func (b *PeerBitmap) MemoryBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := int64(len(b.pages))*int64(unsafe.Sizeof((*bitmapPage)(nil))) + int64(len(b.counts))*2 + int64(len(b.dirty))*8
	for _, p := range b.pages {
		if p != nil && p != fullPage {
			n += MDBlockSize
		}
	}
	return n
}

// CorruptPages returns the pages that failed their checksum at load (their
// range was set).
func (b *PeerBitmap) CorruptPages() []int64 { return append([]int64(nil), b.corrupt...) }

// PagesWritten returns the number of pages written since open.
func (b *PeerBitmap) PagesWritten() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.written
}

// Flush writes every dirty page and syncs the device if it wrote any.
func (b *PeerBitmap) Flush() error {
	_, err := b.flushPages(0, -1)
	return err
}

// FlushRange writes the dirty pages covering [off, off+length), syncs the
// device if it wrote any, and returns how many it wrote.
func (b *PeerBitmap) FlushRange(off, length int64) (int, error) {
	b.mu.Lock()
	first, last, ok := b.blockRange(off, length)
	b.mu.Unlock()
	if !ok {
		return 0, nil
	}
	return b.flushPages(first/BitsPerPage, last/BitsPerPage)
}

// flushPages writes the dirty pages among [first, last] (last < 0: to the
// last page) and syncs.
func (b *PeerBitmap) flushPages(first, last int64) (int, error) {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	type out struct {
		page int64
		data []byte
	}
	var outs []out
	b.mu.Lock()
	if last < 0 {
		last = int64(len(b.pages)) - 1
	}
	for i := first; i <= last; i++ {
		if b.dirty[i/64]&(1<<(i%64)) == 0 {
			continue
		}
		b.dirty[i/64] &^= 1 << (i % 64)
		outs = append(outs, out{i, b.encodePage(i)})
	}
	b.mu.Unlock()
	if len(outs) == 0 {
		return 0, nil
	}
	fail := func(from int, err error) (int, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, o := range outs[from:] {
			b.markDirty(o.page)
		}
		return from, fmt.Errorf("write bitmap of peer %d: %w", b.node, err)
	}
	for k, o := range outs {
		if _, err := b.md.dev.WriteAt(o.data, b.pageOffset(o.page)); err != nil {
			return fail(k, err)
		}
	}
	if err := b.md.dev.Sync(); err != nil {
		return fail(0, err)
	}
	b.mu.Lock()
	b.written += int64(len(outs))
	b.mu.Unlock()
	return len(outs), nil
}

// pageCRC is the checksum of an encoded page.
func (b *PeerBitmap) pageCRC(page []byte) uint32 {
	var slot [4]byte
	binary.LittleEndian.PutUint32(slot[:], uint32(b.slot))
	crc := crc32.Update(0, castagnoli, b.md.volume[:])
	crc = crc32.Update(crc, castagnoli, slot[:])
	return crc32.Update(crc, castagnoli, page[4:])
}

// encodePage renders page i for disk; b.mu is held.
func (b *PeerBitmap) encodePage(i int64) []byte {
	out := make([]byte, MDBlockSize)
	binary.LittleEndian.PutUint32(out[4:], uint32(i))
	if p := b.pages[i]; p != nil {
		q := p
		if p == fullPage {
			q = new(bitmapPage)
			fillPage(q, pageBlocks(b.blocks, i))
		}
		for w, v := range q {
			binary.LittleEndian.PutUint64(out[bitmapPageHeaderSize+8*w:], v)
		}
	}
	binary.LittleEndian.PutUint32(out[0:], b.pageCRC(out))
	return out
}

// decodePage loads page i from its on-disk form; ok is false when the
// checksum or index is wrong. b.mu is held or b is not yet shared.
func (b *PeerBitmap) decodePage(i int64, data []byte) (ok bool) {
	if binary.LittleEndian.Uint32(data[0:]) != b.pageCRC(data) || binary.LittleEndian.Uint32(data[4:]) != uint32(i) {
		return false
	}
	pb := pageBlocks(b.blocks, i)
	var p bitmapPage
	count := 0
	for w := range p {
		v := binary.LittleEndian.Uint64(data[bitmapPageHeaderSize+8*w:])
		if lo := w * 64; lo >= pb {
			v = 0
		} else if pb-lo < 64 {
			v &= ^uint64(0) >> (64 - (pb - lo))
		}
		p[w] = v
		count += bits.OnesCount64(v)
	}
	b.counts[i] = uint16(count)
	b.set += int64(count)
	switch count {
	case 0:
		b.pages[i] = nil
	case pb:
		b.pages[i] = fullPage
	default:
		b.pages[i] = &p
	}
	return true
}

// loadBatch is how many pages a load reads at once.
const loadBatch = 64

// loadPeerBitmap reads and verifies the pages of slot that cover the
// volume; the bits past the volume's end are ignored. A page that fails
// its checksum is taken as all-set and left dirty.
func loadPeerBitmap(md *MD, slot int, node uint32) (*PeerBitmap, []CorruptPage, error) {
	b := newPeerBitmap(md, slot, node)
	var corrupt []CorruptPage
	buf := make([]byte, loadBatch*MDBlockSize)
	n := int64(len(b.pages))
	for first := int64(0); first < n; first += loadBatch {
		k := min(loadBatch, n-first)
		chunk := buf[:k*MDBlockSize]
		clear(chunk) // a short read leaves zeros, which fail the checksum
		if _, err := md.dev.ReadAt(chunk, b.pageOffset(first)); err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("read bitmap of peer %d: %w", node, err)
		}
		for j := int64(0); j < k; j++ {
			i := first + j
			if b.decodePage(i, chunk[j*MDBlockSize:(j+1)*MDBlockSize]) {
				continue
			}
			pb := int64(pageBlocks(b.blocks, i))
			b.setInPage(i, 0, int(pb-1), int(pb), true)
			b.corrupt = append(b.corrupt, i)
			corrupt = append(corrupt, CorruptPage{
				Peer: node, Page: i,
				Offset: i * BitsPerPage * bytesPerBit,
				Length: min(pb*bytesPerBit, md.volumeSize-i*BitsPerPage*bytesPerBit),
			})
		}
	}
	return b, corrupt, nil
}

// writeAllPages writes every page covering the volume (clear) for
// CreateMD, without syncing.
func (b *PeerBitmap) writeAllPages() error {
	const batch = 64
	n := int64(len(b.pages))
	buf := make([]byte, 0, batch*MDBlockSize)
	for first := int64(0); first < n; first += batch {
		buf = buf[:0]
		for i := first; i < min(first+batch, n); i++ {
			buf = append(buf, b.encodePage(i)...)
		}
		if _, err := b.md.dev.WriteAt(buf, b.pageOffset(first)); err != nil {
			return fmt.Errorf("write bitmap of peer %d: %w", b.node, err)
		}
	}
	return nil
}
