package applier

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/applier/apply"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Stream is a secondary's end of the stream from its primary: the
// applier's step (apply.Stream: From, State, SetState, Stop, Fail,
// Exclusive and Apply), which Run drives from the wire.
type Stream struct{ *apply.Stream }

// NewStream is the end of a stream from the primary named from.
func NewStream(from string) *Stream { return &Stream{apply.NewStream(from)} }

// NewStreamAfter is the end of a stream from the primary named from
// that replaces prev (nil: none): apply.NewStreamAfter.
func NewStreamAfter(from string, prev *Stream) *Stream {
	if prev == nil {
		return NewStream(from)
	}
	return &Stream{apply.NewStreamAfter(from, prev.Stream)}
}

// Run applies the stream's batches to v in order, until the stream ends,
// fails, is stopped, or v stops. A reader goroutine keeps frames coming
// while this one applies them; when several frames are waiting, all are
// applied and one ack covers them. While a batch takes long to apply (a
// flush of much data), or a long frame takes long to arrive (a slow
// link) and its bytes keep coming, the peer is told every quarter of the
// peer timeout that this node is alive (an ack of nothing), so that a
// slow disk or a slow link is not taken for a hung node. The reader goroutine stays apart from this one
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
	// every quarter of the timeout tells the primary this node is alive;
	// so does one while a long frame arrives and its bytes came since the
	// tick before (a megabyte on a link of a few megabits a second takes
	// longer than the timeout, and its ack comes only once it is whole).
	// The ticker runs only from an apply's or a long frame's start until a
	// tick finds neither going on: an idle stream keeps no ticker.
	var applying atomic.Bool
	applyStarted := make(chan struct{}, 1)
	arrivals := s.Arrivals()
	var longs <-chan struct{} // nil: the stream says nothing of its frames
	if arrivals != nil {
		longs = arrivals.LongFrames()
	}
	arriving := func() (bool, int64) {
		if arrivals == nil {
			return false, 0
		}
		return arrivals.Arriving()
	}
	clk := clock.Or(v.Clock)
	go func() {
		every := max(v.PeerTimeout/4, 10*time.Millisecond)
		for {
			select {
			case <-done:
				return
			case <-applyStarted:
			case <-longs:
			}
			tick := clk.NewTicker(every)
			_, seen := arriving()
			for running := true; running; {
				select {
				case <-done:
					tick.Stop()
					return
				case <-tick.C():
					busy := applying.Load()
					now, arrived := arriving()
					came := arrived != seen
					seen = arrived
					running = busy || now
					if busy || came {
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
	// One batch, made once: its hooks pace the empty acks above and
	// write the read replies in the stream's order.
	batch := apply.Batch{
		ReadReply: func(seq uint64, st replication.AckStatus, data []byte) error {
			rf := transport.NewFrame(replication.ReadReplyHeaderLen + len(data))
			rf.SetBytes(replication.AppendReadReply(rf.Bytes(), seq, st, data))
			return send(rf)
		},
		Applying: func(on bool) {
			applying.Store(on)
			if on {
				select {
				case applyStarted <- struct{}{}:
				default:
				}
			}
		},
	}
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
			batch.Entries = entries
			a, err := in.Apply(v, batch)
			if err != nil {
				return err
			}
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
			return fmt.Errorf("replication from %s stopped: %s", in.From(), ack.Message)
		}
	}
}
