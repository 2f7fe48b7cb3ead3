package node

import (
	"bytes"
	"context"
	"encoding/json"
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
	// resyncRunBlocks is the largest resync read (1 MiB).
	resyncRunBlocks = 256
	// resyncWindow is how many resync runs may await their ack.
	resyncWindow = 16
	// helloTimeout bounds the handshake of a new stream.
	helloTimeout = 5 * time.Second
	// maxFramesInFlight bounds the frames awaiting their ack. While they
	// are out, new entries wait and go out together in the next frame:
	// under load one frame (and one ack) carries many writes.
	maxFramesInFlight = 2
	// heartbeatInterval is how often an idle stream is probed.
	heartbeatInterval = 500 * time.Millisecond
)

// pending is one entry on its way to a peer.
type pending struct {
	e    replication.Entry
	done chan struct{}
	// acked is set when the peer acknowledged the entry (read after done).
	acked bool
	// readBuf receives an OpRead's data; readOK says it arrived whole.
	readBuf []byte
	readOK  bool
	// onReply takes the FrameReadReply answering this entry (OpVerify).
	onReply func(st replication.AckStatus, data []byte)
	onAck   func() // runs when the peer acknowledged the entry
	// release frees the entry's data buffer once it is encoded.
	release func()
}

func (pd *pending) complete(acked bool) {
	pd.acked = acked
	if acked && pd.onAck != nil {
		pd.onAck()
	}
	if pd.release != nil {
		pd.release()
		pd.release = nil
	}
	close(pd.done)
}

// peer is the primary's side of replication to one secondary: one loop that
// connects, decides what to resync, streams writes and resync data, and
// marks the bitmap whenever the peer cannot be reached.
type peer struct {
	v    *Volume
	name string
	addr string
	// bm marks the blocks this peer misses; it lives in the volume's
	// on-disk metadata. The generation it starts from is
	// v.bitmapGens[name].
	bm *metadata.PeerBitmap

	mu        sync.Mutex
	streaming bool
	state     replication.ReplState
	peerDisk  string
	reason    string
	rule      string // the generation rule of the last connection
	decision  string // and what it decided
	queue     []*pending
	inflight  []*pending
	nextSeq   uint64
	wake      chan struct{}
	// The queue is sent by whichever goroutine finds nobody sending (the
	// submitter itself, most of the time: no hand-off per write).
	stream   *transport.ReplStream
	sending  bool
	sendDone *sync.Cond
	sendFail func(error)
	batch    []*pending
	// frameSeqs holds the last sequence number of each frame awaiting its
	// ack, oldest first.
	frameSeqs []uint64

	// pulling: this primary copies newer data from the peer (it is the
	// SyncTarget); pullTotal is what it missed when the copy began.
	pulling   atomic.Bool
	pullTotal atomic.Int64

	resyncTotal atomic.Int64
	resyncDone  atomic.Int64
	resyncStart atomic.Int64 // unix nanoseconds when the resync began

	// csumsSkipped counts resync bytes a checksum showed were in sync.
	csumsSkipped atomic.Int64

	// Online verify of this peer.
	verifying   atomic.Bool
	verifyDone  atomic.Int64
	verifyTotal atomic.Int64
	verifyFound atomic.Int64

	// unpaused is closed while resync may run; replaced by an open channel
	// while the operator has it paused. Guarded by mu.
	unpaused chan struct{}
	// cancelSession ends the current stream (guarded by mu).
	cancelSession context.CancelFunc
	resyncSent    atomic.Int64
	framesSent    atomic.Uint64
	entriesSent   atomic.Uint64

	client  *transport.ReplClient
	wg      sync.WaitGroup
	running atomic.Bool
	// resumeSeq counts the operator's connects: a split brain found by a
	// session that began before the latest one is not final.
	resumeSeq atomic.Int64
}

