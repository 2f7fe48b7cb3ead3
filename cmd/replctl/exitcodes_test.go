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
	"strings"
	"testing"

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
		{"a node that is not running", []string{"status", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"events of a node that is not running", []string{"events", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
		{"a command to a node that is not running", []string{"primary", "vol0", "--node", "beta", "--addr", closed}, exitUnreachable, "cannot reach a node at " + closed},
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
