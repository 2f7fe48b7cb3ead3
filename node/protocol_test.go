package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// gatedDisk holds every write while closed (a slow or stuck disk).
type gatedDisk struct {
	Disk
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (d *gatedDisk) close() {
	d.mu.Lock()
	d.gate = make(chan struct{})
	d.mu.Unlock()
}

func (d *gatedDisk) open() {
	d.mu.Lock()
	if d.gate != nil {
		close(d.gate)
		d.gate = nil
	}
	d.mu.Unlock()
}

func (d *gatedDisk) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	g := d.gate
	d.mu.Unlock()
	if g != nil {
		<-g
	}
	return d.Disk.WriteAt(p, off)
}

// newGatedCluster is alpha and beta in sync, beta's disk behind a gate.
func newGatedCluster(t *testing.T) (*testCluster, *gatedDisk) {
	t.Helper()
	c := newTestCluster(t, 8<<20)
	c.opts["beta"] = Options{OpenDisk: func(path string, size int64) (Disk, error) {
		d, err := OpenDisk(path, size)
		return &gatedDisk{Disk: d}, err
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	g := c.vol("beta").disk.(*gatedDisk)
	t.Cleanup(g.open)
	return c, g
}

// writeWithin reports whether a 4 KiB write at off completed within d.
func writeWithin(t *testing.T, v *Volume, off int64, d time.Duration) (done chan error, within bool) {
	t.Helper()
	done = make(chan error, 1)
	go func() { done <- v.WriteAt(context.Background(), pattern(byte(off>>12), 4096), off, false) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		return nil, true
	case <-time.After(d):
		return done, false
	}
}

// TestEachProtocolCompletesAWriteWhenItPromises: beta's disk is stuck.
// Under C a write waits for beta's disk; under B it completes once beta
// received it; under A once it is written locally and queued, and the
// lag says what beta does not hold yet. When the disk moves again the
// lag drains and the replicas end identical.
func TestEachProtocolCompletesAWriteWhenItPromises(t *testing.T) {
	c, gate := newGatedCluster(t)
	a := c.vol("alpha")
	gate.close()
	pendingC, ok := writeWithin(t, a, 0, 500*time.Millisecond)
	if ok {
		t.Fatal("protocol C: a write completed while the peer's disk had not written it")
	}
	if _, err := a.adjust("B", ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := writeWithin(t, a, 4096, 2*time.Second); !ok {
		t.Fatal("protocol B: a write the peer received did not complete")
	}
	if _, err := a.adjust("A", ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := writeWithin(t, a, 8192, 2*time.Second); !ok {
		t.Fatal("protocol A: a write written locally did not complete")
	}
	if lag := a.peers["beta"].status().LagBytes; lag < 8192 {
		t.Fatalf("lag %d bytes with two acknowledged writes beta does not hold, want at least 8192", lag)
	}
	gate.open()
	if err := <-pendingC; err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return a.peers["beta"].status().LagBytes == 0 }, "the lag drained")
	c.waitInSync()
	c.requireIdentical()
}

// TestAdjustChangesTheProtocolWhileWriting: the protocol changes back and
// forth on every node, through the control API, while writes go on: no
// write fails and no resync follows.
func TestAdjustChangesTheProtocolWhileWriting(t *testing.T) {
	c := newSyncedCluster(t, 16<<20)
	api := &control{n: c.nodes["beta"]}
	ctx := context.Background()
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.vol("alpha").WriteAt(ctx, pattern(byte(i), 8192), int64(i%1000)*8192, false); err != nil {
				errs <- err
				return
			}
		}
	}()
	resynced := replica(c.status(), "beta").ResyncedBytes
	for _, p := range []string{"A", "B", "C", "A", "C"} {
		r, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Protocol: p})
		if err != nil || len(r.Nodes) != 2 {
			t.Fatalf("adjust to %s: %+v, %v", p, r, err)
		}
		time.Sleep(100 * time.Millisecond) // writes run under it
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("a write failed while the protocol changed: %v", err)
	}
	if _, err := api.Adjust(ctx, &transport.AdjustRequest{Volume: "vol0", Protocol: "B", OnCongestion: "pull-ahead"}); err == nil {
		t.Fatal("pull-ahead under protocol B was accepted")
	}
	c.waitInSync()
	if moved := replica(c.status(), "beta").ResyncedBytes - resynced; moved != 0 {
		t.Fatalf("changing the protocol resynced %d bytes", moved)
	}
	if p := c.status().Volumes[0].Protocol; p != "C" {
		t.Fatalf("status shows protocol %q, want C", p)
	}
	c.requireIdentical()
}
