package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors reach the operator as sentences: which node, which address, what
// to do. The node's own messages are already in words (they only lose
// gRPC's "rpc error: code = ... desc =" wrapping); what the client sees
// by itself (a refused connection, its own deadline) is put in words here,
// by error class and never by matching the text.

// Exit codes: what a script can tell apart without reading the words.
// Classes come from values (our own error types, gRPC status codes,
// context errors), never from the text.
const (
	// exitFailed: the node refused the operation, or it failed.
	exitFailed = 1
	// exitUsage: the command line is wrong (an unknown command or flag, a
	// missing argument, a bad value); nothing was sent.
	exitUsage = 2
	// exitUnreachable: a node the command needs could not be reached, or
	// did not answer in time (--timeout).
	exitUnreachable = 3
	// 4 and 5 are status --check's: a warning, a critical problem.
	// exitUnrecoverable: scrub --wait's scrub found blocks that no
	// replica holds good.
	exitUnrecoverable = 6
)

// exitCodesHelp documents the exit codes in replctl --help.
const exitCodesHelp = `Exit codes: 0 success; 1 the node refused the operation or it failed; 2 a
usage error (unknown command or flag, missing argument, bad value: nothing
was sent); 3 a node could not be reached or did not answer in time; 6
(scrub --wait) the scrub found blocks that no replica holds good.`

// exitError gives an error its exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a usage error: a wrong command line.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// asUsage marks err (cobra's, or a parser's) as a usage error.
func asUsage(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: exitUsage, err: err}
}

// unreachableError marks err as a node that could not be reached.
func unreachableError(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: exitUnreachable, err: err}
}

// exitCode is the exit status for the error a command returned.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// An error with its own code: status --check's verdict.
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	var se *transport.StreamError
	if errors.As(err, &se) && se.Reach == transport.ReachTLS {
		return exitFailed // the node answered, and refused our TLS
	}
	if errors.As(err, &se) && se.Reach != "" {
		return exitUnreachable
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return exitUnreachable
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return exitUnreachable
		}
	}
	return exitFailed
}

// fail turns an error of the call into the sentence the operator reads.
// volume and node are the names the command was given ("" when none):
// when the node refuses the request, they are checked against the
// cluster, so that a typo gets the list of valid names.
func (k *call) fail(err error, volume, node string) error {
	if err == nil {
		return nil
	}
	if ctxErr := k.ctx.Err(); ctxErr != nil {
		return k.interrupted(ctxErr)
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		var tlsErr *transport.StreamError
		if errors.As(err, &tlsErr) && tlsErr.Reach == transport.ReachTLS {
			return k.g.tlsRefused(tlsErr)
		}
		// Either the node said so in words (a command it could not
		// finish), or the client could not talk to it: find out which.
		if why := probe(k.g.addr); why != nil {
			return unreachable(k.g.addr, why)
		}
		var se *transport.StreamError
		if (errors.As(err, &se) && se.Reach == transport.ReachNoAnswer) || !k.answers() {
			return unreachableError(fmt.Errorf("%s accepts connections but its control API does not answer: is replnode hung, paused or overloaded?", k.g.nodeAt()))
		}
		if node != "" {
			// The node at --addr forwarded the command to node.
			if why := k.peerUnreachable(node); why != nil {
				return unreachableError(why)
			}
		}
		return unreachableError(errors.New(plainMessage(st.Message())))
	case codes.NotFound, codes.InvalidArgument, codes.FailedPrecondition:
		if volume != "" || node != "" {
			if bad := k.checkNames(volume, node); bad != nil {
				return bad
			}
		}
	case codes.Unimplemented:
		return fmt.Errorf("%s does not know this request (%s): is it an older replnode?", k.g.nodeAt(), st.Message())
	case codes.Canceled:
		return k.interrupted(context.Canceled)
	}
	return errors.New(st.Message())
}

// precheck, for a command the node at --addr forwards to node, checks
// the names and that node is reachable from there: the node would
// otherwise wait for it until --timeout.
func (k *call) precheck(volume, node string) error {
	if node == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(k.ctx, 10*time.Second)
	defer cancel()
	st, err := k.c.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return k.fail(err, "", "")
	}
	rememberNodes(st)
	if err := checkNames(st, volume, node); err != nil {
		return err
	}
	if err := unreachablePeer(st, node); err != nil {
		return unreachableError(fmt.Errorf("%w; nothing was changed", err))
	}
	return nil
}

// unreachablePeer returns an error naming node when st (the view of the
// node at --addr) says it cannot be reached.
func unreachablePeer(st *transport.ClusterStatus, node string) error {
	for _, n := range st.Nodes {
		if n.Name == node && !n.Alive && n.Name != st.From {
			why := plainMessage(firstLine(n.Error))
			if why == "" {
				why = "no answer"
			}
			if n.ErrorCode == transport.ReachNoAnswer {
				return fmt.Errorf("node %s is unreachable from %s (%s): is replnode on %s (%s) hung or paused? (systemctl status replnode there)", node, st.From, why, node, n.Control)
			}
			return fmt.Errorf("node %s is unreachable from %s (%s): is replnode running on %s (%s)?", node, st.From, why, node, n.Control)
		}
	}
	return nil
}

// peerUnreachable returns an error naming node when the node at --addr
// cannot reach it (nil otherwise).
func (k *call) peerUnreachable(node string) error {
	ctx, cancel := context.WithTimeout(k.parent, 10*time.Second)
	defer cancel()
	st, err := k.c.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return nil
	}
	return unreachablePeer(st, node)
}

