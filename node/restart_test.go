package node

import (
	"context"
	"errors"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestARestartedPrimaryServesNothingUntilAPeerAnswers: a node that was
// primary and restarts does not know whether another node was promoted
// meanwhile. It serves no IO (and no NBD client) until a peer has compared
// generations and epochs with it, says why and how to override that, and
// serves once beta answers.
func TestARestartedPrimaryServesNothingUntilAPeerAnswers(t *testing.T) {
	c := newSyncedCluster(t, 8<<20)
	c.stop("alpha")
	c.stop("beta")
	c.start("alpha")
	v := c.vol("alpha")
	if err := v.WriteAt(context.Background(), pattern(1, 4096), 0, false); !errors.Is(err, ErrNotServing) {
		t.Fatalf("write to a restarted primary with no peer: %v, want ErrNotServing", err)
	}
	st := v.status()
	if st.Role != "Primary" || st.Serving || st.ReasonCode != string(CauseWaitingForPeer) {
		t.Fatalf("restarted primary: role %s serving %v reason %q", st.Role, st.Serving, st.ReasonCode)
	}
	if _, err := (*resolver)(c.nodes["alpha"]).Lookup("vol0"); err == nil {
		t.Fatal("an NBD client was given the export of a primary that waits for its peer")
	}
	c.start("beta")
	eventually(t, func() bool { return v.status().Serving }, "alpha serves once beta answered")
	if err := v.WriteAt(context.Background(), pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.requireIdentical()
}

// TestAWaitingPrimaryServesWhenForced: with its peer gone for good, the
// operator makes the waiting primary serve (replctl primary --force
// --yes); it takes a new epoch, and the peer that comes back later
// catches up from it.
func TestAWaitingPrimaryServesWhenForced(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 8<<20)
	c.stop("alpha")
	c.stop("beta")
	c.start("alpha")
	v := c.vol("alpha")
	epoch := v.epoch()
	if _, err := c.nodes["alpha"].api.Primary(context.Background(), &transport.PrimaryRequest{Volume: "vol0", Node: "alpha", Force: true, Yes: true}); err != nil {
		t.Fatal(err)
	}
	if !v.status().Serving || v.epoch() <= epoch {
		t.Fatalf("forced: serving %v, epoch %d (was %d)", v.status().Serving, v.epoch(), epoch)
	}
	if err := v.WriteAt(context.Background(), pattern(2, 4096), 4096, false); err != nil {
		t.Fatal(err)
	}
	c.start("beta")
	c.waitInSync()
	c.requireIdentical()
}
