package main

// Issue 31's goals, computed from the rows of the same run: replvol as
// users run it (replvol-nodes) against nbdkit, and its CPU per
// replicated write against the floor's.

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// unitRatioFloor is a ratio to the floor's figure.
const unitRatioFloor = "x floor"

// issue31Goals judges replvol-nodes against issue 31's goals; a goal
// whose figures a run did not measure is n/a.
func issue31Goals(rep *report) []issueTarget {
	cells := func(w string) (nodes, nbdkit, floor *cell) {
		for _, r := range rep.Rows {
			if r.Workload == w {
				return r.Targets[tReplvolNodes], r.Targets[tNbdkit], r.Targets[tFloor]
			}
		}
		return nil, nil, nil
	}
	ratio := func(a, b float64) *float64 {
		if a <= 0 || b <= 0 {
			return nil
		}
		return fptr(a / b)
	}
	var out []issueTarget
	add := func(workload string, got *float64, unit, cmp string, bound float64, note string) {
		t := issueTarget{Workload: workload, Got: got, Unit: unit, Target: fmt.Sprintf("%s %g", cmp, bound),
			Status: judge(got, cmp, bound), Note: note}
		if got == nil {
			t.Note = notMeasured
		}
		out = append(out, t)
	}

	n, k, f := cells("randwrite-8k")
	var cpu *float64
	cpuNote := ""
	if n != nil && f != nil {
		cpu = ratio(n.CPUPerIO, f.CPUPerIO)
		if cpu != nil {
			cpuNote = fmt.Sprintf("replvol-nodes %s us, floor %s us", fmtNum(n.CPUPerIO), fmtNum(f.CPUPerIO))
		}
	}
	add("CPU per replicated 8K write (qd16, both nodes)", cpu, unitRatioFloor, atMost, 1.5, cpuNote)
	var iops *float64
	if n != nil && k != nil {
		iops = ratio(n.Median, k.Median)
	}
	add("8K randwrite qd16, protocol C", iops, unitRatio, atLeast, 0.6, "")

	var p50, p99 *float64
	if n, k, _ := cells(latWorkload.Name); n != nil && k != nil {
		p50, p99 = ratio(n.Median, k.Median), ratio(n.LatP99, k.LatP99)
	}
	add("8K randwrite qd1 latency p50", p50, unitRatio, atMost, 1.3, "")
	add("8K randwrite qd1 latency p99", p99, unitRatio, atMost, 1.6, "")

	var seq *float64
	if n, k, _ := cells("seqwrite-1m"); n != nil && k != nil {
		seq = ratio(n.Median, k.Median)
	}
	add("1M seqwrite qd4", seq, unitRatio, atLeast, 0.45, "")
	return out
}

func printIssue31(w io.Writer, ts []issueTarget) {
	printGoals(w, "issue 31 goals (replvol-nodes, this run; latency ratios: lower is better):", ts)
}

// printGoals prints an issue's goals under its title (nothing when the
// run measured none).
func printGoals(w io.Writer, title string, ts []issueTarget) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  goal\tmeasured\ttarget\tstatus\tnote\n")
	for _, t := range ts {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", t.Workload, fmtTargetValue(t), fmtTargetBound(t), t.Status, t.Note)
	}
	tw.Flush()
}
