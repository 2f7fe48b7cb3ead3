package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/node"
	"github.com/replvol/replvol/transport"
)

// Target names, in table order.
const (
	tReplvol = "replvol"
	tNbdkit  = "nbdkit"
	tQuorum  = "quorum"
)

// tReplvolExt is replvol with external metadata: the reference for the
// cost of internal metadata.
const tReplvolExt = "replvol-ext"

// tReplvolTLS is replvol with every link mutual TLS (replctl demo --tls:
// NBD over TLS from fio, replication over TLS): the cost of TLS is its
// ratio to replvol, measured in the same rounds.
const tReplvolTLS = "replvol-tls"

// tNbdkitTLS is nbdkit's file plugin over TLS (GnuTLS, --tls=require
// with client certificates): what TLS costs an unreplicated NBD server on
// the same machine, beside replvol-tls's cost.
const tNbdkitTLS = "nbdkit-tls"

// tReplvolTLSLinks is replvol with mutual TLS on its own links
// (replication, control) and a plain NBD export (replctl demo --tls
// --nbd-tls off): what TLS costs replvol itself, without the NBD client's
// share, which nbdkit-tls shows.
const tReplvolTLSLinks = "replvol-tls-links"

// tReplvolNodes is replvol as users run it (nodes.go): two replnode
// processes, alpha (primary, serving NBD) and beta, each with its own
// disk, over 127.0.0.1, protocol C, internal metadata.
const tReplvolNodes = "replvol-nodes"

// tReplvolNodesNoSums is replvol-nodes with checksums at rest off
// (checksums: off): the reference for what checksums cost (issue 29).
const tReplvolNodesNoSums = "replvol-nodes-nosums"

// tReplvolNodes3 is replvol-nodes with a third replica: replnode
// processes alpha (primary), beta and gamma. Its writes over
// replvol-nodes' are what a third replica costs (issue 31: >= 0.85x).
const tReplvolNodes3 = "replvol-nodes3"

// tFloor is the floor (cmd/replbench/floor): a minimal replicated write
// in Go, no metadata, the limit of the machine and the language beside
// every figure. It is no competitor.
const tFloor = "floor"

// floorLabel is how the tables name the floor.
const floorLabel = "minimal replicated write (Go, no metadata)"

var allTargets = []string{tReplvolNodes, tReplvolNodesNoSums, tReplvolNodes3, tReplvol, tReplvolExt, tReplvolTLS, tReplvolTLSLinks, tNbdkit, tNbdkitTLS, tQuorum, tFloor}

// latencyTargets run the 8K random write qd1 (latWorkload) when selected,
// for issue 31's latency ratios; the replvol demo runs it with the
// protocol variants.
var latencyTargets = []string{tReplvolNodes, tNbdkit, tFloor}

type workload struct {
	Name    string // short id used in JSON
	Label   string // table label
	RW      string // fio --rw
	BS      string // fio --bs
	IODepth int
	Unit    string // "IOPS", "MB/s" or "us" (latency, submission to completion)
	Read    bool
	// Proto: the protocol variants (protocols.go) run it too.
	Proto bool
	// Latency: only the protocol variants run it, for its completion
	// latency percentiles.
	Latency bool
}

var workloads = []workload{
	{Name: "randwrite-8k", Label: "8K randwrite qd16", RW: "randwrite", BS: "8k", IODepth: 16, Unit: "IOPS", Proto: true},
	{Name: "seqwrite-1m", Label: "1M seqwrite qd4", RW: "write", BS: "1m", IODepth: 4, Unit: "MB/s", Proto: true},
	{Name: "randread-8k", Label: "8K randread qd16", RW: "randread", BS: "8k", IODepth: 16, Unit: "IOPS", Read: true},
}

// workloadNames are the names of workloads, in order, and the latency
// reference's (latWorkload), which runs where a target has it.
func workloadNames() []string {
	names := make([]string, 0, len(workloads)+1)
	for _, w := range workloads {
		names = append(names, w.Name)
	}
	return append(names, latWorkload.Name)
}

