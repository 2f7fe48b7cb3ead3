package main

// The idle phase (issue 19): what volumes that do nothing cost. Two
// replnode processes, alpha (primary of every volume) and beta, on
// 127.0.0.1 without raft, serve --idle-volumes volumes of 16 MiB (sparse
// files, internal metadata, protocol C). The phase times how long every
// volume takes to be UpToDate and Connected on both nodes with nothing
// out of sync (alpha's `replctl status --json`, polled every second, at
// most idleSyncTimeout), then, with no client connected, measures each
// node's CPU over --idle-window (utime + stime from /proc/PID/stat, as a
// share of one core) and its resident memory at the end (VmRSS from
// /proc/PID/status). Goal: the primary's node under 2% of a core and
// 256 MiB.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	idleVolumeSize = 16 << 20
	// idleSyncTimeout bounds the wait for every volume to be UpToDate.
	idleSyncTimeout = 180 * time.Second
	// idleSyncGoal: the test wants 1,000 volumes UpToDate within
	// this.
	idleSyncGoal = 60 * time.Second
	// userHZ is the unit of /proc/PID/stat's utime and stime: USER_HZ,
	// 100 on every Linux architecture Go runs on.
	userHZ = 100
)

type idleReport struct {
	Setup   string `json:"setup"`
	Volumes int    `json:"volumes"`
	// UpToDate is how many volumes were in sync on both nodes when the
	// wait ended; SyncSeconds is how long the wait took from the start
	// of the nodes (idleSyncTimeout when not all made it).
	UpToDate    int     `json:"uptodate"`
	SyncSeconds float64 `json:"sync_seconds"`
	WindowS     float64 `json:"window_s"`
	// Nodes: alpha (the primary of every volume) and beta.
	Nodes []idleNode `json:"nodes,omitempty"`
	Error string     `json:"error,omitempty"`
}

type idleNode struct {
	Name   string  `json:"name"`
	CPUPct float64 `json:"cpu_pct_of_one_core"`
	RSSMiB float64 `json:"rss_mib"`
}

// allUpToDate: the wait reached every volume.
func (r *idleReport) allUpToDate() bool { return r.Volumes > 0 && r.UpToDate == r.Volumes }

// primary is alpha's figures, nil when not measured.
func (r *idleReport) primary() *idleNode {
	for i := range r.Nodes {
		if r.Nodes[i].Name == "alpha" {
			return &r.Nodes[i]
		}
	}
	return nil
}

func idleVolumeName(i int) string { return fmt.Sprintf("idle%04d", i+1) }

