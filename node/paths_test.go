package node

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/multipath/faultpath"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// multipathCluster gives alpha two paths (p0, p1) to its backing file, p0
// wrapped in a fault injector.
func multipathCluster(t *testing.T, size int64) (*testCluster, *faultpath.Path) {
	c := newTestCluster(t, size)
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	if err := os.Truncate(img, deviceSize(t, size)+multipath.LabelSize); err != nil {
		t.Fatal(err)
	}
	c.cfg.Volumes[0].Disks["alpha"] = MultiPath(img, img)
	var fp *faultpath.Path
	c.opts["alpha"] = Options{OpenPath: func(pc PathConfig) (multipath.Path, error) {
		p, err := multipath.OpenFilePath(pc.Name, pc.Path)
		if err != nil || pc.Name != "p0" {
			return p, err
		}
		fp = faultpath.New(p)
		lastFault.Store(fp)
		return fp, nil
	}}
	return c, fp
}

func TestPathFailuresNeverReachTheVolumesClient(t *testing.T) {
	c, _ := multipathCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	var p0 *faultpath.Path
	// Fail every 7th operation on p0, reads and writes alike.
	var n atomic.Int64
	inj := faultpath.InjectorFunc(func(op faultpath.Op, off, length int64) faultpath.Fault {
		if n.Add(1)%7 == 0 {
			return faultpath.Fault{Err: faultpath.ErrInjected}
		}
		return faultpath.Fault{}
	})
	p0 = findFaultPath(t, c)
	p0.SetInjector(inj)
	if _, err := c.nodes["alpha"].api.PathAction(context.Background(), &transport.PathRequest{Volume: "vol0", Action: "policy", Policy: "round-robin"}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			buf := make([]byte, 8192)
			for i := range 300 {
				off := r.Int64N(2048) * 8192
				data := pattern(byte(w*50+i), 8192)
				if err := c.vol("alpha").WriteAt(ctx, data, off, false); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				if err := c.vol("alpha").ReadAt(ctx, buf, off); err != nil {
					t.Errorf("read: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p0.Injected() == 0 {
		t.Fatal("no fault was injected")
	}
	c.requireIdentical()
	var sawErrors bool
	for _, p := range c.vol("alpha").pathStatus() {
		sawErrors = sawErrors || (p.Path == "p0" && p.Errors > 0)
	}
	if !sawErrors {
		t.Fatal("path status shows no errors on p0")
	}
}

func findFaultPath(t *testing.T, c *testCluster) *faultpath.Path {
	t.Helper()
	if fp, ok := lastFault.Load().(*faultpath.Path); ok {
		return fp
	}
	t.Fatal("no fault path was opened")
	return nil
}

var lastFault atomic.Value

func TestPathCommandsAndMultipathConfigErrors(t *testing.T) {
	c, _ := multipathCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	api := c.nodes["beta"].api // forwards to alpha
	ctx := context.Background()
	r, err := api.PathAction(ctx, &transport.PathRequest{Volume: "vol0", Node: "alpha", Action: "fail", Path: "p0"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Node != "alpha" || r.Paths[0].State != "FAIL" || r.Paths[1].State != "ACTIVE" {
		t.Fatalf("after fail: %+v", r.Paths)
	}
	if err := c.vol("alpha").WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatalf("write with one path failed by the operator: %v", err)
	}
	if _, err := api.PathAction(ctx, &transport.PathRequest{Volume: "vol0", Node: "alpha", Action: "restore", Path: "p0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.PathAction(ctx, &transport.PathRequest{Volume: "vol0", Node: "alpha", Action: "fail", Path: "nope"}); err == nil {
		t.Fatal("failing an unknown path worked")
	}
	if _, err := api.PathAction(ctx, &transport.PathRequest{Volume: "vol0", Action: "rotate"}); err == nil {
		t.Fatal("beta has a single-path disk, rotate should be refused")
	}
	resp, err := http.Get("http://" + c.nodes["beta"].ControlAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "paths of alpha") || !strings.Contains(string(page), "ACTIVE") {
		t.Fatal("the status page shows no paths")
	}
	st := c.status()
	if len(replica(st, "alpha").Paths) != 2 || len(replica(st, "beta").Paths) != 0 {
		t.Fatalf("status paths: alpha %d, beta %d", len(replica(st, "alpha").Paths), len(replica(st, "beta").Paths))
	}
}

func TestPathsOfAnotherLUNAreRefused(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	for _, f := range []string{a, b} {
		os.WriteFile(f, nil, 0o644)
		os.Truncate(f, deviceSize(t, 4<<20)+multipath.LabelSize)
	}
	// Label both as separate LUNs first.
	for _, f := range []string{a, b} {
		c.cfg.Volumes[0].Disks["alpha"] = MultiPath(f)
		n, err := New(c.cfg, "alpha", Options{StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		closeVolumes(n.volumes())
		n.store.Close()
	}
	c.cfg.Volumes[0].Disks["alpha"] = MultiPath(a, b)
	_, err := New(c.cfg, "alpha", Options{StateDir: t.TempDir()})
	if err == nil {
		t.Fatal("paths to two different LUNs were accepted")
	}
	t.Log(err)
}

// TestThousandPathFailuresUnderFioVerify: fio writes and verifies through
// the NBD export while alpha's preferred path fails 1,000 single IOs; every
// failed IO is retried on the other path, so fio sees no error.
func TestThousandPathFailuresUnderFioVerify(t *testing.T) {
	nbdtest.RequireTool(t, "fio")
	fio, _ := nbdtest.LookTool("fio")
	const size = 64 << 20
	c := newTestCluster(t, size)
	img := c.cfg.Volumes[0].Disks["alpha"].Paths[0].Path
	if err := os.Truncate(img, deviceSize(t, size)+multipath.LabelSize); err != nil {
		t.Fatal(err)
	}
	dc := MultiPath(img, img)
	dc.CheckInterval = Duration(5 * time.Millisecond)
	dc.ReinstateHoldoff = Duration(time.Millisecond)
	c.cfg.Volumes[0].Disks["alpha"] = dc
	var failed atomic.Int64
	const want = 1000
	c.opts["alpha"] = Options{OpenPath: func(pc PathConfig) (multipath.Path, error) {
		p, err := multipath.OpenFilePath(pc.Name, pc.Path)
		if err != nil || pc.Name != "p0" {
			return p, err
		}
		fp := faultpath.New(p)
		var n atomic.Int64
		fp.SetInjector(faultpath.InjectorFunc(func(op faultpath.Op, off, length int64) faultpath.Fault {
			if (op == faultpath.OpRead || op == faultpath.OpWrite) && off < size && n.Add(1)%3 == 0 && failed.Add(1) <= want {
				return faultpath.Fault{Err: faultpath.ErrInjected}
			}
			return faultpath.Fault{}
		}))
		return fp, nil
	}}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	uri := "nbd://" + c.nodes["alpha"].NBDAddr() + "/vol0"
	work := t.TempDir() // fio leaves its verify state file in its directory
	for failed.Load() < want {
		cmd := exec.Command(fio, "--name=verify", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
			"--size=32M", "--iodepth=16", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
			"--output-format=terse")
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fio with %d path failures so far: %v\n%s", failed.Load(), err, out)
		}
	}
	t.Logf("%d injected path failures, no IO error reached fio", min(failed.Load(), want))
	c.waitInSync()
	c.requireIdentical()
	var p0Errors uint64
	for _, p := range c.vol("alpha").pathStatus() {
		if p.Path == "p0" {
			p0Errors = p.Errors
		}
	}
	if p0Errors < want {
		t.Fatalf("p0 shows %d errors, want at least %d", p0Errors, want)
	}
}

// TestByGroupBalanceIsTheDefaultWithGroups: two LUNs on one node, each
// reachable through controller A and controller B; with groups given, the
// nodes spread their active paths over both controllers.
func TestByGroupBalanceIsTheDefaultWithGroups(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	vol1 := c.cfg.Volumes[0]
	vol1.Name = "vol1"
	vol1.Disks = map[string]DiskConfig{}
	for _, name := range []string{"alpha", "beta"} {
		for _, vol := range []*VolumeConfig{&c.cfg.Volumes[0], &vol1} {
			img := filepath.Join(c.dir, name+"-"+vol.Name+"-lun.img")
			os.WriteFile(img, nil, 0o644)
			os.Truncate(img, deviceSize(t, 4<<20)+multipath.LabelSize)
			dc := MultiPath(img, img)
			dc.Paths[0].Group, dc.Paths[1].Group = "ctrl-a", "ctrl-b"
			vol.Disks[name] = dc
		}
	}
	c.cfg.Volumes = append(c.cfg.Volumes, vol1)
	c.start("alpha")
	c.start("beta")
	active := map[string]bool{}
	for _, vol := range []string{"vol0", "vol1"} {
		for _, p := range c.nodes["alpha"].volumes()[vol].pathStatus() {
			if p.Preferred {
				active[p.Group] = true
			}
		}
	}
	if !active["ctrl-a"] || !active["ctrl-b"] {
		t.Fatalf("alpha's two LUNs prefer paths in groups %v, want one on each controller", active)
	}
}
