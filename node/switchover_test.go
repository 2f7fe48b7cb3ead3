package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// servingAnswer is what waitServing returned.
type servingAnswer struct {
	uri string
	err error
}

// TestASwitchoverHearsOfTheNewPrimaryServingFromIt: the node that runs a
// switchover waits for the new primary to serve by asking it once
// (AwaitServing), and the new primary answers when its volume's state
// changes, not when asked again. alpha, a restarted primary that waits for
// its peer, runs on a clock.Fake that never moves, so a waiter that asked
// again at a timer of the clock would never ask again: the wait begins
// (both its timers armed), alpha is forced to serve, and the wait returns
// at once with alpha's export.
func TestASwitchoverHearsOfTheNewPrimaryServingFromIt(t *testing.T) {
	c := newSyncedCluster(t, 4<<20)
	c.stop("alpha")
	c.stop("beta")
	fake := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c.opts["alpha"] = Options{clock: fake}
	n := c.start("alpha")
	v := c.vol("alpha")
	if v.status().Serving {
		t.Fatal("a restarted primary without its peer serves")
	}
	epoch := v.epoch()
	// Only a wait that never ends is cut short: the answer comes in
	// milliseconds.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	armed := fake.Armed()
	done := make(chan servingAnswer, 1)
	go func() {
		uri, err := n.waitServing(ctx, "vol0", "alpha", epoch)
		done <- servingAnswer{uri, err}
	}()
	fake.WaitArmed(armed + 2) // waitServing's deadline, and the wait for alpha to serve
	if err := v.forcePromote(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatalf("waiting for alpha to serve, which it does: %v", got.err)
	}
	if want := n.servingURI("alpha", "vol0"); got.uri != want || want == "" {
		t.Fatalf("alpha serves at %q, want %q", got.uri, want)
	}
	if st := v.status(); !st.Serving || st.Epoch <= epoch {
		t.Fatalf("alpha after the wait: serving %v at epoch %d (was %d)", st.Serving, st.Epoch, epoch)
	}
}

// olderControl is the control API of a node of an earlier release: it
// has no AwaitServing, and answers it as gRPC answers a method it does
// not know.
type olderControl struct {
	transport.ControlServer
	asked *atomic.Int32
}

func (o olderControl) AwaitServing(context.Context, *transport.AwaitServingRequest) (*transport.AwaitServingReply, error) {
	o.asked.Add(1)
	return nil, status.Error(codes.Unimplemented, "unknown method AwaitServing for service replvol.Control")
}

// TestASwitchoverToANodeOfAnEarlierReleaseAsksTheStatus: a new primary
// whose release has no AwaitServing answers it Unimplemented; the node
// that waits for it then asks the cluster's status, as before, and sees
// it serve. alpha waits for beta (of the earlier release) while the
// volume is handed over from alpha to beta.
func TestASwitchoverToANodeOfAnEarlierReleaseAsksTheStatus(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	var asked atomic.Int32
	c.opts["beta"] = Options{wrapControl: func(s transport.ControlServer) transport.ControlServer {
		return olderControl{ControlServer: s, asked: &asked}
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	n := c.nodes["alpha"]
	epoch := c.vol("alpha").epoch()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan servingAnswer, 1)
	go func() {
		uri, err := n.waitServing(ctx, "vol0", "beta", epoch+1)
		done <- servingAnswer{uri, err}
	}()
	eventually(t, func() bool { return asked.Load() > 0 }, "alpha asks beta to answer once it serves")
	r, err := n.api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("switchover to beta: %v", err)
	}
	got := <-done
	if got.err != nil {
		t.Fatalf("waiting for beta, of an earlier release, to serve, which it does: %v", got.err)
	}
	if got.uri != r.NBDURI || got.uri == "" {
		t.Fatalf("beta serves at %q by the status, want %q as the switchover said", got.uri, r.NBDURI)
	}
	if want := n.servingURI("beta", "vol0"); got.uri != want {
		t.Fatalf("the status gives beta's export as %q, the new call as %q: they must be one", got.uri, want)
	}
}
