package main

// The write profile: one more 8K random write run on the replvol demo,
// protocol C, with a CPU profile of the demo's process (both nodes) taken
// from alpha's control port over the run, and where that CPU goes, in
// shares and in microseconds per write: the profile that explains the
// write ratios in the book.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/pprof/profile"
)

// writeProfile is the profile phase's result.
type writeProfile struct {
	Setup    string         `json:"setup,omitempty"`
	IOPS     float64        `json:"iops,omitempty"`
	CPUPerIO float64        `json:"cpu_us_per_io,omitempty"` // the demo's, over the run
	Samples  int64          `json:"samples,omitempty"`
	Shares   []profileShare `json:"shares,omitempty"`
	Error    string         `json:"error,omitempty"`
}

// profileShare is one place the CPU goes.
type profileShare struct {
	What  string  `json:"what"`
	Share float64 `json:"share"`               // of the profile's CPU time
	PerIO float64 `json:"us_per_io,omitempty"` // Share of CPUPerIO
}

// cpuPlace is one place of the profile: a sample counts for the first
// place whose test its stack (leaf first) passes.
type cpuPlace struct {
	what string
	is   func(stack []string) bool
}

func anyFrame(stack []string, prefixes ...string) bool {
	return slices.ContainsFunc(stack, func(f string) bool {
		return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f, p) })
	})
}

func inSyscall(stack []string) bool {
	return anyFrame(stack, "syscall.", "internal/runtime/syscall", "internal/poll.")
}

const repo = "github.com/replvol/replvol/"

// cpuPlaces are the places, in the order a sample is tried against them.
var cpuPlaces = []cpuPlace{
	{"pwrite into the page cache, both replicas (backing)", func(s []string) bool {
		return anyFrame(s, repo+"backing.(*fileDisk).WriteAt", "syscall.pwrite")
	}},
	{"NBD socket: the client's requests in, the replies out (system calls)", func(s []string) bool {
		return inSyscall(s) && anyFrame(s, repo+"transport/nbd.")
	}},
	{"replication socket: frames and acks, both nodes (system calls)", func(s []string) bool {
		return inSyscall(s) && anyFrame(s, repo+"transport.")
	}},
	{"other system calls", inSyscall},
	{"copying in Go (memmove)", func(s []string) bool { return len(s) > 0 && s[0] == "runtime.memmove" }},
	{"activity log and range locks", func(s []string) bool {
		return anyFrame(s, repo+"metadata.(*ActivityLog)", repo+"replication.(*RangeLocks)")
	}},
	{"garbage collection and allocation", func(s []string) bool {
		return anyFrame(s, "runtime.gcBgMarkWorker", "runtime.mallocgc", "runtime.gcDrain", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcAssist")
	}},
	{"Go scheduler, channels, locks and wakeups", func(s []string) bool {
		return anyFrame(s, "runtime.schedule", "runtime.findRunnable", "runtime.mcall", "runtime.park_m", "runtime.selectgo",
			"runtime.chansend", "runtime.chanrecv", "runtime.closechan", "runtime.lock", "runtime.unlock", "runtime.futex",
			"runtime.netpoll", "runtime.semacquire", "runtime.semrelease", "runtime.ready", "runtime.wakep", "runtime.notewakeup",
			"runtime.usleep", "runtime.osyield", "sync.", "internal/sync.")
	}},
	{"other Go code", func([]string) bool { return true }},
}

// placeShares splits p's CPU time over cpuPlaces: the share of each, in
// cpuPlaces' order (places with no sample left out), and the samples.
func placeShares(p *profile.Profile) ([]profileShare, int64) {
	vi := len(p.SampleType) - 1 // cpu nanoseconds (pprof: samples, then cpu)
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	sums := make([]int64, len(cpuPlaces))
	var total, n int64
	for _, s := range p.Sample {
		var stack []string
		for _, loc := range s.Location {
			// Inlined functions first: the leaf is loc.Line[0].
			for _, l := range loc.Line {
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		v := s.Value[vi]
		total += v
		n += s.Value[0]
		for i, pl := range cpuPlaces {
			if pl.is(stack) {
				sums[i] += v
				break
			}
		}
	}
	var out []profileShare
	if total == 0 {
		return nil, n
	}
	for i, pl := range cpuPlaces {
		if sums[i] > 0 {
			out = append(out, profileShare{What: pl.what, Share: float64(sums[i]) / float64(total)})
		}
	}
	return out, n
}

// profilePhase runs the write profile on t, the replvol demo.
func (b *bench) profilePhase(ctx context.Context, t *target, span int64) *writeProfile {
	w := workloads[0] // 8K randwrite qd16
	secs := max(1, int(b.cfg.runtime.Seconds())-1)
	rep := &writeProfile{Setup: fmt.Sprintf("%s on the replvol demo (protocol C, both nodes in one process), a CPU profile of that process from alpha's /debug/pprof/profile over %d s of the run", w.Label, secs)}
	type fioDone struct {
		res *fioResult
		err error
	}
	done := make(chan fioDone, 1)
	go func() {
		res, err := b.fioOn(ctx, t, "profile-"+w.Name, w.RW, w.BS, w.IODepth, span)
		done <- fioDone{res, err}
	}()
	select {
	case <-time.After(b.cfg.ramp + 500*time.Millisecond):
	case <-ctx.Done():
	}
	prof, perr := fetchProfile(ctx, t.control, secs)
	d := <-done
	switch {
	case d.err != nil:
		rep.Error = d.err.Error() + t.diagnose()
		return rep
	case perr != nil:
		rep.Error = perr.Error()
		return rep
	}
	rep.IOPS, rep.CPUPerIO = d.res.IOPS, d.res.ServerCPUPerIO
	rep.Shares, rep.Samples = placeShares(prof)
	for i := range rep.Shares {
		rep.Shares[i].PerIO = rep.Shares[i].Share * rep.CPUPerIO
	}
	logf("profile: %s IOPS, %s us of CPU per write, %d samples", fmtNum(rep.IOPS), fmtNum(rep.CPUPerIO), rep.Samples)
	return rep
}

// fetchProfile takes a CPU profile of secs seconds from the control API
// at addr (plain HTTP: the demo without --tls).
func fetchProfile(ctx context.Context, addr string, secs int) (*profile.Profile, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("CPU profile: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return profile.Parse(resp.Body)
}

func printWriteProfile(w io.Writer, r *writeProfile) {
	fmt.Fprintf(w, "where replvol's CPU goes: %s\n", r.Setup)
	if r.Error != "" {
		fmt.Fprintf(w, "  phase failed: %s\n", r.Error)
		return
	}
	fmt.Fprintf(w, "  %s IOPS, %s us of CPU per write (both nodes), %d samples\n", fmtNum(r.IOPS), fmtNum(r.CPUPerIO), r.Samples)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  where\tshare\tus per write\n")
	for _, s := range r.Shares {
		fmt.Fprintf(tw, "  %s\t%.0f%%\t%s\n", s.What, 100*s.Share, fmtNum(s.PerIO))
	}
	tw.Flush()
}
