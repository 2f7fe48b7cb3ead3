package node

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/node/session"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
)

// lagVolume is a volume in memory with one peer, beta, streaming under
// protocol A with max_lag maxLag: what throttleLag and the waiters on
// the volume's changes read, and nothing else (no disk, no network).
func lagVolume(maxLag int64) (*Volume, *peer) {
	v := &Volume{name: "vol", self: "alpha", clock: clock.Real()}
	v.set.Store(&settings{protocol: 'A', maxLag: maxLag})
	p := &peer{v: v, name: "beta"}
	p.view.Store(&peerView{sess: &session.Session{}, sid: 1, state: replication.Connected, peerDisk: string(replication.UpToDate)})
	p.unpaused.Store(closedChan)
	v.peers.byName = map[string]*peer{"beta": p}
	v.peers.list = []*peer{p}
	return v, p
}

// TestTheLagThrottleReleasesAWriteWhenTheLagFalls: a write held because
// beta lags by max_lag goes on when beta's acknowledgement brings the lag
// below it, with no time passing (the lag's publication wakes it; it
// does not find it at its next look), and another held write goes on when
// beta's stream ends (a peer not connected holds no write back).
func TestTheLagThrottleReleasesAWriteWhenTheLagFalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxLag = 1 << 20
		v, p := lagVolume(maxLag)
		p.lag.Completed(1, maxLag, time.Now())
		p.PublishLag()
		done := make(chan error, 1)
		go func() { done <- v.throttleLag(t.Context(), 'A') }()
		time.Sleep(time.Second)
		synctest.Wait()
		if err, ok := released(done); ok {
			t.Fatalf("a write went on while beta lagged by max_lag (%v)", err)
		}
		began := time.Now()
		p.lag.PeerAcked(1) // beta holds it: the lag falls to 0
		p.PublishLag()
		synctest.Wait()
		if err, ok := released(done); !ok || err != nil {
			t.Fatalf("the lag fell and the write is still held (returned %v, %v): it waits for a poll, not for the lag", ok, err)
		}
		if d := time.Since(began); d != 0 {
			t.Fatalf("released %v after the lag fell, want at once", d)
		}

		p.lag.Completed(2, maxLag, time.Now())
		p.PublishLag()
		go func() { done <- v.throttleLag(t.Context(), 'A') }()
		synctest.Wait()
		if _, ok := released(done); ok {
			t.Fatal("a write went on while beta lagged by max_lag again")
		}
		p.Ended(p.session()) // the stream ends: its lag becomes marked blocks
		synctest.Wait()
		if err, ok := released(done); !ok || err != nil {
			t.Fatalf("beta's stream ended and the write is still held (returned %v, %v)", ok, err)
		}
	})
}

// TestTheLagThrottleEndsWithItsRequest: a held write whose request ends
// (the client went away) returns the context's error.
func TestTheLagThrottleEndsWithItsRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, p := lagVolume(4096)
		p.lag.Completed(1, 4096, time.Now())
		p.PublishLag()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- v.throttleLag(ctx, 'B') }()
		synctest.Wait()
		cancel()
		synctest.Wait()
		if err, ok := released(done); !ok || err != context.Canceled {
			t.Fatalf("returned %v (%v) after the request ended, want context.Canceled", ok, err)
		}
		// Protocol C is never held back by the lag.
		if err := v.throttleLag(t.Context(), 'C'); err != nil {
			t.Fatalf("protocol C: %v", err)
		}
	})
}

// TestEveryChangeOfAPeerWakesTheVolumesWaiters: what a switchover waits
// for (the peer's state, its resync paused or resumed, a pull, the lag)
// wakes the volume's waiters at each change.
func TestEveryChangeOfAPeerWakesTheVolumesWaiters(t *testing.T) {
	_, p := lagVolume(0)
	v := p.v
	for _, c := range []struct {
		name   string
		change func()
	}{
		{"the peer's view changes", func() { p.update(func(pv *peerView) { pv.state = replication.SyncSource }) }},
		{"its resync is paused", func() { p.setPaused(true) }},
		{"its resync is resumed", func() { p.setPaused(false) }},
		{"the rules have it pull", func() {
			// Its state as the view has it already, but for the pull.
			v.mu.Lock()
			v.st.Peers = map[string]volstate.Peer{"beta": {Repl: replication.SyncSource, Session: 1, Pulling: true}}
			v.publishPeersLocked()
			v.mu.Unlock()
		}},
		{"its lag is published", func() { p.PublishLag() }},
		{"its stream ends", func() { p.Ended(p.session()) }},
	} {
		woken := v.changed.wait()
		c.change()
		if _, ok := released(woken); !ok {
			t.Errorf("%s: the volume's waiters were not woken", c.name)
		}
	}
}
