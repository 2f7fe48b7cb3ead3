package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// TestAPrimaryNeverCopiesFromAPeerRaftHasOutdated: the shape of the sim's
// finding pull-from-outdated (seeds 4374 and 47568), set up directly.
// There, after a chain of failovers, raft still had a peer Outdated that
// held the primary's current generation, and the peer named an old
// bitmap generation toward the primary while the primary named none
// toward it: DRBD's rule sync-target-missed-finish made the primary copy
// the peer's marked blocks, and the peer lacked an acknowledged write in
// one of them. Here: alpha, the primary under raft, writes a block all
// three hold; gamma, stopped, is given that shape (its copy of the block
// as it was before the write, marked toward alpha, its bitmap generation
// toward alpha an old one of its history), and raft records it Outdated
// as the seed's earlier primary had. When gamma comes back, alpha must be
// the source of the block: its write is kept on every node, and gamma gets
// it. The rules decide it before raft's record is read now: equal currents
// where only the peer names a bitmap generation make a primary the source
// (rule primary-missed-finish), so status names that rule; raft's record
// turns the shapes where the peer is newer by the generations
// (outdated-peer: volstate's transcript
// a_peer_raft_has_outdated_is_never_copied_onto_the_primary, and node's
// TestAForcedPrimaryNeverPullsFromAPeerThatMissedItsAcknowledgedWrites).
func TestAPrimaryNeverCopiesFromAPeerRaftHasOutdated(t *testing.T) {
	const size = 8 << 20
	const off = 2 << 20
	c, _ := startThreeUnderRaft(t, size)
	ctx := context.Background()
	a := c.vol("alpha")
	old := c.disk("gamma")[off : off+4096]
	written := pattern(13, 4096)
	if err := a.WriteAt(ctx, written, off, true); err != nil {
		t.Fatal(err)
	}
	// A FLUSH: no write of alpha's is in gamma's cache only, so gamma's
	// stop does not have alpha track it (its bitmap generation toward
	// gamma stays none, as in the seed).
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.stop("gamma")

	// gamma's copy: the block as it was, marked toward alpha, and its
	// bitmap generation toward alpha the oldest of its history.
	img := c.cfg.Volumes[0].Disks["gamma"].Paths[0].Path
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(old, off); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	alphaID := c.cfg.NodeID("alpha")
	md, err := metadata.OpenMD(f, metadata.MDOptions{Placement: metadata.Internal, DeviceSize: fi.Size(), Volume: c.cfg.Volumes[0].VolumeUUID(), NodeID: c.cfg.NodeID("gamma")})
	if err != nil {
		t.Fatal(err)
	}
	bm, ok := md.Bitmap(alphaID)
	if !ok {
		t.Fatal("gamma keeps no bitmap toward alpha")
	}
	bm.SetBits(off, 4096)
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := statefile.Open(filepath.Join(c.dir, "gamma", "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	vs, _, err := st.Volume("vol0")
	if err != nil {
		t.Fatal(err)
	}
	oldGen := md.Superblock().History[0]
	if oldGen.IsZero() || oldGen == vs.Generation {
		t.Fatalf("gamma's history holds no generation older than its current %s: the test shows nothing", vs.Generation)
	}
	vs.PeerBitmaps = map[string]replication.Generation{"alpha": oldGen}
	if err := st.PutVolume("vol0", vs); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// raft has gamma Outdated under alpha. alpha proposes a peer that
	// finished a resync UpToDate in the background, and a proposal whose
	// leader lost office while committing it is asked again: one that
	// lands after the test's mark undoes it (a loaded rehearsal's raft
	// changed leaders right after the sync, and gamma never showed
	// Outdated). alpha's own marks wait for those proposals
	// (ensureOutdated); the test's waits too.
	eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.authority.upToDate) == 0
	}, "alpha's proposals of its peers UpToDate are over")
	cl := c.nodes["alpha"].cl.c
	va, _ := cl.Authority().Volume("vol0")
	if _, err := cl.Propose(ctx, replication.MarkOutdatedCommand("vol0", va.Epoch, "gamma")); err != nil {
		t.Fatal(err)
	}
	if !within(10*time.Second, 10*time.Millisecond, func() bool { va, _ = cl.Authority().Volume("vol0"); return va.IsOutdated("gamma") }) {
		t.Fatalf("alpha's raft does not have gamma Outdated: %+v", va)
	}

	// alpha's events from here on: the first connection to gamma's
	// decision is the one raft's record must shape (a later reconnect,
	// once gamma is in sync and no longer Outdated, decides by bitmap).
	since := time.Now()
	c.start("gamma")
	if !within(30*time.Second, 20*time.Millisecond, func() bool {
		p := a.peers.byName["gamma"].status()
		return p.SyncRule != "" && replica(c.status(), "gamma").OutOfSyncBytes == 0 && p.Replication == "Connected"
	}) {
		t.Fatalf("gamma not back in sync with alpha: %+v", a.peers.byName["gamma"].status())
	}
	if first := firstConnected(t, c.nodes["alpha"], "gamma", since); first.Reason != replication.RulePrimaryMissedFinish || first.New != string(replication.SyncSource) {
		t.Errorf("alpha's first connection to gamma went %s by rule %q; want %s by %s",
			first.New, first.Reason, replication.SyncSource, replication.RulePrimaryMissedFinish)
	}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		got := make([]byte, 4096)
		if _, err := c.vol(n).disk.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, written) {
			t.Errorf("%s lost alpha's acknowledged write at %d (it holds gamma's old copy: %v)", n, off, bytes.Equal(got, old))
		}
	}
	c.waitInSync()
	c.requireIdentical()
}

