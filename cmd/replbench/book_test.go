package main

// The pure parts of the book: issue 19's targets judged from a report, the
// markdown and the SVG rendered from it, and the /proc parsers of the idle
// phase. No process is started and nothing listens.

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sampleReport is a report as a full run leaves it: like-for-like page
// cache, every phase measured, 1,000 idle volumes all UpToDate.
func sampleReport() *report {
	c := func(v float64) *cell { return &cell{Median: v, Samples: []float64{v}} }
	rep := &report{
		Date:          "2026-12-01T22:00:00Z",
		Rounds:        3,
		Runtime:       "6s",
		Machine:       machine{CPU: "Test CPU @ 2.0GHz", Cores: 2, Kernel: "6.8.0", Go: "go1.27.3"},
		Versions:      map[string]string{tNbdkit: "nbdkit 1.36 file plugin"},
		PageCacheMode: cacheDrop,
		PageCache:     pageCacheHow(cacheDrop),
		Rows: []*row{
			{Workload: "randwrite-8k", Label: "8K randwrite qd16", Unit: "IOPS",
				Targets: map[string]*cell{tReplvol: c(9000), tReplvolExt: c(9500), tNbdkit: c(20000)},
				Ratios:  map[string]float64{"replvol/nbdkit": 0.45, "replvol/replvol-ext": 0.95}},
			{Workload: "seqwrite-1m", Label: "1M seqwrite qd4", Unit: "MB/s",
				Targets: map[string]*cell{tReplvol: c(300), tReplvolExt: c(310), tNbdkit: c(800)},
				Ratios:  map[string]float64{"replvol/nbdkit": 0.375}},
		},
		Protocols: &protocolReport{Rows: []*protocolRow{
			{Name: "nbdkit", RandWrite: c(20000), SeqWrite: c(800)},
			{Name: "local-only", RandWrite: c(15000), SeqWrite: c(600), SeqWriteRatio: fptr(0.75), LatP50: c(90), LatP99: c(200)},
			{Name: "C", RandWrite: c(9000), SeqWrite: c(300), LatP50: c(180), LatP99: c(400)},
		}},
		Fresh:  &freshReport{Replvol: c(5000), Nbdkit: c(10000), Ratio: fptr(0.5)},
		Resync: &resyncResult{Bytes: 1 << 30, ResyncMBs: 400, CopyMBs: 500, Ratio: 0.8, Status: "PASS"},
		Failover: &failoverReport{Runs: 10, Failover: &phaseTiming{MedianS: 0.9, WorstS: 1.7,
			Runs: []runTiming{{From: "alpha", To: "beta", Seconds: 0.8}, {From: "beta", To: "alpha", Seconds: 0.9}, {From: "alpha", To: "beta", Seconds: 0.9}, {From: "beta", To: "alpha", Seconds: 0.9}, {From: "alpha", To: "beta", Seconds: 0.9},
				{From: "beta", To: "alpha", Seconds: 0.9}, {From: "alpha", To: "beta", Seconds: 0.9}, {From: "beta", To: "alpha", Seconds: 0.9}, {From: "alpha", To: "beta", Seconds: 0.9}, {From: "beta", To: "alpha", Seconds: 1.7}}}},
		Idle: &idleReport{Volumes: 1000, UpToDate: 1000, SyncSeconds: 42, WindowS: 20,
			Nodes: []idleNode{{Name: "alpha", CPUPct: 45, RSSMiB: 1145}, {Name: "beta", CPUPct: 30, RSSMiB: 900}}},
	}
	rep.Issue19 = issueTargets(rep)
	return rep
}

func targetByPrefix(t *testing.T, ts []issueTarget, prefix string) issueTarget {
	t.Helper()
	for _, x := range ts {
		if strings.HasPrefix(x.Workload, prefix) {
			return x
		}
	}
	t.Fatalf("no target %q in %+v", prefix, ts)
	return issueTarget{}
}

