package node

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// beatCounter counts the heartbeats (empty batches) a node sends on its
// replication streams.
type beatCounter struct {
	s     *transport.ReplStream
	beats *atomic.Int64
}

var heartbeatFrame = replication.AppendBatchHeader(nil, 0)

func (c beatCounter) SendMsg(m any) error {
	f := m.(*transport.Frame)
	if bytes.Equal(f.Bytes(), heartbeatFrame) {
		c.beats.Add(1)
	}
	return c.s.Send(f)
}
func (c beatCounter) RecvMsg(m any) error      { return c.s.Recv(m.(*transport.Frame)) }
func (c beatCounter) Context() context.Context { return c.s.Context() }

// TestIdleVolumesShareOneHeartbeatPerPeerNode: six idle volumes between
// alpha and beta send beta one heartbeat per interval between them, not
// one each; yet when beta stops answering (the link partitioned) every
// idle volume's stream finds it within its timeout, and all reconnect in
// sync after the heal.
func TestIdleVolumesShareOneHeartbeatPerPeerNode(t *testing.T) {
	const volumes = 6
	c, link := partitionableCluster(t, 4<<20)
	var beats atomic.Int64
	opts := c.opts["alpha"]
	opts.WrapStream = func(_ string, s *transport.ReplStream) *transport.ReplStream {
		return transport.NewReplStream(beatCounter{s: s, beats: &beats}, s.Close)
	}
	c.opts["alpha"] = opts
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	for i := 1; i < volumes; i++ {
		c.cfg = c.withVolume(fmt.Sprintf("vol%d", i), 4<<20, "alpha")
	}
	for _, n := range []string{"alpha", "beta"} {
		for _, ch := range c.apply(n, c.cfg) {
			if ch.Err != nil {
				t.Fatalf("%s: %+v", n, ch)
			}
		}
	}
	for i := range volumes {
		c.waitVolumeInSync(fmt.Sprintf("vol%d", i))
	}

	// The default peer timeout (2 s) probes every 500 ms: six streams of
	// their own would send 4 heartbeats within about 170 ms.
	const every = 500 * time.Millisecond
	from, start := beats.Load(), time.Now()
	eventually(t, func() bool { return beats.Load()-from >= 4 }, "alpha probes beta")
	if took := time.Since(start); took < 3*every*9/10 {
		t.Fatalf("4 heartbeats within %s: the idle volumes probe beta each on its own, want one probe per %s", took.Round(time.Millisecond), every)
	}

	// The carrier ticks; the other idle streams rest without a ticker.
	eventually(t, func() bool { return restingStreams(c, volumes) == volumes-1 }, fmt.Sprintf("%d of the %d idle streams rest", volumes-1, volumes))

	link.Partition()
	cut := time.Now()
	for i := range volumes {
		v := c.nodes["alpha"].volumes()[fmt.Sprintf("vol%d", i)]
		eventually(t, func() bool { return !v.peers.byName["beta"].connected() }, fmt.Sprintf("vol%d gives up on the silent beta", i))
	}
	if took := time.Since(cut); took > 4*time.Second {
		t.Fatalf("the last idle volume found beta silent %s after the cut, want within its 2 s timeout and a tick", took.Round(time.Millisecond))
	}
	link.Heal()
	for i := range volumes {
		c.waitVolumeInSync(fmt.Sprintf("vol%d", i))
	}
	eventually(t, func() bool { return restingStreams(c, volumes) == volumes-1 }, "the new streams rest again but one")
}

// restingStreams counts alpha's streams to beta, of vol0 to vol(n-1),
// that rest without a ticker.
func restingStreams(c *testCluster, n int) int {
	resting := 0
	for i := range n {
		v := c.nodes["alpha"].volumes()[fmt.Sprintf("vol%d", i)]
		if s := v.peers.byName["beta"].session(); s != nil && s.Resting() {
			resting++
		}
	}
	return resting
}
