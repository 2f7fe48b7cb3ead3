package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport/frame"
)

const (
	// maxBatchBytes bounds one replication frame: small writes are batched
	// up to this size (the per-message cost of gRPC is what batching saves).
	maxBatchBytes = 1 << 20
	// maxBatchEntries bounds the entries of one frame.
	maxBatchEntries = 1024
	// A frame is at most replication.MaxFrameLen, the stream's limit on
	// both ends (frame.MaxSize, the same): a batch of small
	// entries stays below maxBatchBytes, and one entry larger than that
	// goes alone. (This fails to compile otherwise.)
	_ = uint(replication.MaxFrameLen-maxBatchBytes) + uint(frame.MaxSize-replication.MaxFrameLen) + uint(replication.MaxFrameLen-frame.MaxSize)
	// maxFramesInFlight bounds the frames awaiting their ack. While they
	// are out, new entries wait and go out together in the next frame:
	// under load one frame (and one ack) carries many writes.
	maxFramesInFlight = 2
	// maxHeartbeatInterval caps how often an idle stream is probed.
	maxHeartbeatInterval = 500 * time.Millisecond
)

var (
	// ErrEnded: an entry was handed to a stream that had just ended.
	ErrEnded = errors.New("replication stream ended")
	// ErrPeerDiskFailed: the peer could not apply an entry to its disk.
	ErrPeerDiskFailed = errors.New("the peer failed to write an entry to its disk")
	// ErrFrameRefused: the peer refused a batch whose blocks did not
	// match the checksums they came with (replication.AckChecksum),
	// applying nothing of it; its entries are marked for the peer.
	ErrFrameRefused = errors.New("the peer refused a frame whose blocks did not match their checksums")
	// ErrPeerTimeout: the peer answered nothing for the session's
	// timeout (node.ErrPeerTimeout is this error).
	ErrPeerTimeout = errors.New("peer timed out")
)

// Stream is what a session needs of its replication stream: the sending
// goroutine Sends the frames the loop built, the receiving goroutine
// Recvs the peer's acks and replies, and the loop Closes it as it ends,
// which makes a blocked Send or Recv return. The node's is a
// *transport.ReplStream (session_test.go checks that it is one); a
// test's may be a fake the test drives, and the simulation's its link.
type Stream interface {
	Send(f *frame.Frame) error
	Recv(f *frame.Frame) error
	Close()
}

// Peer is what a session needs of the peer it streams to, besides the
// values in its Config: the node's peer implements it. Each method says
// who calls it and whether it may block; Stream, Ended, PublishLag and
// Congestion do not (they swap or load atomic values).
type Peer interface {
	// Stream steps the peer's replication state with news of a stream
	// (the event names it by Config.ID), by volstate's rule
	// (volstate.Peer.Streamed): it congested, drained, started a
	// catch-up, or the peer acknowledged the primary's generation
	// (PeerInSync: its disk is UpToDate unless it is Ahead). The loop
	// calls it, and CatchUp through s.Do.
	Stream(e volstate.StreamEvent)
	// SyncDoneAcked runs once the peer acknowledged the entry that makes
	// it UpToDate at gen (EntrySyncDone), on a goroutine of its own: it
	// may take the volume's state lock, write stable storage and call
	// s.Fail, while the loop goes on. It reports whether the peer is now
	// in sync: the loop then makes it Connected and UpToDate.
	SyncDoneAcked(s *Session, gen replication.Generation) bool
	// Ended: s takes no more entries, and writes go to the peer's bitmap
	// from here. The loop calls it once, as it stops.
	Ended(s *Session)
	// StartTracking makes the volume durably track the peer (a new
	// generation; in authority mode raft records it Outdated first) BEFORE
	// the loop marks in Config.Bitmap the entries the peer did not
	// acknowledge and those it acknowledged from its cache since its last
	// acknowledged flush; an error fails the writes and flushes among the
	// entries left (and a flush that comes after: Session.MarkErr). The
	// loop calls it at its end, once every other goroutine of the session
	// returned; it may block: it takes the volume's locks and writes
	// stable storage.
	StartTracking() error
	// PublishLag makes Config.Lag readable outside the loop; the loop
	// calls it after each change.
	PublishLag()
	// CatchUp resyncs what was marked while the peer was Behind, on a
	// goroutine the loop starts (and waits for at its end): it blocks for
	// the whole resync, talks to the loop through s (Do, Enqueue, Window,
	// Fail) and reports whether the peer caught up.
	CatchUp(s *Session) bool
	// Congestion is the volume's congestion settings now; the loop and
	// Congested's callers call it.
	Congestion() replication.CongestionConfig
}

// Bitmap is the peer's bitmap as a session marks and clears it: the
// blocks of replication.BlockSize the peer misses. The node's is the
// peer's *metadata.PeerBitmap; a simulation's may be its own. Only the
// session's loop marks and clears it while the session runs; Bytes and
// Count may be called meanwhile from elsewhere.
type Bitmap interface {
	// SetBits marks the blocks of [off, off+length), ClearBits clears
	// them.
	SetBits(off, length int64)
	ClearBits(off, length int64)
	// Count is the number of blocks marked; Bytes what they cover of the
	// volume.
	Count() int64
	Bytes() int64
	// Flush writes the marks to stable storage.
	Flush() error
}