func newPeer(v *Volume, name string) *peer {
	nc, _ := v.node.cfg.Node(name)
	bm, ok := v.md.Bitmap(v.node.cfg.NodeID(name))
	if !ok {
		panic(fmt.Sprintf("metadata of %s has no bitmap for peer %s", v.name, name)) // openMD created one per peer
	}
	p := &peer{
		v: v, name: name, addr: nc.Replication,
		bm:       bm,
		state:    replication.StandAlone,
		peerDisk: "DUnknown",
		wake:     make(chan struct{}, 1),
		unpaused: make(chan struct{}),
	}
	close(p.unpaused)
	p.sendDone = sync.NewCond(&p.mu)
	return p
}

func (p *peer) start(ctx context.Context) {
	p.mu.Lock()
	p.state, p.reason = replication.Connecting, ""
	p.mu.Unlock()
	p.wg.Add(1)
	p.running.Store(true)
	go func() {
		defer p.wg.Done()
		defer p.running.Store(false)
		p.run(ctx)
	}()
}

func (p *peer) wait() { p.wg.Wait() }

func (p *peer) run(ctx context.Context) {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		began := time.Now()
		seq := p.resumeSeq.Load()
		err := p.session(ctx)
		var refused *refusedError
		if errors.As(err, &refused) {
			if p.resumeSeq.Load() != seq {
				continue
			}
			reason := fmt.Sprintf("%s: not syncing either way; if %s's data should go, run replctl create-md %s --force --yes on it (a full resync follows)", refused.rule, p.name, p.v.name)
			if refused.reason != "" {
				reason = refused.reason
			}
			p.mu.Lock()
			p.state, p.reason = replication.StandAlone, reason
			p.mu.Unlock()
			kind := "unrelated-data"
			switch refused.rule {
			case replication.RuleUnrelated:
			case ruleNewerEpoch:
				kind = "fenced"
				p.v.fence(reason)
			default:
				kind = "refused"
			}
			p.v.log.Error("refused to sync", "peer", p.name, "rule", refused.rule, "reason", reason)
			p.v.node.event(p.v.name, kind, fmt.Sprintf("%s: %s", p.name, reason))
			break
		}
		var sbe *splitBrainError
		if errors.As(err, &sbe) && p.resumeSeq.Load() != seq {
			continue // the operator connected meanwhile: try again
		}
		if errors.As(err, &sbe) {
			// Both nodes took writes the other lacks: never sync either
			// way unless the volume's policy names a victim; else the
			// operator picks one.
			reason := fmt.Sprintf("split-brain: %s and %s both took writes as primary; resolve with replctl connect %s --discard-my-data --node VICTIM", p.v.self, p.name, p.v.name)
			if sbe.rule != "" {
				reason = fmt.Sprintf("split-brain (%s): %s and %s both changed the data; resolve with replctl connect %s --discard-my-data --node VICTIM", sbe.rule, p.v.self, p.name, p.v.name)
			}
			if victim, policy := p.v.splitBrainVictim(p, sbe.peer); victim != replication.VictimNone && (sbe.peerPrimary || victim == replication.VictimPeer) {
				who := p.name
				if victim == replication.VictimMe {
					who = p.v.self
				}
				reason = fmt.Sprintf("split-brain: policy %s makes %s discard its changes", policy, who)
				if victim == replication.VictimMe {
					p.v.bg.Add(1)
					go func() {
						defer p.v.bg.Done()
						p.v.autoDiscard(p.name, policy)
					}()
				}
			}
			p.mu.Lock()
			p.state, p.reason = replication.StandAlone, reason
			p.mu.Unlock()
			p.v.mu.Lock()
			p.v.reason = reason
			p.v.mu.Unlock()
			p.v.log.Error("split brain", "peer", p.name, "err", err)
			p.v.node.event(p.v.name, "split-brain", fmt.Sprintf("%s and %s both took writes as primary: not syncing (%v)", p.v.self, p.name, err))
			break
		}
		p.mu.Lock()
		if ctx.Err() != nil {
			p.state = replication.StandAlone
		} else {
			p.state = replication.Connecting
			if err != nil {
				p.reason = err.Error()
			}
		}
		p.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			p.v.log.Debug("replication session ended", "peer", p.name, "err", err)
		}
		if time.Since(began) > 5*time.Second {
			delay = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
	if p.client != nil {
		p.client.Close()
		p.client = nil
	}
}

