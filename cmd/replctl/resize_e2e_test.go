package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
)

// TestE2EResizeUnderFioVerify: two replnode processes serve vol0 at
// 64 MiB on disks that hold 256 MiB and their metadata from the start.
// While fio writes and verifies through NBD, `replctl resize vol0 256MiB`
// grows beta, then alpha; fio finds every block it wrote (the IO never
// stopped), a new NBD connection (nbdinfo --size) and status say 256 MiB,
// a write past the old end through a new connection reaches both nodes,
// nothing was resynced, and the two disks are identical over 256 MiB.
// The range gained held different bytes on the two disks before (as a
// grown LUN holds whatever it held): the resize makes it zeroes on both.
func TestE2EResizeUnderFioVerify(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	qemu := RequireTool(t, "qemu-io", "qemu-utils")
	const (
		from = 64 << 20
		to   = 256 << 20
	)
	disk, err := metadata.InternalDeviceSizeFor(to, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	c := newProcClusterN(t, clusterOpts{Size: from, DiskSize: disk})
	for i, name := range []string{"alpha", "beta"} {
		scribble(t, c.disk(name), 100<<20, byte(0x10+i))
		scribble(t, c.disk(name), to-(1<<20), byte(0x20+i))
	}
	hup := c.notifyOf("alpha")
	c.startAll()
	c.waitInSync("alpha")
	before := c.mustStatus("alpha").replica("beta").Resynced

	uri := "nbd://" + c.nodes["alpha"].NBD + "/" + volName
	// About 4 s of writes at 4000 IOPS, then a read of all 64 MiB that
	// checks every block: the resize runs in the middle of the writes.
	fioCmd := exec.Command(fio, "--name=verify", "--ioengine=nbd", "--uri="+uri,
		"--rw=randwrite", "--bs=4k", "--size=64M", "--iodepth=16", "--rate_iops=4000",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--output-format=json")
	fioCmd.Dir = t.TempDir()
	var fioOut syncBuffer
	fioCmd.Stdout, fioCmd.Stderr = &fioOut, &fioOut
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fioCmd.Wait() }()
	c.waitWritten("alpha", 8<<20, fioDone)

	r := c.ctl("alpha", "resize", volName, "256MiB")
	select {
	case err := <-fioDone:
		t.Fatalf("fio ended before the resize did (%v): it must run across it; %s", err, fioOut.tail(2000))
	default:
	}
	if !r.ok() {
		t.Fatalf("replctl resize: %s", r)
	}
	t.Logf("replctl resize:\n%s", r.out)
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "beta grew vol0 from 64.0MiB to 256.0MiB") ||
		!strings.HasPrefix(lines[1], "alpha grew vol0 from 64.0MiB to 256.0MiB") ||
		!strings.HasPrefix(lines[2], "vol0 is 256.0MiB on every node. Next, put size: 256MiB in volumes[vol0]") {
		t.Fatalf("replctl resize does not say beta grew, then alpha, then what to put in the file (in units, once):\n%s", r.out)
	}
	if n := strings.Count(r.out, "until they reconnect"); n != 1 {
		t.Fatalf("replctl resize says %d times that connected clients keep the old size, want once:\n%s", n, r.out)
	}

	if err := <-fioDone; err != nil {
		t.Fatalf("fio verify across the resize: %v\n%s", err, fioOut.tail(4000))
	}
	out := fioOut.tail(1 << 20)
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
			Read struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out[strings.IndexByte(out, '{'):]), &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio json: %v: %s", err, out)
	}
	if j := res.Jobs[0]; j.Error != 0 || j.Write.IOBytes != 64<<20 || j.Read.IOBytes != 64<<20 {
		t.Fatalf("fio verify: error %d, wrote %d, verified %d bytes (want 64 MiB each)", j.Error, j.Write.IOBytes, j.Read.IOBytes)
	}

	if got := strings.TrimSpace(mustRun(t, 20*time.Second, nbdinfo, "--size", uri)); got != itoa(to) {
		t.Fatalf("nbdinfo --size %s = %q after the resize, want %d", uri, got, to)
	}
	if w := runCmd(time.Minute, nil, qemu, "-f", "raw", uri, "-c", "write -P 0x5a 200M 1M", "-c", "read -P 0x5a 200M 1M"); !w.ok() {
		t.Fatalf("qemu-io past the old end: %s", w)
	}
	v := c.waitInSync("alpha")
	if string(v.Size) != itoa(to) {
		t.Fatalf("status says size %s, want %d", v.Size, to)
	}
	if moved := v.replica("beta").Resynced - before; moved != 0 {
		t.Fatalf("the resize resynced %d bytes to beta, want none", moved)
	}
	if text := c.ctl("beta", "status"); !strings.Contains(text.out, "size 256.0MiB") {
		t.Fatalf("replctl status does not show the new size:\n%s", text)
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), to)

	// The file takes the new size without a restart: a SIGHUP finds it
	// is what the nodes run at. A size nobody grew to is named, with the
	// command that grows to it.
	cfg, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ size, warn string }{{"268435456", ""}, {"1073741824", "volumes[vol0].size is 1GiB in the file, but vol0 runs at 256MiB on this node: editing the file does not resize a volume; grow every node's disk, then replctl resize vol0 1GiB"}} {
		edited := strings.Replace(string(cfg), "size: "+itoa(from), "size: "+step.size, 1)
		if err := os.WriteFile(c.cfgPath, []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(c.dir, "alpha.log")
		start, _ := os.ReadFile(logPath)
		if err := c.procs["alpha"].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		marker := "SIGHUP: the config file does not load"
		var logged string
		within(10*time.Second, 100*time.Millisecond, func() bool {
			b, _ := os.ReadFile(logPath)
			logged = string(b[len(start):])
			return step.warn == "" || strings.Contains(logged, step.warn)
		})
		if step.warn == "" {
			// The reload is over when alpha tells systemd READY=1 again:
			// what it logs, it has logged then, and the next step
			// rewrites the file only then, so this reload read this one.
			hup.reloaded()
			b, _ := os.ReadFile(logPath)
			logged = string(b[len(start):])
			if strings.Contains(logged, "size") || strings.Contains(logged, marker) {
				t.Fatalf("SIGHUP with size %s in the file logged:\n%s", step.size, logged)
			}
		} else if !strings.Contains(logged, step.warn) {
			t.Fatalf("SIGHUP with size %s in the file does not say %q; log:\n%s", step.size, step.warn, logged)
		}
	}
}