// Config is the values a session streams with. The pointers are the
// peer's own: they outlive the session, which changes them only from its
// loop (Lag, Bitmap's marks and clears) or atomically.
type Config struct {
	// Name names the peer node in errors and logs.
	Name string
	// ID numbers the session among the peer's streams: the news of an
	// older stream does not change the peer's state (volstate.StreamEvent).
	ID uint64
	// Timeout: the session ends when the peer answers nothing for it.
	Timeout time.Duration
	// Bitmap marks the blocks the peer misses.
	Bitmap Bitmap
	// Lag is what clients were told is written but the peer does not
	// hold yet; the loop owns it while the session runs (each session's
	// loop in turn, which hands it on at its end).
	Lag *replication.Lag
	// WriteSeq numbers the peer's writes, for Lag.
	WriteSeq *atomic.Uint64
	// Counters are the peer's counters the session adds to.
	Counters Counters
	// Beat is the probe this stream shares with the other volumes'
	// streams to the same node (pairbeat.go); nil: it probes for itself.
	Beat *PairBeat
	// Log is the volume's logger.
	Log *slog.Logger
	// FreeBuffer takes back a Pending's Buf once its entry is encoded, or,
	// when the frame carries the payload by reference, once the entry
	// completed (or was not taken). It must not block.
	FreeBuffer func(*[]byte)
	// Sums: the peer takes the checksums of the blocks an entry carries
	// (replication.EntrySums; its HelloReply said Sums); without, entries
	// go out without them.
	Sums bool
	// Clock keeps the session's time: the heartbeat ticks, the peer's
	// silence against Timeout, the congestion controller's and the lag's
	// times. Nil is clock.Real(); a test sets a clock.Fake.
	Clock clock.Clock
}

// Counters are the peer's progress counters a session adds to; status
// reads them at any time.
type Counters struct {
	FramesSent, EntriesSent *atomic.Uint64
	// ResyncDone: resync bytes acknowledged; ChecksumsSkipped: those a
	// checksum showed were in sync; VerifyDone: verify bytes compared;
	// VerifyFound: those found different.
	ResyncDone, ChecksumsSkipped, VerifyDone, VerifyFound *atomic.Int64
}

// Hold is held by an entry until it completes (a write's extent in the
// activity log). The loop calls Done once then; it must not block.
type Hold interface{ Done() }

// Pending is one entry on its way to a peer: a future its submitter waits
// on (Done). What completing it does is data, read by the session's loop:
// the send-buffer bytes it frees, the hold it releases, the window slot
// it takes, the pooled buffer it returns, and its kind. The submitter sets
// the exported fields before it hands the entry over, and does not touch
// them after (but through Session.Do); it reads the results after Done.
type Pending struct {
	Entry replication.Entry
	Kind  EntryKind
	// ReadBuf receives an OpRead's data (ReadOK says it arrived whole).
	ReadBuf []byte
	// Gen (EntrySyncDone): the generation the peer adopts.
	Gen replication.Generation
	// Received, for a write under protocol B, is closed when the peer has
	// received the entry (or it completed).
	Received chan struct{}
	// Wire is the bytes of an application write held in the send buffer
	// (protocols A and B) until the entry completes.
	Wire int64
	// Held is released once the entry completes.
	Held Hold
	// Joint, when not nil, is released once the entry completes, after
	// done is closed (joint.go).
	Joint *Joint
	// Buf is the pooled buffer behind Entry.Data, returned
	// (Config.FreeBuffer) once encoded, or once the entry completed when
	// its frame carried it by reference.
	Buf *[]byte
	// LagSeq numbers a write among the peer's writes, for its lag;
	// Session is the session it went to.
	LagSeq  uint64
	Session *Session

	done chan struct{}
	// acked: the peer acknowledged the entry. err: it did not, and what
	// the peer misses could not be tracked durably either, so a write
	// waiting for it must fail. Both are read after done.
	acked bool
	err   error
	// readOK: an OpRead's data arrived whole. The loop writes it and
	// ReadBuf; the submitter reads them after done.
	readOK bool
	// differ (EntryCsums): the blocks whose checksums the peer found
	// different, set by its FrameReadReply.
	differ []uint32
	// inSync (EntrySyncDone): once acknowledged, it made the peer
	// UpToDate (Peer.SyncDoneAcked).
	inSync   bool
	recvDone bool
	// slot is a run loop's window slot, freed once the entry completes.
	slot chan struct{}
}

// EntryKind says what the session's loop does when an entry completes.
type EntryKind int

const (
	EntryPlain    EntryKind = iota // nothing more than closing done
	EntryRead                      // OpRead: its reply fills ReadBuf
	EntryResync                    // a resync run: its ack clears its bits
	EntryCsums                     // a resync run's checksums: the ack clears the blocks found equal
	EntryVerify                    // a verify run: its reply marks the blocks found different
	EntrySyncDone                  // the peer is UpToDate at Gen once it acks (syncDone)
)

// NewPending returns the pending of e, a plain entry until its submitter
// says otherwise.
func NewPending(e replication.Entry) *Pending {
	return &Pending{Entry: e, done: make(chan struct{})}
}

// Done is closed once the entry completed: acknowledged or not.
func (pd *Pending) Done() <-chan struct{} { return pd.done }

// Acked reports, after Done, whether the peer acknowledged the entry.
func (pd *Pending) Acked() bool { return pd.acked }

// Err is, after Done, why a write waiting for the entry must fail: the
// peer did not acknowledge it, and what it misses could not be tracked
// durably either.
func (pd *Pending) Err() error { return pd.err }

// ReadOK reports, after Done, whether an OpRead's data arrived whole in
// ReadBuf.
func (pd *Pending) ReadOK() bool { return pd.readOK }

// markReceived closes Received, once. Only the session's loop calls it.
func (pd *Pending) markReceived() {
	if pd.Received != nil && !pd.recvDone {
		pd.recvDone = true
		close(pd.Received)
	}
}

