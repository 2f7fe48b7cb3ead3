package session

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/mdtest"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// TestSessionSteps drives the session's real loop, its step (handle), on
// the test's goroutine through a Stepper: none of its goroutines runs. A PCG seeded per run
// chooses each turn: a writer hands the session a write (protocol C
// through Enqueue, A or B through Submit, some FUA), a flush or a read;
// the loop takes its inbox; the test takes the frames it built
// (Stepper.Frame, the sending goroutine's place) as the peer receives them; the peer
// acknowledges what it received, one frame or several at once and in
// order as the applier does, says protocol B's batches arrived, answers
// reads before their ack, and sends a heartbeat's empty ack; the fake
// clock moves and the ticker fires (the peer's silence may end the
// stream); and sometimes the stream breaks (the link is cut, the peer's
// disk fails, the session is cancelled), and the volume's tracking of the
// peer may fail. After every step it checks:
//
//   - no entry completes acknowledged before the peer acknowledged it, or
//     twice, and each the peer acknowledged has completed acknowledged;
//   - protocol B's Received is closed only once the peer said it arrived
//     (or the entry completed);
//   - the frames carry the entries in the order the session took them,
//     numbered one after the other;
//   - an entry completes unacknowledged only once the stream ended, and
//     only once what the peer did not make durable (not acknowledged, or
//     acknowledged from its cache after its last acknowledged flush) is
//     marked in its bitmap, after the volume tracked the peer: a flush
//     waiting on the peer never sees it in sync when it is not; its error
//     is the tracking's;
//   - once the stream ended, every entry it took has completed, none it
//     refused has, and it takes no more.
//
// A failure prints its seed and the transcript's tail. To replay a seed
// (each is deterministic: one goroutine, the fake clock, the seeded
// choices), with its whole transcript:
//
//	go test -run TestSessionSteps ./node/session/ -v -seed N
//
// and -seeds N runs seeds 1 to N instead of the 500 of the normal run.
func TestSessionSteps(t *testing.T) {
	if *stepSeed != 0 {
		r := runSteps(t, *stepSeed)
		if r.failure != "" {
			t.Fatal(r.report(0))
		}
		t.Log(r.report(0))
		return
	}
	for seed := uint64(1); seed <= *stepSeeds; seed++ {
		if r := runSteps(t, seed); r.failure != "" {
			t.Fatal(r.report(80))
		}
	}
}

var (
	stepSeed  = flag.Uint64("seed", 0, "TestSessionSteps: replay this seed only, with its transcript")
	stepSeeds = flag.Uint64("seeds", 500, "TestSessionSteps: run seeds 1 to this")
)

const (
	// stepEntries bounds the entries a run offers; stepTurns its turns.
	stepEntries = 120
	stepTurns   = 1500
	// stepTimeout is the session's: a quarter of it is its tick.
	stepTimeout = 2 * time.Second
	// stepStride spaces the entries' extents: each entry has its own.
	stepStride = 4 * replication.BlockSize
)

// stepData is every write's payload (the entries differ by extent).
var stepData = bytes.Repeat([]byte{0xa5}, stepStride)

var (
	errLinkCut     = errors.New("link cut")
	errTrackFailed = errors.New("the volume could not track the peer")
)

// The node's peer hands a session its *metadata.PeerBitmap.
var _ Bitmap = (*metadata.PeerBitmap)(nil)

// testBitmap is the peer's bitmap on metadata of an in-memory device of a
// volume of cacheTestVolume bytes; dev and opts open the metadata again.
func testBitmap(tb testing.TB) (bm *metadata.PeerBitmap, dev *mdtest.Device, opts metadata.MDOptions) {
	tb.Helper()
	opts = metadata.MDOptions{Placement: metadata.Internal, DeviceSize: cacheTestVolume + 8<<20,
		VolumeSize: cacheTestVolume, NodeID: cacheTestSelf, Peers: []uint32{cacheTestPeer}}
	dev = mdtest.NewDevice(opts.DeviceSize)
	md, err := metadata.CreateMD(dev, opts)
	if err != nil {
		tb.Fatal(err)
	}
	bm, _ = md.Bitmap(cacheTestPeer)
	return bm, dev, opts
}

// stepPeer is the Peer of a run: its congestion is the run's, and its
// StartTracking records that it ran and what the bitmap held then.
type stepPeer struct {
	loosePeer
	cong        replication.CongestionConfig
	bm          *metadata.PeerBitmap
	fail        error
	tracked     int
	markedFirst int64
	ended       int
}

