package nbd_test

// These tests run real NBD clients (libnbd's nbdinfo and nbdsh, qemu-io, fio) against the server
// with a memory Export, to pin interoperability rather than our reading of the spec.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// runTool runs a client with /usr/bin first on PATH (Debian's python3 has the nbd module; a
// pyenv python may shadow it) and returns its output and exit code.
func runTool(t *testing.T, name string, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	return runToolEnv(t, nil, name, args...)
}

func runToolEnv(t *testing.T, env []string, name string, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	path, err := nbdtest.LookTool(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH")), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Dir = t.TempDir() // fio leaves verify state files in its working directory
	err = cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		exitCode = exitErr.ExitCode()
	default:
		t.Fatalf("%s: %v", name, err)
	}
	return out.String(), errOut.String(), exitCode
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	stdout, stderr, code := runTool(t, name, args...)
	if code != 0 {
		t.Fatalf("%s %q: exit %d\nstdout:\n%s\nstderr:\n%s", name, args, code, stdout, stderr)
	}
	return stdout
}

func TestNbdinfoSeesSizeAndCapabilities(t *testing.T) {
	nbdtest.RequireTool(t, "nbdinfo")
	s := startServer(t, map[string]nbd.Export{"vol": nbdtest.NewMemExport(testExportSize), "other": nbdtest.NewMemExport(4096)})
	uri := s.uri("vol")
	if got := strings.TrimSpace(mustRun(t, "nbdinfo", "--size", uri)); got != strconv.Itoa(testExportSize) {
		t.Errorf("nbdinfo --size: %q", got)
	}
	for _, feature := range []string{"flush", "fua", "trim", "zero", "multi-conn"} {
		if _, stderr, code := runTool(t, "nbdinfo", "--can", feature, uri); code != 0 {
			t.Errorf("nbdinfo --can %s: exit %d (0 means yes) %s", feature, code, stderr)
		}
	}
	if _, _, code := runTool(t, "nbdinfo", "--is", "read-only", uri); code != 2 {
		t.Errorf("nbdinfo --is read-only: exit %d, want 2 (no)", code)
	}
	full := mustRun(t, "nbdinfo", uri)
	for _, want := range []string{"block_size_minimum: 1", "block_size_preferred: 4096", "block_size_maximum: 33554432"} {
		if !strings.Contains(full, want) {
			t.Errorf("nbdinfo output lacks %q:\n%s", want, full)
		}
	}
	list := mustRun(t, "nbdinfo", "--list", "nbd://"+s.addr+"/")
	if !strings.Contains(list, "export=\"other\"") || !strings.Contains(list, "export=\"vol\"") {
		t.Errorf("nbdinfo --list:\n%s", list)
	}
}

func TestNbdinfoShowsTheResolverMessageForAnUnknownExport(t *testing.T) {
	nbdtest.RequireTool(t, "nbdinfo")
	s := startServer(t, nil)
	// libnbd 1.14 prints the server's error text only in its debug log ("handshake: server error
	// message: ..."); without LIBNBD_DEBUG it reports NBD_REP_ERR_UNKNOWN as ENOENT.
	_, stderr, code := runTool(t, "nbdinfo", s.uri("vol0"))
	if code == 0 {
		t.Fatal("nbdinfo on an unknown export succeeded")
	}
	if !strings.Contains(stderr, refusal("vol0").Error()) && !strings.Contains(stderr, "No such file or directory") {
		t.Errorf("nbdinfo stderr shows neither the message nor ENOENT:\n%s", stderr)
	}
	_, stderr, _ = runToolEnv(t, []string{"LIBNBD_DEBUG=1"}, "nbdinfo", s.uri("vol0"))
	if !strings.Contains(stderr, "server error message: "+refusal("vol0").Error()) {
		t.Fatalf("nbdinfo (LIBNBD_DEBUG=1) stderr lacks the resolver's message %q:\n%s", refusal("vol0"), stderr)
	}
}