// Session is one replication stream to a peer, from the end of its
// handshake to its failure. One goroutine, its loop, owns everything the
// stream holds: the queue, the entries in flight, their sequence numbers,
// the frames awaiting acks, the congestion controller and the resync runs
// in flight. Everybody else talks to it through channels: writers submit
// entries and get the pending back as a future (Enqueue, Submit), the
// receiving goroutine hands it the peer's acks and replies, the sending
// goroutine takes the frames it built. The session ends at the first error,
// when its context ends, or when the peer answers nothing for its timeout;
// the loop then marks in the peer's bitmap every entry the peer did not
// acknowledge, and every one it acknowledged from its cache since its last
// acknowledged flush (cached.go).
type Session struct {
	peer    Peer
	name    string
	bm      Bitmap
	lag     *replication.Lag
	cfg     Config
	stream  Stream
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration

	lastRecv atomic.Int64 // unix ns of the last frame received
	errc     chan error   // the first error ends the session
	// beat is the probe this stream shares with the other volumes'
	// streams to the same node (pairbeat.go); nil for a bare test peer.
	beat *PairBeat
	// resting: the loop rests without a ticker (restOn), published for
	// status and tests.
	resting atomic.Bool

	// Into the loop: inbox takes the writers' and callers' messages
	// (deliver: buffered, so that a writer does not wait for a busy loop,
	// and taken in the order they were delivered), fromPeer the receiving
	// goroutine's acks and read replies, synced a syncDone whose commit
	// (Peer.SyncDoneAcked) returned. Few channels keep the loop's select
	// short: a select locks every channel it waits on.
	inbox    chan inMsg
	fromPeer chan peerMsg
	synced   chan *Pending
	// closing: the loop takes no new message (deliver refuses it);
	// delivering counts the senders between their look at closing and
	// the end of their send; quiet wakes the last drain of the inbox
	// when the last of them leaves (closeToNew).
	closing    atomic.Bool
	delivering atomic.Int64
	quiet      chan struct{}
	// Out of the loop: frames for the sending goroutine.
	out chan *frame.Frame
	// ended is closed when the loop stops taking messages; finished once
	// it completed every entry; err is then the session's error.
	ended    chan struct{}
	finished chan struct{}
	err      error
	started  bool // Start ran (touched by the goroutine that runs the handshake)

	// For readers outside the loop (read balancing, resync pacing).
	pubAppBytes   atomic.Int64
	pubAhead      atomic.Bool
	catchUpPaused atomic.Bool

	// Owned by the loop (or by a Stepper's caller, which drives its
	// step, handle, on its own goroutine). every is the interval of its ticker, tick; rest
	// wakes it while it rests without one (restOn). io counts the sending
	// and receiving goroutines, which finish waits for.
	every    time.Duration
	tick     clock.Ticker
	rest     <-chan struct{}
	io       sync.WaitGroup
	queue    []*Pending
	inflight []*Pending
	// frames holds the last sequence number of each frame awaiting its
	// ack, oldest first.
	frames  []uint64
	nextSeq uint64
	// held: completions waiting behind a syncDone whose commit runs, in
	// ack order; committing is that syncDone.
	held       []*Pending
	committing *Pending
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
	// cached: the extents the peer acknowledged since its last
	// acknowledged flush, which it may hold only in its cache (cached.go).
	cached cachedSet
	// markErr: end could not track durably what the peer misses; written
	// before finished is closed.
	markErr error
	// stepping: a Stepper drives the loop (stepper.go); completed holds
	// the entries completed since its caller last took them.
	stepping  bool
	completed []*Pending
	// left: at the end, the entries the peer did not acknowledge, from
	// endLeft to endMarked.
	left []*Pending
}

// inMsg is a message into the loop (Session.inbox), of one kind: an entry
// (Enqueue, Submit), the blocks a Behind peer misses (MarkBehind), a
// write acknowledged to its client (CompletedLocally), a call (Do), or a
// work to run beside the loop (Run). Its fields are every kind's side by
// side, with no struct per kind and one func for a call and a work: the
// inbox holds inboxSize of them in every session, a thousand idle
// volumes' sessions too, and they take 88 bytes where the structs took
// 112.
type inMsg struct {
	kind inKind
	// inSubmit: the submission's (admit first, for its flags' word).
	admit  bool
	pd     *Pending
	answer chan Admission
	// inBehind: behindMark's; inCompletion: localCompletion's. Both
	// close ran.
	e     *replication.Entry
	seq   uint64
	bytes int64
	at    time.Time
	ran   chan struct{}
	// inCall runs fn on the loop (its error is nil), inWork beside it.
	fn func() error
}

type inKind uint8

const (
	inSubmit inKind = iota + 1
	inBehind
	inCompletion
	inCall
	inWork
)

// peerNews is the most news of the peer the loop has yet to take: each
// frame awaiting its ack brings at most its receipt (protocol B) and its
// ack, and the receiving goroutine hands over one read reply at a time,
// waiting for the loop's verdict. The receiving goroutine thus never
// waits for room in fromPeer, which a thousand idle volumes' sessions
// hold no more of than that.
const peerNews = 2*maxFramesInFlight + 1

// peerMsg is the receiving goroutine's news: an ack, or a read reply
// (isReply).
type peerMsg struct {
	ack     ackMsg
	isReply bool
	reply   replyMsg
}

