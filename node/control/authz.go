package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Who may call what on the control API (DESIGN.md §5b). With a tls:
// section every call needs a certificate of the cluster's CA, or comes
// through the node's unix socket; authorize is the rule, a pure function
// of the method, the caller's identity and the call's forwarding mark.
// Without a tls: section every call is let in, as before.

// access is what a method does, for the rule.
type access int

const (
	// accessRead: status and events; nodes read each other's.
	accessRead access = iota + 1
	// accessCommand: an operator's command, or a step of one (Demote and
	// Promote are a switchover's). A node may send one only as a
	// forward of a command it received, marked so.
	accessCommand
	// accessNodes: between nodes only (raft proposals, lease renewals).
	accessNodes
)

// methodAccess classes every method of the control API
// (TestEveryControlMethodHasARule).
var methodAccess = map[string]access{
	transport.MethodNodeStatus:     accessRead,
	transport.MethodClusterStatus:  accessRead,
	transport.MethodEvents:         accessRead,
	transport.MethodAwaitServing:   accessRead,
	transport.MethodVolumeList:     accessRead,
	transport.MethodPools:          accessRead,
	transport.MethodVolumeCreate:   accessCommand,
	transport.MethodVolumeDelete:   accessCommand,
	transport.MethodPrimary:        accessCommand,
	transport.MethodDemote:         accessCommand,
	transport.MethodPromote:        accessCommand,
	transport.MethodConnect:        accessCommand,
	transport.MethodDisconnect:     accessCommand,
	transport.MethodResync:         accessCommand,
	transport.MethodPathAction:     accessCommand,
	transport.MethodVerify:         accessCommand,
	transport.MethodMembership:     accessCommand,
	transport.MethodAdjust:         accessCommand,
	transport.MethodResize:         accessCommand,
	transport.MethodClaim:          accessCommand,
	transport.MethodScrub:          accessCommand,
	transport.MethodReadBlocks:     accessNodes,
	transport.MethodClusterForward: accessNodes,
}

// verdict is the rule's answer: allowed, or the gRPC code and the words
// of the refusal.
type verdict struct {
	allowed bool
	code    codes.Code
	why     string
}

// noCertificateWords tell an operator without a certificate what to do.
const noCertificateWords = "this node requires a certificate of the cluster's CA: pass --tls-dir DIR (or set REPLCTL_TLS_DIR) to the directory with the ca.crt, operator.crt and operator.key that replctl certs init wrote, or, on the node's host, use its unix socket (replctl --addr unix:///var/lib/replvol/control.sock: control.sock in its state directory)"

// authorize is the rule of the control API on a cluster with TLS. id is
// the identity the caller's verified certificate names (zero: none);
// local: the call came through the node's unix socket; forwardedBy is
// the node the call says forwarded it ("" when not marked).
func authorize(method string, id pki.Identity, local bool, forwardedBy string) verdict {
	acc, ok := methodAccess[method]
	if !ok {
		return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("no rule lets anyone call %s", method)}
	}
	if local {
		if acc == accessNodes {
			return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("%s is between nodes only, not for the unix socket", method)}
		}
		return verdict{allowed: true}
	}
	if id == (pki.Identity{}) {
		return verdict{code: codes.Unauthenticated, why: noCertificateWords}
	}
	if forwardedBy != "" && (id.Role != pki.RoleNode || id.Name != forwardedBy) {
		return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("the call says node %s forwarded it, but it came with the certificate of %s: a node forwards only under its own certificate", forwardedBy, id)}
	}
	switch id.Role {
	case pki.RoleOperator:
		if acc == accessNodes {
			return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("%s is between nodes only: the operator's certificate may not call it", method)}
		}
		return verdict{allowed: true}
	case pki.RoleNode:
		switch {
		case acc == accessRead, acc == accessNodes:
			return verdict{allowed: true}
		case forwardedBy != "":
			return verdict{allowed: true}
		}
		return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("the certificate of %s may not run %s: a node's certificate is only for what nodes forward to each other; run operator commands with the operator's certificate (replctl --tls-dir DIR reads operator.crt there) or through the node's unix socket", id, method)}
	}
	return verdict{code: codes.PermissionDenied, why: fmt.Sprintf("the certificate of %s may not call the control API: it opens NBD exports only; use the operator's certificate (replctl --tls-dir DIR)", id)}
}

