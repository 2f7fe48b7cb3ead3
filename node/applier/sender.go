package applier

import (
	"errors"

	"github.com/replvol/replvol/transport"
)

// errStreamSenderEnded: a frame was queued after the stream's end.
var errStreamSenderEnded = errors.New("the stream to the primary has ended")

// streamSender is the one goroutine that writes a secondary's stream:
// send queues a frame for it, in order. After the first failed write it
// takes no more frames, and send returns that error.
type streamSender struct {
	s      *transport.ReplStream
	out    chan *transport.Frame
	stop   chan struct{} // closed by close: send what is queued, then end
	failed chan struct{} // closed once a write failed; err is then set
	ended  chan struct{} // closed when the goroutine has returned
	err    error
}

func newStreamSender(s *transport.ReplStream) *streamSender {
	ss := &streamSender{s: s, out: make(chan *transport.Frame, 16), stop: make(chan struct{}), failed: make(chan struct{}), ended: make(chan struct{})}
	go ss.run()
	return ss
}

func (ss *streamSender) run() {
	defer close(ss.ended)
	write := func(f *transport.Frame) bool {
		if err := ss.s.Send(f); err != nil {
			ss.err = err
			close(ss.failed)
			return false
		}
		return true
	}
	for {
		select {
		case f := <-ss.out:
			if !write(f) {
				return
			}
		case <-ss.stop:
			// What was queued before the stream's end still goes out
			// (an ack saying why the secondary stops).
			for {
				select {
				case f := <-ss.out:
					if !write(f) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// send queues f; it fails once a write to the stream failed.
func (ss *streamSender) send(f *transport.Frame) error {
	select {
	case ss.out <- f:
		return nil
	case <-ss.failed:
		return ss.err
	case <-ss.ended:
		return errStreamSenderEnded
	}
}

// close sends what is queued and waits for the goroutine to end (or for
// the stream's context to end, when a write cannot complete).
func (ss *streamSender) close() {
	close(ss.stop)
	select {
	case <-ss.ended:
	case <-ss.s.Context().Done():
	}
}