func TestIssueTargetsJudgeEveryRowAgainstItsBound(t *testing.T) {
	ts := sampleReport().Issue19
	for _, tc := range []struct {
		prefix, status, limit string
	}{
		{"8K randwrite qd16, protocol C", statusMiss, limit8K},        // 0.45 < 0.6
		{"8K randwrite qd16 into a fresh", statusMiss, limit8K},       // 0.5 < 0.55
		{"1M seqwrite qd4, protocol C", statusPass, limit1M},          // 0.375 >= 0.35
		{"1M seqwrite qd4, local-only", statusMiss, limitLocal1M},     // 0.75 < 0.85
		{"failover median", statusPass, ""},                           // 0.9 <= 1
		{"failover worst", statusMiss, ""},                            // 1.7 > 1.5
		{"1000 idle volumes of 16 MiB: all UpToDate", statusPass, ""}, // 42 s <= 60 s
		{"1000 idle volumes: CPU", statusMiss, ""},                    // 45% > 2%
		{"1000 idle volumes: RSS", statusMiss, ""},                    // 1145 > 256
	} {
		got := targetByPrefix(t, ts, tc.prefix)
		if got.Status != tc.status || got.Limit != tc.limit {
			t.Errorf("%s: status %s, limit %q; want %s, %q (%+v)", tc.prefix, got.Status, got.Limit, tc.status, tc.limit, got)
		}
	}
}

func TestIssueTargetsSayWhatARunDidNotMeasure(t *testing.T) {
	rep := sampleReport()
	rep.Fresh, rep.Protocols, rep.Failover, rep.Idle = nil, nil, nil, nil
	ts := issueTargets(rep)
	for _, prefix := range []string{"8K randwrite qd16 into a fresh", "1M seqwrite qd4, local-only", "failover median", "1000 idle volumes: CPU"} {
		got := targetByPrefix(t, ts, prefix)
		if got.Status != statusNA || got.Got != nil || got.Note != notMeasured {
			t.Errorf("%s: %+v, want n/a with the note %q", prefix, got, notMeasured)
		}
	}
}

func TestIssueTargetsRefuseAVerdictOutsideTheTargetsSetup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*report)
		prefix string
		status string
		note   string
	}{
		{"fewer kills than the target counts", func(r *report) {
			r.Failover.Failover = &phaseTiming{MedianS: 0.5, WorstS: 0.6, Runs: []runTiming{{From: "alpha", To: "beta", Seconds: 0.5}, {From: "beta", To: "alpha", Seconds: 0.6}}}
		}, "failover median", statusNA, "2 kills, the target counts >= 10"},
		{"fewer idle volumes than 1,000", func(r *report) { r.Idle.Volumes, r.Idle.UpToDate = 20, 20 }, "1000 idle volumes: CPU", statusNA, "20 volumes, the target is about 1000"},
		{"not every idle volume UpToDate in time", func(r *report) { r.Idle.UpToDate = 600 }, "1000 idle volumes of 16 MiB: all UpToDate", statusMiss, "only 600 of 1000 volumes UpToDate within 3m0s"},
		{"idle figures while volumes still sync", func(r *report) { r.Idle.UpToDate = 600 }, "1000 idle volumes: RSS", statusNA, "only 600 of 1000 volumes UpToDate within 3m0s"},
		{"page cache kept as the runs leave it", func(r *report) { r.PageCacheMode = cacheKeep }, "8K randwrite qd16, protocol C", statusMiss, notLikeForLik},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := sampleReport()
			tc.change(rep)
			got := targetByPrefix(t, issueTargets(rep), tc.prefix)
			if got.Status != tc.status || got.Note != tc.note {
				t.Errorf("%+v; want status %s, note %q", got, tc.status, tc.note)
			}
		})
	}
}