// TestE2EAResizeNoDiskHoldsIsRefusedAtOnce: `replctl resize vol0 1PiB`
// on disks that hold 128 MiB is refused at once (it ran into --timeout,
// twice, while beta burnt a core in an endless check), naming each node's
// disk, what it holds and the largest size every disk holds, saying once
// that nothing changed. No node's size changed, no node keeps a core busy
// afterwards, and a resize to a size the disks hold goes through right
// after (it timed out too).
func TestE2EAResizeNoDiskHoldsIsRefusedAtOnce(t *testing.T) {
	e2e(t) // it times the refusal: not beside the other clusters
	const (
		from = 64 << 20
		to   = 128 << 20
	)
	disk, err := metadata.InternalDeviceSizeFor(to, 61, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	c := newProcClusterN(t, clusterOpts{Size: from, DiskSize: disk})
	c.startAll()
	c.waitInSync("alpha")

	start := time.Now()
	r := c.ctl("alpha", "resize", volName, "1PiB")
	took := time.Since(start)
	t.Logf("replctl resize vol0 1PiB (%s):\n%s", took.Round(time.Millisecond), r.out)
	if r.code != exitFailed {
		t.Fatalf("replctl resize vol0 1PiB: %s; want a refusal (exit %d)", r, exitFailed)
	}
	// The bug took 10 to 60 s (--timeout); a refusal costs no I/O.
	if took > 5*time.Second {
		t.Errorf("the refusal took %s: a size no disk holds is refused at once", took)
	}
	want := []string{
		"vol0 cannot grow to 1.0PiB (1125899906842624 bytes); nothing changed:",
		"every node's disk holds vol0 at up to 128.0MiB (134217728 bytes) now",
	}
	for _, name := range []string{"alpha", "beta"} {
		want = append(want, "no room to grow on "+name+": the disk "+c.disk(name)+" holds "+itoa(disk)+" bytes")
	}
	for _, w := range want {
		if !strings.Contains(r.out, w) {
			t.Errorf("the refusal does not say %q", w)
		}
	}
	if n := strings.Count(r.out, "nothing changed"); n != 1 {
		t.Errorf("the refusal says %d times that nothing changed, want once", n)
	}
	for _, name := range []string{"alpha", "beta"} {
		if v := c.mustStatus(name); string(v.Size) != itoa(from) {
			t.Fatalf("%s says vol0 is %s bytes after the refusal, want %d", name, v.Size, from)
		}
	}

	// Nothing keeps running: the nodes' CPU over two seconds from the
	// refusal, in which a resize to a size the disks hold goes through,
	// stays far below the core the endless check burnt.
	cpu := map[string]time.Duration{}
	for _, name := range []string{"alpha", "beta"} {
		cpu[name] = procCPU(t, c.procs[name].Process.Pid)
	}
	since := time.Now()
	start = time.Now()
	r = c.ctl("alpha", "resize", volName, "128MiB")
	if !r.ok() || !strings.Contains(r.out, "vol0 is 128.0MiB on every node") {
		t.Fatalf("replctl resize vol0 128MiB right after the refusal: %s", r)
	}
	t.Logf("replctl resize vol0 128MiB (%s):\n%s", time.Since(start).Round(time.Millisecond), r.out)
	// The window over which the CPU is measured (no state is waited
	// for): the CPU time counts what ran, however busy the machine.
	time.Sleep(time.Until(since.Add(2 * time.Second)))
	wall := time.Since(since)
	for _, name := range []string{"alpha", "beta"} {
		used := procCPU(t, c.procs[name].Process.Pid) - cpu[name]
		t.Logf("%s used %s of CPU in %s", name, used, wall.Round(time.Millisecond))
		if used > wall/2 {
			t.Errorf("%s used %s of CPU in %s after the refusal: something keeps running", name, used, wall.Round(time.Millisecond))
		}
	}
}

// procCPU is the CPU time process pid has used (user and system).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", itoa(int64(pid)), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	// Linux counts in USER_HZ, 100 a second on every architecture Go runs on.
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// scribble writes 1 MiB of a pattern of seed at off into the file at
// path (a disk past its volume: what a grown LUN may hold).
func scribble(t *testing.T, path string, off int64, seed byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
