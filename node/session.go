package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

const (
	// maxBatchBytes bounds one replication frame: small writes are batched
	// up to this size (the per-message cost of gRPC is what batching saves).
	maxBatchBytes = 1 << 20
	// maxBatchEntries bounds the entries of one frame.
	maxBatchEntries = 1024
	// A frame is at most replication.MaxFrameLen, the stream's limit on
	// both ends (transport.MaxFrameSize, the same): a batch of small
	// entries stays below maxBatchBytes, and one entry larger than that
	// goes alone. (This fails to compile otherwise.)
	_ = uint(replication.MaxFrameLen-maxBatchBytes) + uint(transport.MaxFrameSize-replication.MaxFrameLen) + uint(replication.MaxFrameLen-transport.MaxFrameSize)
	// maxFramesInFlight bounds the frames awaiting their ack. While they
	// are out, new entries wait and go out together in the next frame:
	// under load one frame (and one ack) carries many writes.
	maxFramesInFlight = 2
	// maxHeartbeatInterval caps how often an idle stream is probed.
	maxHeartbeatInterval = 500 * time.Millisecond
)

var (
	// errSessionEnded: an entry was handed to a stream that had just ended.
	errSessionEnded = errors.New("replication stream ended")
	// errPeerDiskFailed: the peer could not apply an entry to its disk.
	errPeerDiskFailed = errors.New("the peer failed to write an entry to its disk")
)

// pending is one entry on its way to a peer.
type pending struct {
	e    replication.Entry
	done chan struct{}
	// acked: the peer acknowledged the entry. err: it did not, and what
	// the peer misses could not be tracked durably either, so a write
	// waiting for it must fail. Both are read after done.
	acked bool
	err   error
	// readBuf receives an OpRead's data; readOK says it arrived whole.
	readBuf []byte
	readOK  bool
	// onReply takes the FrameReadReply answering this entry (OpVerify).
	onReply func(st replication.AckStatus, data []byte)
	// onAck runs on the receiving goroutine when the peer acknowledged
	// the entry, BEFORE done is closed.
	onAck func()
	// finished runs once the entry is completed, acknowledged or not.
	finished func(acked bool)
	// release frees the entry's data buffer once it is encoded.
	release func()
	// received, for a write under protocol B, is closed when the peer has
	// received the entry (or it completed).
	received chan struct{}
	recvDone bool
	// lagSeq numbers a write among the peer's writes, for its lag; peer
	// is the peer it goes to.
	lagSeq uint64
	peer   *peer
}

func newPending(e replication.Entry) *pending {
	return &pending{e: e, done: make(chan struct{})}
}

// markReceived closes received, once. It runs on the session's receiving
// goroutine, or in end once that goroutine has returned.
func (pd *pending) markReceived() {
	if pd.received != nil && !pd.recvDone {
		pd.recvDone = true
		close(pd.received)
	}
}

func (pd *pending) complete(acked bool, err error) {
	pd.acked, pd.err = acked, err
	pd.markReceived()
	if acked && pd.onAck != nil {
		pd.onAck()
	}
	if pd.release != nil {
		pd.release()
		pd.release = nil
	}
	if pd.finished != nil {
		pd.finished(acked)
	}
	close(pd.done)
}

// session is one replication stream to a peer, from the end of its
// handshake to its failure. One goroutine (send) owns the sending side: it
// alone numbers entries, batches them into frames and writes them;
// everybody else only queues (enqueue). Another (receive) completes entries
// as the peer acknowledges them. The session ends at the first error, when
// its context ends, or when the peer answers nothing for its timeout; end
// then marks every entry the peer did not acknowledge in the peer's bitmap.
type session struct {
	p       *peer
	stream  *transport.ReplStream
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration
	// wake is signalled when entries are queued or a frame slot opens.
	wake     chan struct{}
	lastRecv atomic.Int64 // unix ns of the last frame received
	errc     chan error   // the first error ends the session

	mu       sync.Mutex
	closed   bool
	queue    []*pending
	inflight []*pending
	// frames holds the last sequence number of each frame awaiting its
	// ack, oldest first.
	frames  []uint64
	nextSeq uint64

	// Congestion (congestion.go), under mu: appBytes is the application
	// writes queued and not acknowledged; room is closed (and replaced)
	// when it shrinks; ahead: the peer is Behind, writes are marked;
	// catchingUp: the catch-up resync runs (extra tracks it).
	appBytes      int64
	room          chan struct{}
	cong          *replication.Congestion
	congPolicy    replication.OnCongestion
	ahead         bool
	catchingUp    bool
	catchUpPaused atomic.Bool
	extra         sync.WaitGroup
	// runs are the resync runs in flight (offset → length); remarked the
	// blocks marked again meanwhile (their runs' acks keep the marks).
	runs     map[int64]int64
	remarked map[int64]bool
}

func newSession(ctx context.Context, p *peer, s *transport.ReplStream, timeout time.Duration) *session {
	sctx, cancel := context.WithCancel(ctx)
	ss := &session{p: p, stream: s, ctx: sctx, cancel: cancel, timeout: timeout, wake: make(chan struct{}, 1), errc: make(chan error, 1), room: make(chan struct{})}
	ss.lastRecv.Store(time.Now().UnixNano())
	return ss
}

