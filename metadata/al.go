package metadata

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/replvol/replvol/internal/lockorder"
)

// AL transaction types.
const (
	alTypeUpdate = 1
	alTypeInit   = 2
	// alNoExtent marks an empty AL slot.
	alNoExtent = 0xFFFFFFFF
)

// alUpdate puts Extent into AL slot Slot.
type alUpdate struct {
	Slot   uint16
	Extent uint32
}

// alTransaction is one 4 KiB block of the AL ring.
type alTransaction struct {
	Type         uint32
	Seq          uint64
	ALExtents    uint32
	Updates      []alUpdate
	ContextStart uint32
	Context      []uint32
}

// alCRC is the checksum of an AL block: the volume UUID then the block,
// so that a block left over from other metadata never passes.
func alCRC(volume VolumeUUID, b []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, volume[:]), castagnoli, b[:crcOffset])
}

// encodeALTransaction renders tx as one 4 KiB block.
func encodeALTransaction(volume VolumeUUID, tx *alTransaction) []byte {
	if len(tx.Updates) > alUpdatesPerTx || len(tx.Context) > alContextPerTx {
		panic(fmt.Sprintf("AL transaction with %d updates and %d context entries", len(tx.Updates), len(tx.Context)))
	}
	b := make([]byte, MDBlockSize)
	le := binary.LittleEndian
	copy(b[0:4], alMagic)
	le.PutUint32(b[4:], tx.Type)
	le.PutUint64(b[8:], tx.Seq)
	le.PutUint32(b[16:], tx.ALExtents)
	le.PutUint16(b[20:], uint16(len(tx.Updates)))
	le.PutUint16(b[22:], uint16(len(tx.Context)))
	le.PutUint32(b[24:], tx.ContextStart)
	for i, u := range tx.Updates {
		le.PutUint16(b[alUpdatesOffset+2*i:], u.Slot)
		le.PutUint32(b[alExtentsOffset+4*i:], u.Extent)
	}
	for i, e := range tx.Context {
		le.PutUint32(b[alContextOffset+4*i:], e)
	}
	le.PutUint32(b[crcOffset:], alCRC(volume, b))
	return b
}

// errNotALTransaction is a ring block that holds no transaction.
var errNotALTransaction = errors.New("not an AL transaction")

// decodeALTransaction parses one ring block of volume. Any block that is
// not a whole, self-consistent transaction is an error: torn, never
// written, or from other metadata.
func decodeALTransaction(volume VolumeUUID, b []byte) (alTransaction, error) {
	var tx alTransaction
	le := binary.LittleEndian
	if len(b) != MDBlockSize || string(b[0:4]) != alMagic {
		return tx, errNotALTransaction
	}
	if got, want := alCRC(volume, b), le.Uint32(b[crcOffset:]); got != want {
		return tx, fmt.Errorf("%w: checksum %08x, want %08x (torn or foreign)", errNotALTransaction, got, want)
	}
	tx.Type = le.Uint32(b[4:])
	tx.Seq = le.Uint64(b[8:])
	tx.ALExtents = le.Uint32(b[16:])
	nUpdates, nContext := int(le.Uint16(b[20:])), int(le.Uint16(b[22:]))
	tx.ContextStart = le.Uint32(b[24:])
	switch {
	case tx.Type != alTypeUpdate && tx.Type != alTypeInit:
		return tx, fmt.Errorf("%w: type %d", errNotALTransaction, tx.Type)
	case tx.ALExtents < MinALExtents || tx.ALExtents > MaxALExtents:
		return tx, fmt.Errorf("%w: %d AL extents", errNotALTransaction, tx.ALExtents)
	case nUpdates > alUpdatesPerTx || nContext > alContextPerTx:
		return tx, fmt.Errorf("%w: %d updates, %d context entries", errNotALTransaction, nUpdates, nContext)
	case uint64(tx.ContextStart)+uint64(nContext) > uint64(tx.ALExtents):
		return tx, fmt.Errorf("%w: context [%d,+%d) beyond %d slots", errNotALTransaction, tx.ContextStart, nContext, tx.ALExtents)
	}
	tx.Updates = make([]alUpdate, nUpdates)
	for i := range tx.Updates {
		u := alUpdate{Slot: le.Uint16(b[alUpdatesOffset+2*i:]), Extent: le.Uint32(b[alExtentsOffset+4*i:])}
		if uint32(u.Slot) >= tx.ALExtents {
			return tx, fmt.Errorf("%w: update of slot %d of %d", errNotALTransaction, u.Slot, tx.ALExtents)
		}
		tx.Updates[i] = u
	}
	tx.Context = make([]uint32, nContext)
	for i := range tx.Context {
		tx.Context[i] = le.Uint32(b[alContextOffset+4*i:])
	}
	return tx, nil
}

