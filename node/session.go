package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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

// pending is one entry on its way to a peer: a future its submitter waits
// on (done). What completing it does is data, read by the session's loop:
// the send-buffer bytes it frees, the countdown it holds, the window slot
// it takes, the pooled buffer it returns, and its kind.
type pending struct {
	e    replication.Entry
	done chan struct{}
	// acked: the peer acknowledged the entry. err: it did not, and what
	// the peer misses could not be tracked durably either, so a write
	// waiting for it must fail. Both are read after done.
	acked bool
	err   error
	kind  entryKind
	// readBuf receives an OpRead's data; readOK says it arrived whole.
	// The loop writes them; the submitter reads them after done.
	readBuf []byte
	readOK  bool
	// differ (entryCsums): the blocks whose checksums the peer found
	// different, set by its FrameReadReply.
	differ []uint32
	// gen (entrySyncDone): the generation the peer adopts; inSync: once
	// acknowledged, it made the peer UpToDate (syncDoneAcked).
	gen    replication.Generation
	inSync bool
	// received, for a write under protocol B, is closed when the peer has
	// received the entry (or it completed).
	received chan struct{}
	recvDone bool
	// wire is the bytes of an application write held in the send buffer
	// (protocols A and B) until the entry completes.
	wire int64
	// held is done once the entry completes (the activity log's extent).
	held *countdown
	// slot is a run loop's window slot, freed once the entry completes.
	slot chan struct{}
	// buf is the pooled buffer behind e.Data, returned once encoded.
	buf *[]byte
	// lagSeq numbers a write among the peer's writes, for its lag; sess
	// is the session it went to.
	lagSeq uint64
	sess   *session
}

// entryKind says what the session's loop does when an entry completes.
type entryKind int

const (
	entryPlain    entryKind = iota // nothing more than closing done
	entryRead                      // OpRead: its reply fills readBuf
	entryResync                    // a resync run: its ack clears its bits
	entryCsums                     // a resync run's checksums: the ack clears the blocks found equal
	entryVerify                    // a verify run: its reply marks the blocks found different
	entrySyncDone                  // the peer is UpToDate at gen once it acks (syncDone)
)

func newPending(e replication.Entry) *pending {
	return &pending{e: e, done: make(chan struct{})}
}

// markReceived closes received, once. Only the session's loop calls it.
func (pd *pending) markReceived() {
	if pd.received != nil && !pd.recvDone {
		pd.recvDone = true
		close(pd.received)
	}
}

