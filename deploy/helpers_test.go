package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// inCI reports whether the tests run in CI, where a missing tool or
// privilege fails a test instead of skipping it.
func inCI() bool { return os.Getenv("CI") == "true" }

// missing skips the test, or fails it under CI=true.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// requireRoot skips (fails in CI) unless the test runs as root.
func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "%s needs root; running as uid %d", why, os.Geteuid())
	}
}

// requireTool returns the path of tool, from the Debian package debPkg.
func requireTool(t *testing.T, tool, debPkg string) string {
	t.Helper()
	if p, err := exec.LookPath(tool); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, tool)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	missing(t, "%s not found: install the Debian package %s (./deploy/install-test-deps.sh)", tool, debPkg)
	return ""
}

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", dir, err)
	}
	return dir
}

// result is what a command printed (stdout and stderr) and how it ended.
type result struct {
	out  string
	code int
	err  error
}

func (r result) ok() bool { return r.err == nil }

func (r result) String() string {
	return fmt.Sprintf("exit %d (%v): %s", r.code, r.err, strings.TrimSpace(r.out))
}

// run runs name with args in dir (the test's directory when ""), with env
// added to the test's environment, within timeout.
func run(dir string, timeout time.Duration, env []string, name string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	return result{out: out.String(), code: code, err: err}
}

// mustRun runs a command and fails the test, naming the step, unless it
// succeeds; it returns its output.
func mustRun(t *testing.T, step, dir string, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	r := run(dir, timeout, env, name, args...)
	if !r.ok() {
		t.Fatalf("%s: %s %s: %s", step, name, strings.Join(args, " "), r)
	}
	return r.out
}