func TestJudgeBoundsAreInclusive(t *testing.T) {
	for _, tc := range []struct {
		name  string
		got   *float64
		cmp   string
		bound float64
		want  string
	}{
		{"ratio exactly at the target", fptr(0.6), atLeast, 0.6, statusPass},
		{"ratio just under", fptr(0.599), atLeast, 0.6, statusMiss},
		{"time exactly at the bound", fptr(1), atMost, 1, statusPass},
		{"time just over", fptr(1.001), atMost, 1, statusMiss},
		{"nothing measured", nil, atLeast, 0.6, statusNA},
	} {
		if got := judge(tc.got, tc.cmp, tc.bound); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestBookStatesDateMachinePageCacheTargetsAndEveryTable(t *testing.T) {
	rep := sampleReport()
	md := renderBook(rep, "perf.svg")
	for _, want := range []string{
		"2026-12-01T22:00:00Z",
		"| CPU | Test CPU @ 2.0GHz |", "| cores | 2 |", "| kernel | Linux 6.8.0 |", "| Go | go1.27.3 |",
		"## Page-cache state", "POSIX_FADV_DONTNEED",
		"| 8K randwrite qd16, protocol C, like for like | 0.45x | >= 0.6x | ~0.7x | MISS |",
		"| 1M seqwrite qd4, protocol C | 0.38x | >= 0.35x | 0.37-0.4x | PASS |",
		"| 1000 idle volumes: CPU of the primary's node | 45.0% | <= 2% | - | MISS |",
		"![IOPS and latency per protocol, metadata placement, resync throughput and failover times](perf.svg)",
		"multipath",
		// every table the run printed: the main table, the fresh phase, the idle phase
		"8K randwrite qd16", "fresh sparse volume:", "idle volumes:", "alpha  CPU  45.0% of one core",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the book lacks %q:\n%s", want, md)
		}
	}
}

func TestPlotIsWellFormedSVGWithABarPerFigure(t *testing.T) {
	rep := sampleReport()
	svg := renderSVG(rep)
	dec := xml.NewDecoder(strings.NewReader(svg))
	panels, bars := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == "class" && a.Value == "panel" {
					panels++
				}
				if a.Name.Local == "class" && a.Value == "bar" {
					bars++
				}
			}
		}
	}
	// 3 protocols x (8K IOPS, 1M MB/s) + 2 with latency x (p50, p99) +
	// the one IOPS workload x 2 placements (the MB/s one left out: one
	// scale a panel) + resync and raw copy + 10 failovers.
	if want := 3 + 3 + 2*2 + 2 + 2 + 10; bars != want {
		t.Errorf("%d bars, want %d", bars, want)
	}
	if panels != 6 {
		t.Errorf("%d panels, want 6", panels)
	}
	for _, want := range []string{"8K randwrite qd16 per protocol", "metadata placement", "resync throughput", "failover and switchover"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the plot lacks the panel %q", want)
		}
	}
}

func TestPlotSaysWhatARunDidNotMeasure(t *testing.T) {
	rep := &report{Date: "d"}
	svg := renderSVG(rep)
	if n := strings.Count(svg, "not measured in this run"); n != 6 {
		t.Errorf("%d empty panels say so, want 6:\n%s", n, svg)
	}
}

func TestWriteBookPutsThePlotBesideTheBook(t *testing.T) {
	dir := t.TempDir()
	book := filepath.Join(dir, "perf.md")
	if err := writeBook(book, sampleReport()); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(book)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "perf.svg")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "](perf.svg)") {
		t.Error("the book does not embed perf.svg by its name beside it")
	}
}

func TestParseProcStatTicksCountsFieldsAfterTheName(t *testing.T) {
	// A command name with a space and a parenthesis: fields are counted
	// after the last ')'. utime 1500, stime 250.
	stat := "4242 (repl node) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 250 0 0 20 0 12 0 100 0 0\n"
	got, err := parseProcStatTicks(stat)
	if err != nil || got != 1750 {
		t.Fatalf("got %d, %v; want 1750", got, err)
	}
	if _, err := parseProcStatTicks("4242 (replnode) S 1 2"); err == nil {
		t.Error("a truncated stat line parsed")
	}
}

func TestParseVmRSSInBytes(t *testing.T) {
	got, err := parseVmRSS("Name:\treplnode\nVmPeak:\t  999 kB\nVmRSS:\t  131072 kB\nThreads:\t12\n")
	if err != nil || got != 128<<20 {
		t.Fatalf("got %d, %v; want %d", got, err, 128<<20)
	}
	if _, err := parseVmRSS("Name:\tkthread\n"); err == nil {
		t.Error("a status without VmRSS parsed")
	}
}

func TestDropFileCachesLeavesNothingResident(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skip("the temporary directory is tmpfs: its pages are its storage and cannot be dropped")
	}
	file := filepath.Join(dir, "sub", "img")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := residentBytes(f); err != nil || n == 0 {
		t.Fatalf("a file just written: %d bytes resident, %v; want some", n, err)
	}
	resident, err := dropFileCaches([]string{dir, filepath.Join(dir, "gone")})
	if err != nil {
		t.Fatal(err)
	}
	if resident != 0 {
		t.Errorf("%d bytes still resident after the drop", resident)
	}
}

