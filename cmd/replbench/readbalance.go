package main

// The read-balancing phase (issue 10): two UpToDate replicas whose disks
// are throttled, read through the primary with volumes[].read_balancing
// prefer-local (one replica: every read on alpha's disk) and round-robin
// (reads alternate between alpha's disk and beta's).
//
//   - replnode processes alpha (primary) and beta on 127.0.0.1, no raft,
//     protocol C, a --span sized volume (internal metadata).
//   - Each node's backing file is behind its own loop device, and each
//     replnode in its own cgroup capping its reads of that device at
//     --read-throttle bytes/s (cgroup v2 io.max rbps, else v1
//     blkio.throttle.read_bps_device; throttle.go). Without root, losetup
//     or either controller the phase runs on plain files, unthrottled,
//     and says so.
//   - The volume is filled through NBD first, before the cgroups apply.
//   - Each run: the devices' page cache dropped (BLKFLSBUF), then fio 1M
//     sequential reads at qd8 through alpha's NBD export, over the
//     volume at most once (ramp + runtime, or the end of the volume), so
//     no block is read twice. The cgroups' io stats give what each disk
//     served.
//   - The policy changes by a restart of both nodes with the config's
//     read_balancing changed (no online switch exists).

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/replvol/replvol/transport"
	"golang.org/x/sys/unix"
)

const rbGoalMin = 1.5

var rbPolicies = []string{"prefer-local", "round-robin"}

type readBalanceReport struct {
	Setup string `json:"setup"`
	// Throttle is how each node's disk is throttled, or "none: why".
	Throttle  string      `json:"throttle"`
	Throttled bool        `json:"throttled"`
	Policies  []*rbPolicy `json:"policies"`
	// Ratio is round-robin's median over prefer-local's.
	Ratio  *float64 `json:"ratio,omitempty"`
	Goal   string   `json:"goal"`
	Status string   `json:"status"` // PASS, MISS, n/a
	Notes  []string `json:"notes,omitempty"`
	Error  string   `json:"error,omitempty"`
}

type rbPolicy struct {
	Policy string `json:"policy"`
	MBs    *cell  `json:"mb_s"`
	// DiskReadMB is what each node's disk served over the policy's runs
	// (the cgroups' io stats; absent unthrottled).
	DiskReadMB map[string]float64 `json:"disk_read_mb,omitempty"`
}

// rbEnv is what the phase set up, for teardown.
type rbEnv struct {
	c     *fvCluster
	files map[string]string   // node -> backing file
	loops map[string]*loopDev // node -> its loop device (throttled only)
	thr   *ioThrottle
}

// teardown stops the nodes, then removes the cgroups, the loop devices
// and the backing files. It may run more than once.
func (e *rbEnv) teardown() {
	e.c.stopAll()
	e.thr.remove()
	e.thr = nil
	for name, l := range e.loops {
		l.detach()
		delete(e.loops, name)
	}
	for _, f := range e.files {
		os.Remove(f)
	}
}

// dropCaches writes back and drops what the page cache holds of each
// node's disk, so that every read of the next run reaches the disk.
func (e *rbEnv) dropCaches() error {
	if len(e.loops) > 0 {
		for _, l := range e.loops {
			if err := l.dropCache(); err != nil {
				return err
			}
		}
		return nil
	}
	for _, file := range e.files {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		err = unix.Fdatasync(int(f.Fd()))
		if err == nil {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: drop cache: %w", file, err)
		}
	}
	return nil
}

