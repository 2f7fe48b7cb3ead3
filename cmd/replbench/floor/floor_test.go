package main

// The floor answers real NBD clients (nbdinfo, qemu-io), and a write is
// on the replica's file when its reply comes (protocol C).

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// requireTool returns tool's path; without it the test skips, or fails
// under CI=true.
func requireTool(t *testing.T, tool, debPkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s not found: install the Debian package %s (./deploy/install-test-deps.sh)", tool, debPkg)
	}
	t.Skipf("%s not found: install the Debian package %s (./deploy/install-test-deps.sh)", tool, debPkg)
	return ""
}

// startFloor serves a fresh primary file of size bytes, replicated to a
// fresh replica file; it returns the export's URI and the replica's file.
// At the end of the test the listeners close, the sessions end (the
// clients have gone) and then the files close.
func startFloor(t *testing.T, size int64) (uri, replicaFile string) {
	t.Helper()
	dir := t.TempDir()
	var files []*os.File
	open := func(name string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		return f
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	rf, pf := open("replica.img"), open("primary.img")
	rl, pl := listen(), listen()
	rfd, pfd := int(rf.Fd()), int(pf.Fd())
	replicaDone, primaryDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(replicaDone); _ = replicaOn(rl, rfd) }()
	go func() { defer close(primaryDone); _ = serveOn(pl, pfd, size, rl.Addr().String()) }()
	t.Cleanup(func() {
		pl.Close()
		<-primaryDone
		rl.Close()
		<-replicaDone
		for _, f := range files {
			f.Close()
		}
	})
	return "nbd://" + pl.Addr().String(), rf.Name()
}

func TestTheFloorAnswersNbdinfoWithItsSize(t *testing.T) {
	nbdinfo := requireTool(t, "nbdinfo", "libnbd-bin")
	uri, _ := startFloor(t, 16<<20)
	out, err := exec.Command(nbdinfo, "--size", uri).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --size %s: %v: %s", uri, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(16<<20) {
		t.Fatalf("nbdinfo --size = %s, want %d", got, 16<<20)
	}
	out, err = exec.Command(nbdinfo, "--can", "flush", uri).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --can flush: %v: %s (the floor advertises FLUSH)", err, out)
	}
}

func TestTheFloorsWriteIsOnTheReplicaWhenItsReplyComes(t *testing.T) {
	qemuIO := requireTool(t, "qemu-io", "qemu-utils")
	uri, replicaFile := startFloor(t, 16<<20)
	out, err := exec.Command(qemuIO, "-f", "raw", uri,
		"-c", "write -P 0xab 4096 8192", "-c", "flush", "-c", "read -P 0xab 4096 8192").CombinedOutput()
	if err != nil || strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	// qemu-io exited after the write's reply: the replica had it then.
	data, err := os.ReadFile(replicaFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[4096:4096+8192], bytes.Repeat([]byte{0xab}, 8192)) {
		t.Fatal("the replica's file lacks the acknowledged write")
	}
	if !bytes.Equal(data[:4096], make([]byte, 4096)) || !bytes.Equal(data[4096+8192:4096+8192+4096], make([]byte, 4096)) {
		t.Fatal("the replica's file changed outside the write")
	}
}

// TestTheFloorsProcessesKeepTheirFilesOpen runs the floor as the bench
// does, two processes, with the garbage collector at every allocation
// of note (GOGC=1): their files stay open while they serve, so writes
// of several megabytes succeed and reach the replica.
func TestTheFloorsProcessesKeepTheirFilesOpen(t *testing.T) {
	qemuIO := requireTool(t, "qemu-io", "qemu-utils")
	dir := t.TempDir()
	bin := filepath.Join(dir, "floor")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	const size = 16 << 20
	for _, f := range []string{"primary.img", "replica.img"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, f), size); err != nil {
			t.Fatal(err)
		}
	}
	// start runs bin ARGS and returns the address of its "ready" line.
	start := func(args ...string) string {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "GOGC=1")
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		line, err := bufio.NewReader(stdout).ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
		if err != nil || !ok {
			t.Fatalf("%s %s: %q, %v; want a ready line", bin, args[0], line, err)
		}
		return addr
	}
	replica := start("replica", "-file", filepath.Join(dir, "replica.img"))
	primary := start("serve", "-file", filepath.Join(dir, "primary.img"), "-peer", replica)
	var cmds []string
	for i := range 8 {
		cmds = append(cmds, "-c", fmt.Sprintf("write -P 0xcd %d 1M", i<<20))
	}
	out, err := exec.Command(qemuIO, append([]string{"-f", "raw", "nbd://" + primary}, cmds...)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "replica.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[:8<<20], bytes.Repeat([]byte{0xcd}, 8<<20)) {
		t.Fatal("the replica's file lacks the acknowledged writes")
	}
}