func (p *stepPeer) Congestion() replication.CongestionConfig { return p.cong }
func (p *stepPeer) Ended(*Session)                           { p.ended++ }

func (p *stepPeer) StartTracking() error {
	p.tracked++
	p.markedFirst = p.bm.Count()
	return p.fail
}

// stepStream is the session's Stream in a run: nothing goes through it,
// the test takes the frames from the Stepper and hands it the peer's.
type stepStream struct{ closed bool }

func (*stepStream) Send(*transport.Frame) error { return errors.New("a run sends nothing itself") }
func (*stepStream) Recv(*transport.Frame) error { return errors.New("a run receives nothing itself") }
func (st *stepStream) Close()                   { st.closed = true }

// stepEntry is one entry a run offered.
type stepEntry struct {
	id     int
	e      replication.Entry // as offered
	pd     *Pending
	proto  byte
	answer <-chan Admission // a Submit's, until answered
	taken  bool             // the session took it
	// seq: as the peer received it (0: not yet).
	seq       uint64
	completed int
	// replied: a read's reply was handed to the loop; whole: with all
	// its data.
	replied, whole bool
	readChecked    bool
}

// stepHold is an entry's Hold: the session calls Done as the entry
// completes, after its outcome is set and before done is closed.
type stepHold struct {
	r *stepRig
	x *stepEntry
}

func (h stepHold) Done() { h.r.completed(h.x) }

// stepRig is one run.
type stepRig struct {
	seed    uint64
	rng     *rand.Rand
	clk     *clock.Fake
	st      *Stepper // drives s's loop
	s       *Session
	peer    *stepPeer
	stream  *stepStream
	bm      *metadata.PeerBitmap
	log     []string
	failure string

	entries []*stepEntry // every entry offered
	order   []*stepEntry // those the session took, in the order it took them
	nextOut int          // the index in order of the next entry a frame must carry
	// The peer: frames holds the last seq of each frame received and not
	// acknowledged; recvd the last seq received; ackedTo the last
	// acknowledged; flushTo the last flush acknowledged; receipts the
	// protocol B batches whose arrival it has not said yet, saidTo the
	// last it said.
	frames   []uint64
	recvd    uint64
	ackedTo  uint64
	flushTo  uint64
	receipts []uint64
	saidTo   uint64
	waiting  *stepEntry // a Submit not answered yet: the writer waits
	ended    bool
	endErr   error
	// apart: the run tracks the peer at the end itself (TrackApart).
	apart bool
	// completions counts the entries completed (their Hold), taken the
	// Stepper's Completed.
	completions, taken int
}

func runSteps(t *testing.T, seed uint64) *stepRig {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x5e55))
	r := &stepRig{seed: seed, rng: rng, clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), stream: &stepStream{}}
	r.bm, _, _ = testBitmap(t)
	r.peer = &stepPeer{bm: r.bm, cong: replication.CongestionConfig{Policy: replication.CongestionBlock, SendBuffer: []int64{1 << 30, 48 << 10, 20 << 10}[rng.IntN(3)]}}
	if rng.IntN(4) == 0 {
		r.peer.fail = errTrackFailed
	}
	cfg := looseConfig(stepTimeout)
	cfg.Bitmap, cfg.Clock = r.bm, r.clk
	r.st = NewStepper(context.Background(), r.peer, r.stream, cfg) // its loop is this test
	r.s = r.st.Session()
	// Every other seed tracks the peer itself at the end, as a
	// simulation does over its own steps (TrackApart).
	r.apart = seed%2 == 0
	if r.apart {
		r.st.TrackApart()
	}
	r.logf("seed %d: send buffer %d, tracking fails: %v, tracked apart: %v", seed, r.peer.cong.SendBuffer, r.peer.fail != nil, r.apart)
	r.poll()
	for turn := 0; turn < stepTurns && !r.ended && r.failure == ""; turn++ {
		r.turn()
		r.poll()
		r.check()
	}
	if !r.ended && r.failure == "" {
		r.logf("the run ends: the link is cut")
		r.s.Fail(errLinkCut)
		r.poll()
		r.check()
	}
	return r
}

