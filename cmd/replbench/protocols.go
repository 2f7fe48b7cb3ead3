package main

// The protocols table (issue 10): replvol's demo under protocols A, B and
// C and with its peer disconnected (local-only), run in the same rounds as
// the main table, so each figure has an nbdkit figure from the same
// rounds beside it.
//
//   - C is the main table's replvol column (the demo's protocol); A and B
//     are the same demo after `replctl adjust vol0 --protocol A
//     --on-congestion pull-ahead` (A's default policy) and `--protocol B
//     --on-congestion block`.
//   - local-only is the demo after `replctl disconnect vol0 --node beta`:
//     every write goes to alpha's disk and marks the bitmap. After the run
//     `replctl connect vol0 --node beta` resyncs what changed.
//   - After every run on the demo the next waits until both replicas are
//     UpToDate, Connected, with nothing out of sync and no lag, so that
//     no run pays for the catch-up of the one before it.
//   - During the A and B runs the primary's /api/node is polled every
//     250 ms for the peer's lag and for Ahead (A's pull-ahead): an A run
//     that went Ahead ran partly unreplicated, and the table says so.
//
// Workloads: 8K random write qd16 and 1M sequential write qd4 (as ratios
// to nbdkit), and 8K random write qd1 for the latency of a write from
// submission to completion (fio's lat percentiles p50 and p99; clat is in
// the JSON too, see fioResult), reported as added over local-only.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport"
)

// The protocol variants of the replvol demo, as run targets.
const (
	pA     = "replvol-A"
	pB     = "replvol-B"
	pLocal = "replvol-local"
)

var protoVariants = []string{pA, pB, pLocal}

// baseTarget is the target a run name runs on.
func baseTarget(name string) string {
	if slices.Contains(protoVariants, name) {
		return tReplvol
	}
	return name
}

// protoGoalMin: protocol A's 8K random write >= this x nbdkit.
const protoGoalMin = 0.8

// protoRows are the table's rows: the run name and its label.
var protoRows = []struct{ name, label string }{
	{tNbdkit, "nbdkit"},
	{pLocal, "local-only"},
	{pA, "A"},
	{pB, "B"},
	{tReplvol, "C"},
}

// protoSettleTimeout bounds the wait for the demo to be in sync after a
// run (a catch-up after Ahead, the resync after local-only).
const protoSettleTimeout = 5 * time.Minute

type protoRun struct {
	b *bench
	t *target
	// What the demo runs now.
	protocol     string
	disconnected bool
	// cells[workload][run name]
	cells map[string]map[string]*protoCell
}

type protoCell struct {
	values, p50, p99, clat50, clat99 []float64
	cpu                              cell // CPU per IO samples
	monitored, ahead                 int
	maxLag                           int64
}

func newProtoRun(b *bench, t *target) *protoRun {
	return &protoRun{b: b, t: t, protocol: "C", cells: map[string]map[string]*protoCell{}}
}

// prepare puts the demo in the state the run name measures.
func (p *protoRun) prepare(ctx context.Context, name string) error {
	want := "C"
	switch name {
	case pA:
		want = "A"
	case pB:
		want = "B"
	}
	if want != p.protocol {
		policy := "block"
		if want == "A" {
			policy = "pull-ahead" // A's default
		}
		if out, err := p.b.replctlAt(ctx, p.t, "adjust", "vol0", "--protocol", want, "--on-congestion", policy); err != nil {
			return fmt.Errorf("replctl adjust vol0 --protocol %s --on-congestion %s: %v: %s", want, policy, err, strings.TrimSpace(string(out)))
		}
		p.protocol = want
	}
	if name == pLocal && !p.disconnected {
		if out, err := p.b.replctlAt(ctx, p.t, "disconnect", "vol0", "--node", "beta"); err != nil {
			return fmt.Errorf("replctl disconnect vol0 --node beta: %v: %s", err, strings.TrimSpace(string(out)))
		}
		p.disconnected = true
	}
	if name != pLocal && p.disconnected {
		return p.settle(ctx, name)
	}
	return nil
}

