package main

// What each server process spends per IO over a fio run (issue 31): its
// CPU time (utime + stime of /proc/PID/stat, every thread, also the ones
// that ended), its system calls and its context switches (`perf stat -e
// raw_syscalls:sys_enter,context-switches -p PID`, which also counts the
// threads the process starts during the run, as nbdkit does for every
// connection). Without perf, or where it cannot count (not root and
// perf_event_paranoid > -1, no tracepoint), syscalls are not measured and
// every table says so: no figure is made up; the context switches are
// then voluntary + nonvoluntary of /proc/PID/task/*/status, summed over
// the threads alive at the start and at the end of the run, which misses
// a thread that starts and ends in between (nbdkit's per connection; Go's
// runtime rarely ends one). perf's counting costs each system call of the process a little;
// the CPU figures include it, for every target alike.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// syscallEvent is the tracepoint perf counts: every system call entered;
// switchEvent is every context switch.
const (
	syscallEvent = "raw_syscalls:sys_enter"
	switchEvent  = "context-switches"
)

// procCost is what one server process spent per IO over a run, or the
// median of it over the rounds.
type procCost struct {
	Process          string  `json:"process"`
	CPUPerIO         float64 `json:"cpu_us_per_io"`
	CtxSwitchesPerIO float64 `json:"ctx_switches_per_io"`
	// SyscallsPerIO is nil where system calls were not measured
	// (report.Syscalls says why).
	SyscallsPerIO *float64 `json:"syscalls_per_io,omitempty"`
}

// parseCtxSwitches reads voluntary_ctxt_switches plus
// nonvoluntary_ctxt_switches of a /proc/PID/task/TID/status.
func parseCtxSwitches(status string) (int64, error) {
	var sum int64
	found := 0
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status: %s: %w", k, err)
		}
		sum += n
		found++
	}
	if found != 2 {
		return 0, errors.New("status: no voluntary_ctxt_switches and nonvoluntary_ctxt_switches")
	}
	return sum, nil
}

// ctxSwitches sums the context switches of every thread of pid.
func ctxSwitches(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("pid %d: no threads in /proc", pid)
	}
	var sum int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // the thread ended meanwhile
				continue
			}
			return 0, err
		}
		n, err := parseCtxSwitches(string(data))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		sum += n
	}
	return sum, nil
}

// parsePerfCount reads the count of event from `perf stat -x,` output
// (CSV: count,unit,event,...); false where perf did not count it
// ("<not counted>", "<not supported>") or printed no line of it.
func parsePerfCount(out, event string) (int64, bool) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(l), ",")
		if len(f) < 3 || f[2] != event {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// perfSyscalls says how system calls are counted: "" when they can be
// (perf counts the tracepoint of a process of ours), else why not.
func perfSyscalls(ctx context.Context) string {
	if _, err := exec.LookPath("perf"); err != nil {
		return "perf not found (Debian package linux-perf; make deps installs it)"
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "perf", "stat", "-x,", "-e", syscallEvent+","+switchEvent, "--", "true").CombinedOutput()
	n, ok := parsePerfCount(string(out), syscallEvent)
	if _, ok2 := parsePerfCount(string(out), switchEvent); err != nil || !ok || !ok2 || n <= 0 {
		return fmt.Sprintf("perf stat -e %s,%s does not count here (%v): %s", syscallEvent, switchEvent, err, firstOf(string(out)))
	}
	return ""
}

// firstOf is the first non-empty line of s.
func firstOf(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// syscallCounter is one `perf stat -p PID` counting a process's system
// calls and context switches until stopped.
type syscallCounter struct {
	cmd *exec.Cmd
	out string
}

// countSyscalls starts counting pid's system calls; nil when the bench
// does not count them or perf does not start.
func (b *bench) countSyscalls(pid int) *syscallCounter {
	if b.syscallsWhy != "" {
		return nil
	}
	out := filepath.Join(b.tmp, fmt.Sprintf("perf-%d.csv", pid))
	cmd := exec.Command("perf", "stat", "-x,", "-o", out, "-e", syscallEvent+","+switchEvent, "-p", strconv.Itoa(pid))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf("perf stat -p %d: %v: system calls not counted in this run", pid, err)
		return nil
	}
	return &syscallCounter{cmd: cmd, out: out}
}

// perfCount is what a syscallCounter counted; ok false when it did not.
type perfCount struct {
	syscalls, switches int64
	ok                 bool
}

// stop ends the count (SIGINT: perf prints its counts and exits) and
// returns it.
func (s *syscallCounter) stop() perfCount {
	if s == nil {
		return perfCount{}
	}
	defer os.Remove(s.out)
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
		return perfCount{}
	}
	data, err := os.ReadFile(s.out)
	if err != nil {
		return perfCount{}
	}
	sc, ok1 := parsePerfCount(string(data), syscallEvent)
	sw, ok2 := parsePerfCount(string(data), switchEvent)
	return perfCount{syscalls: sc, switches: sw, ok: ok1 && ok2}
}

