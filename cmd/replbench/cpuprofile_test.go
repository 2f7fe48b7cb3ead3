package main

import (
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// stackProfile is a CPU profile with one sample per stack (leaf first),
// each of cpu nanoseconds.
func stackProfile(samples map[int64][]string) *profile.Profile {
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}}}
	fns := map[string]*profile.Function{}
	for cpu, stack := range samples {
		s := &profile.Sample{Value: []int64{1, cpu}}
		for _, name := range stack {
			f := fns[name]
			if f == nil {
				f = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
				fns[name] = f
				p.Function = append(p.Function, f)
			}
			loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
			p.Location = append(p.Location, loc)
			s.Location = append(s.Location, loc)
		}
		p.Sample = append(p.Sample, s)
	}
	return p
}

// TestTheWriteProfileSaysWhereTheCPUGoes: each sample counts once, for
// the first place its stack belongs to: a pwrite under the NBD worker is
// a disk write, not NBD socket IO; a socket read of the replication
// stream is replication; a channel wait is the scheduler's.
func TestTheWriteProfileSaysWhereTheCPUGoes(t *testing.T) {
	p := stackProfile(map[int64][]string{
		400: {"internal/runtime/syscall/linux.Syscall6", "syscall.pwrite", "os.(*File).WriteAt", repo + "backing.(*fileDisk).WriteAt", repo + "transport/nbd.(*serverConn).execute"},
		200: {"internal/runtime/syscall/linux.Syscall6", "syscall.read", "internal/poll.(*FD).Read", repo + "transport/nbd.(*serverConn).transmit"},
		150: {"internal/runtime/syscall/linux.Syscall6", "syscall.write", repo + "transport.(*frameConn).SendMsg", repo + "node/session.(*Session).send"},
		100: {"runtime.futex", "runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.mcall"},
		50:  {"runtime.memmove", repo + "replication.AppendEntry"},
		70:  {"runtime.mapaccess2_fast64", repo + "node.(*Volume).replicate"},
		30:  {"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"},
	})
	shares, n := placeShares(p)
	if n != 7 {
		t.Errorf("%d samples, want 7", n)
	}
	want := map[string]float64{
		"pwrite into the page cache, both replicas (backing)":                  0.4,
		"NBD socket: the client's requests in, the replies out (system calls)": 0.2,
		"replication socket: frames and acks, both nodes (system calls)":       0.15,
		"Go scheduler, channels, locks and wakeups":                            0.1,
		"copying in Go (memmove)":                                              0.05,
		"other Go code":                                                        0.07,
		"garbage collection and allocation":                                    0.03,
	}
	if len(shares) != len(want) {
		t.Fatalf("shares %+v, want %d places", shares, len(want))
	}
	total := 0.0
	for _, s := range shares {
		if w, ok := want[s.What]; !ok || s.Share < w-1e-9 || s.Share > w+1e-9 {
			t.Errorf("%q: share %.3f, want %.3f", s.What, s.Share, w)
		}
		total += s.Share
	}
	if total < 0.999 || total > 1.001 {
		t.Errorf("the shares add up to %.3f", total)
	}
	// In the order of cpuPlaces: the disk first.
	if !strings.HasPrefix(shares[0].What, "pwrite") {
		t.Errorf("first place %q, want the pwrites", shares[0].What)
	}
}

func TestTheBookPrintsTheWriteProfile(t *testing.T) {
	rep := sampleReport()
	rep.Profile = &writeProfile{Setup: "8K randwrite qd16 on the demo", IOPS: 40000, CPUPerIO: 25, Samples: 3000,
		Shares: []profileShare{{What: "pwrite into the page cache, both replicas (backing)", Share: 0.4, PerIO: 10}}}
	md := renderBook(rep, "perf.svg")
	for _, want := range []string{"where replvol's CPU goes: 8K randwrite qd16 on the demo", "25.0 us of CPU per write", "pwrite into the page cache, both replicas (backing)  40%    10.0"} {
		if !strings.Contains(md, want) {
			t.Errorf("the book lacks %q:\n%s", want, md)
		}
	}
}
