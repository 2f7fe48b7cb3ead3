package applier

import (
	"errors"
	"sync"

	"github.com/replvol/replvol/transport"
)

// errStreamSenderEnded: a frame was sent after the stream's end.
var errStreamSenderEnded = errors.New("the stream to the primary has ended")

// streamSender writes a secondary's stream: the receipts (protocol B),
// the heartbeats, the read replies and the acks. Each writer writes its
// frame itself, in the order it sends them: the stream's write lock
// (transport's frameConn) keeps frames whole, and no handoff to another
// goroutine stands between an applied batch and its ack (issue 31: a
// wakeup per ack cost more than the write). A write blocks only while
// the primary reads none of the stream's acks, and the primary's
// receiver never waits on its own writes (node/session), so a writer
// here waits at most until the primary reads or the stream ends (its
// context's end closes the connection). After the first failed write
// send returns that error, and failed is closed.
type streamSender struct {
	s      *transport.ReplStream
	once   sync.Once
	failed chan struct{} // closed once a write failed; err is then set
	ended  chan struct{} // closed by close
	err    error
}

func newStreamSender(s *transport.ReplStream) *streamSender {
	return &streamSender{s: s, failed: make(chan struct{}), ended: make(chan struct{})}
}

// send writes f; it fails once a write to the stream failed, and after
// close.
func (ss *streamSender) send(f *transport.Frame) error {
	select {
	case <-ss.failed:
		f.Release()
		return ss.err
	case <-ss.ended:
		f.Release()
		return errStreamSenderEnded
	default:
	}
	if err := ss.s.Send(f); err != nil {
		ss.once.Do(func() {
			ss.err = err
			close(ss.failed)
		})
		return ss.err
	}
	return nil
}

// close ends the sender: later sends fail. Every frame sent before it is
// written already.
func (ss *streamSender) close() {
	select {
	case <-ss.ended:
	default:
		close(ss.ended)
	}
}