// errRejected marks a stream the secondary refused.
var errRejected = errors.New("peer refused the connection")

// session runs one replication stream until it fails or ctx ends.
func (p *peer) session(ctx context.Context) error {
	if p.client == nil {
		c, err := transport.DialRepl(p.addr)
		if err != nil {
			return err
		}
		p.client = c
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := p.client.Open(sctx)
	if err != nil {
		return fmt.Errorf("connect to %s at %s: %w", p.name, p.addr, err)
	}
	defer s.Close()

	v := p.v
	v.mu.Lock()
	hello := replication.Hello{Volume: v.name, From: v.self, To: p.name, Epoch: v.epoch, Size: v.size, Generation: v.gen, UUIDs: v.uuidsLocked(p.name)}
	v.mu.Unlock()
	if err := sendJSON(s, replication.FrameHello, hello); err != nil {
		return fmt.Errorf("connect to %s at %s: %w", p.name, p.addr, err)
	}
	timer := time.AfterFunc(helloTimeout, cancel)
	var reply replication.HelloReply
	err = recvJSON(s, replication.FrameHelloReply, &reply)
	timer.Stop()
	if err != nil {
		return fmt.Errorf("handshake with %s at %s: %w", p.name, p.addr, err)
	}
	if !reply.Accepted {
		switch {
		case reply.SplitBrain:
			return &splitBrainError{reason: reply.Reason, rule: reply.Rule, peerPrimary: reply.Primary,
				peer: replication.SplitBrainSide{Changes: reply.Changes, PrimarySince: reply.PrimarySince}}
		case reply.Final:
			return &refusedError{rule: reply.Rule, reason: reply.Reason}
		}
		return fmt.Errorf("%w: %s", errRejected, reply.Reason)
	}

	// Decide, and switch new writes from the bitmap to the stream, in one
	// step: a write is either marked before it or queued after it.
	v.genMu.Lock()
	plan, err := p.decide(reply)
	if err != nil {
		v.genMu.Unlock()
		return err
	}
	cur := v.currentGeneration()
	var done *pending
	if !plan.sync && !plan.pull {
		done = p.syncDone(cur)
	}
	errc := make(chan error, 3)
	p.mu.Lock()
	p.streaming, p.rule, p.decision, p.reason = true, plan.rule, plan.outcome, ""
	p.queue, p.inflight, p.frameSeqs = p.queue[:0], p.inflight[:0], p.frameSeqs[:0]
	p.stream = s
	p.cancelSession = cancel
	p.sendFail = func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	switch {
	case plan.pull:
		// The peer is the source: it holds every block this node misses.
		p.state, p.peerDisk = replication.Connected, string(replication.UpToDate)
		p.pullTotal.Store(v.localMissing.Bytes())
		p.resyncStart.Store(time.Now().UnixNano())
		p.pulling.Store(true)
	case plan.sync:
		p.state, p.peerDisk = replication.SyncSource, string(replication.Inconsistent)
		p.enqueueLocked(&pending{e: replication.Entry{Op: replication.OpSyncStart, Data: plan.syncGen[:]}, done: make(chan struct{})})
	default:
		p.state = replication.Connected
		p.enqueueLocked(done)
	}
	p.mu.Unlock()
	v.genMu.Unlock()
	v.mu.Lock()
	if v.fenced && v.role == replication.Primary {
		// The peer took this node's stream: no newer primary holds it.
		v.fenced, v.ioOpen, v.reason = false, true, ""
	}
	if plan.pull {
		// Writes wait no longer: the blocks this node misses are known.
		v.ioOpen = v.role == replication.Primary
	}
	v.mu.Unlock()
	syncing := plan.sync
	v.log.Info("peer connected", "peer", p.name, "rule", plan.rule, "decision", plan.outcome, "out_of_sync", p.bm.Bytes(), "local_missing", v.localMissing.Bytes())
	v.node.event(v.name, "connected", fmt.Sprintf("%s connected: %s by rule=%s; %d bytes out of sync on %s, %d on %s", p.name, plan.outcome, plan.rule, p.bm.Bytes(), p.name, v.localMissing.Bytes(), v.self))

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.flusher(sctx) }()
	p.kick()
	go func() { defer wg.Done(); errc <- p.receiver(s) }()
	switch {
	case syncing:
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.resync(sctx); err != nil {
				errc <- err
			}
		}()
	case plan.pull:
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.pull(sctx, plan.peerGen); err != nil {
				errc <- err
			}
		}()
	}
	err = <-errc
	cancel()
	s.Close()
	wg.Wait()
	p.pulling.Store(false)
	p.fail()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// syncDone builds the entry that makes the peer UpToDate at gen. Callers