// ALStats counts what the activity log did since open.
type ALStats struct {
	// Hits are extents admitted while hot: no metadata I/O.
	Hits int64
	// Misses are cold extents admitted (each in some transaction).
	Misses int64
	// Transactions are AL blocks written; Commits the syncs after them.
	Transactions int64
	Commits      int64
	// Evictions are extents that left the AL; BitmapPagesFlushed the
	// bitmap pages written out for them first.
	Evictions          int64
	BitmapPagesFlushed int64
	// ChecksumPagesFlushed are the checksum pages written out for the
	// evicted extents first (format 2).
	ChecksumPagesFlushed int64
}

// ActivityLog is the set of "hot" 4 MiB extents in which writes may be in
// flight (DRBD's activity log, research/anchors-replication.md §1.3). A
// write to a hot extent costs no metadata I/O. A write to a cold extent
// waits in Admit until ONE transaction naming it is on stable storage,
// BEFORE the data write is issued; admissions that arrive while a
// transaction is being written are batched into the next one (group
// commit). An extent leaves the AL only when no write is in flight in it
// (least recently used first), and its checksum pages (after its data)
// and bitmap pages are on stable storage BEFORE the transaction that
// gives its slot away.
//
// After a crash as primary, ActiveExtents lists every extent a write may
// have reached without its peers: MD.ApplyActivityLog marks them.
//
// It is safe for concurrent use. Admit blocks (on I/O, or until an extent
// can be evicted) and honours its context; Done never blocks.
type ActivityLog struct {
	md          *MD
	slots       int
	ringBlocks  int
	txPerCommit int
	// ringOffset is where the ring lives on the metadata device. MD.Grow
	// moves it, owning the log (committing) meanwhile.
	ringOffset int64

	mu      lockorder.Mutex
	extents map[uint64]*alExtent
	// lru holds the committed extents with no write in flight, oldest
	// first: an intrusive list (alExtent.prev, .next), so that a write
	// to a hot extent allocates nothing.
	lruHead, lruTail *alExtent
	free             []int    // free slots
	next             *alBatch // admissions waiting for the next commit
	committing       bool     // a leader is writing a batch
	// changed is closed by signal for the goroutines waiting for a
	// Done or a commit; nil while nobody waits (waitChan makes it).
	changed   chan struct{}
	failed    error
	stats     ALStats
	onEnqueue func() // test hook: a cold extent joined the next batch

	// Owned by the goroutine that set committing (or by open/create).
	disk   []uint32 // slot contents as last written
	seq    uint64   // Seq of the last transaction written
	cursor int      // first slot of the next context
}

type alExtent struct {
	number uint64
	slot   int
	refs   int
	batch  *alBatch // non-nil until the transaction naming it is durable
	// inLRU: in the lru list, between prev and next.
	inLRU      bool
	prev, next *alExtent
}

type alBatch struct {
	updates []alUpdate
	evicted []uint64
	extents []*alExtent
	done    chan struct{}
	err     error
}

func newBatch() *alBatch { return &alBatch{done: make(chan struct{})} }

