package main

// End-to-end tests: `replctl demo` as a child process, driven by real NBD
// clients nobody here wrote (nbdinfo, qemu-io, fio, libnbd's Python
// bindings, nbdfuse + loop + ext4). Helpers live in testenv_test.go.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestE2ENBDInfo(t *testing.T) {
	e2e(t)
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	d := startDemo(t)
	for _, can := range []string{"flush", "fua", "trim", "zero", "multi-conn"} {
		r := runCmd(20*time.Second, nil, nbdinfo, "--can", can, d.uri)
		if r.code != 0 {
			t.Errorf("nbdinfo --can %s %s: want yes (exit 0), got %s", can, d.uri, r)
		}
	}
	out := strings.TrimSpace(mustRun(t, 20*time.Second, nbdinfo, "--size", d.uri))
	if out != itoa(demoSize) {
		t.Errorf("nbdinfo --size = %q, want %d (256 MiB)", out, demoSize)
	}
}

// patterns written at aligned and unaligned offsets; checks come from a new
// connection so nothing is answered from a client cache.
var patternWrites = []string{
	"write -P 0xab 0 1M",
	"write -P 0xcd 1000 3000",
	"write -P 0x11 300000 70000",
	fmt.Sprintf("write -P 0x77 %d 5000", demoSize-5000), // unaligned, up to the last byte
	"flush",
}

var patternReads = []string{
	"read -P 0xab 0 1000",
	"read -P 0xcd 1000 3000",
	"read -P 0xab 4000 296000",
	"read -P 0x11 300000 70000",
	"read -P 0xab 370000 678576",
	fmt.Sprintf("read -P 0x77 %d 5000", demoSize-5000),
}

// checkPatternsOnDisk checks the same patterns in a backing file.
func checkPatternsOnDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		b      byte
		off, n int64
	}{{0xab, 0, 1000}, {0xcd, 1000, 3000}, {0xab, 4000, 296000}, {0x11, 300000, 70000}, {0xab, 370000, 678576}, {0x77, demoSize - 5000, 5000}} {
		buf := make([]byte, c.n)
		if _, err := f.ReadAt(buf, c.off); err != nil {
			t.Fatalf("%s: read %d@%d: %v", path, c.n, c.off, err)
		}
		if !bytes.Equal(buf, bytes.Repeat([]byte{c.b}, int(c.n))) {
			t.Fatalf("%s: bytes %d..%d are not 0x%02x", path, c.off, c.off+c.n, c.b)
		}
	}
}