// fail ends the session with err (the first error wins).
func (s *session) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
	s.cancel()
}

// enqueue hands pd to the sending goroutine. It reports false when the
// session has ended: pd was not taken.
func (s *session) enqueue(pd *pending) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.queue = append(s.queue, pd)
	s.mu.Unlock()
	s.kick()
	return true
}

func (s *session) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run drives the stream until it fails or ctx ends, then hands back what
// the peer did not acknowledge. work, when not nil, runs beside it (a
// resync or a pull); its error ends the session too.
func (s *session) run(work func() error) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.fail(s.send()) }()
	go func() { defer wg.Done(); s.fail(s.receive()) }()
	if work != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(); err != nil {
				s.fail(err)
			}
		}()
	}
	tick := time.NewTicker(max(s.timeout/4, 10*time.Millisecond))
	var err error
wait:
	for {
		select {
		case err = <-s.errc:
			break wait
		case <-s.ctx.Done():
			select {
			case err = <-s.errc:
			default:
			}
			break wait
		case <-tick.C:
			// A hung peer (a stopped process, a dead link) sends nothing:
			// not even the ack of a heartbeat.
			if quiet := time.Since(time.Unix(0, s.lastRecv.Load())); quiet > s.timeout {
				err = fmt.Errorf("%w: %s answered nothing for %s", ErrPeerTimeout, s.p.name, quiet.Round(time.Millisecond))
				break wait
			}
		}
	}
	tick.Stop()
	s.cancel()
	s.stream.Close()
	wg.Wait()
	s.extra.Wait()
	s.end()
	return err
}

// send is the sending goroutine: it sends what is queued, in queue order,
// batched into frames, and probes an idle stream with an empty batch.
func (s *session) send() error {
	hb := time.NewTicker(min(s.timeout/4, maxHeartbeatInterval))
	defer hb.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case <-s.wake:
		case <-hb.C:
			s.congestionTick()
			s.mu.Lock()
			idle := len(s.queue) == 0 && len(s.inflight) == 0
			s.mu.Unlock()
			if idle {
				f := transport.NewFrame(replication.BatchHeaderLen)
				f.SetBytes(replication.AppendBatchHeader(f.Bytes(), 0))
				if err := s.stream.Send(f); err != nil {
					return fmt.Errorf("send to %s: %w", s.p.name, err)
				}
				continue
			}
		}
		if err := s.sendQueued(); err != nil {
			return err
		}
	}
}

// sendQueued sends queued entries until the queue is empty or every frame
// slot is taken.
func (s *session) sendQueued() error {
	var batch []*pending
	for {
		s.mu.Lock()
		if len(s.queue) == 0 || len(s.frames) >= maxFramesInFlight {
			s.mu.Unlock()
			return nil
		}
		size := replication.BatchHeaderLen
		k := 0
		for k < len(s.queue) && k < maxBatchEntries {
			n := s.queue[k].e.EncodedLen()
			if k > 0 && size+n > maxBatchBytes {
				break
			}
			size += n
			k++
		}
		batch = append(batch[:0], s.queue[:k]...)
		s.queue = s.queue[k:]
		receipt := false
		for _, pd := range batch {
			s.nextSeq++
			pd.e.Seq = s.nextSeq
			s.inflight = append(s.inflight, pd)
			receipt = receipt || pd.received != nil
		}
		s.frames = append(s.frames, s.nextSeq)
		s.mu.Unlock()

		f := transport.NewFrame(size)
		b := replication.AppendBatchHeaderReceipt(f.Bytes(), len(batch), receipt)
		for _, pd := range batch {
			b = replication.AppendEntry(b, &pd.e)
			if pd.release != nil {
				pd.release()
				pd.release = nil
			}
		}
		clear(batch)
		f.SetBytes(b)
		s.p.framesSent.Add(1)
		s.p.entriesSent.Add(uint64(k))
		if err := s.stream.Send(f); err != nil {
			return fmt.Errorf("send to %s: %w", s.p.name, err)
		}
	}
}