// submission is an entry for the loop; admit (an application write under
// protocol A or B) asks the congestion controller first and answers.
type submission struct {
	pd     *Pending
	admit  bool
	answer chan Admission
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

// New makes the session of a stream whose handshake is done; Start (or
// Run) starts it. It ends with ctx.
func New(ctx context.Context, p Peer, s Stream, cfg Config) *Session {
	cfg.Clock = clock.Or(cfg.Clock)
	sctx, cancel := context.WithCancel(ctx)
	ss := &Session{peer: p, name: cfg.Name, bm: cfg.Bitmap, lag: cfg.Lag, cfg: cfg, beat: cfg.Beat,
		stream: s, ctx: sctx, cancel: cancel, timeout: cfg.Timeout, errc: make(chan error, 1),
		inbox: make(chan inMsg, inboxSize), quiet: make(chan struct{}, 1), fromPeer: make(chan peerMsg, peerNews), synced: make(chan *Pending, 1),
		out:   make(chan *frame.Frame, maxFramesInFlight+1),
		ended: make(chan struct{}), finished: make(chan struct{})}
	ss.lastRecv.Store(cfg.Clock.Now().UnixNano())
	return ss
}

// ID numbers the session among its peer's streams (Config.ID).
func (s *Session) ID() uint64 { return s.cfg.ID }

// Context ends when the session does.
func (s *Session) Context() context.Context { return s.ctx }

// Cancel ends the session; what it held is marked for the peer.
func (s *Session) Cancel() { s.cancel() }

// Resting reports whether the loop rests without a ticker (another
// stream to the same node probes it).
func (s *Session) Resting() bool { return s.resting.Load() }

// idle reports whether the stream holds nothing: no entry queued, none
// awaiting its ack, no frame on its way out. Only the loop calls it.
func (s *Session) idle() bool {
	return len(s.queue) == 0 && len(s.inflight) == 0 && len(s.out) == 0
}

// checkPeer is the loop's tick: it fails with ErrPeerTimeout when the
// peer answered nothing for the timeout, lets the congestion controller's
// time pass, and probes the peer when this idle stream is the pair's
// carrier or nothing was heard from the peer node for two intervals.
func (s *Session) checkPeer(every time.Duration) error {
	// A hung peer (a stopped process, a dead link) sends nothing: not
	// even the ack of a heartbeat. A busy stream is judged by its own
	// acks; an idle one owes nothing, and the peer node answering on any
	// stream will do.
	now := s.cfg.Clock.Now().UnixNano()
	idle := s.idle()
	quiet := time.Duration(now - s.lastRecv.Load())
	if idle {
		quiet = s.beat.quietSince(now, s.lastRecv.Load())
	}
	if quiet > s.timeout {
		return fmt.Errorf("%w: %s answered nothing for %s", ErrPeerTimeout, s.name, quiet.Round(time.Millisecond))
	}
	s.congestionTick()
	if idle && (s.beat.carries(s) || s.beat.quietSince(now, 0) >= 2*every) {
		f := frame.New(replication.BatchHeaderLen)
		f.SetBytes(replication.AppendBatchHeader(f.Bytes(), 0))
		s.out <- f // room: only the loop sends, and out is empty
	}
	return nil
}

// restOn returns what wakes this stream while it rests without a ticker,
// or nil when it must tick: it is busy, the congestion controller has
// time to keep (Ahead, a catch-up, writes held for room, blocks marked),
// or no other stream of the pair carries the probe.
func (s *Session) restOn() <-chan struct{} {
	if !s.idle() || len(s.waiting) > 0 || s.ahead || s.catchingUp {
		return nil
	}
	// The pair's check first: it is atomic loads, and the carrier (the
	// only stream of a single volume) stops there, while the bitmap's
	// count takes its lock; a loop turns idle after every ack at qd1.
	rest := s.beat.rest(s)
	if rest == nil || s.bm.Bytes() > 0 {
		return nil
	}
	return rest
}

// Fail ends the session with err (the first error wins).
func (s *Session) Fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
	s.cancel()
}

// Preload queues pd before the loop starts (the handshake's first entry).
func (s *Session) Preload(pd *Pending) {
	if s.started {
		panic("session: preload after start")
	}
	s.queue = append(s.queue, pd)
}

// Start starts the loop and the sending and receiving goroutines.
func (s *Session) Start() {
	if s.started {
		return
	}
	s.started = true
	go s.loop()
}

// Run drives the stream until it fails or ctx ends, then returns once the
// loop handed back what the peer did not acknowledge. work, when not nil,
// runs beside it (a resync or a pull); its error ends the session too.
func (s *Session) Run(work func() error) error {
	s.Start()
	if work != nil {
		s.deliver(inMsg{kind: inWork, fn: work})
	}
	<-s.finished
	return s.err
}

// loop is the session's owner: see Session. It starts the sending and
// receiving goroutines, then hands each message its select takes to
// handle, the loop's step, until the step says the session ends: finish
// then hands back what is left.
func (s *Session) loop() {
	s.io.Add(2)
	go func() { defer s.io.Done(); s.Fail(s.send()) }()
	go func() { defer s.io.Done(); s.Fail(s.receive()) }()
	s.begin()
	for {
		idle := s.idle()
		var ev event
		select {
		case err := <-s.errc:
			ev = event{kind: evFail, err: err}
		case <-s.ctx.Done():
			ev = event{kind: evCanceled}
		case <-s.tick.C():
			ev = event{kind: evTick}
		case <-s.rest:
			ev = event{kind: evRest}
		case m := <-s.inbox:
			ev = event{kind: evInbox, in: m}
		case m := <-s.fromPeer:
			ev = event{kind: evPeer, peer: m}
		case pd := <-s.synced:
			ev = event{kind: evSynced, synced: pd}
		}
		if stop, err := s.handle(idle, ev); stop {
			s.finish(err)
			return
		}
	}
}

// event is what one turn of the loop took, the input of its step
// (handle): a message of the inbox, an ack or a read reply of the peer, a
// syncDone's commit returned, a tick, the end of a rest, the first error,
// or the end of the session's context.
type event struct {
	kind   eventKind
	in     inMsg    // evInbox
	peer   peerMsg  // evPeer
	synced *Pending // evSynced
	err    error    // evFail
}

type eventKind uint8

const (
	evInbox    eventKind = iota + 1 // a message of the inbox (and what else was delivered meanwhile)
	evPeer                          // an ack or a read reply, from the receiving goroutine
	evSynced                        // a syncDone whose commit returned
	evTick                          // the ticker fired
	evRest                          // the pair's carrier left: the rest ends
	evFail                          // the first error (Fail)
	evCanceled                      // the session's context ended
)

// begin readies the loop before its first step: the ticker (a quarter of
// the timeout, at most maxHeartbeatInterval: one tick both checks that
// the peer answers and probes it) and the entries preloaded, sent.
func (s *Session) begin() {
	s.every = max(min(s.timeout/4, maxHeartbeatInterval), 10*time.Millisecond)
	s.tick = s.cfg.Clock.NewTicker(s.every)
	if err := s.sendQueued(); err != nil {
		s.Fail(err)
	}
}