func newActivityLog(md *MD) *ActivityLog {
	n := md.geo.alExtents
	a := &ActivityLog{
		md: md, slots: n, ringBlocks: md.geo.alBlocks, ringOffset: md.geo.alOffset,
		txPerCommit: alTxPerCommit(n, md.geo.alBlocks),
		extents:     map[uint64]*alExtent{},
		next:        newBatch(),
		disk:        make([]uint32, n),
	}
	for i := range a.disk {
		a.disk[i] = alNoExtent
	}
	return a
}

// createActivityLog clears the ring and writes transactions that describe
// every slot as empty, without syncing.
func createActivityLog(md *MD) (*ActivityLog, error) {
	a := newActivityLog(md)
	zero := make([]byte, int64(a.ringBlocks)*MDBlockSize)
	if _, err := md.dev.WriteAt(zero, md.geo.alOffset); err != nil {
		return nil, fmt.Errorf("clear activity log: %w", err)
	}
	for range ceilDiv(a.slots, alContextPerTx) {
		if err := a.writeTransaction(alTypeInit, nil); err != nil {
			return nil, err
		}
	}
	a.stats = ALStats{}
	a.resetHotSet()
	return a, nil
}

// loadActivityLog replays the valid transactions of the ring in Seq order.
func loadActivityLog(md *MD) (*ActivityLog, error) {
	a := newActivityLog(md)
	ring := make([]byte, int64(a.ringBlocks)*MDBlockSize)
	if _, err := md.dev.ReadAt(ring, md.geo.alOffset); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read activity log: %w", err)
	}
	var txs []alTransaction
	for i := range a.ringBlocks {
		tx, err := decodeALTransaction(md.volume, ring[i*MDBlockSize:(i+1)*MDBlockSize])
		if err != nil || tx.ALExtents != uint32(a.slots) || tx.Seq%uint64(a.ringBlocks) != uint64(i) {
			md.report.ALInvalid++
			continue
		}
		txs = append(txs, tx)
	}
	slices.SortFunc(txs, func(x, y alTransaction) int { return compareUint64(x.Seq, y.Seq) })
	known := make([]bool, a.slots)
	for _, tx := range txs {
		for _, u := range tx.Updates {
			a.disk[u.Slot], known[u.Slot] = u.Extent, true
		}
		for i, e := range tx.Context {
			s := int(tx.ContextStart) + i
			a.disk[s], known[s] = e, true
		}
		a.seq = tx.Seq
		a.cursor = (int(tx.ContextStart) + len(tx.Context)) % a.slots
	}
	md.report.ALTransactions = len(txs)
	md.report.ALIncomplete = slices.Contains(known, false)
	a.resetHotSet()
	return a, nil
}

