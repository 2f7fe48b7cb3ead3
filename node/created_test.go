package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newPoolCluster is newRaftCluster whose data nodes have a pool
// "default" each, the directory poolDirOf(c, node).
func newPoolCluster(t *testing.T) *testCluster {
	t.Helper()
	c := newRaftCluster(t, 4<<20)
	for i, nc := range c.cfg.Nodes {
		if !nc.IsWitness() {
			c.cfg.Nodes[i].Pools = []PoolConfig{{Name: "default", Dir: poolDirOf(c, nc.Name)}}
		}
	}
	if err := c.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	return c
}

func poolDirOf(c *testCluster, node string) string { return filepath.Join(c.dir, node+"-pool") }

// eventsOf counts node n's events of kind about volume.
func eventsOf(t *testing.T, n *Node, volume, kind string) int {
	t.Helper()
	evs, err := n.store.Events(1000)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range evs {
		if e.Volume == volume && e.Kind == kind {
			count++
		}
	}
	return count
}

// TestADeletedVolumeWithNBDClientsRunsOnUntilTheyAreGone: a volume
// created at run time serves on its first chosen node; deleted while a
// client is connected there, it stops at once on the other node (its
// file removed), and runs on where the client is, serving it, said once
// however often the node looks again; once the client disconnects it
// stops there too and its file goes.
func TestADeletedVolumeWithNBDClientsRunsOnUntilTheyAreGone(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reply, err := c.nodes["wit"].api.VolumeCreate(ctx, &transport.VolumeCreateRequest{Name: "pvc1", Size: 4 << 20})
	if err != nil || !reply.Created || len(reply.Volume.Replicas) != 2 {
		t.Fatalf("create: %+v, %v", reply, err)
	}
	primary, secondary := reply.Volume.Replicas[0], reply.Volume.Replicas[1]
	p := c.nodes[primary]
	eventually(t, func() bool {
		v, ok := p.volumes()["pvc1"]
		if !ok {
			return false
		}
		s := v.status()
		return s.Role == "Primary" && s.Serving
	}, "pvc1 serves on its first chosen node "+primary)
	cl, err := nbdtest.Dial(ctx, p.NBDAddr(), "pvc1")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Write(0, pattern(3, 4096), nbdtest.CmdFlagFUA); err != nil {
		t.Fatal(err)
	}

	if r, err := c.nodes["beta"].api.VolumeDelete(ctx, &transport.VolumeDeleteRequest{Name: "pvc1"}); err != nil || !r.Deleted {
		t.Fatalf("delete: %+v, %v", r, err)
	}
	image := func(node string) string { return filepath.Join(poolDirOf(c, node), "pvc1.img") }
	eventually(t, func() bool {
		_, err := os.Stat(image(secondary))
		_, running := c.nodes[secondary].volumes()["pvc1"]
		return os.IsNotExist(err) && !running
	}, "pvc1 stopped on "+secondary+" and its file removed")
	eventually(t, func() bool { return eventsOf(t, p, "pvc1", "created-volume-problem") == 1 }, primary+" says it keeps pvc1 for its client")
	for range 3 {
		p.reconcileCreated()
	}
	if n := eventsOf(t, p, "pvc1", "created-volume-problem"); n != 1 {
		t.Fatalf("%s said %d times that it keeps pvc1, want once", primary, n)
	}
	if n := eventsOf(t, p, "pvc1", "remove-refused"); n != 0 {
		t.Fatalf("%s recorded %d refused removals of pvc1 while it looked again", primary, n)
	}
	if err := cl.Write(4096, pattern(4, 4096), nbdtest.CmdFlagFUA); err != nil {
		t.Fatalf("pvc1 stopped serving its client: %v", err)
	}
	if _, err := os.Stat(image(primary)); err != nil {
		t.Fatalf("the file of pvc1 on %s, which still serves it: %v", primary, err)
	}

	if _, err := cl.Disconnect(); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		_, err := os.Stat(image(primary))
		_, running := p.volumes()["pvc1"]
		return os.IsNotExist(err) && !running
	}, "pvc1 stopped on "+primary+" and its file removed once its client is gone")
}