// handle is the loop's step: what it does with ev, and after a message
// what follows each (the peer's silence counts from when the stream stops
// being idle, the queued entries go out in frames, the rest is looked
// at). idle is whether the stream was idle as the loop began to wait for
// ev. It reports whether the session ends, and its error. The frames it
// builds go to s.out: the sending goroutine takes them, or the caller of
// a Stepper, which drives the step on its own goroutine, takes them
// between steps (Stepper.Frame).
func (s *Session) handle(idle bool, ev event) (stop bool, err error) {
	switch ev.kind {
	case evFail:
		return true, ev.err
	case evCanceled:
		select {
		case err = <-s.errc:
		default:
		}
		return true, err
	case evTick:
		if err := s.checkPeer(s.every); err != nil {
			return true, err
		}
		// A heartbeat sent is no work of the stream's own: its silence
		// does not start over, and it may rest.
		s.rested()
		return false, nil
	case evRest:
		// The carrier left: this stream looks at once, as on a tick, and
		// may carry from now on.
		s.rest = nil
		s.tick.Reset(s.every)
		s.resting.Store(false)
		if err := s.checkPeer(s.every); err != nil {
			return true, err
		}
	case evInbox:
		s.take(ev.in)
		// What else was delivered meanwhile goes into the same frames:
		// one wake of the loop for a burst of writes.
		s.takeDelivered(inboxSize)
	case evPeer:
		if ev.peer.isReply {
			ev.peer.reply.err <- s.readReply(ev.peer.reply)
		} else {
			s.acked(ev.peer.ack)
		}
	case evSynced:
		s.syncCommitted(ev.synced)
	default:
		panic(fmt.Sprintf("session: an event of no kind (%d)", ev.kind))
	}
	if idle && !s.idle() {
		// The stream owed the peer nothing until now: its silence counts
		// from here.
		s.lastRecv.Store(s.cfg.Clock.Now().UnixNano())
	}
	if err := s.sendQueued(); err != nil {
		s.Fail(err)
	}
	s.rested()
	return false, nil
}

// rested stops the ticker when the stream may rest (restOn), and starts
// it again when it may not. An idle stream that another stream of the
// pair probes for rests: it waits on rest, which wakes it when that
// carrier leaves (it failed, or its volume went). A thousand idle volumes
// thus keep one ticker per peer node.
func (s *Session) rested() {
	switch r := s.restOn(); {
	case r != nil && s.rest == nil:
		s.tick.Stop()
		s.rest = r
		s.resting.Store(true)
		s.shed()
	case r == nil && s.rest != nil:
		s.rest = nil
		s.tick.Reset(s.every)
		s.resting.Store(false)
	}
}

// restingCap is the most room for entries a resting stream keeps (shed):
// a connection's queue depth of writes, which a stream that rests between
// bursts of them (not the pair's carrier) keeps without an allocation.
const restingCap = inboxSize

// shed drops, as the stream starts to rest, the room its last burst grew
// (a resync's window, a deep queue of writes): its queue and entries in
// flight, empty, the cached set's runs, none since the last flush, and
// its resync runs, none in flight. A thousand idle volumes' streams then
// hold none of it; the next burst grows it again.
func (s *Session) shed() {
	if cap(s.queue) > restingCap {
		s.queue = nil
	}
	if cap(s.inflight) > restingCap {
		s.inflight = nil
	}
	if s.cached.empty() && cap(s.cached.runs) > restingCap {
		s.cached.runs = nil
	}
	if len(s.runs) == 0 {
		s.runs = nil
	}
	if len(s.remarked) == 0 {
		s.remarked = nil
	}
}

// finish ends the session after its last step, with err: the stream is
// closed and takes no new message (closeToNew), and once the sending and
// receiving goroutines and those the loop started returned, end hands
// back what the peer did not acknowledge (the volume tracks the peer
// first, when that is needed); then Finished is closed.
func (s *Session) finish(err error) {
	var tracked error
	if s.stop(err) {
		tracked = s.peer.StartTracking()
	}
	s.marked(tracked)
}

// stop is finish up to the peer's tracking: the stream stops, and the
// entries left are taken from the loop (endLeft). It reports whether
// they, or what the peer holds in its cache only, need the peer tracked
// (Peer.StartTracking) BEFORE marked marks them.
func (s *Session) stop(err error) (track bool) {
	s.tick.Stop()
	s.cancel()
	s.stream.Close()
	s.closeToNew()
	s.io.Wait()
	s.extra.Wait()
	s.err = err
	return s.endLeft()
}

// marked is the rest of finish once the peer's tracking returned tracked
// (nil when none was needed): what is left is marked and completed
// (endMarked), then Finished is closed.
func (s *Session) marked(tracked error) {
	s.endMarked(tracked)
	s.beat.leave(s)
	close(s.finished)
}

// take handles a message of the inbox.
func (s *Session) take(m inMsg) {
	switch m.kind {
	case inSubmit:
		if m.admit && s.closing.Load() {
			m.answer <- AdmitEnded // the stream ends: not taken
			return
		}
		if m.admit {
			s.admit(submission{pd: m.pd, admit: true, answer: m.answer})
		} else {
			s.accept(m.pd)
		}
	case inBehind:
		s.markedBehind(behindMark{e: m.e, ran: m.ran})
	case inCompletion:
		s.completedLocally(localCompletion{seq: m.seq, bytes: m.bytes, at: m.at, ran: m.ran})
	case inCall:
		_ = m.fn() // Do's: it returns nil
	case inWork:
		if s.closing.Load() {
			return // Run's work does not start on a stream that ends
		}
		s.extra.Add(1)
		go func() {
			defer s.extra.Done()
			if err := m.fn(); err != nil {
				s.Fail(err)
			}
		}()
	default:
		panic(fmt.Sprintf("session: a message of no kind (%d)", m.kind))
	}
}

// Do runs f on the loop and returns once it ran; false: the loop ended,
// f did not run.
func (s *Session) Do(f func()) bool {
	ran := make(chan struct{})
	if !s.deliver(inMsg{kind: inCall, fn: func() error { f(); close(ran); return nil }}) {
		return false
	}
	<-ran
	return true
}

// inboxSize is how many messages wait for the loop before a sender
// waits: more than a connection's queue depth of writes.
const inboxSize = 64

