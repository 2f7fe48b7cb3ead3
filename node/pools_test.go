package node

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPoolsTakeEffectOnReload: a pool added to a node's entry of the
// file is there after the SIGHUP (ApplyVolumes): its directory is made,
// its size and free space measured, and an lvm_vg pool is listed as one
// that takes no volume; a pool removed from the file is gone after the
// next.
func TestPoolsTakeEffectOnReload(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	n := c.nodes["alpha"]
	if got := n.pools(); len(got) != 0 {
		t.Fatalf("pools before any: %+v", got)
	}
	dir := filepath.Join(t.TempDir(), "made", "pool")
	next := *c.cfg
	next.Nodes = slices.Clone(c.cfg.Nodes)
	next.Nodes[0].Pools = []PoolConfig{{Name: "default", Dir: dir}, {Name: "fast", LVMVG: "vg0"}}
	if next.Nodes[0].Name != "alpha" {
		t.Fatalf("node 0 is %s", next.Nodes[0].Name)
	}
	c.apply("alpha", &next)
	got := n.pools()
	if len(got) != 2 || got[0].Name != "default" || got[0].State != "" || got[0].Size == 0 || got[0].Free == 0 || got[0].Free > got[0].Size {
		t.Fatalf("after the reload that adds them: %+v", got)
	}
	if got[1].Name != "fast" || !strings.Contains(got[1].State, "lvm not available") {
		t.Fatalf("the lvm pool: %+v", got[1])
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("the pool's directory was not made: %v", err)
	}

	// A sparse file in the pool is promised its whole size.
	before := got[0].Free
	if err := os.Truncate(writeFile(t, filepath.Join(dir, "v.img")), int64(before/2)); err != nil {
		t.Fatal(err)
	}
	if after := n.pools()[0].Free; after > before-before/2+before/16 {
		t.Fatalf("free %d after a sparse file of %d in a pool of %d free: its size is not counted", after, before/2, before)
	}

	c.apply("alpha", c.cfg)
	if got := n.pools(); len(got) != 0 {
		t.Fatalf("after the reload that removes them: %+v", got)
	}
}

func writeFile(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
