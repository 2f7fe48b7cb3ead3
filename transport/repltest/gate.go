package repltest

import (
	"context"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// GateStream is a replication stream whose sends wait at a gate; it
// reports each frame's entry count once sent. Its receiving side hears
// nothing, like a peer that hangs. A test closes Gate to let every send
// through, or leaves it shut to hold them all.
type GateStream struct {
	ctx     context.Context
	Entered chan struct{} // a send is waiting at the gate
	Gate    chan struct{}
	Sent    chan int // each sent frame's entry count, while there is room
}

// NewGateStream returns a stream whose gate is shut, which lives as long
// as ctx.
func NewGateStream(ctx context.Context) *GateStream {
	return &GateStream{ctx: ctx, Entered: make(chan struct{}, 16), Gate: make(chan struct{}), Sent: make(chan int, 16)}
}

// SendMsg waits at the gate, then decodes the frame's batch and reports
// its entry count.
func (g *GateStream) SendMsg(m any) error {
	g.Entered <- struct{}{}
	select {
	case <-g.Gate:
	case <-g.ctx.Done():
		return g.ctx.Err()
	}
	var entries []replication.Entry
	entries, err := replication.DecodeBatch(m.(*transport.Frame).AppendContents(nil), entries)
	if err != nil {
		return err
	}
	select {
	case g.Sent <- len(entries):
	default: // nobody counts these frames
	}
	return nil
}

// RecvMsg hears nothing until the stream's context ends.
func (g *GateStream) RecvMsg(any) error {
	<-g.ctx.Done()
	return g.ctx.Err()
}

// Context is the stream's context.
func (g *GateStream) Context() context.Context { return g.ctx }