// session is one replication stream to a peer, from the end of its
// handshake to its failure. One goroutine, its loop, owns everything the
// stream holds: the queue, the entries in flight, their sequence numbers,
// the frames awaiting acks, the congestion controller and the resync runs
// in flight. Everybody else talks to it through channels: writers submit
// entries and get the pending back as a future (enqueue, submit), the
// receiving goroutine hands it the peer's acks and replies, the sending
// goroutine takes the frames it built. The session ends at the first error,
// when its context ends, or when the peer answers nothing for its timeout;
// the loop then marks every entry the peer did not acknowledge in the
// peer's bitmap.
type session struct {
	p       *peer
	stream  *transport.ReplStream
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration

	lastRecv atomic.Int64 // unix ns of the last frame received
	errc     chan error   // the first error ends the session
	// beat is the probe this stream shares with the other volumes'
	// streams to the same node (pairbeat.go); nil for a bare test peer.
	beat *pairBeat
	// resting: the loop rests without a ticker (restOn), published for
	// status and tests.
	resting atomic.Bool

	// Into the loop.
	submits chan submission
	acks    chan ackMsg
	replies chan replyMsg
	calls   chan func()
	// A writer's news (submit.go): blocks a Behind peer misses, a write
	// acknowledged to its client.
	behind      chan behindMark
	completions chan localCompletion
	works       chan func() error
	synced      chan *pending // a syncDone whose commit (syncDoneAcked) returned
	// Out of the loop: frames for the sending goroutine.
	out chan *transport.Frame
	// ended is closed when the loop stops taking messages; finished once
	// it completed every entry; err is then the session's error.
	ended    chan struct{}
	finished chan struct{}
	err      error
	started  bool // start ran (touched by the goroutine that runs the handshake)

	// For readers outside the loop (read balancing, resync pacing).
	pubAppBytes   atomic.Int64
	pubAhead      atomic.Bool
	catchUpPaused atomic.Bool

	// Owned by the loop.
	queue    []*pending
	inflight []*pending
	// frames holds the last sequence number of each frame awaiting its
	// ack, oldest first.
	frames  []uint64
	nextSeq uint64
	// held: completions waiting behind a syncDone whose commit runs, in
	// ack order; committing is that syncDone.
	held       []*pending
	committing *pending
	// Congestion (congestion.go): appBytes is the application writes
	// queued and not acknowledged; waiting the writes held for room;
	// ahead: the peer is Behind, writes are marked; catchingUp: the
	// catch-up resync (or the connection's resync) runs.
	appBytes   int64
	waiting    []submission
	cong       *replication.Congestion
	congPolicy replication.OnCongestion
	ahead      bool
	catchingUp bool
	// extra counts the goroutines the loop started (work, catch-up,
	// commits); it waits for them before it completes what is left.
	extra sync.WaitGroup
	// runs are the resync runs in flight (offset → length); remarked the
	// blocks marked again meanwhile (their runs' acks keep the marks).
	runs     map[int64]int64
	remarked map[int64]bool
}

// submission is an entry for the loop; admit (an application write under
// protocol A or B) asks the congestion controller first and answers.
type submission struct {
	pd     *pending
	admit  bool
	answer chan admission
}

// ackMsg is an ack from the receiving goroutine: up to seq, received
// (protocol B) or acknowledged.
type ackMsg struct {
	seq      uint64
	received bool
}

// replyMsg is a FrameReadReply; the receiving goroutine waits for the
// loop's verdict (err) before it reuses the frame behind data.
type replyMsg struct {
	seq  uint64
	st   replication.AckStatus
	data []byte
	err  chan error
}

func newSession(ctx context.Context, p *peer, s *transport.ReplStream, timeout time.Duration) *session {
	sctx, cancel := context.WithCancel(ctx)
	ss := &session{p: p, stream: s, ctx: sctx, cancel: cancel, timeout: timeout, errc: make(chan error, 1),
		submits: make(chan submission), acks: make(chan ackMsg, 64), replies: make(chan replyMsg), calls: make(chan func()),
		behind: make(chan behindMark), completions: make(chan localCompletion),
		works: make(chan func() error), synced: make(chan *pending, 1), out: make(chan *transport.Frame, maxFramesInFlight+1),
		ended: make(chan struct{}), finished: make(chan struct{})}
	ss.lastRecv.Store(time.Now().UnixNano())
	if p.v != nil && p.v.node != nil {
		ss.beat = p.v.node.pairBeat(p.name)
	}
	return ss
}

// idle reports whether the stream holds nothing: no entry queued, none
// awaiting its ack, no frame on its way out. Only the loop calls it.
func (s *session) idle() bool {
	return len(s.queue) == 0 && len(s.inflight) == 0 && len(s.out) == 0
}