// caller is who made a control call, as the node learned it.
type caller struct {
	// local: through the node's unix socket.
	local bool
	// id: the identity of the caller's verified certificate (zero: none,
	// or a cluster without TLS).
	id pki.Identity
	// addr: where the call came from.
	addr string
	// by and whom: the forwarding mark (the node that forwarded the call,
	// and on whose behalf); whom alone stands for what a node does by
	// itself on a rule's behalf (the split-brain policy).
	by, whom string
}

// principal says in words on whose behalf the call runs: the original
// operator of a forwarded command.
func (c caller) principal(self string) string {
	switch {
	case c.by != "" && c.whom != "":
		return c.whom
	case c.local:
		return "the unix socket of node " + self
	case c.id != (pki.Identity{}):
		return c.id.String()
	}
	return "a client at " + c.addr
}

type callerKey struct{}

// withCaller records who a call runs for: the node's own calls made
// within it are marked as forwarded on that one's behalf.
func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerOf(ctx context.Context) (caller, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c, ok
}

// localKey marks a request that came through the unix socket.
type localKey struct{}

// Local marks a request's context as come through the node's unix
// socket: whoever may open the socket may call what it serves.
func Local(ctx context.Context) context.Context { return context.WithValue(ctx, localKey{}, true) }

func isLocal(ctx context.Context) bool { return ctx.Value(localKey{}) != nil }

// Gate is the control API's gate on one node: it learns who calls,
// applies the rule (authorize), logs the refusals and marks the calls the
// node forwards. Its methods are safe for concurrent use.
type Gate struct {
	// name is the node's.
	name string
	// tls is the node's certificate and the cluster's CA (nil: the
	// config has no tls: section, and every call is let in).
	tls      *pki.Bundle
	log      *slog.Logger
	refusals *RefusalLog
}

// NewGate returns the gate of node name, which logs to log and notes
// its refusals in refusals; tls is nil without a tls: section.
func NewGate(name string, tls *pki.Bundle, log *slog.Logger, refusals *RefusalLog) *Gate {
	return &Gate{name: name, tls: tls, log: log, refusals: refusals}
}

// Outgoing marks a call this node makes within another's (an operator's
// command it forwards, or a step of it) as forwarded on that one's
// behalf. The node's own calls (status, raft) go unmarked.
func (g *Gate) Outgoing(ctx context.Context) context.Context {
	c, ok := callerOf(ctx)
	if !ok {
		return ctx
	}
	return transport.Forwarded(ctx, g.name, c.principal(g.name))
}

// OnBehalfOfPolicy is the context of a command the node sends by itself,
// as a rule of the config says (the split-brain policy): marked as
// forwarded on the rule's behalf.
func (g *Gate) OnBehalfOfPolicy(ctx context.Context, rule string) context.Context {
	return withCaller(ctx, caller{by: g.name, whom: rule + " of node " + g.name})
}

// Authorize is the control API's gate (transport.WithAuthorize): it
// learns who calls, applies the rule, and records the caller in the
// call's context.
func (g *Gate) Authorize(ctx context.Context, method string) (context.Context, error) {
	c := caller{local: isLocal(ctx), addr: transport.PeerAddr(ctx)}
	c.by, c.whom = transport.ForwardedBy(ctx)
	if c.local {
		if v := authorize(method, pki.Identity{}, true, ""); !v.allowed {
			return nil, g.refuse(c, method, v)
		}
		return withCaller(ctx, c), nil
	}
	if g.tls == nil {
		// A cluster without TLS: every call is let in, as before.
		return withCaller(ctx, c), nil
	}
	id, err := g.tls.Caller(transport.PeerTLS(ctx))
	switch {
	case errors.Is(err, pki.ErrNoCertificate):
	case err != nil:
		return nil, g.refuse(c, method, verdict{code: codes.Unauthenticated,
			why: fmt.Sprintf("the certificate presented is not one of this cluster's (%v): pass the --tls-dir of this cluster's replctl certs init", err)})
	default:
		c.id = id
	}
	v := authorize(method, c.id, false, c.by)
	if !v.allowed {
		return nil, g.refuse(c, method, v)
	}
	if c.by != "" && methodAccess[method] == accessCommand {
		g.log.Info("forwarded command", "method", method, "forwarded_by", c.by, "on_behalf_of", c.whom, "from", c.addr)
	}
	return withCaller(ctx, c), nil
}

