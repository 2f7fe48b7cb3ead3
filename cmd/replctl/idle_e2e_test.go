package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2EAThousandVolumesOnTwoNodesAreUpToDateWithinAMinute: two replnode
// processes serving 1,000 volumes of 16 MiB each (issue 19's idle setup:
// sparse files, internal metadata, protocol C, alpha primary of all) bring
// every volume UpToDate, Connected and in sync on both nodes within 60 s
// of their start. It logs what the idle primary's node then costs (CPU
// over 5 s, RSS); make bench reports those figures over a longer window.
func TestE2EAThousandVolumesOnTwoNodesAreUpToDateWithinAMinute(t *testing.T) {
	e2e(t)
	const volumes = 1000
	c := newProcClusterN(t, clusterOpts{Volumes: volumes, Size: 16 << 20})
	start := time.Now()
	c.startAll()
	last := -1
	var n int
	var err error
	if !within(time.Until(start.Add(60*time.Second)), time.Second, func() bool {
		n, err = c.volumesInSync("alpha")
		if n != last {
			t.Logf("%d of %d volumes UpToDate and in sync after %s", n, volumes, time.Since(start).Round(100*time.Millisecond))
			last = n
		}
		return n == volumes
	}) {
		t.Fatalf("%d of %d volumes UpToDate and in sync 60 s after the start (last status error: %v)", n, volumes, err)
	}
	pid := c.procs["alpha"].Process.Pid
	before := procTicks(t, pid)
	window := 5 * time.Second
	time.Sleep(window)
	cpu := float64(procTicks(t, pid)-before) / 100 / window.Seconds() * 100
	t.Logf("idle primary alpha with %d volumes: %.1f%% of a core over %s, RSS %d MiB", volumes, cpu, window, floodRSS(t, pid)>>20)
}

// volumesInSync counts the volumes node's status shows in sync.
func (c *procCluster) volumesInSync(node string) (int, error) {
	s, err := c.clusterStatus(node)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range s.Volumes {
		if s.Volumes[i].inSync() {
			n++
		}
	}
	return n, nil
}

// procTicks is a process's user and system time in clock ticks (1/100 s).
func procTicks(t *testing.T, pid int) int64 {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	var sum int64
	for _, s := range f[11:13] { // utime, stime: fields 14 and 15
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}