// do not hold p.mu or v.mu.
func (p *peer) syncDone(gen replication.Generation) *pending {
	// The peer adopts this node's lineage: its history, with the bitmap
	// generation retired into it as it is here once the peer acks.
	p.v.mu.Lock()
	u := p.v.uuidsLocked(p.name)
	p.v.mu.Unlock()
	if !u.Bitmap.IsZero() {
		u = u.WithResyncFinishedAsSource()
	}
	data := append([]byte(nil), gen[:]...)
	for _, h := range u.History {
		data = append(data, h[:]...)
	}
	return &pending{
		e:    replication.Entry{Op: replication.OpSyncDone, Data: data},
		done: make(chan struct{}),
		onAck: func() {
			v := p.v
			v.genMu.Lock()
			defer v.genMu.Unlock()
			p.mu.Lock()
			inSync := p.streaming && v.currentGeneration() == gen && p.bm.Count() == 0
			p.mu.Unlock()
			if !inSync {
				return
			}
			v.mu.Lock()
			v.crashedPrimary = false
			v.mu.Unlock()
			// The peer holds gen: its bitmap is retired, durably, BEFORE the
			// peer counts as UpToDate.
			v.mu.Lock()
			if g, ok := v.bitmapGens[p.name]; ok {
				delete(v.bitmapGens, p.name)
				v.retiredGen = g
				if err := v.persistLocked(false); err != nil {
					v.log.Error("persist in-sync peer", "peer", p.name, "err", err)
				}
			}
			v.mu.Unlock()
			p.mu.Lock()
			if p.streaming {
				p.state, p.peerDisk = replication.Connected, string(replication.UpToDate)
			}
			p.mu.Unlock()
		},
	}
}

// announceGeneration tells an in-sync peer the primary's new generation.
// Called with v.genMu held.
func (p *peer) announceGeneration(gen replication.Generation) {
	done := p.syncDone(gen)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streaming && p.state == replication.Connected {
		p.enqueueLocked(done)
		p.kick()
	}
}

// enqueueLocked queues an entry; the caller then sends the queue itself
// (sendLocked) or asks the flusher to (kick).
func (p *peer) enqueueLocked(pd *pending) {
	p.queue = append(p.queue, pd)
}

// kick asks the flusher goroutine to send the queue.
func (p *peer) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// submit hands one write-type entry (or a flush) to the peer. It returns a
// pending to wait for when the entry went into the stream, or nil when the
// peer is not connected and the blocks were marked out of sync instead.
func (p *peer) submit(e replication.Entry) *pending {
	for {
		p.mu.Lock()
		if p.streaming {
			pd := &pending{e: e, done: make(chan struct{})}
			p.enqueueLocked(pd)
			p.sendLocked()
			p.mu.Unlock()
			return pd
		}
		if _, ok := p.v.bitmapGen(p.name); ok || !changesData(e.Op) {
			// A flush the peer misses changes no block of it: nothing to
			// mark, and no reason to leave the generation it shares.
			markEntry(p.bm, &e)
			p.mu.Unlock()
			return nil
		}
		p.mu.Unlock()
		p.v.ensureRotated(p)
		if _, ok := p.v.bitmapGen(p.name); !ok && !p.isStreaming() {
			// Persisting the new generation failed; the volume stops
			// serving IO. The caller's write still completes locally.
			p.mu.Lock()
			markEntry(p.bm, &e)
			p.mu.Unlock()
			return nil
		}
	}
}