// deliver hands m to the loop, in the order of the inbox. It reports
// false, m not taken, once the loop takes no new message (closing); a
// message delivered is taken, by the loop or by its last drain
// (closeToNew), even when the session ends meanwhile. So a writer never
// waits for a busy loop to take its entry (a wakeup per peer and write),
// and the end still hands back every entry delivered. A sender waits
// only while the inbox is full.
func (s *Session) deliver(m inMsg) bool {
	// The count before the look at closing, and closeToNew's store of
	// closing before its look at the count (atomics are sequentially
	// consistent): either the sender sees closing, or the drain sees the
	// sender and waits for it to leave.
	s.delivering.Add(1)
	defer func() {
		if s.delivering.Add(-1) == 0 && s.closing.Load() {
			select {
			case s.quiet <- struct{}{}:
			default: // the drain has a wake already
			}
		}
	}()
	if s.closing.Load() {
		return false
	}
	s.inbox <- m // the loop, or its last drain, takes it
	return true
}

// takeDelivered takes up to n messages waiting in the inbox, without
// waiting; it reports whether it took n (more may wait).
func (s *Session) takeDelivered(n int) bool {
	for range n {
		select {
		case m := <-s.inbox:
			s.take(m)
		default:
			return false
		}
	}
	return true
}

// accept queues pd; the loop owns it from here.
func (s *Session) accept(pd *Pending) {
	switch pd.Kind {
	case EntryResync:
		// Blocks marked again while this run is in flight (pull-ahead)
		// keep their marks: the run carries their older data.
		if s.runs == nil {
			s.runs = map[int64]int64{}
		}
		s.runs[pd.Entry.Off] = pd.Entry.Length
	}
	s.queue = append(s.queue, pd)
}

// sendQueued hands queued entries, batched into frames, to the sending
// goroutine until the queue is empty or every frame slot is taken.
func (s *Session) sendQueued() error {
	for len(s.queue) > 0 && len(s.frames) < maxFramesInFlight {
		// size is the batch's length, own the bytes the frame holds
		// itself: a payload of byReference bytes or more goes out from
		// where it lies.
		size, own := replication.BatchHeaderLen, replication.BatchHeaderLen
		k := 0
		for k < len(s.queue) && k < maxBatchEntries {
			e := &s.queue[k].Entry
			if !s.cfg.Sums {
				e.Sums = nil
			}
			n := e.EncodedLen()
			if k > 0 && size+n > maxBatchBytes {
				break
			}
			size += n
			own += n
			if refersTo(e) {
				own -= len(e.Data)
			}
			k++
		}
		batch := s.queue[:k]
		receipt := false
		for _, pd := range batch {
			s.nextSeq++
			pd.Entry.Seq = s.nextSeq
			s.inflight = append(s.inflight, pd)
			receipt = receipt || pd.Received != nil
		}
		s.frames = append(s.frames, s.nextSeq)
		f := frame.New(own)
		b := replication.AppendBatchHeaderReceipt(f.Bytes(), len(batch), receipt)
		for _, pd := range batch {
			if refersTo(&pd.Entry) {
				// The payload stays where it is until the frame is
				// written: the writer waits for the entry (protocols B
				// and C), the entry owns a copy (A), or its buffer is
				// freed when it completes (a resync run).
				b = replication.AppendEntryHeader(b, &pd.Entry)
				f.Ref(len(b), pd.Entry.Data)
				continue
			}
			b = replication.AppendEntry(b, &pd.Entry)
			if pd.Buf != nil {
				s.cfg.FreeBuffer(pd.Buf)
				pd.Buf, pd.Entry.Data = nil, nil
			}
		}
		f.SetBytes(b)
		clear(s.queue[:k])
		s.queue = s.queue[k:]
		s.cfg.Counters.FramesSent.Add(1)
		s.cfg.Counters.EntriesSent.Add(uint64(k))
		select {
		case s.out <- f: // out has room for every frame in flight
		case <-s.ctx.Done():
			return nil
		}
	}
	return nil
}

// byReference is the smallest payload a frame carries by reference
// rather than by copy: below it a copy costs less than a piece of a
// writev.
const byReference = 2048

// refersTo reports whether a frame carries e's payload by reference.
func refersTo(e *replication.Entry) bool {
	return e.Op.HasPayload() && len(e.Data) >= byReference
}

// send is the sending goroutine: it writes the frames the loop built, in
// order.
func (s *Session) send() error {
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case f := <-s.out:
			if err := s.stream.Send(f); err != nil {
				return fmt.Errorf("send to %s: %w", s.name, err)
			}
		}
	}
}

// receive hands the peer's acks and replies to the loop.
func (s *Session) receive() error {
	f := &frame.Frame{}
	defer f.Release()
	verdict := make(chan error, 1)
	for {
		if err := s.stream.Recv(f); err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from %s: %w", s.name, err)
		}
		m, news, err := s.received(f)
		if err != nil {
			return err
		}
		if !news {
			continue
		}
		if m.isReply {
			m.reply.err = verdict
		}
		select {
		case s.fromPeer <- m:
		case <-s.ended:
			return nil
		}
		if !m.isReply {
			continue
		}
		// The loop may end with the reply still queued: then it never
		// answers.
		select {
		case err := <-verdict:
			if err != nil {
				return err
			}
		case <-s.ended:
			return nil
		}
	}
}

// received reads the peer's frame f: the peer was heard from now, and m
// is its ack or read reply for the loop (news false: nothing for it, a
// heartbeat's ack or the peer saying it is busy); an error ends the
// session. A reply's data is f's: the caller sets reply.err, which the
// loop answers once it is done with the data.
func (s *Session) received(f *frame.Frame) (m peerMsg, news bool, err error) {
	now := s.cfg.Clock.Now().UnixNano()
	s.lastRecv.Store(now)
	s.beat.heard(now)
	if b := f.Bytes(); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameReadReply {
		seq, st, data, err := replication.DecodeReadReply(b)
		if err != nil {
			return peerMsg{}, false, err
		}
		return peerMsg{isReply: true, reply: replyMsg{seq: seq, st: st, data: data}}, true, nil
	}
	ack, err := replication.DecodeAck(f.Bytes())
	if err != nil {
		return peerMsg{}, false, err
	}
	if ack.Status == replication.AckChecksum {
		return peerMsg{}, false, fmt.Errorf("%w: %s", ErrFrameRefused, ack.Message)
	}
	if ack.Status != replication.AckOK && ack.Status != replication.AckReceived {
		return peerMsg{}, false, fmt.Errorf("%w: %s", ErrPeerDiskFailed, ack.Message)
	}
	if ack.Seq == 0 {
		return peerMsg{}, false, nil // a heartbeat's ack, or the peer saying it is busy
	}
	return peerMsg{ack: ackMsg{seq: ack.Seq, received: ack.Status == replication.AckReceived}}, true, nil
}