// receive completes entries as the peer acknowledges them.
func (s *session) receive() error {
	f := &transport.Frame{}
	defer f.Release()
	var done []*pending
	for {
		if err := s.stream.Recv(f); err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from %s: %w", s.p.name, err)
		}
		s.lastRecv.Store(time.Now().UnixNano())
		if b := f.Bytes(); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameReadReply {
			if err := s.readReply(b); err != nil {
				return err
			}
			continue
		}
		ack, err := replication.DecodeAck(f.Bytes())
		if err != nil {
			return err
		}
		if ack.Status != replication.AckOK && ack.Status != replication.AckReceived {
			return fmt.Errorf("%w: %s", errPeerDiskFailed, ack.Message)
		}
		if ack.Seq == 0 {
			continue // a heartbeat's ack, or the peer saying it is busy
		}
		if ack.Status == replication.AckReceived {
			// Protocol B: the peer holds these entries in memory.
			s.mu.Lock()
			for _, pd := range s.inflight {
				if pd.e.Seq > ack.Seq {
					break
				}
				pd.markReceived()
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		k := 0
		for k < len(s.inflight) && s.inflight[k].e.Seq <= ack.Seq {
			k++
		}
		done = append(done[:0], s.inflight[:k]...)
		s.inflight = s.inflight[k:]
		fr := 0
		for fr < len(s.frames) && s.frames[fr] <= ack.Seq {
			fr++
		}
		s.frames = s.frames[fr:]
		s.mu.Unlock()
		var lagSeq uint64
		for _, pd := range done {
			lagSeq = max(lagSeq, pd.lagSeq)
			pd.complete(true, nil)
		}
		if lagSeq > 0 {
			s.p.lagMu.Lock()
			s.p.lag.PeerAcked(lagSeq)
			s.p.lagMu.Unlock()
		}
		clear(done)
		if fr > 0 {
			s.kick() // a frame slot opened
		}
	}
}

// readReply hands an OpRead's or OpVerify's answer to its entry.
func (s *session) readReply(frame []byte) error {
	seq, st, data, err := replication.DecodeReadReply(frame)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pd := range s.inflight {
		if pd.e.Seq != seq {
			continue
		}
		switch {
		case pd.onReply != nil:
			pd.onReply(st, data)
		case pd.e.Op == replication.OpRead:
			if st == replication.AckOK && pd.readBuf != nil && len(data) == len(pd.readBuf) {
				copy(pd.readBuf, data)
				pd.readOK = true
			}
		default:
			return fmt.Errorf("%s answered entry %d, not a read, with data", s.p.name, seq)
		}
		return nil
	}
	return fmt.Errorf("%s answered a read %d that is not in flight", s.p.name, seq)
}

// end closes the session to new entries and hands back every entry the
// peer did not acknowledge: their blocks are marked in the peer's bitmap,
// after the volume durably started tracking the peer (a new generation).
// When that tracking cannot be made durable, the entries complete with the
// error, and no write waiting for them may succeed.
func (s *session) end() {
	p := s.p
	p.mu.Lock()
	if p.sess == s {
		p.sess = nil
		p.peerDisk = dUnknown
	}
	p.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	left := append(s.inflight, s.queue...)
	s.inflight, s.queue, s.frames = nil, nil, nil
	s.mu.Unlock()
	// What the peer did not acknowledge is marked for it now.
	p.lagMu.Lock()
	p.lag.Disconnected()
	p.lagMu.Unlock()
	var err error
	for _, pd := range left {
		if changesData(pd.e.Op) {
			err = p.v.startTracking(p)
			break
		}
	}
	for _, pd := range left {
		markEntry(p.bm, &pd.e)
		pd.complete(false, err)
	}
}

// changesData reports whether an entry of op changes blocks.
func changesData(op replication.Op) bool {
	switch op {
	case replication.OpWrite, replication.OpZero, replication.OpTrim:
		return true
	}
	return false
}

func markEntry(bm *metadata.PeerBitmap, e *replication.Entry) {
	if changesData(e.Op) {
		bm.SetBits(e.Off, e.Length)
	}
}

// window keeps at most a fixed number of entries of one run loop (resync,
// verify) awaiting their acks on a session.
type window struct {
	s     *session
	slots chan struct{}
}

func (s *session) window(size int) *window {
	return &window{s: s, slots: make(chan struct{}, size)}
}

// inFlight is the number of entries sent and not yet completed.
func (w *window) inFlight() int { return len(w.slots) }

// runs sends the entries next produces, one per free slot, until next
// reports none left (pd nil) and every entry sent has completed. next runs
// with a slot held; unlock, when next returns one, is called once the
// entry is queued (a range lock held across its read and its queueing).
// pace runs before each slot is taken.
func (w *window) runs(ctx context.Context, pace func() error, next func() (pd *pending, unlock func(), err error)) error {
	for {
		if pace != nil {
			if err := pace(); err != nil {
				return err
			}
		}
		if err := w.acquire(ctx); err != nil {
			return err
		}
		pd, unlock, err := next()
		if err != nil || pd == nil {
			<-w.slots
			if err != nil {
				return err
			}
			return w.drain(ctx)
		}
		fin := pd.finished
		pd.finished = func(acked bool) {
			if fin != nil {
				fin(acked)
			}
			<-w.slots
		}
		ok := w.s.enqueue(pd)
		if unlock != nil {
			unlock()
		}
		if !ok {
			<-w.slots
			return errSessionEnded
		}
	}
}

func (w *window) acquire(ctx context.Context) error {
	select {
	case w.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.s.ctx.Done():
		return errSessionEnded
	}
}

// drain waits until every entry sent through the window has completed.
func (w *window) drain(ctx context.Context) error {
	for range cap(w.slots) {
		if err := w.acquire(ctx); err != nil {
			return err
		}
	}
	for range cap(w.slots) {
		<-w.slots
	}
	return nil
}