func (p *peer) isStreaming() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streaming
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

// fail ends streaming: every entry not acknowledged is marked in the
// bitmap (after the generation moved on, durably) and completed.
func (p *peer) fail() {
	p.mu.Lock()
	p.stream = nil
	for p.sending {
		p.sendDone.Wait()
	}
	p.streaming = false
	p.peerDisk = "DUnknown"
	left := append(append([]*pending(nil), p.inflight...), p.queue...)
	p.inflight, p.queue, p.frameSeqs = nil, nil, nil
	p.mu.Unlock()
	needMark := false
	for _, pd := range left {
		needMark = needMark || changesData(pd.e.Op)
	}
	if needMark {
		p.v.ensureRotated(p)
	}
	for _, pd := range left {
		markEntry(p.bm, &pd.e)
		pd.complete(false)
	}
}

// flusher sends what is queued when nobody else does (entries queued
// under locks that must not wait for the network).
// On an idle stream it sends an empty batch every heartbeatInterval, so
// that a secondary which stopped taking the stream says so promptly.
func (p *peer) flusher(ctx context.Context) {
	tick := time.NewTicker(heartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.wake:
			p.mu.Lock()
			p.sendLocked()
			p.mu.Unlock()
		case <-tick.C:
			p.mu.Lock()
			if len(p.queue) == 0 && len(p.inflight) == 0 {
				p.heartbeatLocked()
			} else {
				p.sendLocked()
			}
			p.mu.Unlock()
		case <-ctx.Done():
			return
		}
	}
}

// heartbeatLocked sends an empty batch; the secondary acks it like any other.
func (p *peer) heartbeatLocked() {
	if p.sending || p.stream == nil {
		return
	}
	p.sending = true
	s := p.stream
	p.mu.Unlock()
	f := transport.NewFrame(replication.BatchHeaderLen)
	f.SetBytes(replication.AppendBatchHeader(f.Bytes(), 0))
	err := s.Send(f)
	p.mu.Lock()
	p.sending = false
	p.sendDone.Broadcast()
	if err != nil && p.stream == s {
		p.stream = nil
		p.sendFail(fmt.Errorf("send to %s: %w", p.name, err))
	}
	// Whoever queued an entry while the heartbeat was out found the
	// stream busy and left it to the sender: that is this goroutine.
	p.sendLocked()
}

// sendLocked sends every queued entry, in queue order, batched into frames,
// unless another goroutine is already sending (it will send these too).
// Called with p.mu held; drops it while a frame goes out.
func (p *peer) sendLocked() {
	if p.sending || p.stream == nil {
		return
	}
	p.sending = true
	defer func() {
		p.sending = false
		p.sendDone.Broadcast()
	}()
	for len(p.queue) > 0 && p.stream != nil && len(p.frameSeqs) < maxFramesInFlight {
		size := replication.BatchHeaderLen
		k := 0
		for k < len(p.queue) && k < maxBatchEntries {
			n := p.queue[k].e.EncodedLen()
			if k > 0 && size+n > maxBatchBytes {
				break
			}
			size += n
			k++
		}
		batch := append(p.batch[:0], p.queue[:k]...)
		p.queue = p.queue[k:]
		for _, pd := range batch {
			p.nextSeq++
			pd.e.Seq = p.nextSeq
			p.inflight = append(p.inflight, pd)
		}
		p.frameSeqs = append(p.frameSeqs, p.nextSeq)
		s := p.stream
		p.mu.Unlock()

		f := transport.NewFrame(size)
		b := replication.AppendBatchHeader(f.Bytes(), len(batch))
		for _, pd := range batch {
			b = replication.AppendEntry(b, &pd.e)
			if pd.release != nil {
				pd.release()
				pd.release = nil
			}
		}
		clear(batch)
		f.SetBytes(b)
		p.framesSent.Add(1)
		p.entriesSent.Add(uint64(len(batch)))
		err := s.Send(f)

		p.mu.Lock()
		p.batch = batch[:0]
		if err != nil && p.stream == s {
			p.stream = nil
			p.sendFail(fmt.Errorf("send to %s: %w", p.name, err))
		}
	}
}