func (b *bench) idlePhase(ctx context.Context) (rep *idleReport, err error) {
	n := b.cfg.idleVolumes
	rep = &idleReport{
		Setup: fmt.Sprintf("replnode processes alpha (primary of every volume) and beta on 127.0.0.1, no raft, %d volumes of %s (sparse files, internal metadata, protocol C), no client",
			n, fmtSize(idleVolumeSize)),
		Volumes: n,
		WindowS: b.cfg.idleWindow.Seconds(),
	}
	c := &fvCluster{b: b, label: "idle", size: idleVolumeSize, primary: "alpha", startTimeout: idleSyncTimeout}
	c.dir = filepath.Join(b.tmp, "idle")
	defer func() {
		if err != nil {
			err = c.failed(err)
			rep.Error = err.Error()
		}
		c.stopAll()
		os.RemoveAll(c.dir) // the secondary's files fill up as they sync
	}()
	devSize, err := c.setupDataNodes(ctx, true)
	if err != nil {
		return rep, err
	}
	for i := range n {
		c.volumes = append(c.volumes, idleVolumeName(i))
	}
	for _, node := range fvDataNodes {
		if err := os.MkdirAll(filepath.Dir(c.volumeDisk("", node)), 0o755); err != nil {
			return rep, err
		}
		for _, vol := range c.volumes {
			f, err := os.Create(c.volumeDisk(vol, node))
			if err != nil {
				return rep, err
			}
			err = f.Truncate(devSize) // sparse
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return rep, err
			}
		}
	}
	if err := c.writeConfig(); err != nil {
		return rep, err
	}
	logf("idle: starting alpha and beta with %d volumes of %s", n, fmtSize(idleVolumeSize))
	begin := time.Now()
	for _, name := range fvDataNodes {
		if err := c.start(ctx, name); err != nil {
			return rep, err
		}
	}
	for {
		st, err := c.statusAll(ctx, "alpha")
		if err == nil {
			count := 0
			for i := range st.Volumes {
				if c.inSync(&st.Volumes[i]) {
					count++
				}
			}
			if count != rep.UpToDate {
				logf("idle: %d of %d volumes UpToDate after %s", count, n, time.Since(begin).Round(time.Second))
			}
			rep.UpToDate = count
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		rep.SyncSeconds = time.Since(begin).Seconds()
		if rep.allUpToDate() {
			break
		}
		if time.Since(begin) > idleSyncTimeout {
			logf("idle: only %d of %d volumes UpToDate after %s; measuring anyway", rep.UpToDate, n, idleSyncTimeout)
			break
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return rep, err
		}
	}
	logf("idle: measuring CPU and RSS over %s", b.cfg.idleWindow)
	before := map[string]int64{}
	for _, name := range fvDataNodes {
		if before[name], err = readProc(c.nodes[name].proc.cmd.Process.Pid, "stat", parseProcStatTicks); err != nil {
			return rep, err
		}
	}
	start := time.Now()
	profiled := make(chan error, 1)
	if b.cfg.idleProfile != "" {
		go func() {
			profiled <- c.profile(ctx, "alpha", "profile", b.cfg.idleWindow, b.cfg.idleProfile+".cpu.pprof")
		}()
	}
	if err := sleepCtx(ctx, b.cfg.idleWindow); err != nil {
		return rep, err
	}
	elapsed := time.Since(start).Seconds()
	if b.cfg.idleProfile != "" {
		if err := <-profiled; err != nil {
			return rep, err
		}
		if err := c.profile(ctx, "alpha", "heap", 0, b.cfg.idleProfile+".heap.pprof"); err != nil {
			return rep, err
		}
		logf("idle: alpha's profiles in %s.cpu.pprof and %s.heap.pprof (go tool pprof -top FILE)", b.cfg.idleProfile, b.cfg.idleProfile)
	}
	for _, name := range fvDataNodes {
		pid := c.nodes[name].proc.cmd.Process.Pid
		after, err := readProc(pid, "stat", parseProcStatTicks)
		if err != nil {
			return rep, err
		}
		rss, err := readProc(pid, "status", parseVmRSS)
		if err != nil {
			return rep, err
		}
		rep.Nodes = append(rep.Nodes, idleNode{Name: name,
			CPUPct: float64(after-before[name]) / userHZ / elapsed * 100,
			RSSMiB: float64(rss) / (1 << 20)})
	}
	return rep, nil
}

// profile saves node's pprof profile kind (profile: CPU for d; heap)
// from its control port's /debug/pprof/ to file.
func (c *fvCluster) profile(ctx context.Context, node, kind string, d time.Duration, file string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/%s", c.nodes[node].control, kind)
	if d > 0 {
		url += fmt.Sprintf("?seconds=%d", int(d.Seconds()))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", node, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readProc reads /proc/PID/FILE and parses it.
func readProc(pid int, file string, parse func(string) (int64, error)) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return 0, err
	}
	return parse(string(data))
}

// parseProcStatTicks reads utime + stime (fields 14 and 15) of a
// /proc/PID/stat line; the command name (field 2) may hold spaces and
// parentheses, so the fields are counted after its last ')'.
func parseProcStatTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no command name")
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the name", len(f))
	}
	var sum int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: %w", err)
		}
		sum += v
	}
	return sum, nil
}

// parseVmRSS reads the VmRSS line ("VmRSS:   12345 kB") of
// /proc/PID/status, in bytes.
func parseVmRSS(status string) (int64, error) {
	for _, l := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(l, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS %q", strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("/proc/PID/status: no VmRSS")
}

func printIdle(w io.Writer, r *idleReport) {
	fmt.Fprintf(w, "idle volumes: %s\n", r.Setup)
	fmt.Fprintf(w, "  UpToDate on both nodes: %d of %d after %.1fs", r.UpToDate, r.Volumes, r.SyncSeconds)
	if !r.allUpToDate() {
		fmt.Fprintf(w, " (not all within %s: the figures below are not idle)", idleSyncTimeout)
	}
	fmt.Fprintln(w)
	for _, n := range r.Nodes {
		fmt.Fprintf(w, "  %-6s CPU %5.1f%% of one core over %.0fs, RSS %.0f MiB\n", n.Name, n.CPUPct, r.WindowS, n.RSSMiB)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  phase failed: %s\n", r.Error)
	}
}
