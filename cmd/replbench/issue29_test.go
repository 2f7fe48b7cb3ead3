package main

import (
	"fmt"
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
		{"8K randread", "", statusNA}, // no checksums-off row
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
		if !strings.HasPrefix(g.Workload, w.prefix) || value != w.value || g.Status != w.status || g.Unit != unitRatioNoSums {
			t.Errorf("goal %d = %s %q %s %s; want %s %q %s", i, g.Workload, value, g.Status, g.Unit, w.prefix, w.value, w.status)
		}
	}
	if got[2].Note != notMeasured {
		t.Errorf("an unmeasured goal's note is %q, want %q", got[2].Note, notMeasured)
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