// turn takes one seeded choice.
func (r *stepRig) turn() {
	s := r.s
	switch n := r.rng.IntN(100); {
	case n < 30:
		if r.waiting == nil && len(r.entries) < stepEntries && len(s.inbox) < inboxSize {
			r.offer()
		}
	case n < 45:
		if k := r.st.Delivered(); k > 0 && !r.ended {
			r.logf("the loop takes its inbox (%d waiting)", k)
			r.st.Inbox()
			r.stepped()
		}
	case n < 60:
		r.receiveFrame()
	case n < 75:
		r.ack()
	case n < 80:
		r.sayReceived()
	case n < 85:
		r.reply(false)
	case n < 88:
		r.logf("the peer sends a heartbeat's ack")
		r.peerFrame(replication.AppendAck(nil, replication.Ack{}))
	case n < 98:
		d := time.Duration(r.rng.IntN(int(s.every/time.Millisecond)+1)) * time.Millisecond
		r.clk.Advance(d)
		r.logf("the clock moves %v", d)
		if r.st.Tick() {
			r.logf("the ticker fired")
			r.stepped()
		}
	default:
		if r.rng.IntN(6) != 0 { // a failure is rarer still
			return
		}
		switch r.rng.IntN(3) {
		case 0:
			r.logf("the link is cut")
			s.Fail(fmt.Errorf("receive from beta: %w", errLinkCut))
		case 1:
			r.logf("the peer's disk fails")
			r.peerFrame(replication.AppendAck(nil, replication.Ack{Seq: r.ackedTo, Status: replication.AckIOError, Message: "disk gone"}))
		case 2:
			r.logf("the session is cancelled")
			s.Cancel()
		}
	}
}

// offer hands the session a new entry, as the node's writer does.
func (r *stepRig) offer() {
	id := len(r.entries) + 1
	x := &stepEntry{id: id}
	e := replication.Entry{Off: int64(id) * stepStride, Length: int64(1+r.rng.IntN(stepStride/replication.BlockSize)) * replication.BlockSize}
	switch n := r.rng.IntN(10); {
	case n < 6:
		e.Op, e.Data = replication.OpWrite, stepData[:e.Length]
		if r.rng.IntN(4) == 0 {
			e.Flags |= replication.EntryFUA
		}
		x.proto = "ABCC"[r.rng.IntN(4)]
	case n < 8:
		e.Op, e.Off, e.Length = replication.OpFlush, 0, 0
		x.proto = 'C'
	case n < 9:
		e.Op = replication.OpTrim
		x.proto = 'C'
	default:
		e.Op, e.Length = replication.OpRead, replication.BlockSize
		x.proto = 'C'
	}
	x.e = e
	pd := NewPending(e)
	pd.Held = stepHold{r, x}
	if e.Op == replication.OpRead {
		pd.Kind, pd.ReadBuf = EntryRead, make([]byte, e.Length)
	}
	x.pd = pd
	r.entries = append(r.entries, x)
	congestion := x.proto != 'C' && ChangesData(e.Op)
	if congestion {
		pd.Wire = int64(e.EncodedLen())
		if x.proto == 'B' {
			pd.Received = make(chan struct{})
		}
		x.answer = r.st.Submit(pd)
		if x.answer == nil {
			r.logf("entry %d (%s), protocol %c: refused, the stream ended", id, describe(&e), x.proto)
			return
		}
		r.logf("entry %d (%s), protocol %c: submitted", id, describe(&e), x.proto)
		x.taken, r.waiting = true, x
		r.order = append(r.order, x)
		return
	}
	if ChangesData(e.Op) {
		pd.LagSeq = r.s.cfg.WriteSeq.Add(1)
	}
	if !r.s.Enqueue(pd) {
		r.logf("entry %d (%s): refused, the stream ended", id, describe(&e))
		return
	}
	r.logf("entry %d (%s), protocol %c: enqueued", id, describe(&e), x.proto)
	x.taken = true
	r.order = append(r.order, x)
}

func describe(e *replication.Entry) string {
	op := map[replication.Op]string{replication.OpWrite: "write", replication.OpFlush: "flush", replication.OpTrim: "trim", replication.OpRead: "read"}[e.Op]
	s := fmt.Sprintf("%s %d+%d", op, e.Off/replication.BlockSize, e.Length/replication.BlockSize)
	if e.Flags&replication.EntryFUA != 0 {
		s += " FUA"
	}
	return s
}

