package main

// Exit codes by class (issue 15): 2 for a wrong command line, 3 for a node
// that cannot be reached, 1 for a refusal or a failure; decided by values,
// never by the words.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runReplctl runs a command line in this process, as main does, and
// returns its exit code, stdout and stderr.
func runReplctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	code := run(context.Background(), root, &errOut)
	return code, out.String(), errOut.String()
}

func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestExitCodesOfTheCommandLine(t *testing.T) {
	closed := closedAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"an unknown command", []string{"satus"}, exitUsage, `unknown command "satus" for "replctl" (did you mean status?)`},
		{"an unknown subcommand", []string{"path", "lsit"}, exitUsage, `unknown command "lsit" for "replctl path"`},
		{"an unknown flag", []string{"status", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{"a missing argument", []string{"primary", "--addr", closed}, exitUsage, "accepts 1 arg(s), received 0"},
		{"too many arguments", []string{"status", "vol0", "vol1", "--addr", closed}, exitUsage, "accepts at most 1 arg(s)"},
		{"a required flag left out", []string{"primary", "vol0", "--addr", closed}, exitUsage, "--node NAME is required"},
		{"a bad flag value", []string{"status", "--timeout", "soon"}, exitUsage, `invalid argument "soon" for "--timeout"`},
		{"a bad --color", []string{"status", "--color", "pink", "--addr", closed}, exitUsage, `--color "pink": want auto, always or never`},
		{"a bad --since", []string{"events", "--since", "the dawn of time", "--addr", closed}, exitUsage, "--since"},
		{"flags that exclude each other", []string{"events", "--node", "beta", "--all", "--addr", closed}, exitUsage, "give --node NAME or --all, not both"},
		{"nothing to adjust", []string{"adjust", "vol0", "--addr", closed}, exitUsage, "nothing to adjust"},
		{"a bad size", []string{"demo", "--size", "lots"}, exitUsage, "--size"},
		{"an NBD TLS policy without TLS", []string{"demo", "--nbd-tls", "off"}, exitUsage, "--nbd-tls needs --tls"},
		{"no such NBD TLS policy", []string{"demo", "--tls", "--nbd-tls", "maybe"}, exitUsage, "want required, optional or off"},
		{"checksums neither on nor off", []string{"demo", "--checksums", "maybe"}, exitUsage, `--checksums "maybe": want on or off`},
		{"a resize to no size", []string{"resize", "vol0", "lots", "--addr", closed}, exitUsage, `SIZE: size "lots"`},
		{"a resize to a size that is no whole block", []string{"resize", "vol0", "1000", "--addr", closed}, exitUsage, "SIZE: 1000 bytes is not a positive multiple of 4096"},
		{"a resize to max", []string{"resize", "vol0", "max", "--addr", closed}, exitUsage, "give the size to grow to"},
		{"a resize to a node that is not running", []string{"resize", "vol0", "1GiB", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"a node that is not running", []string{"status", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"events of a node that is not running", []string{"events", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"a command to a node that is not running", []string{"primary", "vol0", "--node", "beta", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"an empty node name", []string{"node", "remove", "", "--addr", closed}, exitUsage, "NAME is empty: give the node's name"},
		{"create-md without a config", []string{"create-md", "vol0"}, exitUsage, "--config FILE and --node NAME are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runReplctl(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.says) {
				t.Fatalf("replctl %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.says)
			}
			if code == exitUsage && !strings.Contains(errOut, "--help") {
				t.Errorf("a usage error does not point to --help: %q", errOut)
			}
		})
	}
}

// TestExitCodeClasses pins the classes by value: the node's refusals are
// 1 whatever their words, an unreachable node or a deadline 3.
func TestExitCodeClasses(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"no error", nil, 0},
		{"the node refuses (FailedPrecondition)", status.Error(codes.FailedPrecondition, "vol0 has NBD clients"), exitFailed},
		{"the node refuses a bad value (InvalidArgument)", status.Error(codes.InvalidArgument, "protocol D"), exitFailed},
		{"an unknown name", &nameError{"no volume"}, exitFailed},
		{"a plain failure", errors.New("no resync of vol0 is running: nothing to pause"), exitFailed},
		{"the node is unavailable", status.Error(codes.Unavailable, "anything"), exitUnreachable},
		{"the node did not answer in time", status.Error(codes.DeadlineExceeded, "anything"), exitUnreachable},
		{"a deadline, wrapped", fmt.Errorf("waiting: %w", context.DeadlineExceeded), exitUnreachable},
		{"a usage error, wrapped", fmt.Errorf("events: %w", usageErrorf("--since")), exitUsage},
		{"an unreachable error that reads like a refusal", unreachableError(errors.New("refused")), exitUnreachable},
		{"no certificate (Unauthenticated)", status.Error(codes.Unauthenticated, "pass --tls-dir"), exitFailed},
		{"a node's certificate for an operator command (PermissionDenied)", status.Error(codes.PermissionDenied, "may not run Primary"), exitFailed},
		{"no TLS with the node", &transport.StreamError{Reach: transport.ReachTLS}, exitFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.code {
				t.Fatalf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
			}
		})
	}
	// A control call that could not connect, as transport returns it.
	c, err := transport.DialControl(closedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.NodeStatus(context.Background(), &transport.StatusRequest{})
	if got := exitCode(err); got != exitUnreachable {
		t.Fatalf("exitCode(%v) = %d, want %d", err, got, exitUnreachable)
	}
}

// TestHelpListsTheExitCodes: replctl --help documents them.
func TestHelpListsTheExitCodes(t *testing.T) {
	code, out, _ := runReplctl(t, "--help")
	for _, want := range []string{"Exit codes: 0 success; 1 the node refused", "2 a\nusage error", "3 a node could not be reached"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("replctl --help: exit %d, want %q in:\n%s", code, want, out)
		}
	}
}