// checkPeer is the loop's tick: it fails with ErrPeerTimeout when the
// peer answered nothing for the timeout, lets the congestion controller's
// time pass, and probes the peer when this idle stream is the pair's
// carrier or nothing was heard from the peer node for two intervals.
func (s *session) checkPeer(every time.Duration) error {
	// A hung peer (a stopped process, a dead link) sends nothing: not
	// even the ack of a heartbeat. A busy stream is judged by its own
	// acks; an idle one owes nothing, and the peer node answering on any
	// stream will do.
	now := time.Now().UnixNano()
	idle := s.idle()
	quiet := time.Duration(now - s.lastRecv.Load())
	if idle {
		quiet = s.beat.quietSince(now, s.lastRecv.Load())
	}
	if quiet > s.timeout {
		return fmt.Errorf("%w: %s answered nothing for %s", ErrPeerTimeout, s.p.name, quiet.Round(time.Millisecond))
	}
	s.congestionTick()
	if idle && (s.beat.carries(s) || s.beat.quietSince(now, 0) >= 2*every) {
		f := transport.NewFrame(replication.BatchHeaderLen)
		f.SetBytes(replication.AppendBatchHeader(f.Bytes(), 0))
		s.out <- f // room: only the loop sends, and out is empty
	}
	return nil
}

// restOn returns what wakes this stream while it rests without a ticker,
// or nil when it must tick: it is busy, the congestion controller has
// time to keep (Ahead, a catch-up, writes held for room, blocks marked),
// or no other stream of the pair carries the probe.
func (s *session) restOn() <-chan struct{} {
	if !s.idle() || len(s.waiting) > 0 || s.ahead || s.catchingUp {
		return nil
	}
	// The pair's check first: it is atomic loads, and the carrier (the
	// only stream of a single volume) stops there, while the bitmap's
	// count takes its lock; a loop turns idle after every ack at qd1.
	rest := s.beat.rest(s)
	if rest == nil || s.p.bm.Bytes() > 0 {
		return nil
	}
	return rest
}

// fail ends the session with err (the first error wins).
func (s *session) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
	s.cancel()
}

// preload queues pd before the loop starts (the handshake's first entry).
func (s *session) preload(pd *pending) {
	if s.started {
		panic("session: preload after start")
	}
	s.queue = append(s.queue, pd)
}

// start starts the loop and the sending and receiving goroutines.
func (s *session) start() {
	if s.started {
		return
	}
	s.started = true
	go s.loop()
}

// run drives the stream until it fails or ctx ends, then returns once the
// loop handed back what the peer did not acknowledge. work, when not nil,
// runs beside it (a resync or a pull); its error ends the session too.
func (s *session) run(work func() error) error {
	s.start()
	if work != nil {
		select {
		case s.works <- work:
		case <-s.ended:
		}
	}
	<-s.finished
	return s.err
}

// loop is the session's owner: see session.
func (s *session) loop() {
	defer close(s.finished)
	var io sync.WaitGroup
	io.Add(2)
	go func() { defer io.Done(); s.fail(s.send()) }()
	go func() { defer io.Done(); s.fail(s.receive()) }()
	// One tick both checks that the peer answers and probes it: a quarter
	// of the timeout, at most maxHeartbeatInterval.
	every := max(min(s.timeout/4, maxHeartbeatInterval), 10*time.Millisecond)
	tick := time.NewTicker(every)
	// An idle stream that another stream of the pair probes for rests:
	// its ticker stops and it waits on rest, which wakes it when that
	// carrier leaves (it failed, or its volume went). A thousand idle
	// volumes thus keep one ticker per peer node.
	var rest <-chan struct{}
	rested := func() {
		switch r := s.restOn(); {
		case r != nil && rest == nil:
			tick.Stop()
			rest = r
			s.resting.Store(true)
		case r == nil && rest != nil:
			rest = nil
			tick.Reset(every)
			s.resting.Store(false)
		}
	}
	defer s.beat.leave(s)
	var err error
	if err = s.sendQueued(); err != nil {
		s.fail(err)
	}
wait:
	for {
		idleBefore := s.idle()
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
			if err = s.checkPeer(every); err != nil {
				break wait
			}
			// A heartbeat sent is no work of the stream's own: its
			// silence does not start over, and it may rest.
			rested()
			continue
		case <-rest:
			// The carrier left: this stream looks at once, as on a tick,
			// and may carry from now on.
			rest = nil
			tick.Reset(every)
			s.resting.Store(false)
			if err = s.checkPeer(every); err != nil {
				break wait
			}
		case sub := <-s.submits:
			if sub.admit {
				s.admit(sub)
			} else {
				s.accept(sub.pd)
			}
		case m := <-s.acks:
			s.acked(m)
		case m := <-s.replies:
			m.err <- s.readReply(m)
		case pd := <-s.synced:
			s.syncCommitted(pd)
		case f := <-s.calls:
			f()
		case m := <-s.behind:
			s.markedBehind(m)
		case c := <-s.completions:
			s.completedLocally(c)
		case work := <-s.works:
			s.extra.Add(1)
			go func() {
				defer s.extra.Done()
				if err := work(); err != nil {
					s.fail(err)
				}
			}()
		}
		if idleBefore && !s.idle() {
			// The stream owed the peer nothing until now: its silence
			// counts from here.
			s.lastRecv.Store(time.Now().UnixNano())
		}
		if err := s.sendQueued(); err != nil {
			s.fail(err)
		}
		rested()
	}
	tick.Stop()
	s.cancel()
	s.stream.Close()
	s.closeToNew()
	io.Wait()
	s.extra.Wait()
	s.end()
	s.err = err
}

