package node

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Verify runs on any node: the primary compares every block of the volume
// with each connected secondary, online, while IO goes on.
func (c *control) Verify(ctx context.Context, r *transport.VerifyRequest) (*transport.VerifyReply, error) {
	return onPrimary(ctx, c, r.Volume, "verify against",
		func(v *Volume) (*transport.VerifyReply, error) { return v.startVerify(r.Repair) },
		func(api transport.ControlServer) (*transport.VerifyReply, error) { return api.Verify(ctx, r) })
}

// startVerify starts a verify of every peer that is connected and in sync.
func (v *Volume) startVerify(repair bool) (*transport.VerifyReply, error) {
	reply := &transport.VerifyReply{Primary: v.self}
	for _, p := range v.streamingPeers() {
		if !p.connected() {
			continue
		}
		if !p.verifying.CompareAndSwap(false, true) {
			return nil, status.Errorf(codes.FailedPrecondition, "a verify of %s is already running", p.name)
		}
		reply.Peers = append(reply.Peers, p.name)
		v.bg.Add(1)
		go func() {
			defer v.bg.Done()
			defer p.verifying.Store(false)
			p.verify(repair)
		}()
	}
	if len(reply.Peers) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "no secondary of %s is connected (and not resyncing): nothing to verify against", v.name)
	}
	sort.Strings(reply.Peers)
	v.node.event(v.name, "verify", fmt.Sprintf("online verify started against %v (repair %v)", reply.Peers, repair))
	return reply, nil
}

// verify compares the peer's copy with the local one, 1 MiB at a time:
// each run is read under the range lock and its checksums queued in order
// with the writes, so both sides compare the same state. Differing blocks
// are marked out of sync; with repair they are resynced at the end.
func (p *peer) verify(repair bool) {
	v := p.v
	p.verifyTotal.Store(v.size)
	p.verifyDone.Store(0)
	p.verifyFound.Store(0)
	began := time.Now()
	window := make(chan struct{}, resyncWindow)
	run := int64(resyncRunBlocks * replication.BlockSize)
	ctx := context.Background()
	// acquire takes a window slot; it gives up when the peer is gone (its
	// entries then complete unacknowledged and free no slot).
	acquire := func() bool {
		for {
			select {
			case window <- struct{}{}:
				return true
			case <-v.stopping:
				return false
			case <-time.After(200 * time.Millisecond):
				if !p.isStreaming() {
					return false
				}
			}
		}
	}
	for off := int64(0); off < v.size; off += run {
		if !acquire() {
			v.log.Warn("verify stopped", "peer", p.name)
			return
		}
		length := min(run, v.size-off)
		release, err := v.locks.Lock(ctx, off, length)
		if err != nil {
			return
		}
		bp, err := readBlock(v.disk, off, length)
		if err != nil {
			release()
			v.log.Warn("verify stopped: local read failed", "err", err)
			return
		}
		pd := &pending{done: make(chan struct{})}
		pd.e = replication.Entry{Op: replication.OpVerify, Off: off, Length: length, Data: replication.AppendChecksums(nil, (*bp)[:length])}
		resyncBufs.Put(bp)
		runOff := off
		pd.onReply = func(st replication.AckStatus, data []byte) {
			idx, err := replication.DecodeMismatches(data)
			if st != replication.AckOK || err != nil {
				// The peer could not read: count the whole run.
				idx = nil
				for i := range uint32((length + replication.BlockSize - 1) / replication.BlockSize) {
					idx = append(idx, i)
				}
			}
			for _, i := range idx {
				p.bm.SetBits(runOff+int64(i)*replication.BlockSize, replication.BlockSize)
				p.verifyFound.Add(replication.BlockSize)
			}
		}
		pd.onAck = func() {
			p.verifyDone.Add(length)
			<-window
		}
		p.mu.Lock()
		if !p.streaming {
			p.mu.Unlock()
			release()
			v.log.Warn("verify stopped: the peer disconnected", "peer", p.name)
			return
		}
		p.enqueueLocked(pd)
		p.sendLocked()
		p.mu.Unlock()
		release()
	}
	for range resyncWindow {
		if !acquire() {
			v.log.Warn("verify stopped", "peer", p.name)
			return
		}
	}
	found := p.verifyFound.Load()
	msg := fmt.Sprintf("verify of %s finished in %.1fs: %d bytes out of sync", p.name, time.Since(began).Seconds(), found)
	v.log.Info("verify finished", "peer", p.name, "out_of_sync", found)
	if found > 0 && repair {
		msg += "; resyncing them"
		p.mu.Lock()
		cancel := p.cancelSession
		p.mu.Unlock()
		if cancel != nil {
			cancel() // the reconnection resyncs the marked blocks
		}
	}
	v.node.event(v.name, "verify-done", msg)
}

// connected reports whether the stream to the peer is up and not resyncing.
func (p *peer) connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streaming && p.state == replication.Connected
}