// receiver completes entries as the peer acknowledges them.
func (p *peer) receiver(s *transport.ReplStream) error {
	f := &transport.Frame{}
	defer f.Release()
	var done []*pending
	for {
		if err := s.Recv(f); err != nil {
			return fmt.Errorf("receive from %s: %w", p.name, err)
		}
		if b := f.Bytes(); len(b) > 0 && replication.FrameType(b[0]) == replication.FrameReadReply {
			if err := p.readReply(b); err != nil {
				return err
			}
			continue
		}
		ack, err := replication.DecodeAck(f.Bytes())
		if err != nil {
			return err
		}
		if ack.Status != replication.AckOK {
			return fmt.Errorf("%s failed an entry: %s", p.name, ack.Message)
		}
		p.mu.Lock()
		k := 0
		for k < len(p.inflight) && p.inflight[k].e.Seq <= ack.Seq {
			k++
		}
		done = append(done[:0], p.inflight[:k]...)
		p.inflight = p.inflight[k:]
		f := 0
		for f < len(p.frameSeqs) && p.frameSeqs[f] <= ack.Seq {
			f++
		}
		p.frameSeqs = p.frameSeqs[f:]
		p.mu.Unlock()
		for _, pd := range done {
			pd.complete(true)
		}
		if f > 0 {
			// A frame slot opened: send what queued up meanwhile.
			p.mu.Lock()
			p.sendLocked()
			p.mu.Unlock()
		}
	}
}

var zeroBlock = make([]byte, resyncRunBlocks*replication.BlockSize)

// readBlock reads a resync run into a pooled buffer.
func readBlock(d Disk, off, length int64) (*[]byte, error) {
	bp := resyncBufs.Get().(*[]byte)
	if _, err := d.ReadAt((*bp)[:length], off); err != nil {
		resyncBufs.Put(bp)
		return nil, fmt.Errorf("resync read at %d: %w", off, err)
	}
	return bp, nil
}

var resyncBufs = sync.Pool{New: func() any { b := make([]byte, resyncRunBlocks*replication.BlockSize); return &b }}

