//go:build unix

package web

import (
	"bytes"
	"syscall"
	"testing"
	"time"
)

// TestPageRendersFiftyVolumesQuickly bounds the benchmark's page by the
// CPU time it costs (wall time depends on what else the machine runs):
// under 100 ms, or 1 s with the race detector's instrumentation.
func TestPageRendersFiftyVolumesQuickly(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	in := bigInput()
	var buf bytes.Buffer
	render := func() {
		buf.Reset()
		if err := renderPage(&buf, buildPage(in)); err != nil {
			t.Fatal(err)
		}
	}
	render() // warm up
	const pages = 10
	began := cpuTime(t)
	for range pages {
		render()
	}
	perPage := (cpuTime(t) - began) / pages
	limit := 100 * time.Millisecond
	if raceEnabled {
		limit = time.Second
	}
	t.Logf("50 volumes × 5 nodes: %s of CPU per page (%d KiB); limit %s", perPage.Round(time.Microsecond), buf.Len()>>10, limit)
	if perPage > limit {
		t.Errorf("rendering the page took %s of CPU, want under %s", perPage, limit)
	}
	p := parsePage(t, buf.String())
	if !p.has("replica-vol49-node4-disk") || !p.has("path-vol49-node4-p1-state") {
		t.Errorf("the big page lacks its last volume's rows")
	}
}

// cpuTime is the CPU time the process used so far (every thread: the
// garbage collector's work counts too).
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