func TestQemuIOPatterns(t *testing.T) {
	nbdtest.RequireTool(t, "qemu-io")
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	mem.Fill(8<<20, 2<<20, 0xee) // for write -z and discard to clear
	mustRun(t, "qemu-io", "-f", "raw", s.uri("vol"),
		"-c", "write -P 0xab 0 1M", "-c", "read -P 0xab 0 1M",
		"-c", "write -P 0xcd 1000 3000", "-c", "read -P 0xcd 1000 3000", "-c", "read -P 0xab 4000 4192",
		"-c", "write -P 0x11 4095 2", "-c", "read -P 0x11 4095 2",
		"-c", "write -z 8M 64k", "-c", "read -P 0 8M 64k",
		"-c", "discard 9M 64k",
		"-c", "write -f -P 0x22 2M 64k", // -f: FUA
		"-c", "aio_write -P 0x33 3M 64k", "-c", "aio_write -P 0x44 4M 64k", "-c", "aio_flush",
		"-c", "read -P 0x33 3M 64k", "-c", "read -P 0x44 4M 64k",
		"-c", "flush",
		"-c", "write -P 0x55 16773120 4096", "-c", "read -P 0x55 16773120 4096", // last block
	)
	// Check from the Export's side that offsets and lengths were carried exactly.
	checks := []struct {
		off, length int64
		b           byte
	}{
		{0, 1000, 0xab}, {1000, 3000, 0xcd}, {4000, 95, 0xab}, {4095, 2, 0x11}, {4097, 1<<20 - 4097, 0xab},
		{1 << 20, 1, 0}, {8 << 20, 64 << 10, 0}, {9 << 20, 64 << 10, 0}, {9<<20 + 64<<10, 1, 0xee},
		{2 << 20, 64 << 10, 0x22}, {3 << 20, 64 << 10, 0x33}, {4 << 20, 64 << 10, 0x44},
		{16773120, 4096, 0x55},
	}
	for _, c := range checks {
		if !bytes.Equal(mem.Bytes(c.off, c.length), bytes.Repeat([]byte{c.b}, int(c.length))) {
			t.Errorf("export [%d, +%d) is not all %#x", c.off, c.length, c.b)
		}
	}
	if mem.Calls(nbdtest.OpFlush) == 0 || mem.Calls(nbdtest.OpWriteZeroes) == 0 || mem.Calls(nbdtest.OpTrim) == 0 {
		t.Errorf("flush %d, write-zeroes %d, trim %d calls: qemu should have used all three",
			mem.Calls(nbdtest.OpFlush), mem.Calls(nbdtest.OpWriteZeroes), mem.Calls(nbdtest.OpTrim))
	}
	if mem.FUACalls() == 0 {
		t.Error("qemu-io write -f sent no FUA write")
	}
	// qemu-io exits non-zero when a pattern does not match: make sure that is so, or the
	// checks above prove little.
	if _, _, code := runTool(t, "qemu-io", "-f", "raw", s.uri("vol"), "-c", "read -P 0x99 0 4k"); code == 0 {
		t.Error("qemu-io pattern mismatch was not detected")
	}
}

// nbdshScript sends requests a strict client would refuse, each followed by checks that the
// handle still works. The server must answer each with the right errno and keep the connection.
const nbdshScript = `
import errno
h.set_strict_mode(0)
h.connect_uri(URI)
size = h.get_size()
h.pwrite(b"\x5a" * 4096, 0)

def expect(name, want, f):
    try:
        f()
    except nbd.Error as e:
        if e.errnum != want:
            raise SystemExit("%s: errno %s (%s), want %s" % (name, e.errno, e, want))
    else:
        raise SystemExit("%s: succeeded" % name)
    assert h.pread(4096, 0) == b"\x5a" * 4096, name + ": read after it failed"

expect("read past the end", errno.EINVAL, lambda: h.pread(8192, size - 4096))
expect("write past the end", errno.ENOSPC, lambda: h.pwrite(b"x" * 8192, size - 4096))
expect("trim past the end", errno.EINVAL, lambda: h.trim(8192, size - 4096))
expect("zero past the end", errno.ENOSPC, lambda: h.zero(8192, size - 4096))
expect("zero-length read", errno.EINVAL, lambda: h.pread(0, 0))
expect("zero-length write", errno.EINVAL, lambda: h.pwrite(b"", 0))
expect("zero-length trim", errno.EINVAL, lambda: h.trim(0, 0))
expect("unknown command (NBD_CMD_CACHE)", errno.EINVAL, lambda: h.cache(4096, 0))
expect("read with DF", errno.EINVAL, lambda: h.pread(512, 0, flags=nbd.CMD_FLAG_DF))
expect("zero with FAST_ZERO", errno.EINVAL, lambda: h.zero(512, 0, flags=nbd.CMD_FLAG_FAST_ZERO))
h.flush()
h.shutdown()
print("ok")
`