func TestE2EQemuIOPatterns(t *testing.T) {
	e2e(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	qemuIO(t, d.uri, patternWrites...)
	qemuIO(t, d.uri, patternReads...)
	// The bytes are in the primary's backing file at the same offsets.
	checkPatternsOnDisk(t, d.disk("alpha"))
	// And a wrong pattern is detected (the check itself works).
	r := runCmd(time.Minute, nil, RequireTool(t, "qemu-io", "qemu-utils"), "-f", "raw", d.uri, "-c", "read -P 0xcd 0 4096")
	if r.ok() && !strings.Contains(r.out, "Pattern verification failed") {
		t.Fatalf("qemu-io did not notice a wrong pattern: %s", r)
	}
}

func TestE2EFioVerify(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	d := startDemo(t)
	// fio writes its verify state into its directory: not the source tree.
	r := runCmdIn(t.TempDir(), 3*time.Minute, nil, fio, "--name=verify", "--ioengine=nbd", "--uri="+d.uri,
		"--rw=randwrite", "--bs=4k", "--size=64M", "--iodepth=16",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--output-format=json")
	if !r.ok() {
		t.Fatalf("fio verify: %s", r)
	}
	js := r.out[strings.IndexByte(r.out, '{'):]
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
	if err := json.Unmarshal([]byte(js), &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio json: %v: %s", err, r.out)
	}
	j := res.Jobs[0]
	if j.Error != 0 || j.Write.IOBytes != 64<<20 || j.Read.IOBytes != 64<<20 {
		t.Fatalf("fio verify: error %d, wrote %d, verified %d bytes (want 64 MiB each)", j.Error, j.Write.IOBytes, j.Read.IOBytes)
	}
}

// switchPrimary makes beta the primary and returns beta's URI from status.
func switchPrimary(t *testing.T, d *demo, to string) string {
	t.Helper()
	d.mustCtl("alpha", "primary", volName, "--node", to)
	v := d.waitFor(to, to+" is Primary", 30*time.Second, func(v *volumeStatus) bool {
		r := v.replica(to)
		return v.Primary == to && r != nil && r.Role == "Primary"
	})
	u, err := url.Parse(v.NBDURI)
	if err != nil || u.Host != d.nodes[to].NBD {
		t.Fatalf("after switchover nbd_uri = %q, want a URI on %s's nbd address %s", v.NBDURI, to, d.nodes[to].NBD)
	}
	if r := v.replica("alpha"); r == nil || r.Role != "Secondary" {
		t.Fatalf("after switchover alpha's replica is %+v, want Secondary", r)
	}
	return v.NBDURI
}

func TestE2ESwitchover(t *testing.T) {
	e2eBeside(t)
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	d := startDemo(t)
	d.waitInSync("alpha")
	qemuIO(t, d.uri, patternWrites...)

	betaURI := switchPrimary(t, d, "beta")
	qemuIO(t, betaURI, patternReads...)
	d.waitInSync("beta")
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
	checkPatternsOnDisk(t, d.disk("beta"))

	// The old primary refuses clients and says where the primary is now.
	// libnbd 1.14 shows the server's option-error text only in debug
	// output, so look there (qemu-io prints it as "server reported: ...").
	r := runCmd(20*time.Second, []string{"LIBNBD_DEBUG=1"}, nbdinfo, d.uri)
	if r.ok() {
		t.Fatalf("nbdinfo on the old primary %s succeeded: %s", d.uri, r)
	}
	if msg := serverMessages(r.out); !strings.Contains(msg, "beta") {
		t.Fatalf("nbdinfo on the old primary: the server's error message %q does not name beta: %s", msg, r)
	}
}

// serverMessages returns the error text the server sent during the
// handshake, from libnbd's debug output (LIBNBD_DEBUG=1).
func serverMessages(out string) string {
	var msgs []string
	for _, l := range strings.Split(out, "\n") {
		if _, m, ok := strings.Cut(l, "server error message: "); ok {
			msgs = append(msgs, strings.TrimSpace(m))
		}
	}
	return strings.Join(msgs, " | ")
}

func TestE2EBadInput(t *testing.T) {
	e2eBeside(t)
	py := RequirePythonNBD(t)
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	d := startDemo(t)
	d.waitInSync("alpha")
	qemuIO(t, d.uri, patternWrites...)
	d.waitInSync("alpha")
	before := hashRegion(t, d.disk("alpha"), 0, demoSize)

	// Protocol abuse through libnbd with its client-side checks off.
	const script = `
import json, sys, nbd
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
size = h.get_size()
ref_head, ref_tail = h.pread(65536, 0), h.pread(8192, size - 8192)
res = {}
def attempt(name, f):
    try:
        f()
        res[name] = "ok"
    except nbd.Error as e:
        res[name] = "error: " + str(e)
    try:
        res[name + "/then-read"] = h.pread(65536, 0) == ref_head and h.pread(8192, size - 8192) == ref_tail
    except nbd.Error as e:
        res[name + "/then-read"] = "error: " + str(e)
attempt("oob-read", lambda: h.pread(8192, size - 4096))
attempt("oob-read-far", lambda: h.pread(4096, size + (1 << 30)))
attempt("oob-write", lambda: h.pwrite(b"\xee" * 8192, size - 4096))
attempt("oob-write-far", lambda: h.pwrite(b"\xee" * 4096, size + (1 << 30)))
attempt("oob-zero", lambda: h.zero(8192, size - 4096))
attempt("oob-trim", lambda: h.trim(8192, size - 4096))
attempt("zero-length-write", lambda: h.pwrite(b"", 4096))
attempt("zero-length-read", lambda: h.pread(0, 4096))
h.flush()
h.shutdown()
print(json.dumps(res))
`
	r := runCmd(time.Minute, []string{"PATH=/usr/bin:" + os.Getenv("PATH")}, py, "-c", script, d.uri)
	if !r.ok() {
		t.Fatalf("python libnbd script: %s", r)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(r.out[strings.IndexByte(r.out, '{'):]), &res); err != nil {
		t.Fatalf("python output: %v: %s", err, r.out)
	}
	for _, name := range []string{"oob-read", "oob-read-far", "oob-write", "oob-write-far", "oob-zero", "oob-trim"} {
		if v, _ := res[name].(string); !strings.HasPrefix(v, "error") {
			t.Errorf("%s: want an error reply, got %v", name, res[name])
		}
	}
	for k, v := range res {
		if strings.HasSuffix(k, "/then-read") && v != true {
			t.Errorf("%s: same connection no longer reads correctly: %v", k, v)
		}
	}
	t.Logf("libnbd abuse results: %s", strings.TrimSpace(r.out))

	// Requests no client library sends, on one raw connection.
	c, err := dialRawNBD(d.uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	head, err := c.read(0, 65536)
	if err != nil {
		t.Fatal(err)
	}
	size := c.size
	for _, rq := range []struct {
		name   string
		typ    uint16
		flags  uint16
		off    uint64
		length uint32
		data   []byte
	}{
		{"unknown command 99", 99, 0, 0, 4096, nil},
		{"write past the end (offset+length overflows)", nbdCmdWrite, 0, ^uint64(0) - 4095, 8192, bytes.Repeat([]byte{0xee}, 8192)},
		{"write straddling the end", nbdCmdWrite, 0, size - 4096, 8192, bytes.Repeat([]byte{0xee}, 8192)},
		{"read past the end (offset+length overflows)", nbdCmdRead, 0, ^uint64(0) - 4095, 8192, nil},
	} {
		errno, _, err := c.request(rq.typ, rq.flags, rq.off, rq.length, rq.data, 0)
		if err != nil {
			t.Fatalf("%s: connection broken: %v", rq.name, err)
		}
		if errno == 0 {
			t.Errorf("%s: server replied success", rq.name)
		}
		got, err := c.read(0, 65536)
		if err != nil {
			t.Fatalf("%s: read on the same connection afterwards: %v", rq.name, err)
		}
		if !bytes.Equal(got, head) {
			t.Fatalf("%s: data at offset 0 changed", rq.name)
		}
	}
	if errno, _, err := c.request(nbdCmdFlush, 0, 0, 0, nil, 0); err != nil || errno != 0 {
		t.Fatalf("flush after bad requests: errno %d, %v", errno, err)
	}

	d.waitInSync("alpha")
	if after := hashRegion(t, d.disk("alpha"), 0, demoSize); after != before {
		t.Errorf("alpha's backing file changed under bad requests")
	}
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)

	// A client of the secondary is refused and told who is primary.
	r = runCmd(20*time.Second, []string{"LIBNBD_DEBUG=1"}, nbdinfo, d.uriOf("beta"))
	if r.ok() {
		t.Errorf("nbdinfo on the secondary succeeded: %s", r)
	} else if msg := serverMessages(r.out); !strings.Contains(msg, "alpha") {
		t.Errorf("nbdinfo on the secondary: the server's error message %q does not name alpha: %s", msg, r)
	}
}

func TestE2EBadConfig(t *testing.T) {
	e2e(t)
	bin := replnode(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`nodes:
  - name: alpha
    control: 127.0.0.1:0
    replication: 127.0.0.1:0
    nbd: 127.0.0.1:0
  - name: beta
    control: 127.0.0.1:0
    replication: 127.0.0.1:0
volumes:
  - name: vol0
    size: 64MiB
    protocol: C
    primary: alpha
    disks:
      alpha: %s
      beta: %s
`, filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img"))
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", path, "--node", "alpha")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("replnode accepted a config without nodes[1].nbd: %s", stderr.String())
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("replnode still running 15 s after a config without nodes[1].nbd: %s", stderr.String())
	}
	msg := stderr.String()
	if !strings.Contains(msg, "nbd") || !(strings.Contains(msg, "nodes[1]") || strings.Contains(msg, "beta")) {
		t.Fatalf("replnode's error does not name the missing field nodes[1].nbd: %q", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.img")); err == nil {
		t.Errorf("replnode created a backing file although its config is invalid")
	}
}

func TestE2ECatchUp(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	v := d.waitInSync("alpha")
	r0 := v.replica("beta").Resynced

	d.mustCtl("alpha", "disconnect", volName, "--node", "alpha")
	d.waitFor("alpha", "alpha StandAlone", 20*time.Second, func(v *volumeStatus) bool {
		r := v.replica("alpha")
		return r != nil && r.Replication == "StandAlone"
	})

	// 32 MiB in 4 KiB writes at random block-aligned offsets (some repeat).
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	blocks := map[int64]bool{}
	cmds := make([]string, 0, 8193)
	for i := 0; i < 8192; i++ {
		b := rng.Int64N(demoSize / 4096)
		blocks[b] = true
		cmds = append(cmds, fmt.Sprintf("write -P 0x%02x %d 4k", 1+i%250, b*4096))
	}
	cmds = append(cmds, "flush")
	qemuIO(t, d.uri, cmds...)
	distinct := int64(len(blocks))

	v = d.mustStatus("alpha")
	if r := v.replica("beta"); r != nil && r.OutOfSync == 0 {
		t.Logf("note: status shows beta out_of_sync_bytes=0 while disconnected: %+v", v.Replicas)
	}

	d.mustCtl("alpha", "connect", volName, "--node", "alpha")
	v = d.waitInSync("alpha")
	r1 := v.replica("beta").Resynced
	moved := r1 - r0
	t.Logf("distinct blocks written %d (%d bytes); beta resynced %d bytes", distinct, distinct*4096, moved)
	if moved <= 0 || moved > distinct*4096 {
		t.Errorf("beta resynced %d bytes; want 0 < n <= %d (distinct 4 KiB blocks written while disconnected)", moved, distinct*4096)
	}
	// Status names the generation rule that decided the catch-up.
	if r := v.replica("beta"); r.SyncRule != "bitmap-self" || r.Decision != "source-use-bitmap" {
		t.Errorf("status says %q by rule %q for beta, want source-use-bitmap by bitmap-self", r.Decision, r.SyncRule)
	}
	compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
}

// ---------------------------------------------------------------------------
// ext4 over nbdfuse + loop, then again on the new primary after a switchover

type fuseDisk struct {
	t      *testing.T
	fuse   string // FUSE mount point (a directory)
	file   string // the export as a regular file inside it
	mnt    string
	nbdfus *exec.Cmd
	done   chan struct{}
	loop   string
	mount  bool
}

// attach runs nbdfuse for uri and puts a loop device over the file.
func attach(t *testing.T, uri, dir string) *fuseDisk {
	t.Helper()
	nbdfuse := RequireTool(t, "nbdfuse", "libnbd-bin")
	losetup := RequireTool(t, "losetup", "util-linux")
	fusermount := RequireTool(t, "fusermount3", "fuse3")
	umount := RequireTool(t, "umount", "util-linux")
	fd := &fuseDisk{t: t, fuse: filepath.Join(dir, "fuse"), mnt: filepath.Join(dir, "mnt"), done: make(chan struct{})}
	fd.file = filepath.Join(fd.fuse, "disk")
	for _, p := range []string{fd.fuse, fd.mnt} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var log syncBuffer
	fd.nbdfus = exec.Command(nbdfuse, fd.file, uri)
	fd.nbdfus.Stdout, fd.nbdfus.Stderr = &log, &log
	fd.nbdfus.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := fd.nbdfus.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = fd.nbdfus.Wait(); close(fd.done) }()
	// Cleanups run last-registered first: unmount, detach loop, unmount FUSE.
	t.Cleanup(func() {
		if fd.isFuseMounted() {
			if r := runCmd(20*time.Second, nil, fusermount, "-u", fd.fuse); !r.ok() {
				runCmd(20*time.Second, nil, fusermount, "-u", "-z", fd.fuse)
			}
		}
		select {
		case <-fd.done:
		case <-time.After(10 * time.Second):
			_ = fd.nbdfus.Process.Kill()
			<-fd.done
		}
	})
	if !within(20*time.Second, 50*time.Millisecond, func() bool {
		if fi, err := os.Stat(fd.file); err == nil && fi.Mode().IsRegular() && fi.Size() == demoSize {
			return true
		}
		select {
		case <-fd.done:
			t.Fatalf("nbdfuse %s exited: %s", uri, log.tail(2000))
		default:
		}
		return false
	}) {
		t.Fatalf("nbdfuse: %s did not appear with size %d: %s", fd.file, demoSize, log.tail(2000))
	}
	fd.loop = strings.TrimSpace(mustRun(t, 30*time.Second, losetup, "-f", "--show", fd.file))
	t.Cleanup(func() {
		if fd.mount {
			runCmd(30*time.Second, nil, umount, "-l", fd.mnt)
		}
		if fd.loop != "" {
			runCmd(30*time.Second, nil, losetup, "-d", fd.loop)
		}
	})
	return fd
}

func (fd *fuseDisk) isFuseMounted() bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true
	}
	return bytes.Contains(b, []byte(" "+fd.fuse+" "))
}