// procSample is what the counters of one server process read at one
// moment.
type procSample struct {
	ticks, switches int64
	ok              bool
}

func sampleProc(p *proc) procSample {
	pid := p.cmd.Process.Pid
	ticks, err1 := readProc(pid, "stat", parseProcStatTicks)
	sw, err2 := ctxSwitches(pid)
	return procSample{ticks: ticks, switches: sw, ok: err1 == nil && err2 == nil}
}

// costOf is a process's cost per IO over a run of ios IOs, from its
// samples before and after and what perf counted (where it did, its
// context switches are perf's: /proc's miss the threads that ended).
func costOf(name string, before, after procSample, perf perfCount, ios float64) (procCost, bool) {
	if !before.ok || !after.ok || ios <= 0 {
		return procCost{}, false
	}
	c := procCost{Process: name,
		CPUPerIO:         float64(after.ticks-before.ticks) / userHZ * 1e6 / ios,
		CtxSwitchesPerIO: float64(after.switches-before.switches) / ios}
	if perf.ok {
		c.SyscallsPerIO = fptr(float64(perf.syscalls) / ios)
		c.CtxSwitchesPerIO = float64(perf.switches) / ios
	}
	return c, true
}

// medianCosts is the median, per process, of the runs' costs (every run
// names the same processes in the same order); syscalls only where every
// run counted them.
func medianCosts(runs [][]procCost) []procCost {
	if len(runs) == 0 {
		return nil
	}
	var out []procCost
	for i, p := range runs[0] {
		var cpu, sw, sc []float64
		for _, r := range runs {
			if i >= len(r) || r[i].Process != p.Process {
				return nil
			}
			cpu = append(cpu, r[i].CPUPerIO)
			sw = append(sw, r[i].CtxSwitchesPerIO)
			if r[i].SyscallsPerIO != nil {
				sc = append(sc, *r[i].SyscallsPerIO)
			}
		}
		c := procCost{Process: p.Process, CPUPerIO: median(cpu), CtxSwitchesPerIO: median(sw)}
		if len(sc) == len(runs) {
			c.SyscallsPerIO = fptr(median(sc))
		}
		out = append(out, c)
	}
	return out
}

// totalCost is the sum over processes; its syscalls only where every
// process's were counted.
func totalCost(ps []procCost) procCost {
	t := procCost{Process: "total"}
	var sc float64
	all := len(ps) > 0
	for _, p := range ps {
		t.CPUPerIO += p.CPUPerIO
		t.CtxSwitchesPerIO += p.CtxSwitchesPerIO
		if p.SyscallsPerIO == nil {
			all = false
		} else {
			sc += *p.SyscallsPerIO
		}
	}
	if all {
		t.SyscallsPerIO = &sc
	}
	return t
}

// printCosts prints, per workload and target, what each server process
// spent per IO, and the sum where there are several.
func printCosts(w io.Writer, rep *report) {
	measured := false
	for _, r := range rep.Rows {
		for _, c := range r.Targets {
			measured = measured || len(c.Processes) > 0
		}
	}
	if !measured {
		return
	}
	how, switches := "perf stat -e "+syscallEvent, "perf stat -e "+switchEvent
	if rep.Syscalls != "" {
		how, switches = "NOT MEASURED: "+rep.Syscalls, "/proc/PID/task/*/status, threads that ended during a run not counted"
	}
	fmt.Fprintf(w, "server cost per IO, each server process (median per cell): CPU us (utime+stime), context switches (%s),\n", switches)
	fmt.Fprintf(w, "  syscalls (%s):\n", how)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "workload\ttarget\tprocess\tCPU us\tsyscalls\tctx switches\t\n")
	for _, r := range rep.Rows {
		first := true
		for _, t := range allTargets {
			c, ok := r.Targets[t]
			if !ok || len(c.Processes) == 0 {
				continue
			}
			rows := c.Processes
			if len(rows) > 1 {
				rows = append(append([]procCost(nil), rows...), totalCost(rows))
			}
			for i, p := range rows {
				label, name := "", ""
				if first {
					label = r.Label
					first = false
				}
				if i == 0 {
					name = t
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", label, name, p.Process, fmtNum(p.CPUPerIO), fmtOpt(p.SyscallsPerIO), fmtNum(p.CtxSwitchesPerIO))
			}
		}
	}
	tw.Flush()
}

// fmtOpt prints v, or n/a where it was not measured.
func fmtOpt(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmtNum(*v)
}
