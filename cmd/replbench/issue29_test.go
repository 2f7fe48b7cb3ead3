package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestIssue29GoalsCompareChecksumsOnWithOffInTheSameRun(t *testing.T) {
	rep := &report{Rows: []*row{
		{Workload: "randwrite-8k", Unit: "IOPS", Targets: map[string]*cell{
			tReplvolNodes: {Median: 9000}, tReplvolNodesNoSums: {Median: 10000}, tNbdkit: {Median: 30000},
		}},
		{Workload: "seqwrite-1m", Unit: "MB/s", Targets: map[string]*cell{
			tReplvolNodes: {Median: 450}, tReplvolNodesNoSums: {Median: 500},
		}},
		{Workload: "randread-8k", Unit: "IOPS", Targets: map[string]*cell{
			tReplvolNodes: {Median: 20000},
		}},
	}}
	got := issue29Goals(rep)
	want := []struct {
		prefix string
		value  string
		status string
	}{
		{"8K randwrite", "0.90", statusPass}, // the bound is inclusive
		{"1M seqwrite", "0.90", statusMiss},
		{"8K randread", "", statusNA},        // no checksums-off row
		{"scrub at full rate", "", statusNA}, // no scrub phase
	}
	if len(got) != len(want) {
		t.Fatalf("%d goals, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		value := ""
		if g.Got != nil {
			value = fmt.Sprintf("%.2f", *g.Got)
		}
		unit := unitRatioNoSums
		if i == 3 {
			unit = unitRatioRead
		}
		if !strings.HasPrefix(g.Workload, w.prefix) || value != w.value || g.Status != w.status || g.Unit != unit {
			t.Errorf("goal %d = %s %q %s %s; want %s %q %s", i, g.Workload, value, g.Status, g.Unit, w.prefix, w.value, w.status)
		}
	}
	if got[2].Note != notMeasured {
		t.Errorf("an unmeasured goal's note is %q, want %q", got[2].Note, notMeasured)
	}

	// The scrub phase: its medians' ratio against the plain read.
	rep.Scrub = &scrubReport{Scrub: mkCell([]float64{700, 800, 900}), Read: mkCell([]float64{1000, 1000, 1100})}
	rep.Scrub.Ratio = ratioOf(rep.Scrub.Scrub, rep.Scrub.Read)
	if g := issue29Goals(rep)[3]; g.Got == nil || fmt.Sprintf("%.2f", *g.Got) != "0.80" || g.Status != statusPass || g.Note != "scrub 800, read 1000 MB/s" {
		t.Errorf("the scrub goal: %+v; want 0.80 (800 over 1000 MB/s), PASS", g)
	}
	rep.Scrub = &scrubReport{Error: "replctl scrub: exit status 1"}
	if g := issue29Goals(rep)[3]; g.Got != nil || g.Status != statusNA || g.Note != rep.Scrub.Error {
		t.Errorf("a scrub phase that failed: %+v; want n/a with its error", g)
	}

	rep.Issue29 = got
	var b strings.Builder
	printIssue29(&b, rep.Issue29)
	for _, want := range []string{"issue 29 goals", "replvol-nodes-nosums", "on 9000, off 10000 IOPS", ">= 0.9"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestParseWorkloads: --workloads takes the workloads by name, each once,
// in the order given, and refuses a name it does not know (so a typo does
// not measure nothing) and a list that names none.
func TestParseWorkloads(t *testing.T) {
	got, err := parseWorkloads("seqwrite-1m, randwrite-8k-qd1,seqwrite-1m")
	if err != nil || !slices.Equal(got, []string{"seqwrite-1m", "randwrite-8k-qd1"}) {
		t.Fatalf("parseWorkloads: %q, %v", got, err)
	}
	if got, err := parseWorkloads(strings.Join(workloadNames(), ",")); err != nil || len(got) != len(workloads)+1 {
		t.Fatalf("the default: %q, %v", got, err)
	}
	for _, bad := range []string{"seqwrite-2m", "", " , "} {
		if got, err := parseWorkloads(bad); err == nil {
			t.Errorf("parseWorkloads(%q) = %q, want an error", bad, got)
		}
	}
}