func (fd *fuseDisk) doMount() {
	fd.t.Helper()
	mustRun(fd.t, time.Minute, RequireTool(fd.t, "mount", "util-linux"), "-t", "ext4", fd.loop, fd.mnt)
	fd.mount = true
}

// detach undoes attach in order: umount, losetup -d, fusermount3 -u.
func (fd *fuseDisk) detach() {
	t := fd.t
	t.Helper()
	if fd.mount {
		mustRun(t, time.Minute, RequireTool(t, "umount", "util-linux"), fd.mnt)
		fd.mount = false
	}
	mustRun(t, time.Minute, RequireTool(t, "losetup", "util-linux"), "-d", fd.loop)
	// losetup -d only marks a loop device that is still open (a probe of
	// the device that just changed, the file system's last release) to be
	// cleared at its last close; until then it holds the FUSE file, and
	// fusermount3 -u would find the FUSE mount busy.
	backing := filepath.Join("/sys/block", filepath.Base(fd.loop), "loop", "backing_file")
	if !within(30*time.Second, 20*time.Millisecond, func() bool {
		_, err := os.Stat(backing)
		return os.IsNotExist(err)
	}) {
		t.Fatalf("%s still holds %s 30s after losetup -d", fd.loop, fd.file)
	}
	fd.loop = ""
	mustRun(t, 30*time.Second, RequireTool(t, "fusermount3", "fuse3"), "-u", fd.fuse)
	select {
	case <-fd.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("nbdfuse did not exit after fusermount3 -u")
	}
}

