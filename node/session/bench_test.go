package session

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// ackingStream is a peer that acknowledges each frame as it arrives, up to
// its last entry, and releases the frame as the connection does once it
// wrote it: the session's own costs are what a benchmark over it counts.
type ackingStream struct {
	ctx     context.Context
	buf     []byte
	entries []replication.Entry
	acks    chan uint64
}

func newAckingStream(ctx context.Context) *ackingStream {
	return &ackingStream{ctx: ctx, acks: make(chan uint64, 2*maxFramesInFlight)}
}

func (a *ackingStream) SendMsg(m any) error {
	f := m.(*transport.Frame)
	a.buf = f.AppendContents(a.buf[:0])
	f.Release()
	var err error
	if a.entries, err = replication.DecodeBatch(a.buf, a.entries[:0]); err != nil {
		return err
	}
	if len(a.entries) == 0 {
		return nil // a heartbeat
	}
	select {
	case a.acks <- a.entries[len(a.entries)-1].Seq:
		return nil
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

func (a *ackingStream) RecvMsg(m any) error {
	select {
	case seq := <-a.acks:
		f := m.(*transport.Frame)
		b := f.Bytes()[:0]
		f.SetBytes(replication.AppendAck(b, replication.Ack{Seq: seq, Status: replication.AckOK}))
		return nil
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

func (a *ackingStream) Context() context.Context { return a.ctx }

// blockPeer is a loosePeer whose congestion policy is block, with room for
// every write of a benchmark.
type blockPeer struct{ loosePeer }

func (blockPeer) Congestion() replication.CongestionConfig {
	return replication.CongestionConfig{Policy: replication.CongestionBlock, SendBuffer: 1 << 30}
}

// BenchmarkSubmitAck is one application write under protocol A or B at a
// time: Submit, the frame out, the peer's ack, the entry complete.
func BenchmarkSubmitAck(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := looseConfig(time.Hour)
	cfg.Bitmap, _, _ = testBitmap(b)
	s := New(ctx, blockPeer{}, transport.NewReplStream(newAckingStream(ctx), cancel), cfg)
	done := make(chan error, 1)
	go func() { done <- s.Run(nil) }()
	data := make([]byte, replication.BlockSize)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		binary.BigEndian.PutUint64(data, uint64(i))
		pd := NewPending(replication.Entry{Op: replication.OpWrite, Off: int64(i%1024) * replication.BlockSize, Length: replication.BlockSize, Data: data})
		pd.Wire = int64(pd.Entry.EncodedLen())
		if got := s.Submit(pd); got != AdmitSend {
			b.Fatalf("write %d: admission %d, want AdmitSend", i, got)
		}
		<-pd.Done()
		if !pd.Acked() {
			b.Fatalf("write %d completed without its ack", i)
		}
	}
	b.StopTimer()
	s.Cancel()
	<-done
}