// acked completes the entries up to m.seq (or, protocol B, marks them
// received).
func (s *Session) acked(m ackMsg) {
	if m.received {
		// Protocol B: the peer holds these entries in memory.
		for _, pd := range s.inflight {
			if pd.Entry.Seq > m.seq {
				break
			}
			pd.markReceived()
		}
		return
	}
	k := 0
	for k < len(s.inflight) && s.inflight[k].Entry.Seq <= m.seq {
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
		lagSeq = max(lagSeq, pd.LagSeq)
		// In ack order, which is the order the peer applied them: a flush
		// covers what came before it, not what came after it in the same
		// ack.
		switch {
		case durableOnAck(&pd.Entry):
			s.cached.reset()
		case cachedOnAck(pd):
			s.cached.add(pd.Entry.Off, pd.Entry.Length)
		}
		s.ackedOne(pd)
	}
	clear(done)
	s.inflight = s.inflight[k:]
	if lagSeq > 0 {
		// Under protocol C no write is counted in the lag before its
		// acks (CompletedLocally): the ack leaves the lag as it was, and
		// publishing it again would cost every ack of every peer an
		// allocation and a wake of the volume's watchers for nothing.
		bytes, oldest := s.lag.Bytes(), s.lag.Oldest()
		s.lag.PeerAcked(lagSeq)
		if s.lag.Bytes() != bytes || !s.lag.Oldest().Equal(oldest) {
			s.publishLag()
		}
	}
}

// ackedOne completes pd, acknowledged, in ack order: behind a syncDone
// whose commit runs, it waits for that commit.
func (s *Session) ackedOne(pd *Pending) {
	switch {
	case s.committing != nil:
		s.held = append(s.held, pd)
	case pd.Kind == EntrySyncDone:
		// The commit takes the volume's state lock and writes stable
		// storage: not on the loop, which keeps taking entries meanwhile.
		s.committing = pd
		pd.markReceived()
		s.extra.Add(1)
		go func() {
			defer s.extra.Done()
			pd.inSync = s.peer.SyncDoneAcked(s, pd.Gen)
			s.synced <- pd
		}()
	default:
		s.complete(pd, true, nil)
	}
}

