package applier

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Stream is a secondary's end of the stream from its primary.
type Stream struct {
	from string

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
// overwrites a newer write. f must not wait for the primary.
func (in *Stream) Exclusive(f func()) bool {
	in.applyMu.Lock()
	defer in.applyMu.Unlock()
	if in.stopped {
		return false
	}
	f()
	return true
}

// Run applies the stream's batches to v in order, until the stream ends,
// fails, is stopped, or v stops. A reader goroutine keeps frames coming
// while this one applies them; when several frames are waiting, all are
// applied and one ack covers them. While a batch takes long to apply (a
// flush of much data), the peer is told every quarter of the peer timeout
// that this node is alive (an ack of nothing), so that a slow disk is not
// taken for a hung node. The reader goroutine stays apart from this one
// so that, under protocol B, a batch is receipted as it arrives even
// while an earlier one waits for a slow disk. Each writer of the stream
// (the reader's receipts, the heartbeats, the read replies and the acks)
// writes its frames itself, in order (streamSender): no handoff stands
// between an applied batch and its ack.
func (in *Stream) Run(s *transport.ReplStream, v *Volume) error {
	out := newStreamSender(s)
	defer out.close()
	send := out.send
	frames := make(chan *transport.Frame, 8)
	free := make(chan *transport.Frame, 10)
	for range cap(free) {
		free <- &transport.Frame{}
	}
	rerr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			var f *transport.Frame
			select {
			case f = <-free:
			case <-done:
				return
			}
			if err := s.Recv(f); err != nil {
				rerr <- err
				return
			}
			// Protocol B: say so as soon as the batch is here, before it
			// is applied.
			if seq, receipt, err := replication.BatchReceipt(f.Bytes()); err == nil && receipt && seq != 0 {
				af := transport.NewFrame(32)
				af.SetBytes(replication.AppendAck(af.Bytes(), replication.Ack{Seq: seq, Status: replication.AckReceived}))
				if err := send(af); err != nil {
					rerr <- err
					return
				}
			}
			select {
			case frames <- f:
			case <-done:
				return
			}
		}
	}()
	// While a batch is applied (a slow disk may take long), an empty ack
	// every quarter of the timeout tells the primary this node is alive.
	// The ticker runs only from an apply's start until a tick finds none
	// running: an idle stream keeps no ticker.
	var applying atomic.Bool
	applyStarted := make(chan struct{}, 1)
	clk := clock.Or(v.Clock)
	go func() {
		every := max(v.PeerTimeout/4, 10*time.Millisecond)
		for {
			select {
			case <-done:
				return
			case <-applyStarted:
			}
			tick := clk.NewTicker(every)
			for running := true; running; {
				select {
				case <-done:
					tick.Stop()
					return
				case <-tick.C():
					if running = applying.Load(); running {
						af := transport.NewFrame(32)
						af.SetBytes(replication.AppendAck(af.Bytes(), replication.Ack{}))
						if send(af) != nil {
							tick.Stop()
							return
						}
					}
				}
			}
			tick.Stop()
		}
	}()
	var entries []replication.Entry
	var sums []uint32
	for {
		var f *transport.Frame
		select {
		case f = <-frames:
		case err := <-rerr:
			return err
		case <-out.failed:
			return out.err
		case <-v.Stopping:
			// The volume stops (a removal, a node's shutdown): the
			// stream ends now, not at the primary's next frame.
			return fmt.Errorf("%s on %s is stopping", v.Name, v.Self)
		}
		var ack replication.Ack
		for f != nil {
			var err error
			entries, sums, err = replication.DecodeBatchSums(f.Bytes(), entries[:0], sums[:0])
			if err != nil {
				return err
			}
			in.applyMu.Lock()
			if in.stopped {
				in.applyMu.Unlock()
				return fmt.Errorf("stream from %s replaced or stopped", in.from)
			}
			applying.Store(true)
			select {
			case applyStarted <- struct{}{}:
			default:
			}
			a := in.apply(v, entries, func(seq uint64, st replication.AckStatus, data []byte) error {
				rf := transport.NewFrame(replication.ReadReplyHeaderLen + len(data))
				rf.SetBytes(replication.AppendReadReply(rf.Bytes(), seq, st, data))
				return send(rf)
			})
			applying.Store(false)
			in.applyMu.Unlock()
			free <- f
			f = nil
			if a.Seq != 0 || a.Status != replication.AckOK {
				ack = a
			}
			if a.Status != replication.AckOK {
				break
			}
			select {
			case f = <-frames:
			default:
			}
		}
		af := transport.NewFrame(32)
		af.SetBytes(replication.AppendAck(af.Bytes(), ack))
		if err := send(af); err != nil {
			return err
		}
		if ack.Status != replication.AckOK {
			return fmt.Errorf("replication from %s stopped: %s", in.from, ack.Message)
		}
	}
}