// tlsRefused is a node at --addr with which no TLS came about, and what
// to do: a refusal (exit code 1), the node answered.
func (g *globals) tlsRefused(se *transport.StreamError) error {
	hint := "; pass --tls-dir DIR (or set REPLCTL_TLS_DIR) to the directory replctl certs init wrote, with ca.crt, operator.crt and operator.key, " + unixSocketHint(g.addr)
	if g.tlsDir != "" {
		hint = fmt.Sprintf("; is --tls-dir %s this cluster's (replctl certs init of its cluster file)?", g.tlsDir)
	}
	return &exitError{code: exitFailed, err: errors.New(se.Named(knownNode(g.addr)).Error() + hint)}
}

// answers reports whether the node at --addr answers a status call
// within 2 s.
func (k *call) answers() bool {
	ctx, cancel := context.WithTimeout(k.parent, 2*time.Second)
	defer cancel()
	_, err := k.c.NodeStatus(ctx, &transport.StatusRequest{})
	return err == nil
}

// interrupted says what a request cut short by Ctrl-C or by --timeout
// means: for a command that changes something, that it may or may not
// have happened.
func (k *call) interrupted(ctxErr error) error {
	what := "the request was interrupted"
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		if k.action == "" {
			return unreachableError(fmt.Errorf("no answer from %s within %s (--timeout): it accepts connections but does not answer; is it hung or overloaded?", k.g.nodeAt(), k.g.timeout))
		}
		what = fmt.Sprintf("the request timed out after %s (--timeout)", k.g.timeout)
		return unreachableError(fmt.Errorf("%s: %s may or may not have happened; check replctl status", what, k.action))
	}
	if k.action == "" {
		return errors.New(what)
	}
	return fmt.Errorf("%s: %s may or may not have happened; check replctl status", what, k.action)
}

// checkNames asks the cluster which volumes and nodes exist and returns
// an error listing them when volume or node is not one of them (nil when
// both exist, or when the cluster cannot say).
func (k *call) checkNames(volume, node string) error {
	ctx, cancel := context.WithTimeout(k.ctx, 10*time.Second)
	defer cancel()
	st, err := k.c.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return nil
	}
	rememberNodes(st)
	return checkNames(st, volume, node)
}

// checkNames returns an error listing the valid names when volume or node
// ("" for none) is not in st; node must hold volume when both are given.
func checkNames(st *transport.ClusterStatus, volume, node string) error {
	var vol *transport.VolumeStatus
	if volume != "" {
		var names []string
		for i := range st.Volumes {
			names = append(names, st.Volumes[i].Name)
			if st.Volumes[i].Name == volume {
				vol = &st.Volumes[i]
			}
		}
		if vol == nil {
			return &nameError{fmt.Sprintf("no volume %q in the cluster: the volumes are %s", volume, nameList(names))}
		}
	}
	if node == "" {
		return nil
	}
	var names []string
	found := false
	for _, n := range st.Nodes {
		names = append(names, n.Name)
		found = found || n.Name == node
	}
	if !found {
		return &nameError{fmt.Sprintf("no node %q in the cluster: the nodes are %s", node, nameList(names))}
	}
	if vol != nil {
		var holders []string
		for _, r := range vol.Replicas {
			if r.Node == node {
				return nil
			}
			holders = append(holders, r.Node)
		}
		return &nameError{fmt.Sprintf("node %s holds no disk of %s: its nodes are %s", node, volume, nameList(holders))}
	}
	return nil
}

// nameError is a volume or node name the cluster does not have.
type nameError struct{ msg string }

func (e *nameError) Error() string { return e.msg }

func nameList(names []string) string {
	if len(names) == 0 {
		return "(none)"
	}
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	return strings.Join(sorted, ", ")
}

// probe tries a plain TCP connection to addr: nil when something listens
// there, else why not.
func probe(addr string) error {
	var conn net.Conn
	var err error
	if path, ok := transport.UnixPath(addr); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err = transport.DialUnix(ctx, path)
	} else {
		conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
	}
	if err != nil {
		return err
	}
	conn.Close()
	return nil
}

// unreachable is the error for a node that does not accept connections.
func unreachable(addr string, why error) error {
	msg := fmt.Sprintf("cannot reach %s: is replnode running there? (%s)", nodeAt(addr), transport.DialWords(why))
	if others := otherNodes(addr); len(others) > 0 {
		msg += "; other nodes of its cluster: " + strings.Join(others, ", ") + " (use --addr)"
	}
	return unreachableError(errors.New(msg))
}

// nodeAt names the node at --addr when the last known status lists it.
func (g *globals) nodeAt() string { return nodeAt(g.addr) }

func nodeAt(addr string) string {
	if name := knownNode(addr); name != "" {
		return fmt.Sprintf("node %s at %s", name, addr)
	}
	return "a node at " + addr
}

// plainMessage strips gRPC's wrapping from a message another node's
// status carries (an unreachable peer's error): the words stay.
func plainMessage(msg string) string {
	for _, prefix := range []string{"rpc error: ", "code = ", "connection error: ", "desc = ", "\"transport: ", "transport: ", "Error while dialing: ", "error while dialing: ", "latest balancer error: "} {
		for {
			i := strings.Index(msg, prefix)
			if i < 0 {
				break
			}
			cut := msg[i+len(prefix):]
			if prefix == "code = " {
				if j := strings.IndexByte(cut, ' '); j >= 0 {
					cut = cut[j+1:]
				}
			}
			msg = msg[:i] + cut
		}
	}
	return strings.TrimSpace(strings.Trim(msg, "\""))
}