// TestACreatedVolumeComesBackWithItsNodes: a volume created at run time
// is in no cluster file: a node that restarts runs it again from raft's
// record, on the backing file it made (kept, with its data), and it is
// in sync again; the writes acknowledged before are there.
func TestACreatedVolumeComesBackWithItsNodes(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reply, err := c.nodes["alpha"].api.VolumeCreate(ctx, &transport.VolumeCreateRequest{Name: "pvc1", Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	primary, secondary := reply.Volume.Replicas[0], reply.Volume.Replicas[1]
	c.waitVolumeInSync("pvc1")
	var v *Volume
	eventually(t, func() bool {
		v = c.nodes[primary].volumes()["pvc1"]
		return v != nil && v.WriteAt(ctx, pattern(7, 64<<10), 0, true) == nil
	}, "pvc1 takes a write on "+primary)
	before, err := os.Stat(filepath.Join(poolDirOf(c, secondary), "pvc1.img"))
	if err != nil {
		t.Fatal(err)
	}

	c.stop(secondary)
	c.start(secondary)
	eventually(t, func() bool { _, ok := c.nodes[secondary].volumes()["pvc1"]; return ok }, secondary+" runs pvc1 again after its restart")
	c.waitVolumeInSync("pvc1")
	after, err := os.Stat(filepath.Join(poolDirOf(c, secondary), "pvc1.img"))
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("%s's backing file of pvc1 was made again (%v): it must be kept", secondary, err)
	}
	for _, kind := range []string{"backing-made", "create-md"} {
		if n := eventsOf(t, c.nodes[secondary], "pvc1", kind); n != 1 {
			t.Fatalf("%s recorded %d %s events for pvc1: its file and metadata must be made once, and kept", secondary, n, kind)
		}
	}
	if vol := c.cfg.Volume("pvc1"); vol != nil {
		t.Fatal("the test's cluster file lists pvc1")
	}
	got := make([]byte, 64<<10)
	w := c.nodes[secondary].volumes()["pvc1"]
	if _, err := w.disk.ReadAt(got, 0); err != nil || string(got) != string(pattern(7, 64<<10)) {
		t.Fatalf("%s's copy of pvc1 lacks the write acknowledged before its restart (%v)", secondary, err)
	}
}

// TestADeleteOfAMountedVolumeIsRefused: while a mount holds a created
// volume's claim, its delete is refused, naming the host and the
// directory and how to unmount, and nothing changes; once the claim is
// given back the delete goes through.
func TestADeleteOfAMountedVolumeIsRefused(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reply, err := c.nodes["beta"].api.VolumeCreate(ctx, &transport.VolumeCreateRequest{Name: "pvc1", Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	primary := reply.Volume.Replicas[0]
	p := c.nodes[primary]
	eventually(t, func() bool { v, ok := p.volumes()["pvc1"]; return ok && v.status().Serving }, "pvc1 serves on "+primary)
	holder := transport.MountHolder{Host: "web1", Dir: "/srv/data", ID: "5f0c2a"}
	claim := func(action string) error {
		_, err := p.api.Claim(ctx, &transport.ClaimRequest{Volume: "pvc1", Action: action, Holder: holder, Grace: 30 * time.Second})
		return err
	}
	if err := claim(transport.ClaimTake); err != nil {
		t.Fatal(err)
	}
	_, err = c.nodes["wit"].api.VolumeDelete(ctx, &transport.VolumeDeleteRequest{Name: "pvc1"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pvc1 is mounted on host web1 at /srv/data") ||
		!strings.Contains(err.Error(), "replctl umount /srv/data, on web1") {
		t.Fatalf("delete of a mounted volume: %v", err)
	}
	if _, ok := c.nodes["wit"].cl.c.Authority().Created("pvc1"); !ok {
		t.Fatal("the refused delete changed raft's record")
	}
	if err := claim(transport.ClaimRelease); err != nil {
		t.Fatal(err)
	}
	if r, err := c.nodes["wit"].api.VolumeDelete(ctx, &transport.VolumeDeleteRequest{Name: "pvc1"}); err != nil || !r.Deleted {
		t.Fatalf("delete once unmounted: %+v, %v", r, err)
	}
}

// TestACreatedVolumeAskedAgainOfTheNextLeaderSaysItWasCreated: a create
// whose answer a raft leader change cut off is asked again, under the
// request ID its caller chose once, of the next leader. That leader
// finds the record the first one made, and answers as the first would
// have: created. A create of the same definition under another ID (or
// none) did not make the volume: it says the volume existed, and changes
// nothing.
func TestACreatedVolumeAskedAgainOfTheNextLeaderSaysItWasCreated(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := transport.VolumeCreateRequest{Name: "pvc1", Size: 4 << 20, RequestID: transport.NewRequestID()}
	first, err := c.nodes["wit"].api.VolumeCreate(ctx, &req)
	if err != nil || !first.Created {
		t.Fatalf("create: %+v, %v", first, err)
	}
	recorder, _ := c.nodes["wit"].leader()
	if recorder == "" {
		t.Fatal("no raft leader after the create")
	}
	// The leadership moves to a node that is neither the leader that
	// recorded the create nor pvc1's primary (a data primary hands the
	// leadership on by itself, and a transfer of ours may then meet its
	// own: it is asked again until another node leads).
	to := ""
	for _, name := range []string{"wit", "alpha", "beta"} {
		if name != recorder && name != first.Volume.Replicas[0] {
			to = name
		}
	}
	for deadline := time.Now().Add(time.Minute); ; {
		if l, _ := c.nodes["wit"].leader(); l != "" && l != recorder {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still leads a minute after the transfers began", recorder)
		}
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.nodes[recorder].cl.c.TransferLeadership(tctx, to); err != nil {
			t.Logf("transfer the leadership from %s to %s: %v", recorder, to, err)
			time.Sleep(100 * time.Millisecond)
		}
		tcancel()
	}

	for _, via := range []string{"alpha", "beta", "wit"} {
		again := req
		reply, err := c.nodes[via].api.VolumeCreate(ctx, &again)
		if err != nil || !reply.Created || reply.Volume.Size != first.Volume.Size {
			t.Fatalf("the create asked again under its request ID, through %s: %+v, %v; want created, as its first answer said", via, reply, err)
		}
	}
	for _, id := range []string{transport.NewRequestID(), ""} {
		other := req
		other.RequestID = id
		reply, err := c.nodes["beta"].api.VolumeCreate(ctx, &other)
		if err != nil || reply.Created {
			t.Fatalf("another create of pvc1 (request ID %q): %+v, %v; want it to say pvc1 existed", id, reply, err)
		}
	}
	def, ok := c.nodes["wit"].cl.c.Authority().Created("pvc1")
	if !ok || def.RequestID != req.RequestID || def.Size != 4<<20 {
		t.Fatalf("raft records %+v, %v; want pvc1 as the first create made it", def, ok)
	}
}

// TestAVolumeListShowsEveryCreateAnsweredBeforeIt: a list asked after a
// create was answered holds the volume, whichever leader answers it: one
// just elected (a transfer right after the create, as a primary that
// leads hands its leadership on) has it too.
func TestAVolumeListShowsEveryCreateAnsweredBeforeIt(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 6 {
		name := fmt.Sprintf("pvc%d", round)
		recorder, _ := c.nodes["wit"].leader()
		if recorder == "" {
			t.Fatal("no raft leader")
		}
		reply, err := c.nodes[recorder].api.VolumeCreate(ctx, &transport.VolumeCreateRequest{Name: name, Size: 4 << 20})
		if err != nil || !reply.Created {
			t.Fatalf("create %s on %s: %+v, %v", name, recorder, reply, err)
		}
		// The leadership moves at once (a data primary may hand it on by
		// itself meanwhile: either way another node leads).
		for _, to := range []string{"wit", "alpha", "beta"} {
			if to == recorder {
				continue
			}
			tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
			err := c.nodes[recorder].cl.c.TransferLeadership(tctx, to)
			tcancel()
			if err == nil {
				break
			}
		}
		for _, via := range []string{"wit", "alpha", "beta"} {
			list, err := c.nodes[via].api.VolumeList(ctx, &transport.VolumeListRequest{})
			if err != nil {
				t.Fatalf("round %d: list through %s: %v", round, via, err)
			}
			if !slices.ContainsFunc(list.Volumes, func(v transport.VolumeInfo) bool { return v.Name == name }) {
				leader, _ := c.nodes[via].leader()
				t.Fatalf("round %d: the list through %s (leader %s) lacks %s, created on %s before it was asked: %+v", round, via, leader, name, recorder, list.Volumes)
			}
		}
	}
}

// TestAResizeRightAfterACreateWaitsForEveryReplicaToOpenIt: a volume
// created a moment ago may still be opening on one of its nodes (its
// pass over raft's created volumes has not run yet); a resize asked then
// (csi-sanity's ExpandVolume right after CreateVolume, under load) waits
// for that node to open it, and grows it everywhere, instead of refusing
// with "node beta holds no volume".
func TestAResizeRightAfterACreateWaitsForEveryReplicaToOpenIt(t *testing.T) {
	c := newPoolCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// beta opens nothing created until it is let go.
	late := c.nodes["beta"]
	late.volMu.Lock()
	held := true
	defer func() {
		if held {
			late.volMu.Unlock()
		}
	}()
	if _, err := c.nodes["alpha"].api.VolumeCreate(ctx, &transport.VolumeCreateRequest{Name: "pvc1", Size: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { _, ok := c.nodes["alpha"].volumes()["pvc1"]; return ok }, "alpha runs pvc1")
	done := make(chan error, 1)
	go func() {
		_, err := c.nodes["alpha"].api.Resize(ctx, &transport.ResizeRequest{Volume: "pvc1", Size: 8 << 20})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a resize while beta has not opened pvc1 yet returned before it did: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	late.volMu.Unlock()
	held = false
	if err := <-done; err != nil {
		t.Fatalf("the resize once beta opened pvc1: %v", err)
	}
	for _, name := range []string{"alpha", "beta"} {
		if v := c.nodes[name].volumes()["pvc1"]; v == nil || v.size.Load() != 8<<20 {
			t.Fatalf("%s's pvc1 did not grow to 8 MiB", name)
		}
	}
}
