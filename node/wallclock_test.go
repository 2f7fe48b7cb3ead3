package node

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// wallClockReads are the functions of package time that read the real
// clock or wait on it.
var wallClockReads = map[string]bool{
	"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
	"NewTimer": true, "NewTicker": true, "Tick": true, "Sleep": true,
}

// TestTheNodeReadsTimeOnlyThroughItsClock: the code (not the tests) of
// package node and of the packages of the node's and the replication's
// working parts reads the time and waits only through an injected
// internal/clock.Clock (Node.clock, Volume.clock, each part's
// Config.Clock, backing.OpenOptions.Clock), so that a test can run it on
// a clock.Fake; nothing calls time.Now, time.Sleep, time.After and the
// like directly (issue 28, item 5). internal/clock's Real is the one
// place the real clock is read.
func TestTheNodeReadsTimeOnlyThroughItsClock(t *testing.T) {
	dirs := []string{".", "cluster", "session", "applier", "applier/apply", "control", "failover", "volstate", "volloop", "writepath", "placement", "../multipath", "../multipath/faultpath", "../backing"}
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			checked++
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			timePkg := ""
			for _, imp := range f.Imports {
				if path, _ := strconv.Unquote(imp.Path.Value); path == "time" {
					timePkg = "time"
					if imp.Name != nil {
						timePkg = imp.Name.Name
					}
				}
			}
			if timePkg == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == timePkg && wallClockReads[sel.Sel.Name] {
					t.Errorf("%s: time.%s: read the time through the injected clock (Node.clock, Volume.clock, the part's Config.Clock)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
	if checked < 80 {
		t.Fatalf("only %d files checked in %v: update this test", checked, dirs)
	}
}

// TestAVolumeKeepsTimeOnTheNodesClock: a node made with a clock reads the
// time from it, for its volumes too: on a clock.Fake that does not move,
// a volume's requests take no time by its latency histograms, and its last
// write began at the fake's time.
func TestAVolumeKeepsTimeOnTheNodesClock(t *testing.T) {
	c := newTestCluster(t, 8<<20)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c.opts["alpha"] = Options{clock: clock.NewFake(start)}
	c.start("alpha")
	v := c.vol("alpha")
	ctx := context.Background()
	if err := v.WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.ReadAt(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	for _, op := range []ioOp{opWrite, opFlush, opRead} {
		var n uint64
		for i := range v.counters.latency[op].counts {
			n += v.counters.latency[op].counts[i].Load()
		}
		if sum := time.Duration(v.counters.latency[op].sumNanos.Load()); n != 1 || sum != 0 {
			t.Errorf("%s: %d requests took %v in all, want one that took no time on a clock that does not move", ioOpNames[op], n, sum)
		}
	}
	if got := time.Unix(0, v.counters.lastWrite.Load()); !got.Equal(start) {
		t.Errorf("the last write began at %v, want the fake clock's %v", got, start)
	}
}

// TestAMultipathDiskKeepsTimeOnTheNodesClock: the node opens a multipath
// disk on its own clock (backing.OpenOptions.Clock), so that the path
// rules run on it too: on a clock.Fake moved an hour on, each path of
// alpha's disk has been in its state exactly that hour.
func TestAMultipathDiskKeepsTimeOnTheNodesClock(t *testing.T) {
	c, _ := multipathCluster(t, 4<<20)
	fake := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	o := c.opts["alpha"]
	o.clock = fake
	c.opts["alpha"] = o
	c.start("alpha")
	mp := c.vol("alpha").mp
	if mp == nil {
		t.Fatal("alpha's disk of two paths opened without a multipath device")
	}
	fake.Advance(time.Hour)
	for _, ps := range mp.Paths() {
		if ps.SinceChange != time.Hour {
			t.Errorf("path %s: in its state %v after the node's fake clock moved an hour on, want exactly an hour: the disk does not keep the node's clock", ps.Name, ps.SinceChange)
		}
	}
}
