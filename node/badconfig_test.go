package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPathsThatDoNotExistAreNamed: a node whose backing disk does not
// exist does not start, and says which path and how to make it; so does
// one whose state directory cannot be made.
func TestPathsThatDoNotExistAreNamed(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	missing := filepath.Join(c.dir, "no-such-disk.img")
	c.cfg.Volumes[0].Disks["alpha"] = SinglePath(missing)
	n, err := New(c.cfg, "alpha", Options{})
	if err == nil {
		err = n.Start()
		n.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "backing disk "+missing+" does not exist: create it") {
		t.Errorf("alpha with a missing disk: %v", err)
	}
	t.Logf("a missing disk: %v", err)

	c = newTestCluster(t, 4<<20)
	blocker := filepath.Join(c.dir, "a-file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.cfg.Nodes[0].StateDir = filepath.Join(blocker, "state")
	n, err = New(c.cfg, "alpha", Options{})
	if err == nil {
		err = n.Start()
		n.Close()
	}
	if err == nil || !strings.Contains(err.Error(), blocker) {
		t.Errorf("alpha with a state directory under a file: %v", err)
	}
	t.Logf("a state directory that cannot be made: %v", err)
}
