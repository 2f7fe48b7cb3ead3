package main

// The book (issue 19): --book FILE writes FILE (markdown: the date, the
// machine, how the page-cache state was equalised, issue 19's targets with
// the limit of this machine beside each, and every table the run printed)
// and the plot beside it (FILE with .svg for .md), which FILE embeds. Both
// are rendered from the report alone (renderBook, renderSVG), so tests
// render them from a report they build.

import (
	"bufio"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// machine is what the book says of the machine the run measured.
type machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
	Memory string `json:"memory,omitempty"`
}

func (m machine) String() string {
	s := fmt.Sprintf("%s, %d cores, Linux %s, %s", m.CPU, m.Cores, m.Kernel, m.Go)
	if m.Memory != "" {
		s += ", " + m.Memory + " memory"
	}
	return s
}

// machineInfo reads the machine: /proc/cpuinfo's model name, the number
// of CPUs, uname's release, the Go that built replbench and MemTotal.
func machineInfo() machine {
	m := machine{CPU: "unknown CPU", Cores: runtime.NumCPU(), Kernel: "unknown", Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
					m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	return m
}

// svgPath is the plot's file beside the book.
func svgPath(book string) string {
	return strings.TrimSuffix(book, filepath.Ext(book)) + ".svg"
}

// writeBook writes the book and its plot.
func writeBook(book string, rep *report) error {
	plot := svgPath(book)
	if err := os.WriteFile(plot, []byte(scrubTemp(renderSVG(rep), os.TempDir())), 0o644); err != nil {
		return err
	}
	return os.WriteFile(book, []byte(scrubTemp(renderBook(rep, filepath.Base(plot)), os.TempDir())), 0o644)
}

// scrubTemp replaces the run's temporary directories under tmp (a TLS
// target's certificate directory in its URI) with $TMPDIR/replbench-N:
// the book is committed, and names no path of the machine that wrote it.
func scrubTemp(text, tmp string) string {
	re := regexp.MustCompile(regexp.QuoteMeta(filepath.Join(tmp, "replbench-")) + `[0-9]+`)
	return re.ReplaceAllString(text, "$$TMPDIR/replbench-N")
}

// renderBook is the book's markdown; plot is the SVG's name beside it.
func renderBook(rep *report, plot string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# replvol performance\n\n")
	fmt.Fprintf(&b, "Written by `make bench` (cmd/replbench --book) on %s: edit cmd/replbench, not this file. "+
		"Every figure is a median over %d rounds of %s runs; ratios are replvol over the reference measured in the same rounds.\n\n",
		rep.Date, rep.Rounds, rep.Runtime)
	fmt.Fprintf(&b, "## Machine\n\n| | |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| CPU | %s |\n| cores | %d |\n| kernel | Linux %s |\n| Go | %s |\n", mdCell(rep.Machine.CPU), rep.Machine.Cores, mdCell(rep.Machine.Kernel), mdCell(rep.Machine.Go))
	if rep.Machine.Memory != "" {
		fmt.Fprintf(&b, "| memory | %s |\n", rep.Machine.Memory)
	}
	for _, k := range append(append([]string(nil), allTargets...), "fio") {
		if v, ok := rep.Versions[k]; ok && v != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", k, mdCell(v))
		}
	}
	fmt.Fprintf(&b, "\n## Page-cache state\n\n%s%s.\n\n", rep.PageCache, residentNote(rep))
	fmt.Fprintf(&b, "## Issue 19 targets\n\n")
	fmt.Fprintf(&b, "Ratios are to nbdkit's file plugin. The limit is the issue's measured limit of a 2-core box "+
		"(from the floors of loopback TCP, 470-550 us/MiB, and cached pwrite, 75-115 us/MiB).\n\n")
	fmt.Fprintf(&b, "| workload | measured | target | limit of this machine | status | note |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, t := range rep.Issue19 {
		limit := t.Limit
		if limit == "" {
			limit = "-"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", mdCell(t.Workload), fmtTargetValue(t), mdCell(fmtTargetBound(t)), limit, t.Status, mdCell(t.Note))
	}
	fmt.Fprintf(&b, "\nThe note beside a write ratio is this run's CPU time per IO of each target's processes (server) and of fio (client): on two cores shared by both, the ratio the CPU allows is nbdkit's total over replvol's. Where replvol's CPU goes on 8K writes, by a profile taken in this run, is the table \"where replvol's CPU goes\" below. Where a target is missed, and why, with earlier profiles and what was tried: [perf-gaps.md](perf-gaps.md) (written by hand, not by this run).\n")
	fmt.Fprintf(&b, "\n![IOPS and latency per protocol, metadata placement, resync throughput and failover times](%s)\n\n", plot)
	fmt.Fprintf(&b, "The plot leaves out the multipath path count: `make bench` runs node/multipath's Go benchmark after replbench and appends its output below.\n\n")
	fmt.Fprintf(&b, "## Every table of the run\n\n```text\n")
	printReport(&b, rep)
	fmt.Fprintf(&b, "```\n")
	return b.String()
}

// mdCell makes s safe inside a markdown table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// ---------------------------------------------------------------------------
// the plot

// bar is one bar of a panel; series picks its colour (and the legend).
type bar struct {
	label  string
	value  float64
	series int
}

// panel is one bar chart of the plot.
type panel struct {
	title  string
	unit   string
	series []string // legend, by series; one series: no legend
	bars   []bar
}

var seriesColours = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759"}

const (
	panelW, panelH = 440, 280
	plotCols       = 2
	barTop         = 60 // title, unit, legend and the tallest bar's value above the bars
	barBottom      = 40 // labels below
	barSide        = 40
)

// plotPanels picks the plot's panels from the report.
func plotPanels(rep *report) []panel {
	var ps []panel
	iops := panel{title: "8K randwrite qd16 per protocol", unit: "IOPS"}
	seq := panel{title: "1M seqwrite qd4 per protocol", unit: "MB/s"}
	lat := panel{title: "8K randwrite qd1 latency per protocol", unit: "us", series: []string{"p50", "p99"}}
	if p := rep.Protocols; p != nil {
		for _, r := range p.Rows {
			if r.RandWrite != nil {
				iops.bars = append(iops.bars, bar{label: r.Name, value: r.RandWrite.Median})
			}
			if r.SeqWrite != nil {
				seq.bars = append(seq.bars, bar{label: r.Name, value: r.SeqWrite.Median})
			}
			if r.LatP50 != nil && r.LatP99 != nil {
				lat.bars = append(lat.bars, bar{label: r.Name, value: r.LatP50.Median}, bar{label: "", value: r.LatP99.Median, series: 1})
			}
		}
	}
	md := panel{title: "metadata placement (replvol, protocol C)", unit: "IOPS", series: []string{"internal", "external"}}
	for _, r := range rep.Rows {
		in, ext := r.Targets[tReplvol], r.Targets[tReplvolExt]
		if in != nil && ext != nil && r.Unit == md.unit { // one scale: the 8K workloads
			md.bars = append(md.bars, bar{label: r.Label, value: in.Median}, bar{label: "", value: ext.Median, series: 1})
		}
	}
	rs := panel{title: "resync throughput", unit: "MB/s"}
	if r := rep.Resync; r != nil {
		rs.bars = []bar{{label: "full resync", value: r.ResyncMBs}, {label: "raw copy (dd)", value: r.CopyMBs, series: 1}}
	}
	fo := panel{title: "failover and switchover, every run", unit: "s", series: []string{"failover", "switchover"}}
	if f := rep.Failover; f != nil {
		for i, p := range []*phaseTiming{f.Failover, f.Switchover} {
			if p == nil {
				continue
			}
			for j, r := range p.Runs {
				fo.bars = append(fo.bars, bar{label: fmt.Sprint(j + 1), value: r.Seconds, series: i})
			}
		}
	}
	return append(ps, iops, seq, lat, md, rs, fo)
}

// renderSVG draws the panels in a grid, two a row.
func renderSVG(rep *report) string {
	ps := plotPanels(rep)
	rows := (len(ps) + plotCols - 1) / plotCols
	w, h := plotCols*panelW, rows*panelH+44
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="14" font-weight="bold">replbench %s</text>`+"\n", html.EscapeString(rep.Date))
	fmt.Fprintf(&b, `<text x="10" y="34" fill="#555">%s</text>`+"\n", html.EscapeString(rep.Machine.String()))
	for i, p := range ps {
		drawPanel(&b, p, (i%plotCols)*panelW, 44+(i/plotCols)*panelH)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func drawPanel(b *strings.Builder, p panel, x0, y0 int) {
	fmt.Fprintf(b, `<g class="panel" transform="translate(%d,%d)">`+"\n", x0, y0)
	fmt.Fprintf(b, `<rect x="4" y="4" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", panelW-8, panelH-8)
	fmt.Fprintf(b, `<text x="14" y="22" font-size="13" font-weight="bold">%s</text>`+"\n", html.EscapeString(p.title))
	fmt.Fprintf(b, `<text x="14" y="38" fill="#555">%s</text>`+"\n", html.EscapeString(p.unit))
	for i, s := range p.series {
		lx := panelW - 150 + (i%2)*70
		fmt.Fprintf(b, `<rect x="%d" y="28" width="10" height="10" fill="%s"/><text x="%d" y="37">%s</text>`+"\n",
			lx, seriesColours[i%len(seriesColours)], lx+14, html.EscapeString(s))
	}
	if len(p.bars) == 0 {
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" fill="#888">not measured in this run</text>`+"\n", panelW/2, panelH/2)
		b.WriteString("</g>\n")
		return
	}
	top := 0.0
	for _, br := range p.bars {
		top = max(top, br.value)
	}
	if top <= 0 {
		top = 1
	}
	plotH := float64(panelH - barTop - barBottom)
	slot := float64(panelW-2*barSide) / float64(len(p.bars))
	base := float64(panelH - barBottom)
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333"/>`+"\n", barSide, base, panelW-barSide, base)
	for i, br := range p.bars {
		hgt := br.value / top * plotH
		x := float64(barSide) + float64(i)*slot + slot*0.1
		fmt.Fprintf(b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s</title></rect>`+"\n",
			x, base-hgt, slot*0.8, hgt, seriesColours[br.series%len(seriesColours)], html.EscapeString(strings.TrimSpace(br.label+" "+fmtNum(br.value))), html.EscapeString(p.unit))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9">%s</text>`+"\n", x+slot*0.4, base-hgt-3, fmtNum(br.value))
		if br.label != "" {
			mid := x + slot*0.4
			if i+1 < len(p.bars) && p.bars[i+1].label == "" { // a group of two: the label under both
				mid += slot / 2
			}
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", mid, base+14, html.EscapeString(br.label))
		}
	}
	b.WriteString("</g>\n")
}