// settle reconnects the peer after local-only and waits until the demo is
// in sync.
func (p *protoRun) settle(ctx context.Context, name string) error {
	if p.disconnected {
		if out, err := p.b.replctlAt(ctx, p.t, "connect", "vol0", "--node", "beta"); err != nil {
			return fmt.Errorf("replctl connect vol0 --node beta: %v: %s", err, strings.TrimSpace(string(out)))
		}
		p.disconnected = false
	}
	begin := time.Now()
	for {
		ok, what, err := p.b.demoInSync(ctx, p.t)
		if err != nil {
			return err
		}
		if ok {
			if d := time.Since(begin); d > 2*time.Second {
				logf("%s: in sync again after %s", name, d.Round(100*time.Millisecond))
			}
			return nil
		}
		if time.Since(begin) > protoSettleTimeout {
			return fmt.Errorf("not in sync %s after the run: %s", protoSettleTimeout, what)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// record keeps a run's figures for the table.
func (p *protoRun) record(w workload, name string, r *fioResult, obs lagObs) {
	if !w.Proto && !w.Latency {
		return
	}
	if !slices.ContainsFunc(protoRows, func(row struct{ name, label string }) bool { return row.name == name }) {
		return
	}
	m := p.cells[w.Name]
	if m == nil {
		m = map[string]*protoCell{}
		p.cells[w.Name] = m
	}
	c := m[name]
	if c == nil {
		c = &protoCell{}
		m[name] = c
	}
	c.values = append(c.values, w.value(r))
	c.cpu.addCPU(r)
	c.p50 = append(c.p50, r.LatP50)
	c.p99 = append(c.p99, r.LatP99)
	c.clat50 = append(c.clat50, r.ClatP50)
	c.clat99 = append(c.clat99, r.ClatP99)
	if obs.samples > 0 {
		c.monitored++
		if obs.ahead {
			c.ahead++
		}
		c.maxLag = max(c.maxLag, obs.maxLag)
	}
}

// ---------------------------------------------------------------------------
// report

type protocolReport struct {
	Setup string         `json:"setup,omitempty"`
	Rows  []*protocolRow `json:"rows,omitempty"`
	Goal  string         `json:"goal,omitempty"`
	// Ratio is protocol A's 8K random write over nbdkit's.
	Ratio  *float64 `json:"ratio,omitempty"`
	Status string   `json:"status,omitempty"` // PASS, MISS or n/a
	// Skipped says why the variants did not run.
	Skipped string `json:"skipped,omitempty"`
}

type protocolRow struct {
	Name string `json:"name"` // nbdkit, local-only, A, B, C
	// 8K random write qd16 (IOPS) and 1M sequential write qd4 (MB/s),
	// and each over nbdkit's (medians).
	RandWrite      *cell    `json:"randwrite_8k_qd16_iops,omitempty"`
	RandWriteRatio *float64 `json:"randwrite_8k_qd16_vs_nbdkit,omitempty"`
	SeqWrite       *cell    `json:"seqwrite_1m_qd4_mb_s,omitempty"`
	SeqWriteRatio  *float64 `json:"seqwrite_1m_qd4_vs_nbdkit,omitempty"`
	// 8K random write qd1: latency from submission to completion, p50
	// and p99 (median over the rounds), microseconds, and what each adds
	// over local-only; fio's clat percentiles beside them.
	LatP50      *cell    `json:"lat_p50_us,omitempty"`
	LatP99      *cell    `json:"lat_p99_us,omitempty"`
	AddedP50    *float64 `json:"added_p50_us,omitempty"`
	AddedP99    *float64 `json:"added_p99_us,omitempty"`
	ClatP50     *cell    `json:"clat_p50_us,omitempty"`
	ClatP99     *cell    `json:"clat_p99_us,omitempty"`
	Monitored   int      `json:"monitored_runs,omitempty"`
	AheadRuns   int      `json:"ahead_runs,omitempty"`    // runs in which the peer was seen Ahead (A's pull-ahead)
	MaxLagBytes int64    `json:"max_lag_bytes,omitempty"` // the largest lag seen in any run
}

func mkCell(xs []float64) *cell {
	if len(xs) == 0 {
		return nil
	}
	return &cell{Median: median(xs), Samples: xs}
}

func ratioOf(a, b *cell) *float64 {
	if a == nil || b == nil || b.Median <= 0 {
		return nil
	}
	v := a.Median / b.Median
	return &v
}

func (p *protoRun) report() *protocolReport {
	rep := &protocolReport{
		Setup: "the replvol demo (alpha primary, beta; internal metadata) in the rounds above; A with on_congestion pull-ahead (its default), " +
			"B and C block; local-only: beta disconnected (replctl disconnect vol0 --node beta), every write goes to alpha's disk and bitmap",
		Goal:   fmt.Sprintf("A: 8K random write >= %.1fx nbdkit", protoGoalMin),
		Status: "n/a",
	}
	get := func(w, name string) *protoCell {
		if m := p.cells[w]; m != nil {
			return m[name]
		}
		return nil
	}
	vals := func(w, name string, pick func(*protoCell) []float64) *cell {
		if c := get(w, name); c != nil {
			return mkCell(pick(c))
		}
		return nil
	}
	p50 := func(c *protoCell) []float64 { return c.p50 }
	p99 := func(c *protoCell) []float64 { return c.p99 }
	clat50 := func(c *protoCell) []float64 { return c.clat50 }
	clat99 := func(c *protoCell) []float64 { return c.clat99 }
	// The write cells carry the CPU per IO of their runs.
	writes := func(w, name string) *cell {
		if c := get(w, name); c != nil {
			return withCPU(mkCell(c.values), &c.cpu)
		}
		return nil
	}
	nbdRand := writes("randwrite-8k", tNbdkit)
	nbdSeq := writes("seqwrite-1m", tNbdkit)
	localP50 := vals(latWorkload.Name, pLocal, p50)
	localP99 := vals(latWorkload.Name, pLocal, p99)
	for _, pr := range protoRows {
		row := &protocolRow{Name: pr.label}
		row.RandWrite = writes("randwrite-8k", pr.name)
		row.SeqWrite = writes("seqwrite-1m", pr.name)
		if pr.name != tNbdkit {
			row.RandWriteRatio = ratioOf(row.RandWrite, nbdRand)
			row.SeqWriteRatio = ratioOf(row.SeqWrite, nbdSeq)
		}
		row.LatP50 = vals(latWorkload.Name, pr.name, p50)
		row.LatP99 = vals(latWorkload.Name, pr.name, p99)
		row.ClatP50 = vals(latWorkload.Name, pr.name, clat50)
		row.ClatP99 = vals(latWorkload.Name, pr.name, clat99)
		if pr.name != pLocal && row.LatP50 != nil && localP50 != nil {
			a, b := row.LatP50.Median-localP50.Median, row.LatP99.Median-localP99.Median
			row.AddedP50, row.AddedP99 = &a, &b
		}
		for _, w := range []string{"randwrite-8k", "seqwrite-1m", latWorkload.Name} {
			if c := get(w, pr.name); c != nil {
				row.Monitored += c.monitored
				row.AheadRuns += c.ahead
				row.MaxLagBytes = max(row.MaxLagBytes, c.maxLag)
			}
		}
		rep.Rows = append(rep.Rows, row)
		if pr.name == pA && row.RandWriteRatio != nil {
			rep.Ratio = row.RandWriteRatio
			rep.Status = "MISS"
			if *rep.Ratio >= protoGoalMin {
				rep.Status = "PASS"
			}
		}
	}
	return rep
}

func printProtocols(w io.Writer, r *protocolReport) {
	if r.Skipped != "" {
		fmt.Fprintf(w, "protocols: skipped (%s)\n", r.Skipped)
		return
	}
	fmt.Fprintf(w, "protocols: %s\n", r.Setup)
	fmt.Fprintln(w, "  median per cell; /nbdkit: over nbdkit's in the same rounds; latency: 8K randwrite qd1, submission to completion, us; added: over local-only;")
	fmt.Fprintln(w, "  Ahead: runs in which the peer was seen Ahead (of the A or B runs); max lag: the largest lag_bytes seen")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "replvol\t8K randwrite qd16 IOPS\t/nbdkit\t1M seqwrite qd4 MB/s\t/nbdkit\tlatency p50\tp99\tadded p50\tadded p99\tAhead\tmax lag\t\n")
	num := func(c *cell) string {
		if c == nil {
			return "-"
		}
		return fmtNum(c.Median)
	}
	ratio := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.2fx", *v)
	}
	added := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%+.0f", *v)
	}
	for _, row := range r.Rows {
		ahead, lag := "", ""
		if row.Monitored > 0 {
			ahead = fmt.Sprintf("%d/%d", row.AheadRuns, row.Monitored)
			lag = fmtBytes(row.MaxLagBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Name,
			num(row.RandWrite), ratio(row.RandWriteRatio), num(row.SeqWrite), ratio(row.SeqWriteRatio),
			num(row.LatP50), num(row.LatP99), added(row.AddedP50), added(row.AddedP99), ahead, lag)
	}
	tw.Flush()
	got := "-"
	if r.Ratio != nil {
		got = fmt.Sprintf("%.2fx", *r.Ratio)
	}
	fmt.Fprintf(w, "  goal: %-34s %7s  %s\n", r.Goal, got, r.Status)
	for _, row := range r.Rows {
		if row.AheadRuns > 0 {
			fmt.Fprintf(w, "  note: %s went Ahead (pull-ahead: writes marked, not shipped, then resynced) in %d of its %d runs: those ran partly unreplicated\n",
				row.Name, row.AheadRuns, row.Monitored)
		}
	}
}

// fmtBytes prints a byte count in binary units.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// ---------------------------------------------------------------------------
// lag monitor

// lagObs is what a lag monitor saw during one run.
type lagObs struct {
	samples int
	ahead   bool  // a peer was Ahead (or the volume's replication was)
	maxLag  int64 // the largest lag_bytes of any peer
}

// String is the note a run's log line gets ("" when nothing was seen).
func (o lagObs) String() string {
	if o.samples == 0 {
		return ""
	}
	s := "  max lag " + fmtBytes(o.maxLag)
	if o.ahead {
		s += ", went Ahead"
	}
	return s
}

type lagMonitor struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     lockorder.Mutex
	obs    lagObs
}

// startLagMonitor polls the node's /api/node at control every 250 ms.
func startLagMonitor(ctx context.Context, control string) *lagMonitor {
	ctx, cancel := context.WithCancel(ctx)
	m := &lagMonitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = m.poll(ctx, control) // only answers count
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

func (m *lagMonitor) poll(ctx context.Context, control string) error {
	var st transport.NodeStatus
	if err := getNodeView(ctx, control, 2*time.Second, &st); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.obs.samples++
	for _, v := range st.Volumes {
		if v.Replication == "Ahead" {
			m.obs.ahead = true
		}
		for _, p := range v.Peers {
			if p.Replication == "Ahead" || p.Replication == "Behind" {
				m.obs.ahead = true
			}
			m.obs.maxLag = max(m.obs.maxLag, p.LagBytes)
		}
	}
	return nil
}

// stop ends the monitor and returns what it saw; a nil monitor saw
// nothing.
func (m *lagMonitor) stop() lagObs {
	if m == nil {
		return lagObs{}
	}
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.obs
}