func TestE2EMountExt4(t *testing.T) {
	e2e(t)
	if os.Geteuid() != 0 {
		missing(t, "the mount test needs root (nbdfuse + losetup + mount)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing(t, "the mount test needs /dev/fuse: %v", err)
	}
	mkfs := RequireTool(t, "mkfs.ext4", "e2fsprogs")
	e2fsck := RequireTool(t, "e2fsck", "e2fsprogs")
	RequireTool(t, "nbdfuse", "libnbd-bin")
	RequireTool(t, "fusermount3", "fuse3")
	RequireTool(t, "losetup", "util-linux")
	d := startDemo(t)
	work := t.TempDir()

	a := attach(t, d.uri, filepath.Join(work, "a"))
	start := time.Now()
	mustRun(t, 2*time.Minute, mkfs, "-q", a.loop)
	// mkfs discards the whole device: beta stays in sync through it.
	if v := d.mustStatus("alpha"); !v.inSync() {
		t.Fatalf("after mkfs.ext4 the replicas are not in sync: %+v", v.Replicas)
	}
	if lv, err := fetchLocalView("alpha", d.nodes["alpha"].Control); err != nil {
		t.Fatal(err)
	} else if evs := lv.eventsOf("peer-lost", start); len(evs) > 0 {
		t.Fatalf("mkfs.ext4 cost alpha its peer: %s", evs[0].Message)
	}
	a.doMount()
	rng := rand.New(rand.NewPCG(1, 2))
	files := map[string]string{}
	for i, n := range []int{1, 4096, 100000, 3 << 20} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		name := fmt.Sprintf("f%d.bin", i)
		if err := os.WriteFile(filepath.Join(a.mnt, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[name] = sha256File(t, filepath.Join(a.mnt, name))
	}
	if err := os.MkdirAll(filepath.Join(a.mnt, "dir", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.mnt, "dir", "sub", "hello.txt"), []byte("hello replvol\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	files[filepath.Join("dir", "sub", "hello.txt")] = sha256File(t, filepath.Join(a.mnt, "dir", "sub", "hello.txt"))
	mustRun(t, time.Minute, RequireTool(t, "sync", "coreutils"))
	a.detach()

	betaURI := switchPrimary(t, d, "beta")
	b := attach(t, betaURI, filepath.Join(work, "b"))
	if r := runCmd(2*time.Minute, nil, e2fsck, "-fn", b.loop); r.code != 0 {
		t.Fatalf("e2fsck -fn on beta: %s", r)
	}
	b.doMount()
	for name, sum := range files {
		if got := sha256File(t, filepath.Join(b.mnt, name)); got != sum {
			t.Errorf("%s on beta: sha256 %s, want %s", name, got, sum)
		}
	}
	b.detach()
}
