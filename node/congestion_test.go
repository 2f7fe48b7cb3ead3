package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// slowLink is a replication stream whose sends go no faster than rate
// bytes per second while slow is set: a congested link.
type slowLink struct {
	r    *transport.ReplStream
	slow *atomic.Bool
	rate float64
}

func (l slowLink) SendMsg(m any) error {
	f := m.(*transport.Frame)
	if l.slow.Load() {
		time.Sleep(time.Duration(float64(len(f.Bytes())) / l.rate * float64(time.Second)))
	}
	return l.r.Send(f)
}

func (l slowLink) RecvMsg(m any) error      { return l.r.Recv(m.(*transport.Frame)) }
func (l slowLink) Context() context.Context { return l.r.Context() }

// TestPullAheadGoesOnAtLocalSpeedAndCatchesUp: protocol A with
// pull-ahead over a congested link. Once the send buffer is full the
// primary goes Ahead (beta Behind): writes complete without waiting for
// the link, their blocks are marked and the lag shows them. When the link
// is free again the marked blocks are resynced, beta is UpToDate, the lag
// is zero and the replicas are identical.
func TestPullAheadGoesOnAtLocalSpeedAndCatchesUp(t *testing.T) {
	const size = 64 << 20
	c := newTestCluster(t, size)
	vc := &c.cfg.Volumes[0]
	vc.Protocol, vc.OnCongestion, vc.SendBuffer = "A", "pull-ahead", 1<<20
	slow := &atomic.Bool{}
	c.opts["alpha"] = Options{WrapStream: func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(slowLink{r: s, slow: slow, rate: 1 << 20}, s.Close)
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	slow.Store(true)
	sawAhead, maxLag := false, int64(0)
	ctx := context.Background()
	for i := range 256 { // 16 MiB: 16 s on the slow link
		if err := a.WriteAt(ctx, pattern(byte(i), 64<<10), int64(i)*64<<10, false); err != nil {
			t.Fatal(err)
		}
		ps := a.peers["beta"].status()
		sawAhead = sawAhead || ps.Replication == string(replication.Ahead)
		maxLag = max(maxLag, ps.LagBytes)
	}
	if !sawAhead {
		t.Fatal("the primary never went Ahead of the congested peer")
	}
	if st := replica(c.status(), "beta"); st.Replication != string(replication.Behind) || st.LagBytes == 0 {
		t.Fatalf("beta while the primary is Ahead: %s, lag %d bytes; want Behind with a lag", st.Replication, st.LagBytes)
	}
	t.Logf("lag at most %d bytes while Ahead", maxLag)
	slow.Store(false)
	c.waitInSync()
	if lag := a.peers["beta"].status().LagBytes; lag != 0 {
		t.Fatalf("caught up, but the lag shows %d bytes", lag)
	}
	c.requireIdentical()
}
