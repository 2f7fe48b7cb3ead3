package apply

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/replvol/replvol/replication"
)

// ErrStopped is Apply's answer once the stream was stopped (Stop): a
// stream that replaced it, or the volume's end, owns the disk now, and
// nothing of the batch was applied.
var ErrStopped = errors.New("replaced or stopped")

// Stream is a secondary's end of the stream from its primary: what
// applying it keeps from one batch to the next (the primary it comes
// from, its replication state, a failure to report) and the lock that
// keeps a batch whole against Stop and Exclusive.
type Stream struct {
	from string
	// prev is the stream this one replaces (nil: none, or stopped
	// already), which Exclusive and Apply stop first: until the handler
	// stops it, a batch of the old stream could still be applied beside
	// what holds the new one. Dropped once stopped, so that a chain of
	// replaced streams is not kept.
	prev atomic.Pointer[Stream]

	// applyMu is held while a batch is applied; once stopped is set no
	// further batch of this stream touches the disk.
	applyMu mutex
	stopped bool
	// failed, once set (Fail), fails the next batch as a failed write
	// does; guarded by applyMu.
	failed error

	st atomic.Pointer[replication.ReplState]
}

// NewStream is the end of a stream from the primary named from.
func NewStream(from string) *Stream { return &Stream{from: from} }

// NewStreamAfter is NewStream for a stream that replaces prev (nil:
// none): what holds the new stream (Exclusive) holds off prev's batches
// too, by stopping prev first, which the handler that replaces it does
// anyway before the new stream applies anything.
func NewStreamAfter(from string, prev *Stream) *Stream {
	in := &Stream{from: from}
	in.prev.Store(prev)
	return in
}

// stopPrev stops the stream this one replaced, if any, and forgets it.
func (in *Stream) stopPrev() {
	if prev := in.prev.Load(); prev != nil {
		prev.Stop()
		in.prev.Store(nil)
	}
}

// From names the primary the stream comes from.
func (in *Stream) From() string { return in.from }

// State is the stream's replication state ("" until one is set).
func (in *Stream) State() replication.ReplState {
	if st := in.st.Load(); st != nil {
		return *st
	}
	return ""
}

// SetState sets the stream's replication state.
func (in *Stream) SetState(s replication.ReplState) { in.st.Store(&s) }

// Stop ends the stream's effect on the disk: it returns after any batch
// being applied is done, and no later batch is applied. The stream itself
// ends when its handler next wakes up.
func (in *Stream) Stop() {
	in.applyMu.Lock()
	in.stopped = true
	in.applyMu.Unlock()
}

// Fail makes the next batch fail as if the disk had failed a write of
// it (err), applying nothing of it: its ack says AckIOError, so the
// primary takes this node's disk for failed and marks what it sent, as
// after a failed write. A secondary whose disk it detaches otherwise
// (its bad-block list is full) calls it.
func (in *Stream) Fail(err error) {
	in.applyMu.Lock()
	defer in.applyMu.Unlock()
	in.failed = err
}

// Exclusive runs f while no batch of the stream is applied (holding its
// apply lock), and reports whether it ran: not once the stream is stopped.
// A secondary's scrub reads and repairs its blocks in it, so that a block
// it finds bad is not one a batch is writing, and a repair never
// overwrites a newer write. f must not wait for the primary. The stream
// this one replaced is stopped first (NewStreamAfter): no batch of it is
// applied while f runs either.
func (in *Stream) Exclusive(f func()) bool {
	in.stopPrev()
	in.applyMu.Lock()
	defer in.applyMu.Unlock()
	if in.stopped {
		return false
	}
	f()
	return true
}

// Batch is one decoded frame of the stream, as Apply takes it.
type Batch struct {
	// Entries are applied in order.
	Entries []replication.Entry
	// ReadReply answers an OpRead or OpVerify entry, BEFORE the batch's
	// ack; an error from it ends the batch with AckIOError. Nil when the
	// batch holds neither.
	ReadReply func(seq uint64, st replication.AckStatus, data []byte) error
	// Applying, when set, is told true once the batch starts on the disk
	// (the stream's apply lock held, the stream not stopped) and false
	// once it is done: applier.Run paces the empty acks of a long apply
	// by it.
	Applying func(bool)
}

// Apply is the step of the receiving side: it applies one batch of the
// stream to v, in order, and returns the batch's ack (its last entry's
// Seq; AckIOError once an entry failed on the disk, which the volume's
// State was told, and AckChecksum for a block that does not match the
// checksum it came with, nothing of the batch written). Entries flagged
// FUA, and flushes, are durable BEFORE it returns; so is what a sync
// start or a sync end records. It runs on the caller's goroutine, starts
// none, reads no clock and waits on nothing but v's disk, activity log
// and State (and b.ReadReply): applier.Run calls it for each frame, and
// the simulation (node/sim) calls it for each batch a primary ships.
// It holds the stream's apply lock throughout; once the stream is
// stopped it applies nothing and returns ErrStopped.
func (in *Stream) Apply(v *Volume, b Batch) (replication.Ack, error) {
	in.stopPrev()
	in.applyMu.Lock()
	defer in.applyMu.Unlock()
	if in.stopped {
		return replication.Ack{}, fmt.Errorf("stream from %s %w", in.from, ErrStopped)
	}
	if b.Applying != nil {
		b.Applying(true)
		defer b.Applying(false)
	}
	reply := b.ReadReply
	if reply == nil {
		reply = func(uint64, replication.AckStatus, []byte) error {
			return errors.New("a read in a batch that takes no read replies")
		}
	}
	return in.apply(v, b.Entries, reply), nil
}