// speaksFor refuses a cluster message (a raft proposal, a lease
// renewal) that says it comes from node from, when the node's certificate
// that sent it names another: a node speaks for itself only, and beta's
// certificate cannot renew alpha's lease.
func (g *Gate) speaksFor(ctx context.Context, from string) error {
	if who, ok := callerOf(ctx); ok && who.id.Role == pki.RoleNode && who.id.Name != from {
		why := fmt.Sprintf("a cluster message from %s came with the certificate of %s", from, who.id)
		return g.refuse(who, transport.MethodClusterForward, verdict{code: codes.PermissionDenied, why: why})
	}
	return nil
}

// refuse logs a refusal (once per peer and cause) and returns it as the
// call's error.
func (g *Gate) refuse(c caller, method string, v verdict) error {
	who := "no certificate"
	switch {
	case c.local:
		who = "the unix socket"
	case c.id != (pki.Identity{}):
		who = "certificate of " + c.id.String()
	}
	g.refusals.Note(hostOf(c.addr), v.why, "refused a control call", "method", method, "from", c.addr, "caller", who, "code", v.code.String(), "why", v.why)
	return status.Error(v.code, v.why)
}

// hostOf is the host of a HOST:PORT address (addr itself otherwise).
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// RefusalLog logs each refusal once per peer and cause: a client that
// retries in a loop gets one line (again after a quiet spell). Its
// methods are safe for concurrent use.
type RefusalLog struct {
	once *logonce.Set
	log  *slog.Logger
}

// NewRefusalLog logs to log, a refusal again once it has not recurred
// for quiet, and remembers at most max peers and causes.
func NewRefusalLog(log *slog.Logger, quiet time.Duration, max int) *RefusalLog {
	return &RefusalLog{once: logonce.New(quiet, max, nil), log: log}
}

// Note logs msg and args as a warning, unless the refusal of host for
// cause was logged lately.
func (r *RefusalLog) Note(host, cause, msg string, args ...any) {
	if r.once.First(host + "\x00" + cause) {
		r.log.Warn(msg, args...)
	}
}

// pprofWords say who may read /debug/pprof/.
const pprofWords = "/debug/pprof/ needs the operator's certificate (e.g. curl --cacert ca.crt --cert operator.crt --key operator.key), or the node's unix socket"

// GuardHTTP lets the page, /api/... and /metrics be read by anyone (they
// are read-only: every route is a GET), and /debug/pprof/ only with the
// operator's certificate or through the unix socket.
func (g *Gate) GuardHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.tls != nil && strings.HasPrefix(r.URL.Path, "/debug/pprof") && !isLocal(r.Context()) {
			id, err := g.tls.Caller(r.TLS)
			why := ""
			switch {
			case errors.Is(err, pki.ErrNoCertificate):
				why = pprofWords + "; this request came with no certificate"
			case err != nil:
				why = fmt.Sprintf("%s; the certificate of this request is not one of this cluster's: %v", pprofWords, err)
			case id.Role != pki.RoleOperator:
				why = fmt.Sprintf("%s; this request came with the certificate of %s", pprofWords, id)
			}
			if why != "" {
				g.refusals.Note(hostOf(r.RemoteAddr), why, "refused a profile request", "path", r.URL.Path, "from", r.RemoteAddr, "why", why)
				http.Error(w, why, http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