// stepped is the look after a step of the loop (the Stepper's): whether
// it ended the session, and the entries it completed.
func (r *stepRig) stepped() {
	r.taken += len(r.st.Completed())
	if r.taken != r.completions {
		r.fail("the Stepper handed back %d completed entries, %d completed", r.taken, r.completions)
	}
	if r.ended || !r.st.Ended() {
		return
	}
	r.logf("the loop stops: %v", r.st.Err())
	r.ended, r.endErr = true, r.st.Err()
	if !r.stream.closed {
		r.fail("the session ended without closing its stream")
	}
	if !r.apart {
		return
	}
	r.answered() // a Submit the end refused is not the end's to mark
	if r.st.Tracking() != r.needsTracking() {
		r.fail("the end waits for the peer's tracking: %v, while what is left needs it: %v", r.st.Tracking(), r.needsTracking())
		return
	}
	if !r.st.Tracking() {
		return
	}
	select {
	case <-r.s.Finished():
		r.fail("Finished is closed while the end waits for the peer's tracking")
		return
	default:
	}
	// The run tracks the peer, as StartTracking would have; what is left
	// completes only now (completed checks that it is marked after).
	r.logf("the run tracks the peer")
	r.peer.tracked++
	r.peer.markedFirst = r.bm.Count()
	r.st.Tracked(r.peer.fail)
	r.taken += len(r.st.Completed())
	if r.taken != r.completions {
		r.fail("the Stepper handed back %d completed entries, %d completed", r.taken, r.completions)
	}
}

// poll is the loop's look at its error and its context.
func (r *stepRig) poll() {
	r.st.Poll()
	r.stepped()
}

// receiveFrame takes the oldest frame the loop built, as the peer receives
// it.
func (r *stepRig) receiveFrame() {
	f := r.st.Frame()
	if f == nil {
		return
	}
	b := f.AppendContents(nil)
	f.Release()
	entries, err := replication.DecodeBatch(b, nil)
	if err != nil {
		r.fail("a frame does not decode: %v", err)
		return
	}
	if len(entries) == 0 {
		r.logf("the peer receives a heartbeat")
		return
	}
	r.logf("the peer receives a frame of %d entries, %d to %d", len(entries), entries[0].Seq, entries[len(entries)-1].Seq)
	for _, e := range entries {
		if r.nextOut >= len(r.order) {
			r.fail("a frame carries %s (seq %d), which the session did not take", describe(&e), e.Seq)
			return
		}
		x := r.order[r.nextOut]
		r.nextOut++
		if e.Op != x.e.Op || e.Off != x.e.Off || e.Length != x.e.Length || e.Flags != x.e.Flags || !bytes.Equal(e.Data, x.e.Data) {
			r.fail("a frame carries %s (seq %d) where entry %d (%s) comes next", describe(&e), e.Seq, x.id, describe(&x.e))
			return
		}
		if e.Seq != r.recvd+1 {
			r.fail("entry %d goes out as seq %d after seq %d", x.id, e.Seq, r.recvd)
			return
		}
		x.seq, r.recvd = e.Seq, e.Seq
	}
	r.frames = append(r.frames, r.recvd)
	if _, receipt, err := replication.BatchReceipt(b); err == nil && receipt {
		r.receipts = append(r.receipts, r.recvd)
	}
}

// ack acknowledges the oldest frames received, one or several at once,
// answering the reads among them first, as the applier does.
func (r *stepRig) ack() {
	if len(r.frames) == 0 {
		return
	}
	k := 1 + r.rng.IntN(len(r.frames))
	seq := r.frames[k-1]
	for r.reply(true) && r.unreplied(seq) {
	}
	if r.ended {
		return
	}
	r.frames = r.frames[k:]
	r.ackedTo = seq
	for _, x := range r.order {
		if x.seq != 0 && x.seq <= seq && x.e.Op == replication.OpFlush {
			r.flushTo = max(r.flushTo, x.seq)
		}
	}
	r.logf("the peer acknowledges up to %d (%d frames)", seq, k)
	r.peerFrame(replication.AppendAck(nil, replication.Ack{Seq: seq, Status: replication.AckOK}))
}

// unreplied reports whether a read up to seq waits for its reply.
func (r *stepRig) unreplied(seq uint64) bool {
	for _, x := range r.order {
		if x.e.Op == replication.OpRead && x.seq != 0 && x.seq <= seq && x.seq > r.ackedTo && !x.replied {
			return true
		}
	}
	return false
}