// syncCommitted finishes a syncDone once its commit returned, and the
// completions held behind it.
func (s *Session) syncCommitted(pd *Pending) {
	if s.committing != pd {
		panic("session: a syncDone committed that was not committing")
	}
	s.committing = nil
	if pd.inSync {
		s.lag.CaughtUp()
		s.publishLag()
		s.peer.Stream(volstate.PeerInSync{Peer: s.name, Session: s.cfg.ID})
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
func (s *Session) complete(pd *Pending, acked bool, err error) {
	c := &s.cfg.Counters
	pd.acked, pd.err = acked, err
	pd.markReceived()
	switch pd.Kind {
	case EntryResync:
		if !acked {
			s.clearRun(pd.Entry.Off, 0)
			break
		}
		cleared := s.clearRun(pd.Entry.Off, pd.Entry.Length)
		c.ResyncDone.Add(pd.Entry.Length)
		s.lag.Resynced(cleared)
		s.publishLag()
	case EntryCsums:
		if !acked {
			break
		}
		// Matching blocks are in sync; differing ones stay marked for the
		// data pass.
		off, length := pd.Entry.Off, pd.Entry.Length
		same, next := int64(0), 0
		for b := int64(0); b*replication.BlockSize < length; b++ {
			if next < len(pd.differ) && int64(pd.differ[next]) == b {
				next++
				continue
			}
			s.bm.ClearBits(off+b*replication.BlockSize, replication.BlockSize)
			same += replication.BlockSize
		}
		c.ResyncDone.Add(min(same, length))
		c.ChecksumsSkipped.Add(min(same, length))
	case EntryVerify:
		if acked {
			c.VerifyDone.Add(pd.Entry.Length)
		}
	}
	if pd.Buf != nil {
		s.cfg.FreeBuffer(pd.Buf)
		pd.Buf, pd.Entry.Data = nil, nil
	}
	if pd.Wire > 0 {
		s.released(pd.Wire)
	}
	if pd.Held != nil {
		pd.Held.Done()
	}
	if pd.slot != nil {
		<-pd.slot
	}
	close(pd.done)
	if s.stepping {
		s.completed = append(s.completed, pd)
	}
	if pd.Joint != nil {
		pd.Joint.Release()
	}
}

// readReply hands an OpRead's or a run's checksum answer to its entry.
func (s *Session) readReply(m replyMsg) error {
	for _, pd := range s.inflight {
		if pd.Entry.Seq != m.seq {
			continue
		}
		switch pd.Kind {
		case EntryCsums, EntryVerify:
			blocks := (pd.Entry.Length + replication.BlockSize - 1) / replication.BlockSize
			idx, err := replication.DecodeMismatches(m.data, blocks)
			if m.st != replication.AckOK || err != nil {
				idx = allBlocks(pd.Entry.Length) // the peer could not read: the whole run
			}
			if pd.Kind == EntryCsums {
				pd.differ = idx
				break
			}
			for _, i := range idx {
				s.bm.SetBits(pd.Entry.Off+int64(i)*replication.BlockSize, replication.BlockSize)
				s.cfg.Counters.VerifyFound.Add(replication.BlockSize)
			}
		case EntryRead:
			if m.st == replication.AckOK && pd.ReadBuf != nil && len(m.data) == len(pd.ReadBuf) {
				copy(pd.ReadBuf, m.data)
				pd.readOK = true
			}
		default:
			return fmt.Errorf("%s answered entry %d, not a read, with data", s.name, m.seq)
		}
		return nil
	}
	return fmt.Errorf("%s answered a read %d that is not in flight", s.name, m.seq)
}

// publishLag makes the peer's lag readable outside the loop.
func (s *Session) publishLag() { s.peer.PublishLag() }

// closeToNew ends the peer's stream (writes go to its bitmap from here)
// and the loop's taking of messages; the writes it holds for room try
// again, and find the stream gone.
func (s *Session) closeToNew() {
	s.peer.Ended(s)
	s.closing.Store(true)
	close(s.ended)
	// The messages delivered before closing are taken as the loop takes
	// them (take, closing): an entry goes to the queue and end marks it,
	// a call runs, a Behind peer's blocks are marked; a write asking for
	// admission is refused, as those held for room are; a work does not
	// start. The drain waits for every sender that saw the stream open.
	for {
		for s.takeDelivered(inboxSize) {
		}
		if s.delivering.Load() == 0 {
			break
		}
		select {
		case m := <-s.inbox:
			s.take(m)
		case <-s.quiet:
		}
	}
	// They have all sent and left: what they sent is in the inbox.
	for s.takeDelivered(inboxSize) {
	}
	for _, w := range s.waiting {
		w.answer <- AdmitEnded
	}
	s.waiting = nil
}

// endLeft and endMarked are the session's end: they hand back every
// entry the peer did not acknowledge. Their blocks are marked in the
// peer's bitmap, after the volume durably started tracking the peer (a
// new generation). So are the blocks the peer
// acknowledged from its cache since its last acknowledged flush (a power
// loss of the peer may take them), and those marks are written to stable
// storage: their extents may have left the activity log. All of it
// happens BEFORE any entry left completes, a flush among them too: a
// FLUSH waiting on this peer completes only once the peer is tracked and
// what it may lose is marked, durably. When that cannot be made durable,
// the entries complete with the error, and no write or flush waiting for
// them may succeed (nor a flush that comes after the stream ended:
// MarkErr). It runs on the loop's goroutine once every other goroutine of
// the session returned, in two parts around the peer's tracking (finish
// calls Peer.StartTracking between them; a Stepper's caller may track
// the peer itself, over steps of its own: Stepper.TrackApart): endLeft
// takes what is left and reports whether the peer must be tracked,
// endMarked marks and completes it.
func (s *Session) endLeft() (track bool) {
	// A syncDone the peer acknowledged, and what waits behind it.
	for s.committing != nil {
		s.extra.Wait()
		s.syncCommitted(<-s.synced)
	}
	s.left = append(s.inflight, s.queue...)
	s.inflight, s.queue, s.frames = nil, nil, nil
	// What the peer did not acknowledge is marked for it now.
	s.lag.Disconnected()
	s.publishLag()
	track = !s.cached.empty()
	for _, pd := range s.left {
		track = track || ChangesData(pd.Entry.Op)
	}
	return track
}

// endMarked is the end's part after the peer's tracking, which returned err
// (nil too when none was needed).
func (s *Session) endMarked(err error) {
	left := s.left
	s.left = nil
	for _, pd := range left {
		markEntry(s.bm, &pd.Entry)
	}
	if !s.cached.empty() {
		for _, r := range s.cached.runs {
			s.bm.SetBits(r.off, r.end-r.off)
		}
		s.cached.reset()
		if ferr := s.bm.Flush(); ferr != nil && err == nil {
			err = fmt.Errorf("mark what %s holds only in its cache: %w", s.name, ferr)
		}
	}
	s.markErr = err
	for _, pd := range left {
		s.complete(pd, false, err)
	}
}

// hasEnded reports whether the stream ended: the loop takes no more
// messages, and Finished follows once end marked what the peer misses.
func (s *Session) hasEnded() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

// Finished is closed once the session ended and end marked what the peer
// misses or may hold only in its cache.
func (s *Session) Finished() <-chan struct{} { return s.finished }

// MarkErr is, after Finished, why what the peer misses or holds only in
// its cache could not be tracked durably at the session's end (nil: it
// was, or nothing needed it). A FLUSH that finds the stream ended must
// then fail.
func (s *Session) MarkErr() error { return s.markErr }

// Window keeps at most a fixed number of entries of one run loop (resync,
// verify) awaiting their acks on a session.
type Window struct {
	s     *Session
	slots chan struct{}
}

// Window returns a window of size entries on s.
func (s *Session) Window(size int) *Window {
	return &Window{s: s, slots: make(chan struct{}, size)}
}

// InFlight is the number of entries sent and not yet completed.
func (w *Window) InFlight() int { return len(w.slots) }

// Runs sends the entries next produces, one per free slot, until next
// reports none left (pd nil) and every entry sent has completed. next runs
// with a slot held; unlock, when next returns one, is called once the
// entry is queued (a range lock held across its read and its queueing).
// pace runs before each slot is taken. The entry frees its slot when it
// completes.
func (w *Window) Runs(ctx context.Context, pace func() error, next func() (pd *Pending, unlock func(), err error)) error {
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
		ok := w.s.Enqueue(pd)
		if unlock != nil {
			unlock()
		}
		if !ok {
			if pd.Buf != nil {
				w.s.cfg.FreeBuffer(pd.Buf)
			}
			<-w.slots
			return ErrEnded
		}
	}
}

func (w *Window) acquire(ctx context.Context) error {
	select {
	case w.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.s.ctx.Done():
		return ErrEnded
	}
}

// drain waits until every entry sent through the window has completed.
func (w *Window) drain(ctx context.Context) error {
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

// allBlocks lists every block index of a run of length bytes.
func allBlocks(length int64) []uint32 {
	idx := make([]uint32, 0, (length+replication.BlockSize-1)/replication.BlockSize)
	for i := range uint32((length + replication.BlockSize - 1) / replication.BlockSize) {
		idx = append(idx, i)
	}
	return idx
}