// firstConnected is n's first "connected" event toward peer since the
// given time (its Reason is the rule that decided the connection).
func firstConnected(t *testing.T, n *Node, peer string, since time.Time) transport.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found := make(chan transport.Event, 1)
	go n.api.Events(ctx, &transport.EventsRequest{History: 1000, Since: since}, func(e *transport.Event) error {
		if e.Kind == "connected" && e.Peer == peer {
			select {
			case found <- *e:
			default:
			}
			return errors.New("found")
		}
		return nil
	})
	select {
	case e := <-found:
		return e
	case <-ctx.Done():
		t.Fatalf("%s recorded no connected event toward %s since %s", n.name, peer, since.Format(time.RFC3339Nano))
	}
	return transport.Event{}
}

// TestAnUpToDateProposalThatDoesNotStartLeavesNothingToWaitFor: a
// proposal that raft record a peer UpToDate runs as a background task,
// and a record of the peer Outdated (the next write it misses) waits for
// it. A task that does not start (the volume stops; or the last such
// proposal has closed its wait and its task has not ended yet, which is
// held here) must leave nothing to wait for: a crash test hung ten
// minutes on that wait, the stopping primary's peers ending their
// streams, each waiting to record its peer Outdated.
func TestAnUpToDateProposalThatDoesNotStartLeavesNothingToWaitFor(t *testing.T) {
	c := startRaftServing(t, 8<<20)
	v := c.vol("alpha")
	const kind = "propose up-to-date beta"
	// Once raft has beta UpToDate and no proposal of it runs, nothing
	// proposes it again: the task held from here is the only one.
	var epoch uint64
	eventually(t, func() bool {
		va, ok := c.nodes["alpha"].cl.c.Authority().Volume("vol0")
		v.mu.Lock()
		defer v.mu.Unlock()
		if !ok || !va.IsUpToDate("beta") || v.authority.upToDate["beta"] != nil || v.tasks[kind] {
			return false
		}
		epoch = v.st.Durable.Epoch
		if v.tasks == nil {
			v.tasks = map[string]bool{}
		}
		v.tasks[kind] = true
		return true
	}, "raft has beta UpToDate, and no proposal of it runs")
	v.proposeUpToDate("beta", epoch)
	v.mu.Lock()
	_, waiting := v.authority.upToDate["beta"]
	delete(v.tasks, kind)
	v.mu.Unlock()
	if waiting {
		t.Fatal("a proposal that did not start left a wait behind: the next write beta misses would wait for it forever")
	}
	done := make(chan error, 1)
	go func() { done <- v.recordOutdated("beta", true) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("record beta Outdated: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("recording beta Outdated still waits after 30 s for a proposal that never ran")
	}
}
