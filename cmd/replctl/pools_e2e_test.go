package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestE2EVolumeCreateAndDeleteFromPools is issue 30's done-means test of
// volumes made at run time: two data nodes with a pool each and a
// witness, each a replnode process. replctl volume create (asked of the
// witness, which forwards it to the raft leader) makes the backing file
// on both data nodes, the first chosen node serves the volume over NBD
// (qemu-io writes and reads it back), and volume list shows it beside
// the file's volume; the same create again changes nothing, another
// definition of the name is refused. A create that does not fit is
// refused naming the free space per node, three replicas on two data
// nodes are refused, a delete needs --yes, and delete --yes takes the
// backing files away on both nodes: at once on the primary, and on the
// secondary, which is down meanwhile, once it is back.
func TestE2EVolumeCreateAndDeleteFromPools(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Pools: true, Size: 16 << 20})
	c.startAll()
	c.waitFor("alpha", "vol0 in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)

	// Status shows each data node's pool, in words and in JSON.
	if out := c.mustCtl("beta", "status"); !strings.Contains(out, "POOL") || !strings.Contains(out, "default  alpha") || !strings.Contains(out, "default  beta") {
		t.Fatalf("replctl status does not list the pools:\n%s", out)
	}
	js := c.mustCtl("witness", "status", "--json")
	var st struct {
		Pools []transport.PoolStatus `json:"pools"`
	}
	if err := json.Unmarshal([]byte(js[strings.IndexByte(js, '{'):]), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Pools) != 2 || st.Pools[0].Node != "alpha" || st.Pools[1].Node != "beta" || st.Pools[0].Name != "default" || st.Pools[0].Size == 0 || st.Pools[0].Free == 0 || st.Pools[0].State != "" {
		t.Fatalf("status --json pools: %+v", st.Pools)
	}

	out := c.mustCtl(witnessName, "volume", "create", "pvc1", "--size", "32MiB")
	if !strings.Contains(out, "created pvc1: 32.0MiB (33554432 bytes) in pool default on ") {
		t.Fatalf("replctl volume create: %q", out)
	}
	images := map[string]string{}
	for _, n := range []string{"alpha", "beta"} {
		images[n] = filepath.Join(c.poolDir(n), "pvc1.img")
	}
	if !within(30*time.Second, 100*time.Millisecond, func() bool {
		for _, img := range images {
			if fi, err := os.Stat(img); err != nil || fi.Size() <= 32<<20 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the backing files %v did not appear", images)
	}

	list := func(node string) transport.VolumeListReply {
		t.Helper()
		var l transport.VolumeListReply
		if err := json.Unmarshal([]byte(c.mustCtl(node, "volume", "list", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	var pvc transport.VolumeInfo
	for _, v := range list("beta").Volumes {
		if v.Name == "pvc1" {
			pvc = v
		}
	}
	if pvc.Source != transport.VolumeFromAPI || pvc.Size != 32<<20 || pvc.Pool != "default" || pvc.Protocol != "C" || len(pvc.Replicas) != 2 {
		t.Fatalf("volume list --json shows pvc1 as %+v", pvc)
	}
	primary := pvc.Replicas[0]
	uri := "nbd://" + c.nodes[primary].NBD + "/pvc1"
	qemuIOEventually(t, 60*time.Second, "pvc1 on its first primary "+primary, uri, "write -P 0x5a 0 1M", "write -P 0x6b 31M 1M", "flush")
	qemuIO(t, uri, "read -P 0x5a 0 1M", "read -P 0x6b 31M 1M")

	table := c.mustCtl("alpha", "volume", "list")
	for _, want := range []string{"NAME", "pvc1", "default", "api", "vol0", "config"} {
		if !strings.Contains(table, want) {
			t.Fatalf("replctl volume list does not say %q:\n%s", want, table)
		}
	}
	if out := c.mustCtl("beta", "volume", "create", "pvc1", "--size", "32MiB"); !strings.Contains(out, "pvc1 exists already as asked") {
		t.Fatalf("the same create again: %q", out)
	}
	if r := c.ctl("alpha", "volume", "create", "pvc1", "--size", "64MiB"); r.ok() || !strings.Contains(r.out, "exists with another definition") {
		t.Fatalf("pvc1 created again with another size: %s", r)
	}
	if r := c.ctl("alpha", "volume", "create", "vol0", "--size", "64MiB"); r.ok() || !strings.Contains(r.out, "vol0 is a volume of the cluster file") {
		t.Fatalf("a create of the file's vol0: %s", r)
	}

	// A resize grows a pool's volume: each node grows its file in the
	// pool, raft records the new size, and the gained range serves.
	sizes := map[string]int64{}
	for n, img := range images {
		fi, err := os.Stat(img)
		if err != nil {
			t.Fatal(err)
		}
		sizes[n] = fi.Size()
	}
	if r := c.ctl(witnessName, "resize", "pvc1", "48MiB"); !r.ok() {
		t.Fatalf("replctl resize of a pool's volume: %s", r)
	}
	for n, img := range images {
		if fi, err := os.Stat(img); err != nil || fi.Size() < sizes[n]+16<<20 {
			t.Fatalf("%s's file %s did not grow by 16 MiB with pvc1 (%d bytes before): %v %v", n, img, sizes[n], fi, err)
		}
	}
	if !within(30*time.Second, 100*time.Millisecond, func() bool {
		for _, v := range list("alpha").Volumes {
			if v.Name == "pvc1" {
				return v.Size == 48<<20
			}
		}
		return false
	}) {
		t.Fatalf("raft does not record pvc1's new size: %+v", list("alpha").Volumes)
	}
	qemuIO(t, uri, "write -P 0x7c 47M 1M", "flush", "read -P 0x7c 47M 1M", "read -P 0x5a 0 1M")

	r := c.ctl("beta", "volume", "create", "huge", "--size", "100TiB")
	if r.ok() || !strings.Contains(r.out, "volume huge not created") || !strings.Contains(r.out, "alpha: ") || !strings.Contains(r.out, "beta: ") || !strings.Contains(r.out, "free") {
		t.Fatalf("a create that does not fit: %s; want a refusal naming each node's free space", r)
	}
	r = c.ctl("alpha", "volume", "create", "three", "--size", "16MiB", "--replicas", "3")
	if r.ok() || !strings.Contains(r.out, "3 replicas need 3 data nodes, and the cluster has 2 (alpha, beta)") {
		t.Fatalf("three replicas on two data nodes: %s", r)
	}
	for _, name := range []string{"huge", "three"} {
		for _, n := range []string{"alpha", "beta"} {
			if _, err := os.Stat(filepath.Join(c.poolDir(n), name+".img")); !os.IsNotExist(err) {
				t.Fatalf("a refused create left %s on %s: %v", name, n, err)
			}
		}
	}

	if r := c.ctl("alpha", "volume", "delete", "pvc1"); r.ok() || r.code != 2 || !strings.Contains(r.out, "add --yes") {
		t.Fatalf("volume delete without --yes: %s", r)
	}
	if r := c.ctl("alpha", "volume", "delete", "vol0", "--yes"); r.ok() || !strings.Contains(r.out, "vol0 is a volume of the cluster file") {
		t.Fatalf("volume delete of the file's vol0: %s", r)
	}
	// The secondary is down while the volume is deleted: the primary
	// stops it and removes its file at once, the secondary when it is
	// back.
	secondary := pvc.Replicas[1]
	c.kill(secondary)
	if out := c.mustCtl(witnessName, "volume", "delete", "pvc1", "--yes"); !strings.Contains(out, "deleted pvc1") {
		t.Fatalf("volume delete --yes: %q", out)
	}
	gone := func(node string) bool {
		_, err := os.Stat(images[node])
		return os.IsNotExist(err)
	}
	if !within(30*time.Second, 100*time.Millisecond, func() bool { return gone(primary) }) {
		t.Fatalf("the backing file %s stays on the primary %s after the delete", images[primary], primary)
	}
	if gone(secondary) {
		t.Fatalf("the backing file %s of the secondary %s, down, went away", images[secondary], secondary)
	}
	c.start(secondary)
	c.waitListening(secondary, 30*time.Second)
	if !within(30*time.Second, 100*time.Millisecond, func() bool { return gone(secondary) }) {
		t.Fatalf("the backing file %s stays on %s, back after the delete", images[secondary], secondary)
	}
	for _, v := range list("alpha").Volumes {
		if v.Name == "pvc1" {
			t.Fatalf("volume list shows pvc1 after its delete: %+v", v)
		}
	}
	if out := c.mustCtl("beta", "volume", "delete", "pvc1", "--yes"); !strings.Contains(out, "nothing deleted") {
		t.Fatalf("a delete of a name that does not exist: %q", out)
	}
	// vol0, the file's, runs on.
	c.waitFor("alpha", "vol0 still in sync", syncTimeout, raftInSync)
}