func compareUint64(x, y uint64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// resetHotSet builds the in-memory hot set from a.disk: every extent in a
// slot is committed, with no write in flight.
func (a *ActivityLog) resetHotSet() {
	a.free = a.free[:0]
	for s := a.slots - 1; s >= 0; s-- {
		e := a.disk[s]
		if e == alNoExtent || a.extents[uint64(e)] != nil {
			a.free = append(a.free, s)
			continue
		}
		x := &alExtent{number: uint64(e), slot: s}
		a.lruPushBack(x)
		a.extents[uint64(e)] = x
	}
}

// Admit makes the extents that [off, off+length) touches hot, writing and
// syncing an AL transaction for the cold ones, BEFORE it returns: only then
// may the data write be issued. Every successful Admit must be followed by
// Done with the same range once the write completes. A hot extent costs
// no I/O. On error nothing is admitted.
func (a *ActivityLog) Admit(ctx context.Context, off, length int64) error {
	if length <= 0 {
		return nil
	}
	first, last := extentOf(off), extentOf(off+length-1)
	if last >= alNoExtent {
		return fmt.Errorf("activity log: extent %d beyond the format's range", last)
	}
	var wait []*alBatch
	a.mu.Lock()
	for {
		if a.failed != nil {
			a.mu.Unlock()
			return a.failed
		}
		wait = wait[:0]
		e := first
		for ; e <= last; e++ {
			x := a.acquire(e)
			if x == nil {
				break
			}
			if x.batch != nil && !slices.Contains(wait, x.batch) {
				wait = append(wait, x.batch)
			}
		}
		if e > last {
			break
		}
		// Every slot has a write in flight or is not yet committed. Give
		// back what this write holds (all or nothing, so that writes
		// spanning extents cannot deadlock), make sure queued extents get
		// committed, and wait for a Done.
		a.releaseLocked(first, e)
		if !a.committing && len(a.next.updates) > 0 {
			a.commitQueued()
			continue
		}
		ch := a.waitChan()
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		a.mu.Lock()
	}
	a.mu.Unlock()
	for _, b := range wait {
		if err := a.await(ctx, b); err != nil {
			a.Done(off, length)
			return err
		}
	}
	return nil
}

// acquire takes a reference on extent e, making it hot (queued for the
// next transaction) if it was cold and a slot can be had: a free one, or
// that of the least recently used extent with no write in flight. It
// returns nil when no slot can. a.mu is held.
func (a *ActivityLog) acquire(e uint64) *alExtent {
	if x := a.extents[e]; x != nil {
		x.refs++
		if x.inLRU {
			a.lruRemove(x)
		}
		if x.batch == nil {
			a.stats.Hits++
		}
		return x
	}
	slot := -1
	if n := len(a.free); n > 0 {
		slot, a.free = a.free[n-1], a.free[:n-1]
	} else if v := a.lruHead; v != nil {
		a.lruRemove(v)
		delete(a.extents, v.number)
		slot = v.slot
		a.next.evicted = append(a.next.evicted, v.number)
		a.stats.Evictions++
	}
	if slot < 0 {
		return nil
	}
	x := &alExtent{number: e, slot: slot, refs: 1, batch: a.next}
	a.extents[e] = x
	a.next.updates = append(a.next.updates, alUpdate{Slot: uint16(slot), Extent: uint32(e)})
	a.next.extents = append(a.next.extents, x)
	a.stats.Misses++
	if a.onEnqueue != nil {
		a.onEnqueue()
	}
	return x
}

// await returns once batch b is durable. If no commit is running, the
// caller becomes the leader and commits b and whatever queues meanwhile.
func (a *ActivityLog) await(ctx context.Context, b *alBatch) error {
	a.mu.Lock()
	for {
		select {
		case <-b.done:
			a.mu.Unlock()
			return b.err
		default:
		}
		if !a.committing {
			a.commitQueued()
			continue
		}
		a.mu.Unlock()
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		a.mu.Lock()
	}
}

// commitQueued writes the queued batches until none is left. a.mu is held
// on entry and exit, and released during I/O.
func (a *ActivityLog) commitQueued() {
	for len(a.next.updates) > 0 && a.failed == nil {
		b := a.next
		a.next = newBatch()
		a.committing = true
		a.mu.Unlock()
		err := a.commit(b)
		a.mu.Lock()
		a.committing = false
		if err != nil {
			a.failed = fmt.Errorf("activity log failed, the disk must be detached: %w", err)
			err = a.failed
		}
		b.err = err
		for _, x := range b.extents {
			x.batch = nil
			if x.refs == 0 && a.extents[x.number] == x {
				a.lruPushBack(x)
			}
		}
		close(b.done)
		a.signal()
	}
	if a.failed != nil && len(a.next.updates) > 0 {
		b := a.next
		a.next = newBatch()
		b.err = a.failed
		close(b.done)
	}
}

// signal wakes the admissions waiting for an evictable extent.
func (a *ActivityLog) signal() {
	if a.changed != nil {
		close(a.changed)
		a.changed = nil
	}
}

// waitChan is the channel the next signal closes. a.mu is held.
func (a *ActivityLog) waitChan() chan struct{} {
	if a.changed == nil {
		a.changed = make(chan struct{})
	}
	return a.changed
}

// lruPushBack puts x, not in the list, at its end. a.mu is held.
func (a *ActivityLog) lruPushBack(x *alExtent) {
	x.prev, x.next, x.inLRU = a.lruTail, nil, true
	if a.lruTail != nil {
		a.lruTail.next = x
	} else {
		a.lruHead = x
	}
	a.lruTail = x
}

// lruRemove takes x out of the list. a.mu is held.
func (a *ActivityLog) lruRemove(x *alExtent) {
	if x.prev != nil {
		x.prev.next = x.next
	} else {
		a.lruHead = x.next
	}
	if x.next != nil {
		x.next.prev = x.prev
	} else {
		a.lruTail = x.prev
	}
	x.prev, x.next, x.inLRU = nil, nil, false
}

// commit makes batch b durable: the checksum pages of the evicted
// extents first, after the data they describe (synced), then their bitmap
// pages (synced), then the transactions, synced.
//
// AN EXTENT LEAVES THE ACTIVITY LOG ONLY ONCE THE CHECKSUMS OF ITS BLOCKS
// ARE DURABLE, AND THE DATA THEY DESCRIBE BEFORE THEM: after a crash,
// recovery recomputes the sums of the extents still in the log and
// trusts every other stored sum (TestALEvictionMakesTheChecksumsDurable).
func (a *ActivityLog) commit(b *alBatch) error {
	if a.md.sums != nil && len(b.evicted) > 0 {
		n, err := a.md.sums.flushExtents(b.evicted)
		a.mu.Lock()
		a.stats.ChecksumPagesFlushed += int64(n)
		a.mu.Unlock()
		if err != nil {
			return err
		}
	}
	for _, e := range b.evicted {
		n, err := a.md.flushBitmapRange(extentStart(e), ExtentSize)
		a.mu.Lock()
		a.stats.BitmapPagesFlushed += int64(n)
		a.mu.Unlock()
		if err != nil {
			return err
		}
	}
	ups := b.updates
	for len(ups) > 0 {
		for k := 0; k < a.txPerCommit && len(ups) > 0; k++ {
			n := min(alUpdatesPerTx, len(ups))
			if err := a.writeTransaction(alTypeUpdate, ups[:n]); err != nil {
				return err
			}
			ups = ups[n:]
		}
		if err := a.md.dev.Sync(); err != nil {
			return fmt.Errorf("sync activity log: %w", err)
		}
		a.mu.Lock()
		a.stats.Commits++
		a.mu.Unlock()
	}
	return nil
}

// writeTransaction applies ups to a.disk and writes the next transaction,
// with the next window of context, without syncing.
func (a *ActivityLog) writeTransaction(typ uint32, ups []alUpdate) error {
	for _, u := range ups {
		a.disk[u.Slot] = u.Extent
	}
	seq, cursor, err := a.writeNext(a.ringOffset, typ, ups, a.seq, a.cursor)
	if err != nil {
		return err
	}
	a.seq, a.cursor = seq, cursor
	a.mu.Lock()
	a.stats.Transactions++
	a.mu.Unlock()
	return nil
}

// writeNext writes, into the ring at ring, the transaction that follows
// seq with the window of context at cursor, and returns the Seq and
// cursor after it. It changes nothing in a.
func (a *ActivityLog) writeNext(ring int64, typ uint32, ups []alUpdate, seq uint64, cursor int) (uint64, int, error) {
	n := min(alContextPerTx, a.slots-cursor)
	tx := alTransaction{
		Type: typ, Seq: seq + 1, ALExtents: uint32(a.slots), Updates: ups,
		ContextStart: uint32(cursor), Context: a.disk[cursor : cursor+n],
	}
	off := ring + int64(tx.Seq%uint64(a.ringBlocks))*MDBlockSize
	if _, err := a.md.dev.WriteAt(encodeALTransaction(a.md.volume, &tx), off); err != nil {
		return seq, cursor, fmt.Errorf("write activity log: %w", err)
	}
	return tx.Seq, (cursor + n) % a.slots, nil
}

// own waits for a commit under way to end and takes the ring for the
// caller: no transaction is written until release. Admissions of hot
// extents go on meanwhile; cold ones wait. A failed log refuses.
func (a *ActivityLog) own() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.committing {
		ch := a.waitChan()
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
	if a.failed != nil {
		return a.failed
	}
	a.committing = true
	return nil
}

// release gives the ring back after own, committing what queued
// meanwhile. fail, when not nil, fails the log instead (the disk must be
// detached).
func (a *ActivityLog) release(fail error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.committing = false
	if fail != nil && a.failed == nil {
		a.failed = fmt.Errorf("activity log failed, the disk must be detached: %w", fail)
	}
	a.commitQueued()
	a.signal()
}

// writeRingAt writes, into a zeroed ring at ring, transactions that
// describe every slot as a.disk holds it (the slots as last committed),
// without syncing, and returns the Seq and cursor after them. The caller
// owns the log.
func (a *ActivityLog) writeRingAt(ring int64) (uint64, int, error) {
	zero := make([]byte, int64(a.ringBlocks)*MDBlockSize)
	if _, err := a.md.dev.WriteAt(zero, ring); err != nil {
		return a.seq, a.cursor, fmt.Errorf("clear activity log: %w", err)
	}
	seq, cursor := a.seq, a.cursor
	for covered := 0; covered < a.slots; {
		covered += min(alContextPerTx, a.slots-cursor)
		var err error
		if seq, cursor, err = a.writeNext(ring, alTypeUpdate, nil, seq, cursor); err != nil {
			return seq, cursor, err
		}
	}
	return seq, cursor, nil
}

// Done releases the extents of a write admitted with the same range.
func (a *ActivityLog) Done(off, length int64) {
	if length <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(extentOf(off), extentOf(off+length-1)+1)
}

// releaseLocked drops one reference on extents [first, end). a.mu is held.
func (a *ActivityLog) releaseLocked(first, end uint64) {
	for e := first; e < end; e++ {
		x := a.extents[e]
		if x == nil || x.refs == 0 {
			panic(fmt.Sprintf("activity log: Done on extent %d without Admit", e))
		}
		x.refs--
		if x.refs == 0 && x.batch == nil {
			a.lruPushBack(x)
			a.signal()
		}
	}
}

// ActiveExtents returns, sorted, every extent in the activity log: after
// opening the metadata of a crashed primary, the extents that may hold
// writes its peers never received.
func (a *ActivityLog) ActiveExtents() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]uint64, 0, len(a.extents))
	for e := range a.extents {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// Stats returns the counters since open.
func (a *ActivityLog) Stats() ALStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Extents returns the number of AL slots (al-extents).
func (a *ActivityLog) Extents() int { return a.slots }

// Reset clears a failure once the disk works again (a re-attach): it
// writes the whole in-memory hot set to the ring, durably, so that the
// log covers every extent admitted since, and lets admissions go on. On
// error the log stays failed.
func (a *ActivityLog) Reset() error {
	a.mu.Lock()
	if a.failed == nil {
		a.mu.Unlock()
		return nil
	}
	for a.committing {
		ch := a.waitChan()
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
	a.committing = true // this goroutine owns the ring fields now
	for i := range a.disk {
		a.disk[i] = alNoExtent
	}
	for _, x := range a.extents {
		a.disk[x.slot] = uint32(x.number)
	}
	a.mu.Unlock()
	var err error
	for range ceilDiv(a.slots, alContextPerTx) {
		if err = a.writeTransaction(alTypeUpdate, nil); err != nil {
			break
		}
	}
	if err == nil {
		err = a.md.dev.Sync()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.committing = false
	if err == nil {
		a.failed = nil
	}
	a.signal()
	return err
}
