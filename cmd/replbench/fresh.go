package main

// The fresh sparse-volume phase (issue 19): 8K random writes at qd16 into
// volumes nothing has written yet, where every write allocates blocks. Each
// round starts a new replvol demo (its disks sparse files: replctl demo
// truncates them) and a new nbdkit file plugin on a sparse file of the same
// size, runs the workload once on each (the order alternates per round)
// over the span, then stops both and removes their files. Nothing is
// prefilled, so the page cache holds nothing of either file at the start.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

type freshReport struct {
	Setup   string   `json:"setup,omitempty"`
	Replvol *cell    `json:"replvol_iops,omitempty"`
	Nbdkit  *cell    `json:"nbdkit_iops,omitempty"`
	Ratio   *float64 `json:"ratio,omitempty"` // replvol's median over nbdkit's
	Skipped string   `json:"skipped,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func (b *bench) freshPhase(ctx context.Context, span int64) (rep *freshReport, err error) {
	w := workloads[0] // 8K randwrite qd16
	rep = &freshReport{Setup: fmt.Sprintf("%s into a new %s volume per round: a fresh replvol demo (sparse disks, protocol C) and nbdkit on a fresh sparse file; over %s, one run each per round",
		w.Label, fmtSize(b.cfg.size), fmtSize(span))}
	var rv, nk []float64
	var rvCPU, nkCPU cell
	defer func() {
		rep.Replvol, rep.Nbdkit = withCPU(mkCell(rv), &rvCPU), withCPU(mkCell(nk), &nkCPU)
		rep.Ratio = ratioOf(rep.Replvol, rep.Nbdkit)
		if err != nil {
			rep.Error = err.Error()
		}
	}()
	for round := 0; round < b.cfg.rounds; round++ {
		dir := filepath.Join(b.tmp, "fresh-"+strconv.Itoa(round+1))
		img := filepath.Join(b.tmp, "fresh-"+strconv.Itoa(round+1)+".img")
		f, err := os.Create(img)
		if err == nil {
			err = f.Truncate(b.cfg.size) // sparse, like the demo's disks
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return rep, err
		}
		logf("fresh: round %d/%d: starting a fresh replvol demo and nbdkit on a sparse file", round+1, b.cfg.rounds)
		demo, err := b.startDemo(ctx, dir, "internal")
		if err != nil {
			return rep, fmt.Errorf("fresh replvol demo: %w", err)
		}
		plain, err := b.serveNbdkit(ctx, "nbdkit-"+filepath.Base(img), img, false)
		if err != nil {
			return rep, fmt.Errorf("fresh nbdkit: %w", err)
		}
		runs := []*target{demo, plain}
		if round%2 == 1 {
			runs = []*target{plain, demo}
		}
		for _, t := range runs {
			res, err := b.fioOn(ctx, t, "fresh-"+w.Name, w.RW, w.BS, w.IODepth, span)
			if err != nil {
				return rep, fmt.Errorf("round %d on %s: %w%s", round+1, t.name, err, t.diagnose())
			}
			v := w.value(res)
			if t == demo {
				rv = append(rv, v)
				rvCPU.addCPU(res)
			} else {
				nk = append(nk, v)
				nkCPU.addCPU(res)
			}
			logf("fresh: round %d/%d  %-18s %-13s %10s %s", round+1, b.cfg.rounds, w.Label, t.name, fmtNum(v), w.Unit)
		}
		for _, t := range runs {
			for _, p := range t.procs {
				p.stop()
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return rep, err
		}
		if err := os.Remove(img); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func printFresh(w io.Writer, r *freshReport) {
	if r.Skipped != "" {
		fmt.Fprintf(w, "fresh sparse volume: skipped (%s)\n", r.Skipped)
		return
	}
	fmt.Fprintf(w, "fresh sparse volume: %s\n", r.Setup)
	samples := func(c *cell) string {
		if c == nil {
			return "-"
		}
		var xs []string
		for _, x := range c.Samples {
			xs = append(xs, fmtNum(x))
		}
		return fmtNum(c.Median) + " IOPS (runs " + strings.Join(xs, " ") + ")"
	}
	fmt.Fprintf(w, "  replvol %s; nbdkit %s", samples(r.Replvol), samples(r.Nbdkit))
	if r.Ratio != nil {
		fmt.Fprintf(w, "; replvol/nbdkit %.2fx", *r.Ratio)
	}
	fmt.Fprintln(w)
	if r.Error != "" {
		fmt.Fprintf(w, "  phase failed: %s\n", r.Error)
	}
}
