package main

// Issue 31's goals, computed from the rows of the same run: replvol as
// users run it (replvol-nodes) against nbdkit, its CPU per replicated
// write against the floor's, and three replicas (replvol-nodes3) against
// its two.

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// unitRatioFloor is a ratio to the floor's figure.
const unitRatioFloor = "x floor"

// unitRatioTwo is a ratio to replvol-nodes' figure (two replicas).
const unitRatioTwo = "x 2 replicas"

// issue31Goals judges replvol-nodes against issue 31's goals; a goal
// whose figures a run did not measure is n/a.
func issue31Goals(rep *report) []issueTarget {
	rowOf := func(w string) *row {
		for _, r := range rep.Rows {
			if r.Workload == w {
				return r
			}
		}
		return nil
	}
	cells := func(w string) (nodes, nbdkit, floor *cell) {
		if r := rowOf(w); r != nil {
			return r.Targets[tReplvolNodes], r.Targets[tNbdkit], r.Targets[tFloor]
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

	// A third replica costs its peer's share only when the sends to the
	// peers overlap: replvol-nodes3's IOPS over replvol-nodes', and
	// beside it what each write cost the processes of each.
	var three *float64
	threeNote := ""
	if r := rowOf("randwrite-8k"); r != nil {
		if n3, n2 := r.Targets[tReplvolNodes3], r.Targets[tReplvolNodes]; n3 != nil && n2 != nil {
			three = ratio(n3.Median, n2.Median)
			threeNote = fmt.Sprintf("CPU per IO, every node: 3 replicas %s us, 2 replicas %s us", fmtCPU(n3), fmtCPU(n2))
		}
	}
	add("3 replicas vs 2, 8K randwrite qd16", three, unitRatioTwo, atLeast, 0.85, threeNote)

	var seq *float64
	if n, k, _ := cells("seqwrite-1m"); n != nil && k != nil {
		seq = ratio(n.Median, k.Median)
	}
	add("1M seqwrite qd4", seq, unitRatio, atLeast, 0.45, "")
	return out
}

// fmtCPU is c's server CPU per IO, or n/a where it was not measured.
func fmtCPU(c *cell) string {
	if c.CPUPerIO <= 0 {
		return "n/a"
	}
	return fmtNum(c.CPUPerIO)
}

func printIssue31(w io.Writer, ts []issueTarget) {
	printGoals(w, "issue 31 goals (replvol-nodes, this run; latency ratios: lower is better; 3 replicas: replvol-nodes3 over replvol-nodes):", ts)
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