func TestNbdshOutOfRangeAndUnknownRequestsKeepTheHandle(t *testing.T) {
	nbdtest.RequireTool(t, "nbdsh")
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	script := fmt.Sprintf("URI = %q\n%s", s.uri("vol"), nbdshScript)
	if out := mustRun(t, "nbdsh", "-c", script); strings.TrimSpace(out) != "ok" {
		t.Fatalf("nbdsh: %q", out)
	}
	if errs := s.Stats().Errors; errs.Read != 3 || errs.Write != 2 || errs.Trim != 2 || errs.WriteZeroes != 2 || errs.Other != 1 {
		t.Errorf("error counters %+v", errs)
	}
}

func TestFioRandomWritesVerify(t *testing.T) {
	nbdtest.RequireTool(t, "fio")
	s := startServer(t, nil)
	out := mustRun(t, "fio", "--name=verify", "--ioengine=nbd", "--uri="+s.uri("vol"),
		"--rw=randwrite", "--bs=4k", "--size="+fmt.Sprint(testExportSize), "--iodepth=16",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=terse")
	// Terse format v3: "3;fio-version;jobname;groupid;error;...".
	i := strings.Index(out, "3;fio-")
	if i < 0 {
		t.Fatalf("no terse line in fio output:\n%s", out)
	}
	if fields := strings.Split(out[i:], ";"); len(fields) < 5 || fields[4] != "0" {
		t.Fatalf("fio reported an error:\n%s", out)
	}
	if st := s.Stats(); st.Requests.Write < testExportSize/4096 || st.Requests.Read < testExportSize/4096 {
		t.Errorf("fio wrote %d and read %d blocks, want at least %d each", st.Requests.Write, st.Requests.Read, testExportSize/4096)
	}
}

// TestRealClientsOverTLS: libnbd (nbdinfo, nbdsh, nbdcopy: nbds:// with tls-certificates) and
// qemu-io (tls-creds-x509 on the same directory) read and write over TLS with the files pki.Init
// writes for NBD clients; against TLSRequired, plaintext nbdinfo and qemu-io are refused with an
// error that says TLS is required, and so are both with a second CA's files.
func TestRealClientsOverTLS(t *testing.T) {
	nbdtest.RequireTool(t, "nbdinfo", "nbdsh", "nbdcopy", "qemu-io")
	p := newTestPKI(t)
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem}, func(c *nbd.Config) {
		c.TLS, c.TLSCertificatesHint = p.server, "DIR/nbd-client"
	})
	certs := filepath.Join(p.dir, pki.NBDClientDir)
	uri := "nbds://" + s.addr + "/vol?tls-certificates=" + certs
	if out := mustRun(t, "nbdinfo", uri); !strings.Contains(out, "newstyle-fixed with TLS") || !strings.Contains(out, "export-size: 16777216") {
		t.Errorf("nbdinfo %s:\n%s", uri, out)
	}
	script := fmt.Sprintf("h.set_uri_allow_local_file(True)\nh.connect_uri(%q)\nassert h.get_tls_negotiated()\n"+
		"h.pwrite(b'\\x5a' * 65536, 1 << 20)\nassert h.pread(65536, 1 << 20) == b'\\x5a' * 65536\nh.flush()\nh.shutdown()\nprint('ok')", uri)
	if out := mustRun(t, "nbdsh", "-c", script); strings.TrimSpace(out) != "ok" {
		t.Fatalf("nbdsh over TLS: %q", out)
	}

	out := filepath.Join(t.TempDir(), "copy.img")
	mustRun(t, "nbdcopy", uri, out)
	if b, err := os.ReadFile(out); err != nil || len(b) != testExportSize || !bytes.Equal(b[1<<20:1<<20+65536], bytes.Repeat([]byte{0x5a}, 65536)) {
		t.Errorf("nbdcopy over TLS: %d bytes, %v", len(b), err)
	}

	tlsObject := "tls-creds-x509,id=tls0,dir=" + certs + ",endpoint=client"
	image := "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=" + s.port() + ",export=vol"
	mustRun(t, "qemu-io", "--object", tlsObject, "--image-opts", image+",tls-creds=tls0",
		"-c", "write -P 0xab 0 1M", "-c", "read -P 0xab 0 1M", "-c", "write -P 0xcd 4096 4096",
		"-c", "read -P 0x5a 1M 64k", "-c", "flush")
	if !bytes.Equal(mem.Bytes(0, 4096), bytes.Repeat([]byte{0xab}, 4096)) || !bytes.Equal(mem.Bytes(4096, 4096), bytes.Repeat([]byte{0xcd}, 4096)) {
		t.Error("the export does not hold what qemu-io wrote over TLS")
	}

	// Plaintext against TLS required. libnbd 1.14 reports NBD_REP_ERR_TLS_REQD as ENOTSUP
	// ("Operation not supported") and prints the server's message in its debug log; qemu-io
	// prints both.
	plain := "nbd://" + s.addr + "/vol"
	stdout, stderr, code := runTool(t, "nbdinfo", plain)
	if code == 0 || !strings.Contains(stdout, "without TLS") || !strings.Contains(stderr, "Operation not supported") {
		t.Errorf("plaintext nbdinfo: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	_, stderr, _ = runToolEnv(t, []string{"LIBNBD_DEBUG=1"}, "nbdinfo", plain)
	want := "server error message: TLS is required: this server serves NBD only over TLS, to clients with a certificate of its CA; " +
		"connect with TLS, e.g. nbds://" + s.addr + "/vol?tls-certificates=DIR/nbd-client"
	if !strings.Contains(stderr, want) {
		t.Errorf("plaintext nbdinfo (LIBNBD_DEBUG=1) does not show %q:\n%s", want, stderr)
	}
	_, stderr, code = runTool(t, "qemu-io", "--image-opts", image, "-c", "read 0 4k")
	if code == 0 || !strings.Contains(stderr, "TLS negotiation required") || !strings.Contains(stderr, "server reported: TLS is required") {
		t.Errorf("plaintext qemu-io: exit %d\nstderr:\n%s", code, stderr)
	}

	// A client certificate of another cluster's CA (with this server's CA to trust, so that
	// the refusal is the server's).
	other := filepath.Join(newTestPKI(t).dir, pki.NBDClientDir)
	mixed := t.TempDir()
	for _, f := range []struct{ from, name string }{{certs, "ca-cert.pem"}, {other, "client-cert.pem"}, {other, "client-key.pem"}} {
		b, err := os.ReadFile(filepath.Join(f.from, f.name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mixed, f.name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, stderr, code = runTool(t, "nbdinfo", "nbds://"+s.addr+"/vol?tls-certificates="+mixed)
	if code == 0 {
		t.Errorf("nbdinfo with another CA's client certificate succeeded")
	}
	t.Logf("nbdinfo with another CA's client certificate: exit %d: %s", code, stderr)
	// (qemu-io checks its own certificate against the CA and does not connect.)
	waitUntil(t, "the refusal counted", func() (bool, string) {
		n := s.Stats().TLSHandshakeFailures
		return n == 1, fmt.Sprint(n, " TLS handshake failures")
	})
	if st := s.Stats(); st.TLSConnections < 4 || st.TLSRequiredRefusals == 0 || st.TransmittingConnections != 0 {
		t.Errorf("%d TLS connections, %d TLS-required refusals", st.TLSConnections, st.TLSRequiredRefusals)
	}
}
