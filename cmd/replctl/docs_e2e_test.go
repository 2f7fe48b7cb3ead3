package main

// The docs' runnable blocks, run as written against `replctl demo`.
//
// A fenced block whose info string is `sh tour` (the README's tour) or
// `sh demo FLAGS` is run line by line: the test starts `replctl demo
// --base-port 0 FLAGS` and runs each line with sh from the repository's
// root, requiring exit 0, or the code a trailing `# exits N` names; a
// trailing `# prints: TEXT` requires TEXT in the line's output, and a
// trailing comment saying "Ctrl-C ends it" runs a command that follows
// (events) until it printed something, then sends it SIGINT, as a user's
// Ctrl-C, and requires exit 0. What the test changes, and nothing else:
//   - the demo's ports where the block has the defaults 7800 to 7805
//     (alpha's control, replication, NBD, then beta's), and
//     REPLCTL_ADDR set to alpha's control address, replctl's default of
//     127.0.0.1:7800 for the demo's default ports;
//   - a temporary directory where the block has /mnt/vol0 or the demo's
//     --dir, and REPLCTL_RUN_DIR set to a temporary directory, so that
//     what replctl mount records is this test's to undo;
//   - `go build -o replctl` and `./replctl` write and run the binary in a
//     temporary directory instead of the source tree, and `replctl` on the
//     PATH is this package's build;
//   - `sudo ` is dropped when the test runs as root (CI does); a block that
//     uses sudo or replctl mount needs root and the mount tools, and fails
//     without them under CI=true, as every tool a line runs does;
//   - the demo itself is started by the test (a `go run ./cmd/replctl
//     demo` is the same binary, built by TestMain), with the size the
//     docs give it (1GiB, the default) unless the block's flags say.
// The README's demo output and `replctl status` sample are compared with
// what the demo and the tour's first `replctl status` print, and every
// http://127.0.0.1:780x/... address a page gives is fetched from the demo.
//
// Only checked, not run (guide_test.go): command lines in other blocks and
// in code spans, because they need real hosts or another cluster: systemctl,
// dpkg, apt, nbd-client and modprobe, replctl against 10.0.0.1 or the
// /var/lib/replvol socket, hooks in a cluster file, make bench and make
// deb. Each of those names a real replctl or replnode command and flags,
// and every make target and test a page names exists.

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runnableBlocks are a page's blocks marked `sh tour` or `sh demo ...`.
func runnableBlocks(t *testing.T, page *mdPage) []mdBlock {
	var out []mdBlock
	for _, b := range page.blocks {
		if f := strings.Fields(b.info); len(f) >= 2 && f[0] == "sh" && (f[1] == "tour" || f[1] == "demo") {
			out = append(out, b)
		}
	}
	return out
}

// docLine is one command line of a runnable block, with what its trailing
// comment asks.
type docLine struct {
	n       int    // its line in the page
	cmd     string // as written, continuation lines joined
	exit    int    // the exit code wanted
	prints  string // text its output must hold ("": none)
	follows bool   // a command that runs until Ctrl-C
}

// bare is the command without its comment.
func (l docLine) bare() string {
	if i := commentStart(l.cmd); i >= 0 {
		return strings.TrimSpace(l.cmd[:i])
	}
	return l.cmd
}

var exitsComment = regexp.MustCompile(`^exits? (\d+)\b`)

