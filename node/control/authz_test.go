package control

import (
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
)

// TestEveryControlMethodHasARule: a method added to the control API
// without a line in methodAccess would be refused to everyone; this says
// which one.
func TestEveryControlMethodHasARule(t *testing.T) {
	methods := transport.ControlMethods()
	for _, m := range methods {
		if _, ok := methodAccess[m]; !ok {
			t.Errorf("control method %s has no rule in methodAccess", m)
		}
	}
	if len(methodAccess) != len(methods) {
		t.Errorf("methodAccess has %d rules for %d methods", len(methodAccess), len(methods))
	}
}

// TestWhoMayCallWhat pins the control API's rule on a cluster with TLS:
// status and events for nodes and the operator; commands for the
// operator and the unix socket, and for a node only as a forward it marks
// under its own name; cluster messages between nodes only; no
// certificate, an NBD client's, or a forward under another's name are
// refused in words that say what to do.
func TestWhoMayCallWhat(t *testing.T) {
	operator := pki.Identity{Role: pki.RoleOperator, Name: "operator"}
	alpha := pki.Identity{Role: pki.RoleNode, Name: "alpha"}
	nbdClient := pki.Identity{Role: pki.RoleNBDClient, Name: "nbd-client"}
	none := pki.Identity{}
	for _, tc := range []struct {
		name        string
		method      string
		id          pki.Identity
		local       bool
		forwardedBy string
		want        codes.Code // codes.OK: allowed
		words       string
	}{
		{"the operator reads the status", transport.MethodClusterStatus, operator, false, "", codes.OK, ""},
		{"the operator runs a switchover", transport.MethodPrimary, operator, false, "", codes.OK, ""},
		{"the operator discards a split brain's data", transport.MethodConnect, operator, false, "", codes.OK, ""},
		{"the operator changes the membership", transport.MethodMembership, operator, false, "", codes.OK, ""},
		{"the operator follows the events", transport.MethodEvents, operator, false, "", codes.OK, ""},
		{"the operator sends a raft message", transport.MethodClusterForward, operator, false, "", codes.PermissionDenied, "between nodes only"},
		{"the unix socket runs a switchover", transport.MethodPrimary, none, true, "", codes.OK, ""},
		{"the unix socket adjusts a volume", transport.MethodAdjust, none, true, "", codes.OK, ""},
		{"the unix socket reads the status", transport.MethodNodeStatus, none, true, "", codes.OK, ""},
		{"the unix socket sends a raft message", transport.MethodClusterForward, none, true, "", codes.PermissionDenied, "between nodes only"},
		{"a node reads another's status", transport.MethodNodeStatus, alpha, false, "", codes.OK, ""},
		{"a node reads the cluster status", transport.MethodClusterStatus, alpha, false, "", codes.OK, ""},
		{"a node follows the events", transport.MethodEvents, alpha, false, "", codes.OK, ""},
		{"a node forwards a raft proposal", transport.MethodClusterForward, alpha, false, "", codes.OK, ""},
		{"a node forwards a raft proposal within a command", transport.MethodClusterForward, alpha, false, "alpha", codes.OK, ""},
		{"a node forwards an operator's connect", transport.MethodConnect, alpha, false, "alpha", codes.OK, ""},
		{"a node demotes the old primary in a switchover", transport.MethodDemote, alpha, false, "alpha", codes.OK, ""},
		{"a node promotes the new primary in a switchover", transport.MethodPromote, alpha, false, "alpha", codes.OK, ""},
		{"a node forwards an operator's adjust", transport.MethodAdjust, alpha, false, "alpha", codes.OK, ""},
		{"a node asks each node to grow its copy in a resize", transport.MethodResize, alpha, false, "alpha", codes.OK, ""},
		{"a node's certificate resizes a volume itself", transport.MethodResize, alpha, false, "", codes.PermissionDenied, "may not run Resize"},
		{"a node forwards a path action", transport.MethodPathAction, alpha, false, "alpha", codes.OK, ""},
		{"a node forwards a resync to the primary", transport.MethodResync, alpha, false, "alpha", codes.OK, ""},
		{"a node forwards a verify to the primary", transport.MethodVerify, alpha, false, "alpha", codes.OK, ""},
		{"a node's certificate runs a switchover itself", transport.MethodPrimary, alpha, false, "", codes.PermissionDenied, "may not run Primary: a node's certificate is only for what nodes forward"},
		{"a node's certificate disconnects a volume itself", transport.MethodDisconnect, alpha, false, "", codes.PermissionDenied, "operator's certificate"},
		{"a node's certificate promotes itself", transport.MethodPromote, alpha, false, "", codes.PermissionDenied, "may not run Promote"},
		{"a node's certificate removes a voter itself", transport.MethodMembership, alpha, false, "", codes.PermissionDenied, "may not run Membership"},
		{"a node's certificate forwards in another node's name", transport.MethodPrimary, alpha, false, "beta", codes.PermissionDenied, "says node beta forwarded it, but it came with the certificate of node alpha"},
		{"the operator's certificate marks a call forwarded", transport.MethodPrimary, operator, false, "alpha", codes.PermissionDenied, "a node forwards only under its own certificate"},
		{"no certificate reads the status", transport.MethodClusterStatus, none, false, "", codes.Unauthenticated, "--tls-dir"},
		{"no certificate runs a switchover", transport.MethodPrimary, none, false, "", codes.Unauthenticated, "unix socket"},
		{"no certificate with a forwarding mark", transport.MethodConnect, none, false, "alpha", codes.Unauthenticated, "--tls-dir"},
		{"an NBD client's certificate reads the status", transport.MethodClusterStatus, nbdClient, false, "", codes.PermissionDenied, "opens NBD exports only"},
		{"an NBD client's certificate runs a switchover", transport.MethodPrimary, nbdClient, false, "", codes.PermissionDenied, "opens NBD exports only"},
		{"a method nobody knows", "Format", operator, false, "", codes.PermissionDenied, "no rule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := authorize(tc.method, tc.id, tc.local, tc.forwardedBy)
			if tc.want == codes.OK {
				if !v.allowed {
					t.Fatalf("refused (%s): %s", v.code, v.why)
				}
				return
			}
			if v.allowed {
				t.Fatal("allowed")
			}
			if v.code != tc.want || !strings.Contains(v.why, tc.words) {
				t.Fatalf("refused with %s %q; want %s saying %q", v.code, v.why, tc.want, tc.words)
			}
		})
	}
}