// parseWorkloads is --workloads: names of workloadNames, comma-separated,
// each once.
func parseWorkloads(s string) ([]string, error) {
	var out []string
	for _, w := range strings.Split(s, ",") {
		w = strings.TrimSpace(w)
		switch {
		case w == "" || slices.Contains(out, w):
		case !slices.Contains(workloadNames(), w):
			return nil, fmt.Errorf("unknown workload %q; want some of %s", w, strings.Join(workloadNames(), ","))
		default:
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workload named; want some of %s", strings.Join(workloadNames(), ","))
	}
	return out, nil
}

// rowRatio is the ratio key of workload's row; false when it has none,
// or has no row (--workloads left it out): the goal is then n/a.
func rowRatio(rows map[string]*row, workload, key string) (float64, bool) {
	r, ok := rows[workload]
	if !ok {
		return 0, false
	}
	v, ok := r.Ratios[key]
	return v, ok
}

// latWorkload is the latency reference of the protocols table: 8K random
// writes one at a time, latency percentiles.
var latWorkload = workload{Name: "randwrite-8k-qd1", Label: "8K randwrite qd1", RW: "randwrite", BS: "8k", IODepth: 1, Unit: "us", Latency: true}

// value is the figure a run gives for the workload: IOPS, MB/s or the
// median latency in microseconds.
func (w workload) value(r *fioResult) float64 {
	switch w.Unit {
	case "MB/s":
		return r.BW / 1e6
	case "us":
		return r.LatP50
	}
	return r.IOPS
}

// runTargets lists the targets that run w in every round: the selected
// targets for the main workloads, plus the protocol variants of the
// replvol demo when proto is on.
func (b *bench) runTargets(w workload, proto bool) []string {
	var names []string
	if !w.Latency {
		names = slices.Clone(b.cfg.targets)
	} else {
		for _, t := range b.cfg.targets {
			if slices.Contains(latencyTargets, t) {
				names = append(names, t)
			}
		}
	}
	if proto {
		if w.Latency {
			names = append(names, tReplvol)
		}
		if w.Proto || w.Latency {
			names = append(names, protoVariants...)
		}
	}
	return names
}

type goal struct {
	Workload string
	Versus   string
	Min      float64
}

var goals = []goal{
	{"randwrite-8k", tNbdkit, 0.4},
	{"randwrite-8k", tQuorum, 1.5},
	{"randread-8k", tNbdkit, 0.8},
	{"randwrite-8k", tReplvolExt, 0.9},
}

// tlsGoal is a TLS target's ratio to plaintext replvol.
type tlsGoal struct {
	goal
	Target, Label string
}

// tlsGoals: TLS costs at most 15% of protocol C's writes (issue 16):
// replvol-tls over replvol, and replvol-tls-links (replvol's own links
// only) over replvol.
var tlsGoals = []tlsGoal{
	{goal{"randwrite-8k", tReplvol, 0.85}, tReplvolTLS, "TLS"},
	{goal{"seqwrite-1m", tReplvol, 0.85}, tReplvolTLS, "TLS"},
	{goal{"randwrite-8k", tReplvol, 0.85}, tReplvolTLSLinks, "TLS on replvol's links (NBD plain)"},
	{goal{"seqwrite-1m", tReplvol, 0.85}, tReplvolTLSLinks, "TLS on replvol's links (NBD plain)"},
}

type config struct {
	rounds  int
	runtime time.Duration
	ramp    time.Duration
	size    int64
	span    int64
	jsonOut bool
	targets []string
	// workloads are the names of the workloads the fio rounds run
	// (--workloads; all of them by default).
	workloads []string
	dir       string
	replctl   string
	keepLogs  bool

	failoverRuns int // failover and switchover runs after the fio phases (0: none)

	protocols     bool  // protocols A, B, C and local-only in the fio rounds
	readBalancing bool  // the read-balancing phase
	readThrottle  int64 // read-balancing phase: read bytes/s per node's disk (0: no throttle)

	pageCache   string        // cacheDrop or cacheKeep (pagecache.go)
	fresh       bool          // the fresh sparse-volume phase (fresh.go)
	scrub       bool          // the scrub phase (scrub.go)
	profile     bool          // the write profile (cpuprofile.go)
	idleVolumes int           // idle phase: volumes (0: skip; idle.go)
	idleWindow  time.Duration // idle phase: how long the CPU is measured
	idleProfile string        // idle phase: save the primary's profiles (PREFIX.cpu.pprof, PREFIX.heap.pprof)
	book        string        // write the book (perf.md and perf.svg beside it) here ("": none)
	// nodesProfile: save the primary's CPU profile of every 8K random
	// write run on a target of replnode processes to
	// PREFIX-TARGET-rROUND.cpu.pprof ("": none).
	nodesProfile string
}

func main() {
	os.Exit(run())
}

func run() int {
	var cfg config
	var sizeStr, spanStr, targetsStr, workloadsStr string
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; every round runs every workload on every target")
	flag.DurationVar(&cfg.runtime, "runtime", 6*time.Second, "measured time per fio run")
	flag.DurationVar(&cfg.ramp, "ramp", time.Second, "fio ramp_time (not measured) per run")
	flag.StringVar(&sizeStr, "size", "1GiB", "volume/image size of every target")
	flag.StringVar(&spanStr, "span", "512MiB", "region of the volume the workloads touch (clamped to the export size)")
	flag.StringVar(&workloadsStr, "workloads", strings.Join(workloadNames(), ","), "comma-separated workloads of the fio rounds: "+strings.Join(workloadNames(), ",")+" (e.g. seqwrite-1m alone to measure what a 1 MiB write costs)")
	flag.BoolVar(&cfg.jsonOut, "json", false, "print the results as JSON instead of a table")
	flag.StringVar(&targetsStr, "targets", strings.Join(allTargets, ","), "comma-separated targets: "+strings.Join(allTargets, ","))
	flag.StringVar(&cfg.dir, "dir", "", "parent directory for the temporary images (default: $TMPDIR)")
	flag.StringVar(&cfg.replctl, "replctl", "", "prebuilt replctl binary (default: go build ./cmd/replctl)")
	flag.BoolVar(&cfg.keepLogs, "keep-logs", false, "keep the server logs (the images are always removed)")
	flag.IntVar(&cfg.failoverRuns, "failover-runs", 10, "failover and switchover runs each, after the fio phases (0: skip)")
	flag.BoolVar(&cfg.protocols, "protocols", true, "also run replvol with protocols A and B and with its peer disconnected (local-only) in the fio rounds (needs targets replvol and nbdkit)")
	flag.BoolVar(&cfg.readBalancing, "read-balancing", true, "run the read-balancing phase (prefer-local vs round-robin on two throttled replicas)")
	var throttleStr string
	flag.StringVar(&throttleStr, "read-throttle", "50MiB", "read-balancing phase: read bandwidth per second of each node's disk (cgroup blkio/io throttle on a loop device; 0: unthrottled)")
	flag.StringVar(&cfg.pageCache, "page-cache", cacheDrop, "page-cache state of the targets' files: drop (64 KiB prefill; every target's files written back and dropped from the cache before every run) or keep (1 MiB prefill, the cache as runs leave it)")
	flag.BoolVar(&cfg.profile, "write-profile", true, "profile the replvol demo's CPU under one more 8K randwrite qd16 run and say where it goes (needs the target replvol)")
	flag.BoolVar(&cfg.scrub, "scrub", true, "run the scrub phase (replctl scrub at full rate on replvol-nodes' alpha against a plain sequential read of its backing file; needs the target replvol-nodes)")
	flag.BoolVar(&cfg.fresh, "fresh", true, "run the fresh sparse-volume phase (8K randwrite qd16 into a new replvol demo and a new sparse nbdkit file; needs targets replvol and nbdkit)")
	flag.IntVar(&cfg.idleVolumes, "idle-volumes", 1000, "idle phase: volumes of 16 MiB on two replnode processes, then their idle CPU and RSS (0: skip)")
	flag.DurationVar(&cfg.idleWindow, "idle-window", 20*time.Second, "idle phase: how long the idle CPU is measured")
	flag.StringVar(&cfg.idleProfile, "idle-profile", "", "idle phase: save the primary's CPU profile over the window and its heap profile after it to PREFIX.cpu.pprof and PREFIX.heap.pprof")
	flag.StringVar(&cfg.book, "book", "", "write the book here (markdown; the SVG plot beside it, same name with .svg), e.g. docs/perf.md")
	flag.StringVar(&cfg.nodesProfile, "nodes-profile", "", "save the primary's CPU profile of every 8K randwrite qd16 run on a target of replnode processes to PREFIX-TARGET-rROUND.cpu.pprof (go tool pprof -diff_base)")
	flag.Parse()

	var err error
	if cfg.size, err = node.ParseSize(sizeStr); err != nil {
		fmt.Fprintln(os.Stderr, "replbench: --size:", err)
		return 2
	}
	if cfg.span, err = node.ParseSize(spanStr); err != nil {
		fmt.Fprintln(os.Stderr, "replbench: --span:", err)
		return 2
	}
	if throttleStr != "0" {
		if cfg.readThrottle, err = node.ParseSize(throttleStr); err != nil {
			fmt.Fprintln(os.Stderr, "replbench: --read-throttle:", err)
			return 2
		}
	}
	if cfg.workloads, err = parseWorkloads(workloadsStr); err != nil {
		fmt.Fprintln(os.Stderr, "replbench: --workloads:", err)
		return 2
	}
	for _, t := range strings.Split(targetsStr, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		if !slices.Contains(allTargets, t) {
			fmt.Fprintf(os.Stderr, "replbench: unknown target %q\n", t)
			return 2
		}
		if !slices.Contains(cfg.targets, t) {
			cfg.targets = append(cfg.targets, t)
		}
	}
	if len(cfg.targets) == 0 || cfg.rounds < 1 || cfg.runtime < time.Second || cfg.failoverRuns < 0 || cfg.idleVolumes < 0 || cfg.idleWindow < time.Second {
		fmt.Fprintln(os.Stderr, "replbench: need at least one target, --rounds >= 1, --runtime >= 1s, --failover-runs >= 0, --idle-volumes >= 0 and --idle-window >= 1s")
		return 2
	}
	if cfg.pageCache != cacheDrop && cfg.pageCache != cacheKeep {
		fmt.Fprintf(os.Stderr, "replbench: --page-cache %q: want drop or keep\n", cfg.pageCache)
		return 2
	}
	slices.SortFunc(cfg.targets, func(a, b string) int {
		return slices.Index(allTargets, a) - slices.Index(allTargets, b)
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b := &bench{cfg: cfg}
	rep, err := b.run(ctx)
	b.cleanup()
	if err == nil {
		rep.Issue19 = issueTargets(rep)
		rep.Issue31 = issue31Goals(rep)
		rep.Issue29 = issue29Goals(rep)
	}
	if err == nil && cfg.book != "" {
		if err = writeBook(cfg.book, rep); err == nil {
			logf("book written: %s and %s", cfg.book, svgPath(cfg.book))
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "replbench: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "replbench:", err)
		return 1
	}
	if cfg.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(os.Stderr, "replbench:", err)
			return 1
		}
	} else {
		printReport(os.Stdout, rep)
	}
	code := 0
	if rep.ReadBalancing != nil && rep.ReadBalancing.Error != "" {
		fmt.Fprintln(os.Stderr, "replbench: read-balancing phase:", rep.ReadBalancing.Error)
		code = 1
	}
	if rep.Failover != nil && rep.Failover.Error != "" {
		fmt.Fprintln(os.Stderr, "replbench: failover phase:", rep.Failover.Error)
		code = 1
	}
	if rep.Profile != nil && rep.Profile.Error != "" {
		fmt.Fprintln(os.Stderr, "replbench: write profile:", rep.Profile.Error)
		code = 1
	}
	if rep.Fresh != nil && rep.Fresh.Error != "" {
		fmt.Fprintln(os.Stderr, "replbench: fresh phase:", rep.Fresh.Error)
		code = 1
	}
	if rep.Idle != nil && rep.Idle.Error != "" {
		fmt.Fprintln(os.Stderr, "replbench: idle phase:", rep.Idle.Error)
		code = 1
	}
	return code
}

// ---------------------------------------------------------------------------
// report

type cell struct {
	Median  float64   `json:"median"`
	Samples []float64 `json:"samples"`
	// CPUPerIO is the median CPU time the target's server processes
	// spent per IO (microseconds; every node of a replvol demo, nbdkit
	// alone, qemu-nbd and its nbdkit for the quorum), over the samples
	// in CPUPerIOSamples: what separates the targets when the machine's
	// two cores are the limit.
	CPUPerIO        float64   `json:"cpu_us_per_io,omitempty"`
	CPUPerIOSamples []float64 `json:"cpu_us_per_io_samples,omitempty"`
	// ClientCPUPerIO is the same of the client, fio (median).
	ClientCPUPerIO        float64   `json:"client_cpu_us_per_io,omitempty"`
	ClientCPUPerIOSamples []float64 `json:"client_cpu_us_per_io_samples,omitempty"`
	// Processes is what each server process spent per IO (cost.go),
	// the median per process of costSamples, one entry a run.
	Processes   []procCost `json:"processes,omitempty"`
	costSamples [][]procCost
	// LatP99 is the median of the runs' p99 latency (us), on the rows
	// whose figure is a latency (its p50).
	LatP99        float64   `json:"lat_p99_us,omitempty"`
	LatP99Samples []float64 `json:"lat_p99_us_samples,omitempty"`
}

type row struct {
	Workload string             `json:"workload"`
	Label    string             `json:"label"`
	Unit     string             `json:"unit"`
	Targets  map[string]*cell   `json:"targets"`
	Ratios   map[string]float64 `json:"ratios,omitempty"` // "replvol/nbdkit", "replvol/quorum"
}

type goalResult struct {
	Goal   string   `json:"goal"`
	Ratio  *float64 `json:"ratio"` // nil when a target was not run
	Min    float64  `json:"min"`
	Status string   `json:"status"` // PASS, MISS, n/a
}

type report struct {
	Date     string            `json:"date"`
	Nproc    int               `json:"nproc"`
	Machine  machine           `json:"machine"`
	Rounds   int               `json:"rounds"`
	Runtime  string            `json:"runtime"`
	Size     int64             `json:"size_bytes"`
	Span     int64             `json:"span_bytes"`
	Versions map[string]string `json:"versions"`
	URIs     map[string]string `json:"uris"`
	Rows     []*row            `json:"results"`
	Goals    []goalResult      `json:"goals"`
	Resync   *resyncResult     `json:"resync,omitempty"`
	// PageCache says how every target's files were put in the same
	// page-cache state (pagecache.go); PageCacheResident is the most
	// that stayed resident after a drop, in bytes.
	PageCacheMode     string `json:"page_cache_mode"`
	PageCache         string `json:"page_cache"`
	PageCacheResident int64  `json:"page_cache_resident_max_bytes"`
	// Syscalls says why the servers' system calls were not counted;
	// "" when perf counted them (cost.go).
	Syscalls string `json:"syscalls_not_measured,omitempty"`
	// Protocols: replvol under protocols A, B and C and local-only,
	// measured in the same rounds as the table above.
	Protocols     *protocolReport    `json:"protocols,omitempty"`
	ReadBalancing *readBalanceReport `json:"read_balancing,omitempty"`
	Failover      *failoverReport    `json:"failover,omitempty"`
	Fresh         *freshReport       `json:"fresh,omitempty"`
	Scrub         *scrubReport       `json:"scrub,omitempty"`
	Profile       *writeProfile      `json:"write_profile,omitempty"`
	Idle          *idleReport        `json:"idle,omitempty"`
	// Issue19 is every target of issue 19 with the limit of this
	// machine beside it (issue19.go).
	Issue19 []issueTarget `json:"issue19_targets"`
	// Issue31 is issue 31's goals for replvol-nodes, from the same run
	// (issue31.go).
	Issue31 []issueTarget `json:"issue31_goals,omitempty"`
	// Issue29 is what checksums at rest cost: replvol-nodes against
	// replvol-nodes-nosums, from the same run (issue29.go).
	Issue29 []issueTarget `json:"issue29_goals,omitempty"`
}

// resyncResult compares a full resync with a raw copy of the same file.
type resyncResult struct {
	Bytes      int64   `json:"bytes"`
	ResyncMBs  float64 `json:"resync_mb_s"`
	CopyMBs    float64 `json:"raw_copy_mb_s"`
	Ratio      float64 `json:"ratio"`
	CopyMethod string  `json:"raw_copy"`
	Status     string  `json:"status"`
}

// printReport prints every table of the report (the book embeds it too).
func printReport(w io.Writer, rep *report) {
	printTable(w, rep)
	if rep.Protocols != nil {
		fmt.Fprintln(w)
		printProtocols(w, rep.Protocols)
	}
	if rep.Profile != nil {
		fmt.Fprintln(w)
		printWriteProfile(w, rep.Profile)
	}
	if rep.Fresh != nil {
		fmt.Fprintln(w)
		printFresh(w, rep.Fresh)
	}
	if rep.ReadBalancing != nil {
		fmt.Fprintln(w)
		printReadBalancing(w, rep.ReadBalancing)
	}
	if rep.Failover != nil {
		fmt.Fprintln(w)
		printFailover(w, rep.Failover)
	}
	if rep.Idle != nil {
		fmt.Fprintln(w)
		printIdle(w, rep.Idle)
	}
	fmt.Fprintln(w)
	printIssueTargets(w, rep.Issue19)
}

func printTable(w io.Writer, rep *report) {
	fmt.Fprintf(w, "replbench  %s  nproc=%d  rounds=%d  runtime=%s  size=%s  span=%s  (median per cell)\n",
		rep.Date, rep.Nproc, rep.Rounds, rep.Runtime, fmtSize(rep.Size), fmtSize(rep.Span))
	fmt.Fprintf(w, "  machine: %s\n", rep.Machine)
	fmt.Fprintf(w, "  page cache: %s%s\n", rep.PageCache, residentNote(rep))
	for _, t := range allTargets {
		v, ok := rep.Versions[t]
		switch {
		case !ok:
		case t == tFloor:
			fmt.Fprintf(w, "  floor: %s\n", v)
		default:
			fmt.Fprintf(w, "  %-8s %s\n", t+":", v)
		}
	}
	if v, ok := rep.Versions["fio"]; ok {
		fmt.Fprintf(w, "  %-8s %s\n", "client:", v)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	shown := shownTargets(rep)
	fmt.Fprint(tw, "workload\tunit\t"+strings.Join(shown, "\t")+"\treplvol/nbdkit\treplvol/quorum\tinternal/external\treplvol tls/plain\tlinks tls/plain\tnbdkit tls/plain\t\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t", r.Label, r.Unit)
		for _, t := range shown {
			if c, ok := r.Targets[t]; ok {
				fmt.Fprintf(tw, "%s\t", fmtNum(c.Median))
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		for _, k := range []string{"replvol/nbdkit", "replvol/quorum", "replvol/replvol-ext", "replvol-tls/replvol", "replvol-tls-links/replvol", "nbdkit-tls/nbdkit"} {
			if v, ok := r.Ratios[k]; ok {
				fmt.Fprintf(tw, "%.2fx\t", v)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprint(tw, "\n")
	}
	tw.Flush()
	if slices.ContainsFunc(rep.Rows, func(r *row) bool { return r.Workload == latWorkload.Name }) {
		fmt.Fprintf(w, "  (%s: latency from submission to completion, p50, lower is better; p99 in the issue 31 goals below)\n", latWorkload.Label)
	}
	printCPUPerIO(w, rep)
	printCosts(w, rep)
	printIssue31(w, rep.Issue31)
	printIssue29(w, rep.Issue29)
	fmt.Fprintln(w, "goals:")
	for _, g := range rep.Goals {
		got := "-"
		if g.Ratio != nil {
			got = fmt.Sprintf("%.2fx", *g.Ratio)
		}
		fmt.Fprintf(w, "  %-34s %7s  %s\n", g.Goal, got, g.Status)
	}
	if r := rep.Resync; r != nil {
		fmt.Fprintf(w, "resync: full resync of %s: %.0f MB/s; raw copy (%s): %.0f MB/s\n", fmtSize(r.Bytes), r.ResyncMBs, r.CopyMethod, r.CopyMBs)
		fmt.Fprintf(w, "  %-34s %6.2fx  %s\n", "resync >= 0.8x raw copy", r.Ratio, r.Status)
	}
}

// printCPUPerIO prints the server processes' CPU time per IO of each
// workload and target, and replvol's over nbdkit's: when the cores are
// the limit, the throughput ratio is about the inverse of that.
func printCPUPerIO(w io.Writer, rep *report) {
	measured := false
	for _, r := range rep.Rows {
		for _, c := range r.Targets {
			measured = measured || c.CPUPerIO > 0
		}
	}
	if !measured {
		return
	}
	fmt.Fprintln(w, "CPU per IO, us: server (every process behind the URI: both nodes of the replvol demo) + client (fio);")
	fmt.Fprintln(w, "  bound: nbdkit's server+client over replvol's, the throughput ratio the CPU time allows when the cores are the limit:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "workload\t")
	shown := shownTargets(rep)
	for _, t := range shown {
		fmt.Fprintf(tw, "%s\t", t)
	}
	fmt.Fprint(tw, "replvol/nbdkit server\tbound\t\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t", r.Label)
		for _, t := range shown {
			if c, ok := r.Targets[t]; ok && c.CPUPerIO > 0 {
				fmt.Fprintf(tw, "%s+%s\t", fmtNum(c.CPUPerIO), fmtNum(c.ClientCPUPerIO))
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		if v, ok := cpuRatio(r.Targets[tReplvol], r.Targets[tNbdkit]); ok {
			fmt.Fprintf(tw, "%.2fx\t%.2fx\t\n", v, cpuBound(r.Targets[tReplvol], r.Targets[tNbdkit]))
		} else {
			fmt.Fprint(tw, "-\t-\t\n")
		}
	}
	tw.Flush()
}

// cpuBound is the throughput ratio of replvol (rv) to nbdkit (nk) that
// their CPU time per IO (server and client) allows when the machine's
// cores are the limit: nbdkit's over replvol's. Call it where cpuRatio
// is ok.
func cpuBound(rv, nk *cell) float64 {
	return (nk.CPUPerIO + nk.ClientCPUPerIO) / (rv.CPUPerIO + rv.ClientCPUPerIO)
}

// cpuNote says what each IO cost replvol (rv) and nbdkit (nk) in CPU,
// and the ratio that allows; "" where it was not measured.
func cpuNote(rv, nk *cell) string {
	v, ok := cpuRatio(rv, nk)
	if !ok {
		return ""
	}
	return fmt.Sprintf("CPU per IO, server+client: replvol %s+%s us, nbdkit %s+%s us (servers %.1fx); the CPU allows %.2fx",
		fmtNum(rv.CPUPerIO), fmtNum(rv.ClientCPUPerIO), fmtNum(nk.CPUPerIO), fmtNum(nk.ClientCPUPerIO), v, cpuBound(rv, nk))
}

// cpuRatio is replvol's (rv) server CPU per IO over nbdkit's (nk).
func cpuRatio(rv, nk *cell) (float64, bool) {
	if rv == nil || nk == nil || rv.CPUPerIO <= 0 || nk.CPUPerIO <= 0 {
		return 0, false
	}
	return rv.CPUPerIO / nk.CPUPerIO, true
}

// shownTargets are the targets, in table order, that some row measured.
func shownTargets(rep *report) []string {
	var out []string
	for _, t := range allTargets {
		if slices.ContainsFunc(rep.Rows, func(r *row) bool { _, ok := r.Targets[t]; return ok }) {
			out = append(out, t)
		}
	}
	return out
}

func fmtNum(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ---------------------------------------------------------------------------
// the run

type bench struct {
	cfg     config
	tmp     string
	mu      lockorder.Mutex
	procs   []*proc // in start order; stopped in reverse
	targets map[string]*target

	replctlBin string
	built      map[string]bool // packages goBuild built into tmp/bin

	// syscallsWhy says why system calls are not counted ("": perf
	// counts them; cost.go).
	syscallsWhy string
}

type target struct {
	name    string
	uri     string
	version string
	// files are the target's files and directories: what a drop of the
	// page cache covers.
	files   []string
	control string  // replvol: alpha's control API
	disk    string  // replvol: alpha's backing file
	procs   []*proc // the server processes behind the URI
	// roles name procs in the cost table, one each (nil: the
	// processes' own names).
	roles []string
	// settle, when set, waits until the target is ready for the next
	// run (replvol-nodes: both replicas in sync).
	settle func(context.Context) error
}

// role is the name of t's i-th server process in the tables.
func (t *target) role(i int) string {
	if i < len(t.roles) {
		return t.roles[i]
	}
	return t.procs[i].name
}

// cpuTicks is the CPU time the server processes of t have used, in
// USER_HZ ticks (utime + stime); false when one cannot be read.
func (t *target) cpuTicks() (int64, bool) {
	var sum int64
	for _, p := range t.procs {
		v, err := readProc(p.cmd.Process.Pid, "stat", parseProcStatTicks)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return sum, len(t.procs) > 0
}

// cpuPerIO is the CPU time per IO, in microseconds, of ticks used over a
// fio run of res: its IOs are counted at the measured rate over the ramp
// and the runtime (fio does IO at that rate in both).
func cpuPerIO(ticks int64, res *fioResult, window time.Duration) float64 {
	ios := res.IOPS * window.Seconds()
	if ios <= 0 {
		return 0
	}
	return float64(ticks) / userHZ * 1e6 / ios
}

// fioOn is a timed fio run against t that also measures the CPU time
// per IO of t's server processes and of fio (fioResult.ServerCPUPerIO).
func (b *bench) fioOn(ctx context.Context, t *target, name, rw, bs string, qd int, span int64) (*fioResult, error) {
	cpu0, ok0 := t.cpuTicks()
	before := make([]procSample, len(t.procs))
	counters := make([]*syscallCounter, len(t.procs))
	for i, p := range t.procs {
		before[i] = sampleProc(p)
		counters[i] = b.countSyscalls(p.cmd.Process.Pid)
	}
	res, err := b.fio(ctx, t.uri, name, rw, bs, qd, span, fioTimed)
	counts := make([]perfCount, len(t.procs))
	for i, c := range counters {
		counts[i] = c.stop()
	}
	if err != nil {
		return nil, err
	}
	window := b.cfg.ramp + b.cfg.runtime
	if cpu1, ok1 := t.cpuTicks(); ok0 && ok1 {
		res.ServerCPUPerIO = cpuPerIO(cpu1-cpu0, res, window)
		res.ClientCPUPerIO = cpuPerIO(int64(res.ClientCPU*userHZ/time.Second), res, window)
	}
	ios := res.IOPS * window.Seconds()
	for i, p := range t.procs {
		c, ok := costOf(t.role(i), before[i], sampleProc(p), counts[i], ios)
		if !ok {
			res.Procs = nil
			break
		}
		res.Procs = append(res.Procs, c)
	}
	return res, nil
}

// addCPU adds the CPU times per IO of run r to c's samples.
func (c *cell) addCPU(r *fioResult) {
	if r.ServerCPUPerIO > 0 {
		c.CPUPerIOSamples = append(c.CPUPerIOSamples, r.ServerCPUPerIO)
		c.ClientCPUPerIOSamples = append(c.ClientCPUPerIOSamples, r.ClientCPUPerIO)
	}
	if len(r.Procs) > 0 {
		c.costSamples = append(c.costSamples, r.Procs)
	}
}

// settleCPU sets c's CPU medians from its samples.
func (c *cell) settleCPU() {
	if len(c.CPUPerIOSamples) > 0 {
		c.CPUPerIO, c.ClientCPUPerIO = median(c.CPUPerIOSamples), median(c.ClientCPUPerIOSamples)
	}
	c.Processes = medianCosts(c.costSamples)
	if len(c.LatP99Samples) > 0 {
		c.LatP99 = median(c.LatP99Samples)
	}
}

// withCPU is c with the CPU samples of cpu (and their medians); c may be
// nil.
func withCPU(c, cpu *cell) *cell {
	if c != nil && cpu != nil {
		c.CPUPerIOSamples, c.ClientCPUPerIOSamples = cpu.CPUPerIOSamples, cpu.ClientCPUPerIOSamples
		c.costSamples = cpu.costSamples
		c.settleCPU()
	}
	return c
}

// diagnose names the server processes of t that have exited.
func (t *target) diagnose() string {
	var msgs []string
	for _, p := range t.procs {
		if p.exited() {
			msgs = append(msgs, fmt.Sprintf("%s (pid %d) exited unexpectedly: %v; log %s", p.name, p.cmd.Process.Pid, p.exitErr(), p.log))
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return " [" + strings.Join(msgs, "; ") + "]"
}

func (b *bench) run(ctx context.Context) (*report, error) {
	for _, tool := range []string{"fio", "nbdinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (run ./deploy/install-test-deps.sh)", tool)
		}
	}
	tmp, err := os.MkdirTemp(b.cfg.dir, "replbench-")
	if err != nil {
		return nil, err
	}
	b.tmp = tmp
	b.targets = map[string]*target{}

	rep := &report{
		Date:          time.Now().Format(time.RFC3339),
		Nproc:         runtime.NumCPU(),
		Rounds:        b.cfg.rounds,
		Runtime:       b.cfg.runtime.String(),
		Size:          b.cfg.size,
		Versions:      map[string]string{"fio": firstLine(ctx, "fio", "--version")},
		URIs:          map[string]string{},
		Machine:       machineInfo(),
		PageCache:     pageCacheHow(b.cfg.pageCache),
		PageCacheMode: b.cfg.pageCache,
	}
	b.syscallsWhy = perfSyscalls(ctx)
	rep.Syscalls = b.syscallsWhy
	if b.syscallsWhy != "" {
		logf("system calls are not counted in this run: %s", b.syscallsWhy)
	}
	span := b.cfg.span
	for _, name := range b.cfg.targets {
		var t *target
		var err error
		logf("starting %s", name)
		switch name {
		case tReplvolNodes, tReplvolNodesNoSums, tReplvolNodes3:
			t, err = b.startReplvolNodes(ctx, name)
		case tFloor:
			t, err = b.startFloor(ctx)
		case tReplvol:
			t, err = b.startReplvol(ctx, "internal")
		case tReplvolExt:
			t, err = b.startReplvol(ctx, "external")
		case tReplvolTLS:
			t, err = b.startReplvol(ctx, "internal", "--tls")
		case tReplvolTLSLinks:
			t, err = b.startReplvol(ctx, "internal", "--tls", "--nbd-tls", "off")
		case tNbdkit:
			t, err = b.startNbdkit(ctx, false)
		case tNbdkitTLS:
			t, err = b.startNbdkit(ctx, true)
		case tQuorum:
			t, err = b.startQuorum(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		b.targets[name] = t
		rep.Versions[name] = t.version
		rep.URIs[name] = t.uri
		size, err := exportSize(ctx, t.uri)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		span = min(span, size)
	}
	span &^= 1<<20 - 1
	if span < 64<<20 {
		return nil, fmt.Errorf("span %d too small (export smaller than 64 MiB?)", span)
	}
	rep.Span = span

	fill := prefillBlock(b.cfg.pageCache)
	for _, name := range b.cfg.targets {
		logf("prefilling %s (%s sequential write, %s blocks)", name, fmtSize(span), fill)
		if _, err := b.fio(ctx, b.targets[name].uri, "fill", "write", fill, 4, span, fioOnce); err != nil {
			return nil, fmt.Errorf("prefill %s: %w%s", name, err, b.targets[name].diagnose())
		}
	}
	// Every target starts from the same page-cache state (pagecache.go).
	var cacheFiles []string
	for _, name := range b.cfg.targets {
		cacheFiles = append(cacheFiles, b.targets[name].files...)
	}
	equalise := func() error {
		// No run pays for the writeback of the one before it.
		if out, err := exec.CommandContext(ctx, "sync").CombinedOutput(); err != nil {
			return fmt.Errorf("sync: %v: %s", err, out)
		}
		if b.cfg.pageCache != cacheDrop {
			return nil
		}
		resident, err := dropFileCaches(cacheFiles)
		if err != nil {
			return fmt.Errorf("dropping the targets' page cache: %w", err)
		}
		rep.PageCacheResident = max(rep.PageCacheResident, resident)
		return nil
	}
	if err := equalise(); err != nil {
		return nil, fmt.Errorf("after the prefill: %w", err)
	}

	// The protocol variants run on the replvol demo in the same rounds as
	// the other targets (protocols.go).
	var proto *protoRun
	if b.cfg.protocols {
		if b.targets[tReplvol] != nil && b.targets[tNbdkit] != nil {
			proto = newProtoRun(b, b.targets[tReplvol])
		} else {
			rep.Protocols = &protocolReport{Skipped: "needs the targets replvol and nbdkit"}
		}
	}
	plan := slices.DeleteFunc(slices.Clone(workloads), func(w workload) bool { return !slices.Contains(b.cfg.workloads, w.Name) })
	if slices.Contains(b.cfg.workloads, latWorkload.Name) && len(b.runTargets(latWorkload, proto != nil)) > 0 {
		plan = append(plan, latWorkload)
	}
	// A row per workload of the plan, a cell per target that runs it
	// (the protocol variants have their own table).
	rows := map[string]*row{}
	for _, w := range plan {
		r := &row{Workload: w.Name, Label: w.Label, Unit: w.Unit, Targets: map[string]*cell{}, Ratios: map[string]float64{}}
		if w.Latency {
			r.Unit = "us p50"
		}
		for _, t := range b.runTargets(w, proto != nil) {
			if !slices.Contains(protoVariants, t) {
				r.Targets[t] = &cell{}
			}
		}
		rows[w.Name] = r
		rep.Rows = append(rep.Rows, r)
	}
	for round := 0; round < b.cfg.rounds; round++ {
		for _, w := range plan {
			names := b.runTargets(w, proto != nil)
			for i := range names {
				// The order rotates per round.
				name := names[(i+round)%len(names)]
				t := b.targets[baseTarget(name)]
				if proto != nil && t == proto.t {
					if err := proto.prepare(ctx, name); err != nil {
						return nil, fmt.Errorf("round %d %s on %s: %w%s", round+1, w.Name, name, err, t.diagnose())
					}
				}
				if t.settle != nil {
					if err := t.settle(ctx); err != nil {
						return nil, fmt.Errorf("round %d %s on %s: %w%s", round+1, w.Name, name, err, t.diagnose())
					}
				}
				if err := equalise(); err != nil {
					return nil, err
				}
				var mon *lagMonitor
				if proto != nil && (name == pA || name == pB) {
					mon = startLagMonitor(ctx, t.control)
				}
				profiled := b.profileNodes(ctx, t, w, round)
				res, err := b.fioOn(ctx, t, w.Name, w.RW, w.BS, w.IODepth, span)
				if perr := <-profiled; perr != nil {
					logf("round %d %s on %s: no profile: %v", round+1, w.Name, name, perr)
				}
				obs := mon.stop()
				if err != nil {
					time.Sleep(200 * time.Millisecond) // let a dying server be reaped
					return nil, fmt.Errorf("round %d %s on %s: %w%s", round+1, w.Name, name, err, t.diagnose())
				}
				if proto != nil && t == proto.t {
					if err := proto.settle(ctx, name); err != nil {
						return nil, fmt.Errorf("round %d %s on %s: after the run: %w%s", round+1, w.Name, name, err, t.diagnose())
					}
				}
				v := w.value(res)
				if r, ok := rows[w.Name]; ok {
					if c, ok := r.Targets[name]; ok {
						c.Samples = append(c.Samples, v)
						c.addCPU(res)
						if w.Latency {
							c.LatP99Samples = append(c.LatP99Samples, res.LatP99)
						}
					}
				}
				if proto != nil {
					proto.record(w, name, res, obs)
				}
				if w.Latency {
					logf("round %d/%d  %-18s %-13s latency p50 %s us, p99 %s us (clat p50 %s, p99 %s)", round+1, b.cfg.rounds, w.Label, name,
						fmtNum(res.LatP50), fmtNum(res.LatP99), fmtNum(res.ClatP50), fmtNum(res.ClatP99))
				} else {
					logf("round %d/%d  %-18s %-13s %10s %s%s", round+1, b.cfg.rounds, w.Label, name, fmtNum(v), w.Unit, obs.String())
				}
			}
		}
	}
	if proto != nil {
		// Back to protocol C, connected, for the resync phase.
		if err := proto.prepare(ctx, tReplvol); err != nil {
			return nil, fmt.Errorf("protocols: back to protocol C: %w%s", err, proto.t.diagnose())
		}
		rep.Protocols = proto.report()
	}
	for _, r := range rep.Rows {
		for _, c := range r.Targets {
			c.Median = median(c.Samples)
			c.settleCPU()
		}
		if rv, ok := r.Targets[tReplvol]; ok {
			for _, ref := range []string{tNbdkit, tQuorum, tReplvolExt} {
				if c, ok := r.Targets[ref]; ok && c.Median > 0 {
					r.Ratios[tReplvol+"/"+ref] = rv.Median / c.Median
				}
			}
			for _, tt := range []string{tReplvolTLS, tReplvolTLSLinks} {
				if c, ok := r.Targets[tt]; ok && rv.Median > 0 {
					r.Ratios[tt+"/"+tReplvol] = c.Median / rv.Median
				}
			}
		}
		if nk, ok := r.Targets[tNbdkit]; ok && nk.Median > 0 {
			if c, ok := r.Targets[tNbdkitTLS]; ok {
				r.Ratios[tNbdkitTLS+"/"+tNbdkit] = c.Median / nk.Median
			}
		}
	}
	for _, g := range goals {
		w := workloads[slices.IndexFunc(workloads, func(w workload) bool { return w.Name == g.Workload })]
		gr := goalResult{Goal: fmt.Sprintf("%s >= %.1fx %s", w.Label, g.Min, g.Versus), Min: g.Min, Status: "n/a"}
		if v, ok := rowRatio(rows, g.Workload, tReplvol+"/"+g.Versus); ok {
			gr.Ratio = &v
			gr.Status = "MISS"
			if v >= g.Min {
				gr.Status = "PASS"
			}
		}
		rep.Goals = append(rep.Goals, gr)
	}
	for _, g := range tlsGoals {
		w := workloads[slices.IndexFunc(workloads, func(w workload) bool { return w.Name == g.Workload })]
		gr := goalResult{Goal: fmt.Sprintf("%s %s >= %.2fx plaintext", w.Label, g.Label, g.Min), Min: g.Min, Status: "n/a"}
		if v, ok := rowRatio(rows, g.Workload, g.Target+"/"+g.Versus); ok {
			gr.Ratio = &v
			gr.Status = "MISS"
			if v >= g.Min {
				gr.Status = "PASS"
			}
		}
		rep.Goals = append(rep.Goals, gr)
	}
	if t, ok := b.targets[tReplvol]; ok && b.cfg.profile {
		if err := equalise(); err != nil {
			return nil, err
		}
		rep.Profile = b.profilePhase(ctx, t, span)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if t, ok := b.targets[tReplvol]; ok {
		r, err := b.resyncPhase(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("resync phase: %w%s", err, t.diagnose())
		}
		rep.Resync = r
	}
	if t, ok := b.targets[tReplvolNodes]; ok && b.cfg.scrub {
		if err := equalise(); err != nil {
			return nil, err
		}
		rep.Scrub = b.scrubPhase(ctx, t)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if b.cfg.fresh || b.cfg.readBalancing || b.cfg.failoverRuns > 0 || b.cfg.idleVolumes > 0 {
		// The fio targets are done: stop them so that they do not share
		// the machine with the clusters measured next.
		for _, t := range b.targets {
			for _, p := range t.procs {
				p.stop()
			}
		}
	}
	if b.cfg.fresh {
		if b.targets[tReplvol] == nil || b.targets[tNbdkit] == nil {
			rep.Fresh = &freshReport{Skipped: "needs the targets replvol and nbdkit"}
		} else {
			fr, err := b.freshPhase(ctx, span)
			if err != nil && ctx.Err() != nil {
				return nil, err
			}
			rep.Fresh = fr // on error, what was measured and fr.Error
		}
	}
	if b.cfg.readBalancing {
		rr, err := b.readBalancePhase(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		rep.ReadBalancing = rr // on error, what was measured and rr.Error
	}
	if b.cfg.failoverRuns > 0 {
		fr, err := b.failoverPhase(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		rep.Failover = fr // on error, what was measured and fr.Error
	}
	if b.cfg.idleVolumes > 0 {
		ir, err := b.idlePhase(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		rep.Idle = ir // on error, what was measured and ir.Error
	}
	return rep, nil
}

// resyncPhase fills the whole replvol volume, runs a full resync of the
// secondary and times it, then times a raw sequential copy of the same
// backing file with direct IO (dd), the reference the goal is set against.
func (b *bench) resyncPhase(ctx context.Context, t *target) (*resyncResult, error) {
	size := b.cfg.size &^ (1<<20 - 1)
	logf("resync: filling all %s of replvol", fmtSize(size))
	if _, err := b.fio(ctx, t.uri, "fillall", "write", "1m", 4, size, fioOnce); err != nil {
		return nil, err
	}
	ctl := func(args ...string) ([]byte, error) { return b.replctlAt(ctx, t, args...) }
	inSync := func() (bool, error) {
		ok, _, err := b.demoInSync(ctx, t)
		return ok, err
	}
	begin := time.Now()
	if out, err := ctl("resync", "vol0"); err != nil {
		return nil, fmt.Errorf("replctl resync: %v: %s", err, out)
	}
	started := false
	for {
		ok, err := inSync()
		if err != nil {
			return nil, err
		}
		if !ok {
			started = true
		} else if started || time.Since(begin) > 5*time.Second {
			break
		}
		if time.Since(begin) > 10*time.Minute {
			return nil, fmt.Errorf("resync did not finish in 10 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resyncSecs := time.Since(begin).Seconds()
	logf("resync: %s in %.2fs", fmtSize(size), resyncSecs)

	dst := filepath.Join(b.tmp, "rawcopy.img")
	begin = time.Now()
	cmd := exec.CommandContext(ctx, "dd", "if="+t.disk, "of="+dst, "bs=1M", fmt.Sprintf("count=%d", size>>20),
		"iflag=direct", "oflag=direct", "conv=notrunc")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dd: %v: %s", err, out)
	}
	copySecs := time.Since(begin).Seconds()
	os.Remove(dst)
	r := &resyncResult{
		Bytes: size, ResyncMBs: float64(size) / 1e6 / resyncSecs, CopyMBs: float64(size) / 1e6 / copySecs,
		CopyMethod: "dd bs=1M iflag=direct oflag=direct",
	}
	r.Ratio = r.ResyncMBs / r.CopyMBs
	r.Status = "MISS"
	if r.Ratio >= 0.8 {
		r.Status = "PASS"
	}
	return r, nil
}

// parseStatus decodes the output of `replctl status --json` (whatever
// precedes its JSON object is skipped).
func parseStatus(out []byte) (*transport.ClusterStatus, error) {
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var st transport.ClusterStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("replctl status --json: %v", err)
	}
	return &st, nil
}

// replctlAt runs replctl ARGS --addr <the demo's control address>.
func (b *bench) replctlAt(ctx context.Context, t *target, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return exec.CommandContext(cctx, b.replctlBin, append(args, "--addr", t.control)...).CombinedOutput()
}

// demoInSync reports whether every replica of the demo is UpToDate,
// Connected, with nothing out of sync and no lag; what says why not.
func (b *bench) demoInSync(ctx context.Context, t *target) (ok bool, what string, err error) {
	out, err := b.replctlAt(ctx, t, "status", "--json")
	if err != nil {
		return false, "", fmt.Errorf("replctl status: %v: %s", err, out)
	}
	st, err := parseStatus(out)
	if err != nil {
		return false, "", err
	}
	if len(st.Volumes) == 0 {
		return false, "no volume in the status", nil
	}
	for _, v := range st.Volumes {
		for _, r := range v.Replicas {
			if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSyncBytes != 0 || r.LagBytes != 0 {
				return false, fmt.Sprintf("%s: disk %s, replication %s, %d bytes out of sync, lag %d bytes",
					r.Node, r.Disk, r.Replication, r.OutOfSyncBytes, r.LagBytes), nil
			}
		}
	}
	return true, "", nil
}

// ---------------------------------------------------------------------------
// targets

func (b *bench) startNbdkit(ctx context.Context, withTLS bool) (*target, error) {
	name, img := tNbdkit, filepath.Join(b.tmp, "plain.img")
	if withTLS {
		name, img = tNbdkitTLS, filepath.Join(b.tmp, "plain-tls.img")
	}
	if err := prealloc(img, b.cfg.size); err != nil {
		return nil, err
	}
	return b.serveNbdkit(ctx, name, img, withTLS)
}

// serveNbdkit serves img with nbdkit's file plugin, as target name.
func (b *bench) serveNbdkit(ctx context.Context, name, img string, withTLS bool) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	argv := []string{"nbdkit", "--exit-with-parent", "-f", "-p", strconv.Itoa(port), "-i", "127.0.0.1"}
	uri := fmt.Sprintf("nbd://127.0.0.1:%d", port)
	if withTLS {
		// The certificates replctl certs init makes: nbdkit serves with
		// a node's, fio comes with the NBD client's.
		dir := filepath.Join(b.tmp, "nbdkit-tls")
		if _, err := pki.Init(dir, []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "nbdkit"}, Hosts: []string{"127.0.0.1", "localhost"}}}, true); err != nil {
			return nil, err
		}
		server := filepath.Join(dir, "server")
		if err := os.MkdirAll(server, 0o700); err != nil {
			return nil, err
		}
		for from, to := range map[string]string{pki.CAFile: "ca-cert.pem", pki.CertFile("nbdkit"): "server-cert.pem", pki.KeyFile("nbdkit"): "server-key.pem"} {
			data, err := os.ReadFile(filepath.Join(dir, from))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(server, to), data, 0o600); err != nil {
				return nil, err
			}
		}
		argv = append(argv, "--tls=require", "--tls-certificates="+server, "--tls-verify-peer")
		uri = fmt.Sprintf("nbds://127.0.0.1:%d/?tls-certificates=%s", port, filepath.Join(dir, pki.NBDClientDir))
	}
	p, err := b.start(name, nil, append(argv, "file", img)...)
	if err != nil {
		return nil, err
	}
	if err := waitNBD(ctx, uri, p, 30*time.Second); err != nil {
		return nil, err
	}
	version := firstLine(ctx, "nbdkit", "--version") + " file plugin"
	if withTLS {
		version += ", --tls=require --tls-verify-peer"
	}
	return &target{name: name, uri: uri, version: version, procs: []*proc{p}, files: []string{img}}, nil
}

func (b *bench) startQuorum(ctx context.Context) (*target, error) {
	local := filepath.Join(b.tmp, "quorum-local.img")
	child := filepath.Join(b.tmp, "quorum-child.img")
	for _, f := range []string{local, child} {
		if err := prealloc(f, b.cfg.size); err != nil {
			return nil, err
		}
	}
	p2, err := freePort()
	if err != nil {
		return nil, err
	}
	pc, err := b.start("nbdkit-quorum-child", nil, "nbdkit", "--exit-with-parent", "-f", "-p", strconv.Itoa(p2), "-i", "127.0.0.1", "file", child)
	if err != nil {
		return nil, err
	}
	if err := waitNBD(ctx, fmt.Sprintf("nbd://127.0.0.1:%d", p2), pc, 30*time.Second); err != nil {
		return nil, err
	}
	q := strings.Join([]string{
		"driver=quorum,vote-threshold=2,read-pattern=fifo",
		"children.0.driver=raw,children.0.file.driver=file,children.0.file.filename=" + local,
		"children.1.driver=raw,children.1.file.driver=nbd,children.1.file.server.type=inet",
		"children.1.file.server.host=127.0.0.1,children.1.file.server.port=" + strconv.Itoa(p2),
	}, ",")
	p3, err := freePort()
	if err != nil {
		return nil, err
	}
	pq, err := b.start("qemu-nbd", nil, "qemu-nbd", "-b", "127.0.0.1", "-p", strconv.Itoa(p3), "-t",
		"--cache=writeback", "--aio=threads", "--image-opts", q)
	if err != nil {
		return nil, err
	}
	uri := fmt.Sprintf("nbd://127.0.0.1:%d", p3)
	if err := waitNBD(ctx, uri, pq, 30*time.Second); err != nil {
		return nil, err
	}
	return &target{name: tQuorum, uri: uri, version: firstLine(ctx, "qemu-nbd", "--version") + " quorum(file, nbd->nbdkit)", procs: []*proc{pc, pq},
		files: []string{local, child}}, nil
}

func (b *bench) startReplvol(ctx context.Context, md string, extra ...string) (*target, error) {
	bin := b.cfg.replctl
	if bin == "" && b.replctlBin != "" {
		bin = b.replctlBin
	}
	if bin == "" {
		root, err := moduleRoot(ctx)
		if err != nil {
			return nil, err
		}
		bin = filepath.Join(b.tmp, "bin", "replctl")
		logf("building ./cmd/replctl")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/replctl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/replctl: %v\n%s", err, out)
		}
	}
	b.replctlBin = bin
	return b.startDemo(ctx, filepath.Join(b.tmp, "demo-"+md+strings.Join(extra, "")), md, extra...)
}

// startDemo runs `replctl demo` in dir (its disks are sparse files there)
// and waits until it serves.
func (b *bench) startDemo(ctx context.Context, dir, md string, extra ...string) (*target, error) {
	bin := b.replctlBin
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lines := make(chan string, 64)
	p, err := b.start("replvol-"+filepath.Base(dir), lines, append([]string{bin, "demo", "--dir", dir, "--base-port", "0", "--size", fmtSize(b.cfg.size), "--metadata", md}, extra...)...)
	if err != nil {
		return nil, err
	}
	uri, control := "", ""
	deadline := time.NewTimer(90 * time.Second)
	defer deadline.Stop()
	for ready := false; !ready; {
		select {
		case l, ok := <-lines:
			if !ok {
				return nil, fmt.Errorf("demo exited before ready (%v); log: %s", p.exitErr(), p.log)
			}
			l = strings.TrimSpace(l)
			switch {
			case (strings.HasPrefix(l, "nbd://") || strings.HasPrefix(l, "nbds://")) && uri == "":
				uri = strings.Fields(l)[0]
			case strings.HasPrefix(l, "node alpha: control "):
				control = strings.Fields(l)[3]
			case l == "ready":
				ready = true
			}
		case <-deadline.C:
			return nil, fmt.Errorf("demo not ready after 90s; log: %s", p.log)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if uri == "" {
		return nil, fmt.Errorf("demo printed ready but no nbd:// line; log: %s", p.log)
	}
	if err := waitNBD(ctx, uri, p, 30*time.Second); err != nil {
		return nil, err
	}
	ver := ""
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if v := firstLine(ctx, bin, args...); v != "" && !strings.Contains(strings.ToLower(v), "unknown") && !strings.Contains(v, "Error") {
			ver = v
			break
		}
	}
	if ver == "" {
		ver = "replvol (dev build, " + runtime.Version() + ")"
	}
	name := tReplvol
	switch {
	case slices.Contains(extra, "--nbd-tls"):
		name = tReplvolTLSLinks
	case slices.Contains(extra, "--tls"):
		name = tReplvolTLS
	case md == "external":
		name = tReplvolExt
	}
	return &target{name: name, uri: uri, version: ver + " demo, " + md + " metadata, primary " + uri, procs: []*proc{p},
		control: control, disk: filepath.Join(dir, "alpha", "vol0.img"), files: []string{dir}}, nil
}

// ---------------------------------------------------------------------------
// processes

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) exitErr() error {
	if p.exited() {
		if p.err == nil {
			return errors.New("exit status 0")
		}
		return p.err
	}
	return nil
}

// start runs a server in its own process group with its output in a log
// file. When lines is non-nil, stdout is also sent line by line to it (and
// the channel is closed at EOF).
func (b *bench) start(name string, lines chan<- string, argv ...string) (*proc, error) {
	logPath := filepath.Join(b.tmp, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = nil
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdout io.ReadCloser
	if lines != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			lf.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = lf
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	var copied sync.WaitGroup
	if lines != nil {
		copied.Add(1)
		go func() {
			defer copied.Done()
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				fmt.Fprintln(lf, sc.Text())
				select {
				case lines <- sc.Text():
				default: // nobody listens any more; keep draining
				}
			}
		}()
	}
	go func() {
		copied.Wait()
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after 10 s.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		logf("%s did not stop after SIGTERM; killing", p.name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (b *bench) cleanup() {
	b.mu.Lock()
	procs := slices.Clone(b.procs)
	b.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}
	if b.tmp == "" {
		return
	}
	if b.cfg.keepLogs {
		_ = filepath.Walk(b.tmp, func(path string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && !strings.HasSuffix(path, ".log") {
				os.Remove(path)
			}
			return nil
		})
		logf("logs kept in %s", b.tmp)
		return
	}
	if err := os.RemoveAll(b.tmp); err != nil {
		logf("cleanup: %v", err)
	}
}

// ---------------------------------------------------------------------------
// fio

type fioResult struct {
	IOPS float64
	BW   float64 // bytes/s
	// LatP50 and LatP99 are percentiles of the latency from submission
	// to completion (fio's lat_ns), in microseconds. ClatP50 and ClatP99
	// are fio's completion-latency (clat_ns) percentiles: with the nbd
	// engine the request often goes out, and sometimes its reply comes
	// back, before fio stamps the issue time, so clat moves between runs
	// that lat does not (identical qd1 runs: clat p50 105 vs 140 us, lat
	// p50 152 vs 155 us), and can be a few microseconds.
	LatP50, LatP99   float64
	ClatP50, ClatP99 float64
	// ClientCPU is the CPU time fio itself used, start to exit.
	ClientCPU time.Duration
	// Procs is what each server process spent per IO over a timed run
	// (fioOn); nil where not measured.
	Procs []procCost
	// ServerCPUPerIO and ClientCPUPerIO are the CPU time per IO, in
	// microseconds, of the target's server processes and of fio, over a
	// timed run (fioOn); 0 where not measured.
	ServerCPUPerIO, ClientCPUPerIO float64
}

// fioMode is how long a fio run lasts.
type fioMode int

const (
	// fioOnce goes over the span once, however long that takes.
	fioOnce fioMode = iota
	// fioTimed loops over the span for ramp + runtime (time_based).
	fioTimed
	// fioCapped goes over the span at most once: it stops after ramp +
	// runtime or at the end of the span, whichever comes first (a
	// sequential read that never reads a block twice).
	fioCapped
)

func (b *bench) fio(ctx context.Context, uri, name, rw, bs string, qd int, span int64, mode fioMode) (*fioResult, error) {
	uri, cl, err := b.fioClient(uri)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(cl.dir, "fio-"+name+".json")
	args := []string{
		"--name=" + name, "--ioengine=nbd", "--uri=" + uri,
		"--rw=" + rw, "--bs=" + bs, "--iodepth=" + strconv.Itoa(qd),
		"--size=" + strconv.FormatInt(span, 10),
		"--lat_percentiles=1",
		"--output-format=json", "--output=" + out,
	}
	switch mode {
	case fioTimed:
		args = append(args, "--time_based")
		fallthrough
	case fioCapped:
		args = append(args,
			"--runtime="+strconv.Itoa(int(b.cfg.runtime.Seconds())),
			"--ramp_time="+strconv.Itoa(int(b.cfg.ramp.Seconds())))
	}
	cmd := exec.CommandContext(ctx, cl.argv[0], append(cl.argv[1:], args...)...)
	cmd.Env = cl.env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	combined, err := cmd.CombinedOutput()
	defer os.Remove(out)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("fio: %v: %s", err, strings.TrimSpace(string(combined)))
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	// fio may print notices ("fio: connected to NBD server") before the JSON.
	if i := strings.IndexByte(string(data), '{'); i > 0 {
		data = data[i:]
	}
	type pcts struct {
		Percentile map[string]float64 `json:"percentile"`
	}
	type dir struct {
		IOPS float64 `json:"iops"`
		BW   float64 `json:"bw_bytes"`
		Clat pcts    `json:"clat_ns"`
		Lat  pcts    `json:"lat_ns"`
	}
	var j struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  dir `json:"read"`
			Write dir `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("fio json: %w", err)
	}
	if len(j.Jobs) != 1 {
		return nil, fmt.Errorf("fio: %d jobs in output", len(j.Jobs))
	}
	jb := j.Jobs[0]
	if jb.Error != 0 {
		return nil, fmt.Errorf("fio job error %d: %s", jb.Error, strings.TrimSpace(string(combined)))
	}
	d := jb.Write
	if strings.Contains(rw, "read") {
		d = jb.Read
	}
	// fio's default percentile list holds 50 and 99, keyed "50.000000".
	pct := func(ps pcts, p float64) float64 {
		for k, v := range ps.Percentile {
			if f, err := strconv.ParseFloat(k, 64); err == nil && f == p {
				return v / 1e3
			}
		}
		return 0
	}
	return &fioResult{IOPS: d.IOPS, BW: d.BW,
		LatP50: pct(d.Lat, 50), LatP99: pct(d.Lat, 99), ClatP50: pct(d.Clat, 50), ClatP99: pct(d.Clat, 99),
		ClientCPU: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}, nil
}

// ---------------------------------------------------------------------------
// helpers

// benchStart is when the run began: log lines carry the time since.
var benchStart = time.Now()

func logf(format string, args ...any) {
	el := time.Since(benchStart).Truncate(time.Second)
	fmt.Fprintf(os.Stderr, "replbench: [%02d:%02d] "+format+"\n", append([]any{int(el.Minutes()), int(el.Seconds()) % 60}, args...)...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitNBD polls nbdinfo until the server answers, the process exits or the
// timeout passes.
func waitNBD(ctx context.Context, uri string, p *proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last []byte
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := exec.CommandContext(cctx, "nbdinfo", "--size", uri).CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
		last = out
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.exited() {
			return fmt.Errorf("%s exited (%v) before serving %s; log: %s", p.name, p.exitErr(), uri, p.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not serving %s after %s: %s", p.name, uri, timeout, strings.TrimSpace(string(last)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fioClient is how fio reaches an export: the URI to give it, the command
// that runs it, its environment (nil: this process's) and the directory
// it writes its results to.
type fioClient struct {
	argv []string
	env  []string
	dir  string
}

// fioClient returns how fio reaches uri. fio's nbd engine does not let
// libnbd read local files named in a URI, so an nbds:// URI's
// tls-certificates become libnbd's default directory: $HOME/.pki/libnbd
// for a user other than root (root's is /etc/pki/libnbd, which a bench
// must not touch), so as root fio runs as nobody (setpriv), with a home
// of its own holding a copy of the certificates.
func (b *bench) fioClient(uri string) (string, fioClient, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fioClient{}, err
	}
	certs := u.Query().Get("tls-certificates")
	if certs == "" {
		return uri, fioClient{argv: []string{"fio"}, dir: b.tmp}, nil
	}
	home := filepath.Join(b.tmp, "home-"+strings.NewReplacer(":", "-", "/", "-").Replace(u.Host))
	pkiDir := filepath.Join(home, ".pki", "libnbd")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return "", fioClient{}, err
	}
	for _, f := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
		data, err := os.ReadFile(filepath.Join(certs, f))
		if err != nil {
			return "", fioClient{}, err
		}
		if err := os.WriteFile(filepath.Join(pkiDir, f), data, 0o600); err != nil {
			return "", fioClient{}, err
		}
	}
	cl := fioClient{argv: []string{"fio"}, env: append(os.Environ(), "HOME="+home), dir: home}
	if os.Geteuid() == 0 {
		const nobody = 65534
		if err := os.Chmod(b.tmp, 0o711); err != nil { // nobody passes through to its home
			return "", fioClient{}, err
		}
		for _, d := range []string{home, filepath.Join(home, ".pki"), pkiDir, filepath.Join(pkiDir, "ca-cert.pem"), filepath.Join(pkiDir, "client-cert.pem"), filepath.Join(pkiDir, "client-key.pem")} {
			if err := os.Chown(d, nobody, nobody); err != nil {
				return "", fioClient{}, err
			}
		}
		cl.argv = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "fio"}
	}
	u.RawQuery = ""
	return u.String(), cl, nil
}

func exportSize(ctx context.Context, uri string) (int64, error) {
	out, err := exec.CommandContext(ctx, "nbdinfo", "--size", uri).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("nbdinfo --size %s: %v: %s", uri, err, out)
	}
	return strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
}

func firstLine(ctx context.Context, name string, args ...string) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, name, args...).Output()
	if err != nil {
		return ""
	}
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(l)
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the replvol module: run from the repository or pass --replctl")
	}
	return filepath.Dir(mod), nil
}

// prealloc creates a file of the given size with its blocks allocated.
func prealloc(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if err := f.Truncate(size); err != nil {
			return err
		}
	}
	return f.Close()
}

func fmtSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return strconv.FormatInt(n, 10)
}