// TestTheBookNamesNoPathOfTheMachine: a TLS target's URI names its
// certificate directory under the run's temporary directory; the book
// says $TMPDIR instead.
func TestTheBookNamesNoPathOfTheMachine(t *testing.T) {
	in := "nbds://127.0.0.1:35517/vol0?tls-certificates=/var/tmp/x/replbench-664908031/demo/tls/nbd-client and /var/tmp/x/replbench-1/a"
	got := scrubTemp(in, "/var/tmp/x")
	want := "nbds://127.0.0.1:35517/vol0?tls-certificates=$TMPDIR/replbench-N/demo/tls/nbd-client and $TMPDIR/replbench-N/a"
	if got != want {
		t.Fatalf("scrubTemp = %q, want %q", got, want)
	}
}

// TestTheServersCPUPerIOExplainsTheWriteRatios: where a run measured the
// servers' CPU per IO, the 8K and 1M rows say what each IO cost replvol's
// nodes and nbdkit, and the book prints the table of it; a run that did
// not measure it says nothing of it.
func TestTheServersCPUPerIOExplainsTheWriteRatios(t *testing.T) {
	rep := sampleReport()
	for _, r := range rep.Rows {
		if r.Workload == "randwrite-8k" {
			r.Targets[tReplvol].CPUPerIO, r.Targets[tNbdkit].CPUPerIO = 28.8, 10.7
			r.Targets[tReplvol].ClientCPUPerIO, r.Targets[tNbdkit].ClientCPUPerIO = 4.2, 4.3
		}
	}
	rep.Issue19 = issueTargets(rep)
	got := targetByPrefix(t, rep.Issue19, "8K randwrite qd16, protocol C")
	// (10.7+4.3)/(28.8+4.2) = 15/33
	if want := "CPU per IO, server+client: replvol 28.8+4.20 us, nbdkit 10.7+4.30 us (servers 2.7x); the CPU allows 0.45x"; got.Note != want {
		t.Errorf("8K row's note %q, want %q", got.Note, want)
	}
	if got := targetByPrefix(t, rep.Issue19, "1M seqwrite qd4, protocol C"); got.Note != "" {
		t.Errorf("1M row's note %q: its CPU was not measured", got.Note)
	}
	// The fresh phase and local-only (the protocol rounds) say it too.
	rep.Fresh.Replvol.CPUPerIO, rep.Fresh.Replvol.ClientCPUPerIO = 30, 5
	rep.Fresh.Nbdkit.CPUPerIO, rep.Fresh.Nbdkit.ClientCPUPerIO = 10, 4
	for _, r := range rep.Protocols.Rows {
		switch r.Name {
		case "local-only":
			r.SeqWrite.CPUPerIO, r.SeqWrite.ClientCPUPerIO = 400, 250
		case "nbdkit":
			r.SeqWrite.CPUPerIO, r.SeqWrite.ClientCPUPerIO = 320, 250
		}
	}
	rep.Issue19 = issueTargets(rep)
	for prefix, want := range map[string]string{
		"8K randwrite qd16 into a fresh": "replvol 30.0+5.00 us, nbdkit 10.0+4.00 us (servers 3.0x); the CPU allows 0.40x",
		"1M seqwrite qd4, local-only":    "replvol 400+250 us, nbdkit 320+250 us (servers 1.2x); the CPU allows 0.88x",
	} {
		if got := targetByPrefix(t, rep.Issue19, prefix); !strings.HasSuffix(got.Note, want) {
			t.Errorf("%s: note %q, want it to end %q", prefix, got.Note, want)
		}
	}
	md := renderBook(rep, "perf.svg")
	if !strings.Contains(md, "CPU per IO, us:") || !strings.Contains(md, "28.8+4.20") || !strings.Contains(md, "2.69x  0.45x") {
		t.Errorf("the book lacks the CPU-per-IO table:\n%s", md)
	}
	if strings.Contains(renderBook(sampleReport(), "perf.svg"), "CPU per IO") {
		t.Error("a run that measured no CPU per IO prints a table of it")
	}
}

func TestCPUPerIOCountsTheIOsOfTheRampAndTheRuntime(t *testing.T) {
	// 3 s of CPU (300 ticks) over 7 s at 10,000 IOPS: 70,000 IOs, 42.9 us each.
	got := cpuPerIO(300, &fioResult{IOPS: 10000}, 7*time.Second)
	if got < 42.8 || got > 42.9 {
		t.Errorf("cpuPerIO = %.3f us, want 42.86", got)
	}
	if got := cpuPerIO(300, &fioResult{}, 7*time.Second); got != 0 {
		t.Errorf("cpuPerIO of a run without IO = %v, want 0", got)
	}
}