// reply answers the oldest read received and not answered (inOrder: its
// data whole; else, at random, a short read the loop must not take as
// whole). It reports whether it answered one.
func (r *stepRig) reply(inOrder bool) bool {
	for _, x := range r.order {
		if x.e.Op != replication.OpRead || x.seq == 0 || x.seq <= r.ackedTo || x.replied {
			continue
		}
		data := bytes.Repeat([]byte{byte(x.id)}, int(x.e.Length))
		whole := inOrder || r.rng.IntN(4) != 0
		if !whole {
			data = data[:len(data)/2]
		}
		x.replied, x.whole = true, whole
		r.logf("the peer answers read %d (seq %d), whole: %v", x.id, x.seq, whole)
		r.peerFrame(replication.AppendReadReply(nil, x.seq, replication.AckOK, data))
		return true
	}
	return false
}

// sayReceived is protocol B's receipt: the oldest batch asking for one
// arrived.
func (r *stepRig) sayReceived() {
	if len(r.receipts) == 0 {
		return
	}
	seq := r.receipts[0]
	r.receipts = r.receipts[1:]
	r.saidTo = max(r.saidTo, seq)
	r.logf("the peer says it received up to %d", seq)
	r.peerFrame(replication.AppendAck(nil, replication.Ack{Seq: seq, Status: replication.AckReceived}))
}

// peerFrame hands the loop a frame of the peer, as the receiving
// goroutine does.
func (r *stepRig) peerFrame(b []byte) {
	if r.ended {
		return
	}
	f := &transport.Frame{}
	f.SetBytes(b)
	if err := r.st.Received(f); err != nil {
		r.logf("the receiving goroutine fails: %v", err)
	}
	r.stepped()
}

// completed is an entry's completion, as the session completes it.
func (r *stepRig) completed(x *stepEntry) {
	x.completed++
	r.completions++
	pd := x.pd
	r.logf("entry %d completes, acknowledged: %v, error: %v", x.id, pd.acked, pd.err)
	if x.completed > 1 {
		r.fail("entry %d completed twice", x.id)
		return
	}
	if !x.taken {
		r.fail("entry %d completed, which the session did not take", x.id)
		return
	}
	if pd.acked {
		if x.seq == 0 || x.seq > r.ackedTo {
			r.fail("entry %d (seq %d) completed acknowledged while the peer acknowledged up to %d", x.id, x.seq, r.ackedTo)
		}
		if pd.err != nil {
			r.fail("entry %d completed acknowledged with an error: %v", x.id, pd.err)
		}
		return
	}
	if !r.s.hasEnded() {
		r.fail("entry %d completed unacknowledged while the stream runs", x.id)
		return
	}
	r.checkMarked(fmt.Sprintf("as entry %d (%s) completed unacknowledged", x.id, describe(&x.e)))
	if want := r.trackErr(); !errors.Is(pd.err, want) || (want == nil && pd.err != nil) {
		r.fail("entry %d completed unacknowledged with error %v, want %v", x.id, pd.err, want)
	}
}

// needsTracking reports whether the end must track the peer: an entry that
// changes blocks was not acknowledged, or was from the peer's cache only.
func (r *stepRig) needsTracking() bool {
	for _, x := range r.order {
		if ChangesData(x.e.Op) && !r.durable(x) {
			return true
		}
	}
	return false
}

// trackErr is the error the entries left must complete with.
func (r *stepRig) trackErr() error {
	if r.needsTracking() {
		return r.peer.fail
	}
	return nil
}

// durable reports whether the peer holds x durably: it acknowledged x, and
// x was FUA or a flush after it was acknowledged.
func (r *stepRig) durable(x *stepEntry) bool {
	if x.seq == 0 || x.seq > r.ackedTo {
		return false
	}
	return x.e.Flags&replication.EntryFUA != 0 || x.seq < r.flushTo
}