// do runs f on the loop and returns once it ran; false: the loop ended,
// f did not run.
func (s *session) do(f func()) bool {
	ran := make(chan struct{})
	select {
	case s.calls <- func() { f(); close(ran) }:
		<-ran
		return true
	case <-s.ended:
		return false
	}
}

// accept queues pd; the loop owns it from here.
func (s *session) accept(pd *pending) {
	switch pd.kind {
	case entryResync:
		// Blocks marked again while this run is in flight (pull-ahead)
		// keep their marks: the run carries their older data.
		if s.runs == nil {
			s.runs = map[int64]int64{}
		}
		s.runs[pd.e.Off] = pd.e.Length
	}
	s.queue = append(s.queue, pd)
}

// sendQueued hands queued entries, batched into frames, to the sending
// goroutine until the queue is empty or every frame slot is taken.
func (s *session) sendQueued() error {
	for len(s.queue) > 0 && len(s.frames) < maxFramesInFlight {
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
		batch := s.queue[:k]
		receipt := false
		for _, pd := range batch {
			s.nextSeq++
			pd.e.Seq = s.nextSeq
			s.inflight = append(s.inflight, pd)
			receipt = receipt || pd.received != nil
		}
		s.frames = append(s.frames, s.nextSeq)
		f := transport.NewFrame(size)
		b := replication.AppendBatchHeaderReceipt(f.Bytes(), len(batch), receipt)
		for _, pd := range batch {
			b = replication.AppendEntry(b, &pd.e)
			if pd.buf != nil {
				resyncBufs.Put(pd.buf)
				pd.buf, pd.e.Data = nil, nil
			}
		}
		f.SetBytes(b)
		clear(s.queue[:k])
		s.queue = s.queue[k:]
		s.p.framesSent.Add(1)
		s.p.entriesSent.Add(uint64(k))
		select {
		case s.out <- f: // out has room for every frame in flight
		case <-s.ctx.Done():
			return nil
		}
	}
	return nil
}

// send is the sending goroutine: it writes the frames the loop built, in
// order.
func (s *session) send() error {
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case f := <-s.out:
			if err := s.stream.Send(f); err != nil {
				return fmt.Errorf("send to %s: %w", s.p.name, err)
			}
		}
	}
}

