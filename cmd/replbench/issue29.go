package main

// Issue 29's cost goals, computed from the rows of the same run: replvol
// as users run it with checksums at rest (replvol-nodes) against the same
// layout with them off (replvol-nodes-nosums).

import (
	"fmt"
	"io"
)

// unitRatioNoSums is a ratio to replvol-nodes-nosums's figure.
const unitRatioNoSums = "x checksums off"

// unitRatioRead is a ratio to a plain sequential read of the same file.
const unitRatioRead = "x plain read"

// issue29Goals judges what checksums cost; a goal whose figures a run did
// not measure is n/a.
func issue29Goals(rep *report) []issueTarget {
	var out []issueTarget
	for _, g := range []struct {
		workload, label string
		bound           float64
	}{
		{"randwrite-8k", "8K randwrite qd16, protocol C, checksums on", 0.9},
		{"seqwrite-1m", "1M seqwrite qd4, checksums on", 0.95},
		{"randread-8k", "8K randread qd16, checksums on", 0.95},
	} {
		var got *float64
		note := notMeasured
		for _, r := range rep.Rows {
			if r.Workload != g.workload {
				continue
			}
			on, off := r.Targets[tReplvolNodes], r.Targets[tReplvolNodesNoSums]
			if on != nil && off != nil && on.Median > 0 && off.Median > 0 {
				got = fptr(on.Median / off.Median)
				note = fmt.Sprintf("on %s, off %s %s", fmtNum(on.Median), fmtNum(off.Median), r.Unit)
			}
		}
		out = append(out, issueTarget{Workload: g.label, Got: got, Unit: unitRatioNoSums,
			Target: fmt.Sprintf("%s %g", atLeast, g.bound), Status: judge(got, atLeast, g.bound), Note: note})
	}
	var scrub *float64
	note := notMeasured
	if s := rep.Scrub; s != nil && s.Ratio != nil {
		scrub, note = s.Ratio, fmt.Sprintf("scrub %s, read %s MB/s", fmtNum(s.Scrub.Median), fmtNum(s.Read.Median))
	} else if s != nil && s.Error != "" {
		note = s.Error
	}
	out = append(out, issueTarget{Workload: "scrub at full rate (replvol-nodes' alpha)", Got: scrub, Unit: unitRatioRead,
		Target: fmt.Sprintf("%s %g", atLeast, scrubGoal), Status: judge(scrub, atLeast, scrubGoal), Note: note})
	return out
}

func printIssue29(w io.Writer, ts []issueTarget) {
	printGoals(w, "issue 29 goals (what checksums at rest cost: replvol-nodes against replvol-nodes-nosums, this run):", ts)
}

// onOff names a setting that is on or off.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