// checkMarked checks that the volume tracked the peer, and then marked
// what it does not hold durably.
func (r *stepRig) checkMarked(when string) {
	r.answered() // a Submit the end refused is not the end's to mark
	if !r.needsTracking() {
		return
	}
	if r.peer.tracked != 1 {
		r.fail("%s: the volume tracked the peer %d times, want once", when, r.peer.tracked)
		return
	}
	if r.peer.markedFirst != 0 {
		r.fail("%s: %d blocks were marked before the volume tracked the peer", when, r.peer.markedFirst)
	}
	for _, x := range r.order {
		if !ChangesData(x.e.Op) || r.durable(x) {
			continue
		}
		for b := x.e.Off / replication.BlockSize; b*replication.BlockSize < x.e.Off+x.e.Length; b++ {
			if !r.bm.Test(b) {
				r.fail("%s: entry %d (%s, seq %d; acknowledged up to %d, flush up to %d) is not marked at block %d",
					when, x.id, describe(&x.e), x.seq, r.ackedTo, r.flushTo, b)
				return
			}
		}
	}
}

// answered takes the answer to the Submit the writer waits on, if the
// loop gave it.
func (r *stepRig) answered() {
	w := r.waiting
	if w == nil {
		return
	}
	select {
	case a := <-w.answer:
		r.waiting = nil
		r.logf("entry %d: admission %d", w.id, a)
		if a != AdmitSend {
			// Not taken: the writer marks it itself. It was the last
			// offered (the writer waited).
			w.taken = false
			r.order = r.order[:len(r.order)-1]
		}
	default:
	}
}

// check is the look after every step.
func (r *stepRig) check() {
	r.answered()
	if w := r.waiting; w != nil && r.ended {
		r.fail("entry %d's Submit is not answered after the stream ended", w.id)
	}
	for _, x := range r.order {
		if x.seq != 0 && x.seq <= r.ackedTo && (x.completed != 1 || !x.pd.acked) {
			r.fail("entry %d (seq %d): the peer acknowledged up to %d, and it completed %d times, acknowledged: %v",
				x.id, x.seq, r.ackedTo, x.completed, x.pd.acked)
		}
		if x.pd.Received != nil {
			select {
			case <-x.pd.Received:
				if (x.seq == 0 || x.seq > r.saidTo) && x.completed == 0 {
					r.fail("entry %d (seq %d) was marked received before the peer said so (up to %d)", x.id, x.seq, r.saidTo)
				}
			default:
				if x.seq != 0 && x.seq <= r.saidTo {
					r.fail("entry %d (seq %d) is not marked received, the peer said it received up to %d", x.id, x.seq, r.saidTo)
				}
			}
		}
		if x.e.Op == replication.OpRead && x.completed == 1 && x.pd.acked && !x.readChecked {
			x.readChecked = true
			if x.pd.readOK != x.whole {
				r.fail("read %d completed, its data whole: %v, while the peer's reply was whole: %v", x.id, x.pd.readOK, x.whole)
			} else if x.whole && !bytes.Equal(x.pd.ReadBuf, bytes.Repeat([]byte{byte(x.id)}, int(x.e.Length))) {
				r.fail("read %d completed with data that is not the peer's", x.id)
			}
		}
	}
	if !r.ended {
		return
	}
	for _, x := range r.entries {
		switch {
		case x.taken && x.completed != 1:
			r.fail("the stream ended, and entry %d it took completed %d times", x.id, x.completed)
		case !x.taken && x.completed != 0:
			r.fail("the stream ended, and entry %d it refused completed", x.id)
		}
	}
	r.checkMarked("at the end")
	if r.peer.ended != 1 {
		r.fail("the peer was told %d times that the stream ended, want once", r.peer.ended)
	}
	if want := r.trackErr(); !errors.Is(r.s.MarkErr(), want) || (want == nil && r.s.MarkErr() != nil) {
		r.fail("MarkErr is %v, want %v", r.s.MarkErr(), want)
	}
	select {
	case <-r.s.Finished():
	default:
		r.fail("the stream ended and Finished is not closed")
	}
	pd := NewPending(replication.Entry{Op: replication.OpFlush})
	if r.s.Enqueue(pd) {
		r.fail("the stream ended and took an entry")
	}
}

func (r *stepRig) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

// fail records the run's first failure.
func (r *stepRig) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.logf("FAIL: %s", msg)
	if r.failure == "" {
		r.failure = msg
	}
}

// report is the run's seed, its failure and the last n lines of its
// transcript (0: all of it).
func (r *stepRig) report(n int) string {
	lines := r.log
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	head := fmt.Sprintf("seed %d", r.seed)
	if r.failure != "" {
		head += ": " + r.failure + fmt.Sprintf(" (replay: go test -run TestSessionSteps ./node/session/ -v -seed %d)", r.seed)
	}
	return head + "\n\t" + strings.Join(lines, "\n\t")
}
