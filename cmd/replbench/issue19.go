package main

// Issue 19's targets, each as a row: what this run measured, the target,
// the limit of this machine the issue measured beside it (from floors of
// loopback TCP and cached pwrite on one 2-core box: protocol C reaches
// about 0.7x nbdkit on 8K writes and 0.37-0.4x on 1M writes; local-only
// about 0.9x on 1M writes), and PASS, MISS or n/a (not measured, or not
// the target's setup).

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// issueTarget is one row.
type issueTarget struct {
	Workload string   `json:"workload"`
	Got      *float64 `json:"got"` // nil: not measured
	Unit     string   `json:"unit"`
	Target   string   `json:"target"`
	Limit    string   `json:"limit"` // the machine's limit, "" where the issue states none
	Status   string   `json:"status"`
	Note     string   `json:"note,omitempty"`
}

// failoverKillsWanted is how many kills the failover target counts over.
const failoverKillsWanted = 10

// idleVolumesWanted is how many volumes the idle targets are about.
const idleVolumesWanted = 1000

// limit8K and the others are the issue's limits of this machine.
const (
	limit8K       = "~0.7x"
	limit1M       = "0.37-0.4x"
	limitLocal1M  = "~0.9x"
	unitRatio     = "x nbdkit"
	unitSeconds   = "s"
	unitCorePct   = "% of a core"
	unitMiB       = "MiB"
	statusNA      = "n/a"
	statusPass    = "PASS"
	statusMiss    = "MISS"
	atLeast       = ">="
	atMost        = "<="
	notMeasured   = "not measured in this run"
	notLikeForLik = "--page-cache keep: not like for like"
)

// judge is PASS when got meets the bound (cmp atLeast or atMost), MISS
// when it does not, n/a when nothing was measured.
func judge(got *float64, cmp string, bound float64) string {
	if got == nil {
		return statusNA
	}
	ok := *got >= bound
	if cmp == atMost {
		ok = *got <= bound
	}
	if ok {
		return statusPass
	}
	return statusMiss
}

func fptr(v float64) *float64 { return &v }