// receive hands the peer's acks and replies to the loop.
func (s *session) receive() error {
	f := &transport.Frame{}
	defer f.Release()
	verdict := make(chan error, 1)
	for {
		if err := s.stream.Recv(f); err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from %s: %w", s.p.name, err)
		}
		now := time.Now().UnixNano()
		s.lastRecv.Store(now)
		s.beat.heard(now)
		if b := f.Bytes(); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameReadReply {
			seq, st, data, err := replication.DecodeReadReply(b)
			if err != nil {
				return err
			}
			select {
			case s.replies <- replyMsg{seq: seq, st: st, data: data, err: verdict}:
			case <-s.ended:
				return nil
			}
			if err := <-verdict; err != nil {
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
		select {
		case s.acks <- ackMsg{seq: ack.Seq, received: ack.Status == replication.AckReceived}:
		case <-s.ended:
			return nil
		}
	}
}

// acked completes the entries up to m.seq (or, protocol B, marks them
// received).
func (s *session) acked(m ackMsg) {
	if m.received {
		// Protocol B: the peer holds these entries in memory.
		for _, pd := range s.inflight {
			if pd.e.Seq > m.seq {
				break
			}
			pd.markReceived()
		}
		return
	}
	k := 0
	for k < len(s.inflight) && s.inflight[k].e.Seq <= m.seq {
		k++
	}
	done := s.inflight[:k]
	fr := 0
	for fr < len(s.frames) && s.frames[fr] <= m.seq {
		fr++
	}
	s.frames = s.frames[fr:]
	var lagSeq uint64
	for _, pd := range done {
		lagSeq = max(lagSeq, pd.lagSeq)
		s.ackedOne(pd)
	}
	clear(done)
	s.inflight = s.inflight[k:]
	if lagSeq > 0 {
		s.p.lag.PeerAcked(lagSeq)
		s.publishLag()
	}
}

// ackedOne completes pd, acknowledged, in ack order: behind a syncDone
// whose commit runs, it waits for that commit.
func (s *session) ackedOne(pd *pending) {
	switch {
	case s.committing != nil:
		s.held = append(s.held, pd)
	case pd.kind == entrySyncDone:
		// The commit takes the volume's state lock and writes stable
		// storage: not on the loop, which keeps taking entries meanwhile.
		s.committing = pd
		pd.markReceived()
		s.extra.Add(1)
		go func() {
			defer s.extra.Done()
			pd.inSync = s.p.syncDoneAcked(s, pd.gen)
			s.synced <- pd
		}()
	default:
		s.complete(pd, true, nil)
	}
}

// syncCommitted finishes a syncDone once its commit returned, and the
// completions held behind it.
func (s *session) syncCommitted(pd *pending) {
	if s.committing != pd {
		panic("session: a syncDone committed that was not committing")
	}
	s.committing = nil
	if pd.inSync {
		s.p.lag.CaughtUp()
		s.publishLag()
		s.p.setState(s, replication.Connected, string(replication.UpToDate))
	}
	s.complete(pd, true, nil)
	held := s.held
	s.held = nil
	for _, h := range held {
		s.ackedOne(h)
	}
}

// complete finishes pd: what its kind does, then the resources it holds,
// then done. Only the loop calls it (and end, on the loop's goroutine).
func (s *session) complete(pd *pending, acked bool, err error) {
	p := s.p
	pd.acked, pd.err = acked, err
	pd.markReceived()
	switch pd.kind {
	case entryResync:
		if !acked {
			s.clearRun(pd.e.Off, 0)
			break
		}
		cleared := s.clearRun(pd.e.Off, pd.e.Length)
		p.resyncDone.Add(pd.e.Length)
		p.lag.Resynced(cleared)
		s.publishLag()
	case entryCsums:
		if !acked {
			break
		}
		// Matching blocks are in sync; differing ones stay marked for the
		// data pass.
		off, length := pd.e.Off, pd.e.Length
		same, next := int64(0), 0
		for b := int64(0); b*replication.BlockSize < length; b++ {
			if next < len(pd.differ) && int64(pd.differ[next]) == b {
				next++
				continue
			}
			p.bm.ClearBits(off+b*replication.BlockSize, replication.BlockSize)
			same += replication.BlockSize
		}
		p.resyncDone.Add(min(same, length))
		p.csumsSkipped.Add(min(same, length))
	case entryVerify:
		if acked {
			p.verifyDone.Add(pd.e.Length)
		}
	}
	if pd.buf != nil {
		resyncBufs.Put(pd.buf)
		pd.buf, pd.e.Data = nil, nil
	}
	if pd.wire > 0 {
		s.released(pd.wire)
	}
	if pd.held != nil {
		pd.held.done()
	}
	if pd.slot != nil {
		<-pd.slot
	}
	close(pd.done)
}

// readReply hands an OpRead's or a run's checksum answer to its entry.
func (s *session) readReply(m replyMsg) error {
	for _, pd := range s.inflight {
		if pd.e.Seq != m.seq {
			continue
		}
		switch pd.kind {
		case entryCsums, entryVerify:
			blocks := (pd.e.Length + replication.BlockSize - 1) / replication.BlockSize
			idx, err := replication.DecodeMismatches(m.data, blocks)
			if m.st != replication.AckOK || err != nil {
				idx = allBlocks(pd.e.Length) // the peer could not read: the whole run
			}
			if pd.kind == entryCsums {
				pd.differ = idx
				break
			}
			for _, i := range idx {
				s.p.bm.SetBits(pd.e.Off+int64(i)*replication.BlockSize, replication.BlockSize)
				s.p.verifyFound.Add(replication.BlockSize)
			}
		case entryRead:
			if m.st == replication.AckOK && pd.readBuf != nil && len(m.data) == len(pd.readBuf) {
				copy(pd.readBuf, m.data)
				pd.readOK = true
			}
		default:
			return fmt.Errorf("%s answered entry %d, not a read, with data", s.p.name, m.seq)
		}
		return nil
	}
	return fmt.Errorf("%s answered a read %d that is not in flight", s.p.name, m.seq)
}

// publishLag makes the peer's lag readable outside the loop.
func (s *session) publishLag() {
	l := &s.p.lag
	s.p.lagView.Store(&lagView{bytes: l.Bytes(), oldest: l.Oldest()})
}

// closeToNew ends the peer's stream (writes go to its bitmap from here)
// and the loop's taking of messages; the writes it holds for room try
// again, and find the stream gone.
func (s *session) closeToNew() {
	p := s.p
	p.update(func(pv *peerView) {
		if pv.sess == s {
			pv.sess, pv.peerDisk = nil, dUnknown
		}
	})
	close(s.ended)
	for _, w := range s.waiting {
		w.answer <- admitEnded
	}
	s.waiting = nil
}

// end hands back every entry the peer did not acknowledge: their blocks
// are marked in the peer's bitmap, after the volume durably started
// tracking the peer (a new generation). When that tracking cannot be made
// durable, the entries complete with the error, and no write waiting for
// them may succeed. It runs on the loop's goroutine once every other
// goroutine of the session returned.
func (s *session) end() {
	p := s.p
	// A syncDone the peer acknowledged, and what waits behind it.
	for s.committing != nil {
		s.extra.Wait()
		s.syncCommitted(<-s.synced)
	}
	left := append(s.inflight, s.queue...)
	s.inflight, s.queue, s.frames = nil, nil, nil
	// What the peer did not acknowledge is marked for it now.
	p.lag.Disconnected()
	s.publishLag()
	var err error
	for _, pd := range left {
		if changesData(pd.e.Op) {
			err = p.v.startTracking(p)
			break
		}
	}
	for _, pd := range left {
		markEntry(p.bm, &pd.e)
		s.complete(pd, false, err)
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
// pace runs before each slot is taken. The entry frees its slot when it
// completes.
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
		pd.slot = w.slots
		ok := w.s.enqueue(pd)
		if unlock != nil {
			unlock()
		}
		if !ok {
			if pd.buf != nil {
				resyncBufs.Put(pd.buf)
			}
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