// completions runs replctl __complete ARGS in this process and returns the
// candidates (the words before a tab) and the directive line.
func completions(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	code, out, errOut := runReplctl(t, append([]string{"__complete"}, args...)...)
	if code != 0 {
		t.Fatalf("replctl __complete %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	var words []string
	directive := ""
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, ":") {
			directive = l
			continue
		}
		words = append(words, strings.SplitN(l, "\t", 2)[0])
	}
	return words, directive
}

// TestCompletionOfFixedValues: flags and arguments with fixed values
// complete them, with no cluster needed; with no node answering at
// --addr, names complete to nothing, quietly and at once.
func TestCompletionOfFixedValues(t *testing.T) {
	closed := closedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", closed, "adjust", "vol0", "--protocol", ""}, "A B C"},
		{[]string{"--addr", closed, "adjust", "vol0", "--on-congestion", "p"}, "pull-ahead"},
		{[]string{"--addr", closed, "path", "policy", "vol0", ""}, "active-read failover queue-length round-robin service-time"},
		{[]string{"status", "--color", ""}, "always auto never"},
		{[]string{"demo", "--metadata", ""}, "external internal"},
		{[]string{"demo", "--nbd-tls", ""}, "off optional required"},
		{[]string{"demo", "--checksums", ""}, "off on"},
		{[]string{"--addr", closed, "primary", ""}, ""},
		{[]string{"--addr", closed, "primary", "vol0", "--node", ""}, ""},
	} {
		start := time.Now()
		got, directive := completions(t, tc.args...)
		if strings.Join(got, " ") != tc.want || directive != ":4" {
			t.Errorf("replctl __complete %s: %q %s, want %q and :4 (no files)", strings.Join(tc.args, " "), got, directive, tc.want)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("replctl __complete %s took %s", strings.Join(tc.args, " "), took)
		}
	}
}

// TestCompletionOfCreateMDReadsTheConfig: create-md works offline, so its
// volume and --node complete from the file --config names.
func TestCompletionOfCreateMDReadsTheConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "cluster.yaml")
	yaml := fmt.Sprintf(`nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802", state_dir: %q}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805", state_dir: %q}
volumes:
  - {name: vol0, size: 64MiB, primary: alpha, disks: {alpha: %q, beta: %q}}
  - {name: vol1, size: 64MiB, primary: beta, disks: {alpha: %q, beta: %q}}
`, filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "a0"), filepath.Join(dir, "b0"), filepath.Join(dir, "a1"), filepath.Join(dir, "b1"))
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := completions(t, "create-md", "--config", cfg, ""); strings.Join(got, " ") != "vol0 vol1" {
		t.Errorf("create-md volumes: %q", got)
	}
	if got, _ := completions(t, "create-md", "vol1", "--config", cfg, "--node", ""); strings.Join(got, " ") != "alpha beta" {
		t.Errorf("create-md --node: %q", got)
	}
}