// issueTargets evaluates issue 19's targets against a report.
func issueTargets(rep *report) []issueTarget {
	var out []issueTarget
	// add appends a row and returns its index (out grows: no pointers).
	add := func(workload string, got *float64, unit, cmp string, bound float64, limit, note string) int {
		t := issueTarget{Workload: workload, Got: got, Unit: unit, Target: cmp + " " + strconv.FormatFloat(bound, 'f', -1, 64),
			Limit: limit, Status: judge(got, cmp, bound), Note: note}
		if got == nil {
			t.Note = notMeasured
		}
		out = append(out, t)
		return len(out) - 1
	}
	mainRatio := func(w string) *float64 {
		for _, r := range rep.Rows {
			if r.Workload == w {
				if v, ok := r.Ratios[tReplvol+"/"+tNbdkit]; ok {
					return fptr(v)
				}
			}
		}
		return nil
	}
	cacheNote := ""
	if rep.PageCacheMode == cacheKeep {
		cacheNote = notLikeForLik
	}
	// cpuNote says what each IO cost the servers in CPU, where the rows
	// measured it: on two cores shared by the client and the servers,
	// the throughput ratio follows the inverse of the CPU ratio.
	withNote := func(note, more string) string {
		if note != "" && more != "" {
			return note + "; " + more
		}
		return note + more
	}
	cpuNoteOf := func(w string) string {
		for _, r := range rep.Rows {
			if r.Workload == w {
				return withNote(cacheNote, cpuNote(r.Targets[tReplvol], r.Targets[tNbdkit]))
			}
		}
		return cacheNote
	}
	add("8K randwrite qd16, protocol C, like for like", mainRatio("randwrite-8k"), unitRatio, atLeast, 0.6, limit8K, cpuNoteOf("randwrite-8k"))
	var fresh *float64
	freshNote := ""
	if rep.Fresh != nil {
		fresh, freshNote = rep.Fresh.Ratio, cpuNote(rep.Fresh.Replvol, rep.Fresh.Nbdkit)
	}
	add("8K randwrite qd16 into a fresh sparse volume", fresh, unitRatio, atLeast, 0.55, limit8K, freshNote)
	add("1M seqwrite qd4, protocol C", mainRatio("seqwrite-1m"), unitRatio, atLeast, 0.35, limit1M, cpuNoteOf("seqwrite-1m"))
	var local *float64
	localNote := cacheNote
	if rep.Protocols != nil {
		var lo, nk *protocolRow
		for _, r := range rep.Protocols.Rows {
			switch r.Name {
			case "local-only":
				lo, local = r, r.SeqWriteRatio
			case tNbdkit:
				nk = r
			}
		}
		if lo != nil && nk != nil {
			localNote = withNote(cacheNote, cpuNote(lo.SeqWrite, nk.SeqWrite))
		}
	}
	add("1M seqwrite qd4, local-only", local, unitRatio, atLeast, 0.85, limitLocal1M, localNote)

	var median, worst *float64
	killsNote := ""
	if f := rep.Failover; f != nil && f.Failover != nil && len(f.Failover.Runs) > 0 {
		median, worst = fptr(f.Failover.MedianS), fptr(f.Failover.WorstS)
		if n := len(f.Failover.Runs); n < failoverKillsWanted {
			killsNote = fmt.Sprintf("%d kills, the target counts >= %d", n, failoverKillsWanted)
		}
	}
	for _, i := range []int{
		add("failover median (kill -9 of the primary -> first write acknowledged)", median, unitSeconds, atMost, 1, "", killsNote),
		add("failover worst", worst, unitSeconds, atMost, 1.5, "", killsNote),
	} {
		if killsNote != "" {
			out[i].Status = statusNA
		}
	}

	var syncS, cpu, rss *float64
	idleNote := ""
	if r := rep.Idle; r != nil {
		if r.SyncSeconds > 0 { // the wait ran (to the bound when not all made it)
			syncS = fptr(r.SyncSeconds)
		}
		if p := r.primary(); p != nil {
			cpu, rss = fptr(p.CPUPct), fptr(p.RSSMiB)
		}
		switch {
		case r.Volumes != idleVolumesWanted:
			idleNote = fmt.Sprintf("%d volumes, the target is about %d", r.Volumes, idleVolumesWanted)
		case !r.allUpToDate():
			idleNote = fmt.Sprintf("only %d of %d volumes UpToDate within %s", r.UpToDate, r.Volumes, idleSyncTimeout)
		}
	}
	syncRow := add(fmt.Sprintf("%d idle volumes of 16 MiB: all UpToDate", idleVolumesWanted), syncS, unitSeconds, atMost, idleSyncGoal.Seconds(), "", idleNote)
	idleRows := []int{
		add(fmt.Sprintf("%d idle volumes: CPU of the primary's node", idleVolumesWanted), cpu, unitCorePct, atMost, 2, "", idleNote),
		add(fmt.Sprintf("%d idle volumes: RSS of the primary's node", idleVolumesWanted), rss, unitMiB, atMost, 256, "", idleNote),
	}
	if rep.Idle != nil && rep.Idle.Volumes != idleVolumesWanted {
		out[syncRow].Status = statusNA
		for _, i := range idleRows {
			out[i].Status = statusNA
		}
	} else if rep.Idle != nil && !rep.Idle.allUpToDate() {
		out[syncRow].Status = statusMiss // they did not all make it
		for _, i := range idleRows {
			out[i].Status = statusNA // not idle
		}
	}
	return out
}

// fmtTargetValue prints a row's measured value in its unit.
func fmtTargetValue(t issueTarget) string {
	if t.Got == nil {
		return "-"
	}
	switch t.Unit {
	case unitRatio, unitRatioFloor, unitRatioTwo:
		return fmt.Sprintf("%.2fx", *t.Got)
	case unitSeconds:
		return fmt.Sprintf("%.2f s", *t.Got)
	case unitCorePct:
		return fmt.Sprintf("%.1f%%", *t.Got)
	case unitMiB:
		return fmt.Sprintf("%.0f MiB", *t.Got)
	}
	return fmtNum(*t.Got)
}

// fmtTargetBound prints a row's target in its unit.
func fmtTargetBound(t issueTarget) string {
	switch t.Unit {
	case unitRatio, unitRatioFloor, unitRatioTwo:
		return t.Target + "x"
	case unitSeconds:
		return t.Target + " s"
	case unitCorePct:
		return t.Target + "%"
	case unitMiB:
		return t.Target + " MiB"
	}
	return t.Target
}

func printIssueTargets(w io.Writer, ts []issueTarget) {
	fmt.Fprintln(w, "issue 19 targets (ratios to nbdkit; limit: the measured limit of a 2-core box, from the issue):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  workload\tmeasured\ttarget\tlimit\tstatus\tnote\n")
	for _, t := range ts {
		limit := t.Limit
		if limit == "" {
			limit = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", t.Workload, fmtTargetValue(t), fmtTargetBound(t), limit, t.Status, t.Note)
	}
	tw.Flush()
}
