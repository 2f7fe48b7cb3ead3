package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2EAThousandVolumesOnTwoNodesAreUpToDateWithinAMinute: two replnode
// processes serving 1,000 volumes of 16 MiB each (issue 19's idle setup:
// sparse files, internal metadata, protocol C, alpha primary of all) bring
// every volume UpToDate, Connected and in sync on both nodes within 60 s
// of their start; then the idle primary's node costs what a node with one
// volume does (DESIGN.md §5: liveness and leases belong to nodes, not
// volumes).
//
// What it asserts is a count of wakeups, not CPU time: the voluntary
// context switches of all of alpha's threads (each a sleep that ended in
// a wakeup) over idleWindow, at most idleWakeupsPerSecond in one of
// idleWindows windows. A loop per volume that wakes once a second (a
// ticker, a poll of the disk or the peer) costs 1,000 wakeups a second,
// however little CPU each takes (a few microseconds: under 1% of a core,
// which a CPU bound on a shared 2-core machine could not tell from
// noise); an idle node wakes far less than that (raft, gossip and the
// pair's heartbeat are per node). And alpha's RSS at most idleRSSMiB, a
// few times what the node holds (make bench measured 204 MiB): one MiB
// more per volume fails it. make bench's idle phase (cmd/replbench
// idle.go) reports the CPU share and RSS over a longer window.
func TestE2EAThousandVolumesOnTwoNodesAreUpToDateWithinAMinute(t *testing.T) {
	e2e(t)
	const volumes = 1000
	c := newProcClusterN(t, clusterOpts{Volumes: volumes, Size: 16 << 20})
	start := time.Now()
	// The minute is the bound, the start of 1,000 volumes included: the
	// nodes may take any part of it to listen (under load, over 30 s).
	c.startAllWithin(60 * time.Second)
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
	// A node that just brought 1,000 volumes in sync may still be
	// settling (on a loaded machine: the runtime returning the memory of
	// the start, a stream that timed out reconnecting), which passes; a
	// cost per volume (a ticker, a poll) is in every window. So the test
	// watches up to idleWindows windows and wants one within the bound.
	var wakeups float64
	for w := 1; w <= idleWindows; w++ {
		logFrom := c.logSize("alpha")
		ticks, switches := procTicks(t, pid), contextSwitches(t, pid)
		began := time.Now()
		// The window is the measurement, not a wait for a state.
		time.Sleep(idleWindow)
		took := time.Since(began).Seconds()
		cpu := float64(procTicks(t, pid)-ticks) / 100 / took * 100
		wakeups = float64(contextSwitches(t, pid)-switches) / took
		t.Logf("idle primary alpha with %d volumes, window %d of %.1f s: %.0f wakeups/s (voluntary context switches of its threads), %.1f%% of a core",
			volumes, w, took, wakeups, cpu)
		if wakeups <= idleWakeupsPerSecond {
			break
		}
		t.Logf("alpha logged in that window: %s", c.logSummarySince("alpha", logFrom))
	}
	rss := floodRSS(t, pid) >> 20 // after the windows: the heap as an idle node keeps it
	t.Logf("alpha's RSS: %d MiB", rss)
	if wakeups > idleWakeupsPerSecond {
		t.Errorf("idle alpha with %d volumes woke %.0f times a second in each of %d windows, want at most %d in one: does something run per volume (a ticker, a poll)?",
			volumes, wakeups, idleWindows, idleWakeupsPerSecond)
	}
	if rss > idleRSSMiB {
		t.Errorf("idle alpha with %d volumes holds %d MiB, want at most %d MiB", volumes, rss, idleRSSMiB)
	}
}

const (
	// idleWindow is how long the idle node is watched at a time, and
	// idleWindows how many times at most.
	idleWindow  = 5 * time.Second
	idleWindows = 3
	// idleWakeupsPerSecond bounds an idle node's wakeups: 40% of what one
	// wakeup a second per volume costs alone, several times what an idle
	// node with 1,000 volumes woke here (27 a second).
	idleWakeupsPerSecond = 400
	// idleRSSMiB bounds its resident memory.
	idleRSSMiB = 600
)

// contextSwitches is the sum of the voluntary context switches of all
// of a process's threads (/proc/PID/task/*/status): how often it slept
// and woke. Involuntary ones (preemption) count how busy the machine is,
// not the process, and are left out.
func contextSwitches(t *testing.T, pid int) int64 {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the threads of %d: %v", pid, err)
	}
	var sum int64
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.Lines(string(b)) {
			name, value, ok := strings.Cut(line, ":")
			if !ok || name != "voluntary_ctxt_switches" {
				continue
			}
			v, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			sum += v
		}
	}
	return sum
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