func blockLines(b mdBlock) []docLine {
	var out []docLine
	n := b.line
	acc, start := "", 0
	for _, l := range b.text {
		if acc == "" {
			start = n
		}
		n++
		if strings.HasSuffix(l, `\`) {
			acc += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		line := strings.TrimSpace(acc + l)
		acc = ""
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		d := docLine{n: start, cmd: line}
		if i := commentStart(line); i >= 0 {
			comment := strings.TrimSpace(line[i+1:])
			if m := exitsComment.FindStringSubmatch(comment); m != nil {
				d.exit, _ = strconv.Atoi(m[1])
			}
			if _, text, ok := strings.Cut(comment, "prints: "); ok {
				d.prints = strings.TrimSpace(text)
			}
			d.follows = strings.Contains(comment, "Ctrl-C ends it")
		}
		out = append(out, d)
	}
	return out
}

// docRun is one runnable block's demo and what the block's lines become.
type docRun struct {
	t       *testing.T
	d       *demo
	page    *mdPage
	repo    string // the repository's root, where lines run
	work    string // where ./replctl is built
	env     []string
	subst   []*strings.Replacer
	ports   map[string]string // 7800..7805 -> the demo's
	exports []string          // the block's export lines so far
	outputs map[string]string // a line as written, without its comment -> its output (the first run)
}

// startDocRun starts the demo a block asks for, and works out the
// substitutions and environment its lines run with.
func startDocRun(t *testing.T, page *mdPage, b mdBlock) *docRun {
	t.Helper()
	lines := blockLines(b)
	if len(lines) == 0 {
		t.Fatalf("%s:%d: the runnable block has no command", page.path, b.line)
	}
	mounts := false
	for _, l := range lines {
		if strings.Contains(l.cmd, "sudo ") || regexp.MustCompile(`replctl(\s+--\S+\s+\S+)*\s+(u?mount)\b`).MatchString(l.cmd) {
			mounts = true
		}
	}
	if mounts {
		needMountTools(t)
	}
	for _, l := range lines {
		requireToolsOf(t, l.cmd)
	}

	// The demo, with the block's flags; its --dir becomes a temporary one.
	flags := strings.Fields(b.info)[2:]
	var demoArgs []string
	dirAsWritten := ""
	for i := 0; i < len(flags); i++ {
		if flags[i] == "--dir" && i+1 < len(flags) {
			dirAsWritten = flags[i+1]
			i++
			continue
		}
		demoArgs = append(demoArgs, flags[i])
	}
	d := startDemo(t, append([]string{"--size", "1GiB"}, demoArgs...)...)

	repo, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	r := &docRun{t: t, d: d, page: page, repo: repo, work: t.TempDir(), outputs: map[string]string{}}
	runs := newMountRunDirs(t, "host")
	runs.cleanUpAtTheEnd()
	r.ports = map[string]string{}
	for i, n := range []string{"alpha", "beta"} {
		node := d.nodes[n]
		for j, addr := range []string{node.Control, node.Replication, node.NBD} {
			_, port, _ := strings.Cut(addr, ":")
			r.ports[strconv.Itoa(7800+3*i+j)] = port
		}
	}
	pairs := []string{"/mnt/vol0", runs.mountPoint("vol0")}
	if dirAsWritten != "" {
		pairs = append(pairs, dirAsWritten, d.dir)
	}
	r.subst = append(r.subst, strings.NewReplacer(pairs...))

	// replctl on the PATH is this package's build.
	bin := t.TempDir()
	if err := os.Symlink(replctlBin, filepath.Join(bin, "replctl")); err != nil {
		t.Fatal(err)
	}
	r.env = []string{
		"PATH=" + bin + ":" + filepath.Dir(goCommand()) + ":" + os.Getenv("PATH") + ":/usr/sbin:/sbin",
		"REPLCTL_ADDR=" + d.nodes["alpha"].Control,
		"REPLCTL_RUN_DIR=" + runs.dirs["host"],
		"NO_COLOR=1",
	}
	return r
}

var defaultPort = regexp.MustCompile(`\b780[0-5]\b`)

// sub is a line or text as it runs here.
func (r *docRun) sub(s string) string {
	s = defaultPort.ReplaceAllStringFunc(s, func(p string) string { return r.ports[p] })
	for _, rep := range r.subst {
		s = rep.Replace(s)
	}
	return s
}

// asRun is a command line as the test runs it.
func (r *docRun) asRun(cmd string) string {
	cmd = r.sub(cmd)
	cmd = regexp.MustCompile(`(^|[\s;&|(])\./replctl\b`).ReplaceAllString(cmd, "${1}"+filepath.Join(r.work, "replctl"))
	cmd = regexp.MustCompile(`-o replctl\b`).ReplaceAllString(cmd, "-o "+filepath.Join(r.work, "replctl"))
	if os.Geteuid() == 0 {
		cmd = regexp.MustCompile(`\bsudo\s+`).ReplaceAllString(cmd, "")
	}
	return cmd
}

// runLine runs one line of the block as its comment says, and fails the
// test unless it did what the page promises.
func (r *docRun) runLine(l docLine) {
	t := r.t
	t.Helper()
	if strings.HasPrefix(l.cmd, "export ") {
		r.exports = append(r.exports, r.asRun(l.cmd))
		return
	}
	script := r.asRun(l.cmd)
	if len(r.exports) > 0 {
		script = strings.Join(r.exports, "; ") + "; " + script
	}
	where := fmt.Sprintf("%s:%d: %s", r.page.path, l.n, l.cmd)
	if l.follows {
		r.runFollowing(where, script)
		return
	}
	res := runCmdIn(r.repo, 3*time.Minute, r.env, "/bin/sh", "-c", script)
	t.Logf("%s\n  ran: %s\n  exit %d: %s", where, script, res.code, strings.TrimSpace(res.out))
	if res.code != l.exit {
		t.Fatalf("%s\nexits %d, the page says %d (ran %q):\n%s", where, res.code, l.exit, script, res.out)
	}
	if l.prints != "" && !strings.Contains(res.out, r.sub(l.prints)) {
		t.Fatalf("%s\nprinted no %q (ran %q):\n%s", where, r.sub(l.prints), script, res.out)
	}
	if _, seen := r.outputs[l.bare()]; !seen {
		r.outputs[l.bare()] = res.out
	}
}

// runFollowing runs a command that follows until Ctrl-C: it must print,
// keep running, and end with exit 0 on SIGINT.
func (r *docRun) runFollowing(where, script string) {
	t := r.t
	t.Helper()
	// exec: SIGINT reaches the command itself, as Ctrl-C does.
	if i := strings.LastIndex(script, "; "); i >= 0 && len(r.exports) > 0 {
		script = script[:i+2] + "exec " + script[i+2:]
	} else {
		script = "exec " + script
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = r.repo
	cmd.Env = append(os.Environ(), r.env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	exited := false
	printed := within(30*time.Second, 50*time.Millisecond, func() bool {
		select {
		case err := <-done:
			exited = true
			done <- err
			return true
		default:
		}
		return strings.Count(out.tail(1<<20), "\n") >= 2
	})
	if exited || !printed {
		t.Fatalf("%s\nwant it to print and follow until Ctrl-C; it exited %v, printed:\n%s", where, exited, out.tail(1<<20))
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		done <- err
		t.Logf("%s\n  ran: %s\n  ended by SIGINT (%v): %s", where, script, err, strings.TrimSpace(out.tail(4000)))
		if err != nil {
			t.Fatalf("%s\nCtrl-C ended it with %v, want exit 0:\n%s", where, err, out.tail(1<<20))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s\nstill running 10 s after SIGINT:\n%s", where, out.tail(1<<20))
	}
}

// fetchPagesAddresses fetches every http://127.0.0.1:780x/ address the
// page's prose gives, from the demo: each must answer 200.
func (r *docRun) fetchPagesAddresses() {
	t := r.t
	t.Helper()
	addr := regexp.MustCompile(`http://127\.0\.0\.1:780[0-5](/[^\s)` + "`" + `]*)?`)
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, l := range r.page.prose {
		for _, u := range addr.FindAllString(l, -1) {
			u = strings.TrimRight(u, ".,;:")
			resp, err := hc.Get(r.sub(u))
			if err != nil {
				t.Fatalf("%s gives %s: %v", r.page.path, u, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s gives %s: %s", r.page.path, u, resp.Status)
			}
			t.Logf("%s: %s answers %s", r.page.path, r.sub(u), resp.Status)
		}
	}
}

// toolPackages are the Debian packages of the tools a runnable line may
// start; a tool missing from the machine fails the test under CI=true.
var toolPackages = map[string]string{
	"nbdinfo": "libnbd-bin", "nbdcopy": "libnbd-bin", "qemu-io": "qemu-utils",
	"promtool": "prometheus", "go": "golang", "tee": "coreutils", "mkdir": "coreutils",
	"cat": "coreutils", "sync": "coreutils", "echo": "coreutils",
}

// requireToolsOf requires the program of each simple command of line.
func requireToolsOf(t *testing.T, line string) {
	t.Helper()
	for _, seg := range commandSegments(line) {
		words := strings.Fields(seg)
		for len(words) > 0 && (words[0] == "sudo" || words[0] == "export" || strings.Contains(words[0], "=")) {
			words = words[1:]
		}
		if len(words) == 0 || strings.Contains(words[0], "replctl") {
			continue
		}
		if words[0] == "go" {
			if _, err := os.Stat(goCommand()); err != nil {
				missing(t, "go not found: the tour builds replctl with it")
			}
			continue
		}
		pkg, known := toolPackages[words[0]]
		if !known {
			t.Fatalf("a runnable line starts %s, which this test does not know: add it to toolPackages with its Debian package", words[0])
		}
		RequireTool(t, words[0], pkg)
	}
}

// TestE2EReadmeTourRunsAsWritten: the README's tour, the block marked
// `sh tour`, run as written against the demo (see the top of this file
// for what the test changes). Each line must exit 0 and print what its
// comment says; the README's demo output is what the demo printed, and
// its `replctl status` sample is what the tour's first status printed,
// but for the times. The status page it points to answers. Nothing of the
// mounts is left behind.
func TestE2EReadmeTourRunsAsWritten(t *testing.T) {
	e2eBeside(t)
	page := readPage(t, "README.md")
	var tours []mdBlock
	for _, b := range runnableBlocks(t, page) {
		if strings.Fields(b.info)[1] == "tour" {
			tours = append(tours, b)
		}
	}
	if len(tours) != 1 {
		t.Fatalf("README.md has %d blocks marked `sh tour`, want the tour's one", len(tours))
	}
	r := startDocRun(t, page, tours[0])
	r.checkDemoOutput()
	for _, l := range blockLines(tours[0]) {
		r.runLine(l)
	}
	r.checkStatusSample()
	r.fetchPagesAddresses()
}

// checkDemoOutput: each line of the README's demo output (the text block
// that starts with `$ go run ./cmd/replctl demo`) is a line the demo
// printed, with its ports and directory.
func (r *docRun) checkDemoOutput() {
	t := r.t
	t.Helper()
	var sample []string
	for _, b := range r.page.blocks {
		if len(b.text) > 0 && strings.HasPrefix(b.text[0], "$ go run ./cmd/replctl demo") {
			sample = b.text[1:]
		}
	}
	if len(sample) < 3 {
		t.Fatal("README.md shows no output of `$ go run ./cmd/replctl demo`")
	}
	m := regexp.MustCompile(`^replvol demo in (\S+) `).FindStringSubmatch(sample[0])
	if m == nil {
		t.Fatalf("the README's demo output starts %q, not with the demo's directory", sample[0])
	}
	dir := strings.NewReplacer(m[1], r.d.dir)
	printed := map[string]bool{}
	for _, l := range strings.Split(r.d.out.tail(1<<20), "\n") {
		printed[strings.TrimSpace(l)] = true
	}
	for _, l := range sample {
		if want := dir.Replace(r.sub(l)); !printed[want] {
			t.Errorf("the README's demo output has %q; the demo printed no %q:\n%s", l, want, r.d.out.tail(4000))
		}
	}
}

// checkStatusSample: the README's `replctl status` sample is, word for
// word, what the tour's first `./replctl status` printed, but for the
// last resync's time and age.
func (r *docRun) checkStatusSample() {
	t := r.t
	t.Helper()
	out, ran := r.outputs["./replctl status"]
	if !ran {
		t.Fatal("the tour runs no ./replctl status to compare the README's sample with")
	}
	var sample []string
	for _, b := range r.page.blocks {
		if len(b.text) > 0 && b.text[0] == "$ replctl status" {
			sample = b.text[1:]
		}
	}
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(sample) == 0 || len(got) != len(sample) {
		t.Fatalf("the README's status sample has %d lines, replctl status printed %d:\n%s", len(sample), len(got), out)
	}
	lastResync := regexp.MustCompile(`\d+(\.\d+)?[KMGT]?i?B in \d+s, \d+s ago`)
	for i := range sample {
		want := strings.Fields(lastResync.ReplaceAllString(r.sub(sample[i]), "RESYNC"))
		have := strings.Fields(lastResync.ReplaceAllString(got[i], "RESYNC"))
		if strings.Join(want, " ") != strings.Join(have, " ") {
			t.Errorf("the README's status sample, line %d:\n  %s\nreplctl status printed:\n  %s", i+1, sample[i], got[i])
		}
	}
}

// TestE2EDocsBlocksRunAgainstTheDemo: every block of docs/*.md marked
// `sh demo FLAGS` runs as written against a demo started with FLAGS (see
// the top of this file), and the http://127.0.0.1:780x/ addresses of its
// page answer.
func TestE2EDocsBlocksRunAgainstTheDemo(t *testing.T) {
	e2eBeside(t)
	blocks := 0
	for _, file := range docFiles(t) {
		if !strings.HasPrefix(file, "docs/") {
			continue
		}
		page := readPage(t, file)
		for _, b := range runnableBlocks(t, page) {
			blocks++
			b := b
			t.Run(fmt.Sprintf("%s:%d", filepath.Base(file), b.line), func(t *testing.T) {
				e2eBeside(t)
				r := startDocRun(t, page, b)
				for _, l := range blockLines(b) {
					r.runLine(l)
				}
				r.fetchPagesAddresses()
			})
		}
	}
	if blocks < 4 {
		t.Fatalf("found %d blocks marked `sh demo` in docs/: the marks are gone", blocks)
	}
}

// TestDocLinesReadTheirComments pins how a runnable line's trailing
// comment is read.
func TestDocLinesReadTheirComments(t *testing.T) {
	b := mdBlock{line: 10, text: []string{
		"replctl status                             # exits 1: no certificate",
		"# a comment line",
		"",
		"nbdinfo nbd://127.0.0.1:7802/vol0         # prints: can_multi_conn: true",
		"qemu-io -f raw nbd://127.0.0.1:7802/vol0 \\",
		"  -c 'write -P 0xab 0 1M'",
		"replctl events --since 10m                 # the history, then live; Ctrl-C ends it",
		"echo '# not a comment' | cat",
	}}
	got := blockLines(b)
	want := []docLine{
		{n: 10, exit: 1},
		{n: 13, prints: "can_multi_conn: true"},
		{n: 14},
		{n: 16, follows: true},
		{n: 17},
	}
	if len(got) != len(want) {
		t.Fatalf("blockLines = %+v, want %d lines", got, len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.n != w.n || g.exit != w.exit || g.prints != w.prints || g.follows != w.follows {
			t.Errorf("line %d: %+v, want n %d exit %d prints %q follows %v", i, g, w.n, w.exit, w.prints, w.follows)
		}
	}
	if !strings.Contains(got[2].cmd, "-c 'write -P 0xab 0 1M'") {
		t.Errorf("the continued qemu-io line reads %q", got[2].cmd)
	}
	var r docRun
	r.ports = map[string]string{"7802": "40507"}
	if s := r.sub("nbd://127.0.0.1:7802/vol0 port=7802 17802"); s != "nbd://127.0.0.1:40507/vol0 port=40507 17802" {
		t.Errorf("sub = %q", s)
	}
}