// joinCgroups moves the data nodes' replnode processes into their cgroups.
func (e *rbEnv) joinCgroups() error {
	if e.thr == nil {
		return nil
	}
	for _, name := range fvDataNodes {
		if err := e.thr.join(name, e.c.nodes[name].proc.cmd.Process.Pid); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) readBalancePhase(ctx context.Context) (rep *readBalanceReport, err error) {
	size := min(b.cfg.span, b.cfg.size) &^ (1<<20 - 1)
	size = max(size, 64<<20)
	rep = &readBalanceReport{
		Setup: fmt.Sprintf("replnode processes alpha (primary) and beta on 127.0.0.1, protocol C, a %s volume filled first; "+
			"fio 1M sequential reads at qd8 through alpha's NBD export, page cache dropped before each run and no block read twice in a run; median of %d runs per policy",
			fmtSize(size), b.cfg.rounds),
		Goal:   fmt.Sprintf("round-robin >= %.1fx one replica (prefer-local)", rbGoalMin),
		Status: "n/a",
	}
	c := &fvCluster{b: b, label: "readbal", size: size, readBalancing: rbPolicies[0], primary: "alpha"}
	env := &rbEnv{c: c, files: map[string]string{}, loops: map[string]*loopDev{}}
	defer func() {
		if err != nil {
			err = c.failed(err)
			rep.Error = err.Error()
		}
		env.teardown()
	}()

	c.dir = filepath.Join(b.tmp, "readbalance")
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return rep, err
	}
	devSize, err := c.setupDataNodes(ctx, true)
	if err != nil {
		return rep, err
	}
	if err := c.dataDisks(devSize, true); err != nil {
		return rep, err
	}
	for name, img := range c.disks {
		env.files[name] = img
	}

	// Loop devices and cgroups, or plain files unthrottled.
	var why string
	if b.cfg.readThrottle <= 0 {
		why = "-read-throttle 0"
	} else if _, _, err := throttleSupport(); err != nil {
		why = err.Error()
	}
	if why == "" {
		devs := map[string]string{}
		for _, name := range fvDataNodes {
			l, err := attachLoop(ctx, env.files[name])
			if err == nil {
				env.loops[name] = l
				devs[name], err = devNum(l.path)
			}
			if err != nil {
				why = err.Error()
				break
			}
		}
		if why == "" {
			tag := fmt.Sprintf("replbench-%d", os.Getpid())
			if env.thr, err = newIOThrottle(tag, devs, b.cfg.readThrottle); err != nil {
				why = err.Error()
			}
		}
		if why == "" {
			for name, l := range env.loops {
				c.disks[name] = l.path
			}
			rep.Throttled = true
			rep.Throttle = fmt.Sprintf("%s/s of reads per node's disk (%s on loop devices %s, %s)",
				fmtBytes(b.cfg.readThrottle), env.thr.kind, env.loops["alpha"].path, env.loops["beta"].path)
		} else {
			for name, l := range env.loops {
				l.detach()
				delete(env.loops, name)
			}
		}
	}
	if !rep.Throttled {
		rep.Throttle = "none: " + why
		logf("read balancing: disks NOT throttled (%s): plain files, the figures show the page cache and CPU, not two disks", why)
	} else {
		logf("read balancing: %s", rep.Throttle)
	}
	if err := c.writeConfig(); err != nil {
		return rep, err
	}

	logf("read balancing: starting alpha and beta (read_balancing %s)", c.readBalancing)
	if err := c.startAll(ctx); err != nil {
		return rep, err
	}
	ready := func() (*transport.VolumeStatus, error) { return c.waitServing(ctx, fvSyncTimeout) }
	v, err := ready()
	if err != nil {
		return rep, err
	}
	uri := v.NBDURI
	logf("read balancing: filling the volume (%s sequential write through %s)", fmtSize(size), uri)
	if _, err := b.fio(ctx, uri, "rb-fill", "write", "1m", 4, size, fioOnce); err != nil {
		return rep, fmt.Errorf("fill: %w", err)
	}
	if _, err := ready(); err != nil {
		return rep, err
	}
	if out, err := exec.CommandContext(ctx, "sync").CombinedOutput(); err != nil {
		return rep, fmt.Errorf("sync: %v: %s", err, out)
	}
	if err := env.joinCgroups(); err != nil {
		return rep, err
	}

	for i, policy := range rbPolicies {
		if i > 0 {
			// The policy is read at start: restart both nodes, the
			// primary first, with the config changed.
			logf("read balancing: restarting alpha and beta with read_balancing %s", policy)
			for _, name := range fvDataNodes {
				c.nodes[name].proc.stop()
			}
			c.readBalancing = policy
			if err := c.writeConfig(); err != nil {
				return rep, err
			}
			for _, name := range fvDataNodes {
				if err := c.start(ctx, name); err != nil {
					return rep, err
				}
			}
			if v, err = ready(); err != nil {
				return rep, err
			}
			uri = v.NBDURI
			if err := env.joinCgroups(); err != nil {
				return rep, err
			}
		}
		pr := &rbPolicy{Policy: policy}
		if env.thr != nil {
			pr.DiskReadMB = map[string]float64{}
		}
		var samples []float64
		for round := 0; round < b.cfg.rounds; round++ {
			if out, err := exec.CommandContext(ctx, "sync").CombinedOutput(); err != nil {
				return rep, fmt.Errorf("sync: %v: %s", err, out)
			}
			if err := env.dropCaches(); err != nil {
				return rep, err
			}
			before := map[string]int64{}
			if env.thr != nil {
				for _, name := range fvDataNodes {
					if before[name], err = env.thr.readBytes(name); err != nil {
						return rep, err
					}
				}
			}
			res, err := b.fio(ctx, uri, "rb-"+policy, "read", "1m", 8, size, fioCapped)
			if err != nil {
				return rep, fmt.Errorf("%s run %d: %w", policy, round+1, err)
			}
			mbs := res.BW / 1e6
			samples = append(samples, mbs)
			split := ""
			if env.thr != nil {
				var parts []string
				for _, name := range fvDataNodes {
					after, err := env.thr.readBytes(name)
					if err != nil {
						return rep, err
					}
					mb := float64(after-before[name]) / 1e6
					pr.DiskReadMB[name] += mb
					parts = append(parts, fmt.Sprintf("%s's disk %.0f MB", name, mb))
				}
				split = " (" + strings.Join(parts, ", ") + ")"
			}
			logf("read balancing: %d/%d  %-12s %8s MB/s%s", round+1, b.cfg.rounds, policy, fmtNum(mbs), split)
		}
		pr.MBs = mkCell(samples)
		rep.Policies = append(rep.Policies, pr)
	}

	one, rr := rep.Policies[0], rep.Policies[1]
	rep.Ratio = ratioOf(rr.MBs, one.MBs)
	if rep.Ratio != nil {
		rep.Status = "MISS"
		if *rep.Ratio >= rbGoalMin {
			rep.Status = "PASS"
		}
	}
	if !rep.Throttled {
		rep.Notes = append(rep.Notes, "the disks were not throttled: the figures are not the goal's setup")
	}
	if total := rr.DiskReadMB["alpha"] + rr.DiskReadMB["beta"]; rr.DiskReadMB != nil && total > 0 {
		share := rr.DiskReadMB["beta"] / total
		if share < 0.05 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("round-robin read %.0f%% of its data from beta's disk: the reads were not balanced (volumes[].read_balancing not in effect, or beta not readable)", share*100))
		}
	}
	return rep, nil
}