// resync sends every block marked in the bitmap, then makes the peer
// UpToDate. Application writes go on meanwhile: a resync read holds the
// range lock until its entry is queued, so a write to the same blocks is
// queued before the read (and overwritten by it) or after it.
func (p *peer) resync(ctx context.Context) error {
	v := p.v
	window := make(chan struct{}, resyncWindow)
	p.resyncTotal.Store(p.bm.Bytes())
	p.resyncDone.Store(0)
	began := time.Now()
	p.resyncStart.Store(began.UnixNano())
	var wire int64 // data bytes sent (zero ranges cost no bandwidth)
	cursor := int64(0)
	// With csums, the first pass sends checksums: blocks the peer already
	// holds are not sent at all (DRBD's csums-alg).
	csums := v.cfg.Csums
	drain := func() error {
		for range resyncWindow {
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for range resyncWindow {
			<-window
		}
		return nil
	}
	for {
		start, n, ok := p.bm.NextRun(cursor, resyncRunBlocks)
		if !ok {
			if err := drain(); err != nil {
				return err
			}
			if p.bm.Count() == 0 {
				break
			}
			// Later passes send data: what the checksums showed differs,
			// and what was written meanwhile.
			cursor, csums = 0, false
			continue
		}
		cursor = start + n
		p.mu.Lock()
		unpaused := p.unpaused
		p.mu.Unlock()
		select {
		case <-unpaused:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := v.resyncPace(ctx, began, wire, window); err != nil {
			return err
		}
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		off := start * replication.BlockSize
		length := min(n*replication.BlockSize, v.size-off)
		release, err := v.locks.Lock(ctx, off, length)
		if err != nil {
			return err
		}
		pd := &pending{done: make(chan struct{})}
		if csums {
			bp, err := readBlock(v.disk, off, length)
			if err != nil {
				release()
				return err
			}
			pd.e = replication.Entry{Op: replication.OpVerify, Off: off, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])}
			resyncBufs.Put(bp)
			var differ []uint32
			pd.onReply = func(st replication.AckStatus, data []byte) {
				idx, err := replication.DecodeMismatches(data)
				if st != replication.AckOK || err != nil {
					idx = []uint32{}
					for i := range uint32(n) {
						idx = append(idx, i)
					}
				}
				differ = idx
			}
			pd.onAck = func() {
				// Matching blocks are in sync; differing ones stay marked
				// for the data pass.
				same := int64(0)
				next := 0
				for b := int64(0); b*replication.BlockSize < length; b++ {
					if next < len(differ) && int64(differ[next]) == b {
						next++
						continue
					}
					p.bm.ClearBits(off+b*replication.BlockSize, replication.BlockSize)
					same += replication.BlockSize
				}
				p.resyncDone.Add(min(same, length))
				p.csumsSkipped.Add(min(same, length))
				<-window
			}
		} else if hf, ok := v.disk.(holeFinder); ok && hf.IsHole(off, length) {
			pd.e = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
		} else if bp, err := readBlock(v.disk, off, length); err != nil {
			release()
			return err
		} else if buf := (*bp)[:length]; bytes.Equal(buf, zeroBlock[:length]) {
			pd.e = replication.Entry{Op: replication.OpResyncZero, Off: off, Length: length}
			resyncBufs.Put(bp)
		} else {
			pd.e = replication.Entry{Op: replication.OpResyncData, Off: off, Length: length, Data: buf}
			pd.release = func() { resyncBufs.Put(bp) }
		}
		if pd.onAck == nil {
			pd.onAck = func() {
				p.bm.ClearBits(off, length)
				p.resyncDone.Add(length)
				<-window
			}
		}
		p.mu.Lock()
		if !p.streaming {
			p.mu.Unlock()
			release()
			return errors.New("stream ended during resync")
		}
		p.enqueueLocked(pd)
		p.sendLocked()
		p.mu.Unlock()
		if !csums {
			p.resyncSent.Add(length)
		}
		if pd.e.Op == replication.OpResyncData {
			wire += length
		}
		release()
	}
	// Everything marked is on the peer: hand it the current generation.
	v.genMu.Lock()
	pd := p.syncDone(v.currentGeneration())
	p.mu.Lock()
	if !p.streaming {
		p.mu.Unlock()
		v.genMu.Unlock()
		return errors.New("stream ended during resync")
	}
	p.enqueueLocked(pd)
	p.mu.Unlock()
	v.genMu.Unlock()
	p.kick()
	select {
	case <-pd.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	total := p.resyncTotal.Load()
	secs := time.Since(began).Seconds()
	v.log.Info("resync finished", "peer", p.name, "bytes", total, "seconds", secs)
	v.node.event(v.name, "resync-done", fmt.Sprintf("resync to %s finished: %d bytes in %.1fs", p.name, total, secs))
	return nil
}

func (p *peer) status() transport.PeerStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := transport.PeerStatus{
		Node: p.name, Replication: string(p.state), PeerDisk: p.peerDisk,
		OutOfSyncBytes: p.bm.Bytes(), SyncRule: p.rule, SyncDecision: p.decision, Reason: p.reason,
		ResyncSentBytes: p.resyncSent.Load(),
		FramesSent:      p.framesSent.Load(),
		EntriesSent:     p.entriesSent.Load(),
	}
	if p.state == replication.SyncSource {
		ps.ResyncTotalBytes = p.resyncTotal.Load()
		ps.ResyncDoneBytes = p.resyncDone.Load()
		if secs := time.Since(time.Unix(0, p.resyncStart.Load())).Seconds(); secs > 0 {
			ps.ResyncRate = int64(float64(ps.ResyncDoneBytes) / secs)
		}
		select {
		case <-p.unpaused:
		default:
			ps.Replication = string(replication.PausedSyncS)
		}
	}
	if p.pulling.Load() {
		ps.Replication = string(replication.SyncTarget)
		select {
		case <-p.unpaused:
		default:
			ps.Replication = string(replication.PausedSyncT)
		}
		ps.ResyncTotalBytes = p.pullTotal.Load()
		ps.ResyncDoneBytes = max(0, ps.ResyncTotalBytes-p.v.localMissing.Bytes())
		if secs := time.Since(time.Unix(0, p.resyncStart.Load())).Seconds(); secs > 0 {
			ps.ResyncRate = int64(float64(ps.ResyncDoneBytes) / secs)
		}
	}
	if _, ok := p.v.bitmapGen(p.name); ok && !p.streaming {
		ps.PeerDisk = string(replication.Outdated)
	}
	ps.VerifyDoneBytes, ps.VerifyTotalBytes, ps.VerifyFoundBytes = p.verifyDone.Load(), p.verifyTotal.Load(), p.verifyFound.Load()
	ps.ResyncSkippedBytes = p.csumsSkipped.Load()
	if p.verifying.Load() && p.state == replication.Connected {
		ps.Replication = string(replication.VerifyS)
	}
	return ps
}

func sendJSON(s *transport.ReplStream, t replication.FrameType, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f := transport.NewFrame(len(data) + 1)
	f.SetBytes(append(append(f.Bytes(), byte(t)), data...))
	return s.Send(f)
}

func recvJSON(s *transport.ReplStream, t replication.FrameType, v any) error {
	f := &transport.Frame{}
	defer f.Release()
	if err := s.Recv(f); err != nil {
		return err
	}
	b := f.Bytes()
	if len(b) == 0 || replication.FrameType(b[0]) != t {
		return fmt.Errorf("%w: expected frame type %d", replication.ErrBadFrame, t)
	}
	return json.Unmarshal(b[1:], v)
}

// setPaused pauses or resumes this peer's resync.
func (p *peer) setPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.unpaused:
		if paused {
			p.unpaused = make(chan struct{})
		}
	default:
		if !paused {
			close(p.unpaused)
		}
	}
}

// fullResync marks the whole volume out of sync for this peer and restarts
// its stream, so that the peer is resynced from scratch (DRBD's invalidate
// of the peer). The peer is Inconsistent from the restart until resync ends.
func (p *peer) fullResync() {
	p.bm.SetAll()
	p.mu.Lock()
	cancel := p.cancelSession
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// readReply hands an OpRead's data to its waiting entry.
func (p *peer) readReply(frame []byte) error {
	seq, st, data, err := replication.DecodeReadReply(frame)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pd := range p.inflight {
		if pd.e.Seq == seq {
			switch {
			case pd.onReply != nil:
				pd.onReply(st, data)
			case pd.e.Op == replication.OpRead:
				if st == replication.AckOK && len(data) == len(pd.readBuf) {
					copy(pd.readBuf, data)
					pd.readOK = true
				}
			default:
				return fmt.Errorf("%s answered entry %d, not a read, with data", p.name, seq)
			}
			return nil
		}
	}
	return fmt.Errorf("%s answered a read %d that is not in flight", p.name, seq)
}

// inSync reports whether the peer holds every write: connected, its disk
// UpToDate, nothing marked for it.
func (p *peer) inSync() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streaming && p.state == replication.Connected && p.peerDisk == string(replication.UpToDate) && p.bm.Count() == 0
}

// read reads [off, off+len(buf)) from the peer's disk, which must be in
// sync. It serves the primary while its own disk is detached.
func (p *peer) read(ctx context.Context, buf []byte, off int64) error {
	p.mu.Lock()
	if !p.streaming || p.state != replication.Connected || p.peerDisk != string(replication.UpToDate) {
		p.mu.Unlock()
		return fmt.Errorf("%s is not connected and in sync", p.name)
	}
	pd := &pending{e: replication.Entry{Op: replication.OpRead, Off: off, Length: int64(len(buf))}, done: make(chan struct{}), readBuf: buf}
	p.enqueueLocked(pd)
	p.sendLocked()
	p.mu.Unlock()
	select {
	case <-pd.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !pd.readOK {
		return fmt.Errorf("read of %d bytes at %d from %s failed", len(buf), off, p.name)
	}
	return nil
}