func printReadBalancing(w io.Writer, r *readBalanceReport) {
	fmt.Fprintf(w, "read balancing: %s\n", r.Setup)
	fmt.Fprintf(w, "  throttle: %s\n", r.Throttle)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "  read_balancing\t1M seqread qd8 (MB/s)\truns (MB/s)\tread from alpha's disk\tfrom beta's disk\t\n")
	for _, p := range r.Policies {
		med, runs := "-", "-"
		if p.MBs != nil {
			med = fmtNum(p.MBs.Median)
			var xs []string
			for _, x := range p.MBs.Samples {
				xs = append(xs, fmtNum(x))
			}
			runs = strings.Join(xs, " ")
		}
		a, bb := "-", "-"
		if p.DiskReadMB != nil {
			a = fmt.Sprintf("%.0f MB", p.DiskReadMB["alpha"])
			bb = fmt.Sprintf("%.0f MB", p.DiskReadMB["beta"])
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t\n", p.Policy, med, runs, a, bb)
	}
	tw.Flush()
	got := "-"
	if r.Ratio != nil {
		got = fmt.Sprintf("%.2fx", *r.Ratio)
	}
	fmt.Fprintf(w, "  goal: %-34s %7s  %s\n", r.Goal, got, r.Status)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  phase failed: %s\n", r.Error)
	}
}
