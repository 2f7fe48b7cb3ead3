package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLayering pins the package seams of DESIGN.md §7: the replication
// rules import none of the project's I/O packages, the control API
// client that replctl uses does not link the daemon, and the parts split
// out of the node (the stream to a peer, node/session; the receiving side,
// node/applier; the control API's server, which runs the node through an
// interface) do not reach back up into it. A rule forbids a package and
// its subpackages; one starting with = forbids that package alone.
func TestLayering(t *testing.T) {
	forbidden := map[string][]string{
		"github.com/replvol/replvol/replication": {"/transport", "/node", "/web", "/metadata", "google.golang.org/grpc", "go.etcd.io/bbolt"},
		"github.com/replvol/replvol/transport":   {"/node", "/web", "/metadata"},
		"github.com/replvol/replvol/web":         {"/node", "/metadata", "/replication"},
		"github.com/replvol/replvol/metadata":    {"/node", "/transport", "/web", "go.etcd.io/bbolt", "github.com/hashicorp/raft"},
		// The volume's state machine is pure: the replication rules and
		// the standard library, nothing of the node or the cluster.
		"github.com/replvol/replvol/node/volstate": {"/node", "/transport", "/web", "/metadata", "/backing", "/config",
			"google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The leader's failover rule is pure: the replication rules and
		// the standard library, nothing of raft, gossip or the node (the
		// simulation runs it).
		"github.com/replvol/replvol/node/failover": {"/node", "/transport", "/web", "/metadata", "/backing", "/config",
			"google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The placement of a created volume's replicas is pure: the
		// leader gathers the pools and asks it.
		"github.com/replvol/replvol/node/placement": {"/node", "/replication", "/transport", "/web", "/metadata", "/backing", "/config", "/multipath",
			"google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The order of a write's stages is pure: node's write path and
		// the simulation run it; it imports nothing of the project.
		"github.com/replvol/replvol/node/writepath": {"/node", "/replication", "/transport", "/web", "/metadata", "/backing", "/config", "/internal", "/multipath", "google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The receiving side of replication: the volume reaches it, not
		// the other way round.
		"github.com/replvol/replvol/node/applier": {"=/node", "/node/cluster", "/web", "/metadata", "/backing", "/config",
			"go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The applier's step, which the simulation runs: no wire, so
		// nothing of transport or gRPC either.
		"github.com/replvol/replvol/node/applier/apply": {"/node", "/transport", "/web", "/metadata", "/backing", "/config", "/multipath",
			"google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The stream to one peer: the node calls it, never the other way.
		"github.com/replvol/replvol/node/session": {"=/node", "/node/cluster", "/web",
			"go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The volume's loop: the step its runner and the simulation
		// share, over volstate (TestVolumeLoopLayering names what it may
		// import).
		"github.com/replvol/replvol/node/volloop": {"=/node", "/node/cluster", "/node/session", "/node/applier", "/node/control", "/transport", "/web", "/metadata", "/backing", "/config", "/multipath",
			"google.golang.org/grpc", "go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
		// The control API (handlers, authorization, the guarded port)
		// sits below the node: node implements its control.Node.
		"github.com/replvol/replvol/node/control": {"=/node", "/node/cluster", "/web", "/metadata", "/backing", "/config",
			"go.etcd.io/bbolt", "github.com/hashicorp/raft", "github.com/hashicorp/memberlist"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == pkg {
				continue
			}
			for _, b := range bad {
				name, exact := strings.CutPrefix(b, "=")
				if strings.HasPrefix(name, "/") {
					name = "github.com/replvol/replvol" + name
				}
				if dep == name || !exact && strings.HasPrefix(dep, name+"/") {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}

// TestVolumeLoopLayering: the volume's loop (node/volloop), which node
// runs and the simulation steps, imports volstate, internal/lockorder and
// the standard library alone.
func TestVolumeLoopLayering(t *testing.T) {
	const mod = "github.com/replvol/replvol"
	importsOnly(t, mod+"/node/volloop", "-f={{join .Imports \"\\n\"}}", mod+"/node/volstate", mod+"/internal/lockorder")
}

// TestFrameLayering: the replication stream's message (transport/frame),
// which the session builds its frames in and the simulation therefore
// links, links the standard library and at most the replication rules:
// nothing of the wire's connections or gRPC (TestSimLayering allows it
// alone of transport).
func TestFrameLayering(t *testing.T) {
	const mod = "github.com/replvol/replvol"
	importsOnly(t, mod+"/transport/frame", "-deps", mod+"/transport/frame", mod+"/replication")
}

// importsOnly fails t for each package outside the standard library that
// go list with flag names for pkg, unless allowed.
func importsOnly(t *testing.T, pkg, flag string, allowed ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", flag, pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") && !slices.Contains(allowed, imp) {
			t.Errorf("%s links %s: only %s and the standard library", pkg, imp, strings.Join(allowed, ", "))
		}
	}
}

// TestReplctlLayering pins issue 17's seam: replctl reaches nodes only
// through transport and reads the cluster file through config, so its
// code links neither the node nor raft, memberlist or bbolt. Only its demo
// package runs nodes; only backing (create-md, which resets the volume's
// entry in the node's bbolt state.db) links bbolt, and not raft or
// memberlist. Each rule walks the import graph from a package, not
// entering the packages it exempts, and names the import chain of what it
// finds.
func TestReplctlLayering(t *testing.T) {
	const (
		mod     = "github.com/replvol/replvol"
		replctl = mod + "/cmd/replctl"
		demo    = replctl + "/internal/demo"
	)
	// A name ending in /... stands for its subpackages too.
	daemon := []string{mod + "/node", mod + "/node/cluster/...", "github.com/hashicorp/raft/...", "github.com/hashicorp/memberlist/..."}
	bbolt := []string{"go.etcd.io/bbolt/..."}
	rules := []struct {
		from      string
		exempt    []string
		forbidden []string
	}{
		{replctl, []string{demo}, daemon},
		{replctl, []string{demo, mod + "/backing"}, bbolt},
		{mod + "/backing", nil, daemon},
		{mod + "/config", nil, append(append([]string{mod + "/transport/..."}, daemon...), bbolt...)},
	}
	graph := importGraph(t, replctl, mod+"/backing", mod+"/config")
	if _, ok := graph[demo]; !ok {
		t.Fatalf("replctl does not import %s: update this test", demo)
	}
	for _, r := range rules {
		deps := reachable(graph, r.from, r.exempt)
		for _, dep := range slices.Sorted(maps.Keys(deps)) {
			chain := deps[dep]
			for _, f := range r.forbidden {
				if dep == strings.TrimSuffix(f, "/...") || strings.HasSuffix(f, "/...") && strings.HasPrefix(dep, strings.TrimSuffix(f, "...")) {
					t.Errorf("%s imports %s: %s", r.from, dep, strings.Join(chain, " -> "))
				}
			}
		}
	}
}

// TestSimLayering pins the simulation's seam (node/sim): it runs the pure
// rules (volstate, replication, failover.Decide, the write's stages of
// writepath), the volume loop's step (node/volloop's Core), the peer
// session a primary ships through (node/session, stepped) and the
// applier's step (node/applier/apply) over models of its own (disks,
// links, raft), so nothing it links is the node or a package of I/O: no node, cluster,
// transport, metadata, backing or config, and no raft, memberlist, gRPC
// or bbolt. One package under transport is allowed, transport/frame
// alone: the replication stream's message and its buffer pool, a leaf
// of the wire that imports the standard library only (no gRPC, no
// connection), which the peer session builds its frames in.
func TestSimLayering(t *testing.T) {
	const (
		mod = "github.com/replvol/replvol"
		sim = mod + "/node/sim"
	)
	forbidden := []string{mod + "/node", mod + "/node/cluster/...", mod + "/multipath/...", mod + "/transport/...", mod + "/web/...", mod + "/metadata/...",
		mod + "/backing/...", mod + "/config/...", "google.golang.org/grpc/...", "go.etcd.io/bbolt/...",
		"github.com/hashicorp/raft/...", "github.com/hashicorp/memberlist/..."}
	allowed := []string{mod + "/transport/frame"}
	graph := importGraph(t, sim)
	for _, runs := range []string{mod + "/node/failover", mod + "/node/volstate", mod + "/node/volloop", mod + "/node/writepath", mod + "/node/session", mod + "/node/applier/apply"} {
		if !slices.Contains(graph[sim], runs) {
			t.Fatalf("%s does not import %s: the simulation no longer runs production's rules there (update this test if that moved)", sim, runs)
		}
	}
	deps := reachable(graph, sim, nil)
	for _, dep := range slices.Sorted(maps.Keys(deps)) {
		if slices.Contains(allowed, dep) {
			continue
		}
		for _, f := range forbidden {
			if dep == strings.TrimSuffix(f, "/...") || strings.HasSuffix(f, "/...") && strings.HasPrefix(dep, strings.TrimSuffix(f, "...")) {
				t.Errorf("%s imports %s: %s", sim, dep, strings.Join(deps[dep], " -> "))
			}
		}
	}
}

// importGraph maps each package that pkgs depend on (pkgs included) to
// its imports, as go list -deps reports them.
func importGraph(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Imports"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list %v: %v", pkgs, err)
	}
	graph := map[string][]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		graph[p.ImportPath] = p.Imports
	}
	return graph
}

// reachable returns every package from imports, directly or not, without
// entering the exempt ones, each with the chain of imports that reaches
// it.
func reachable(graph map[string][]string, from string, exempt []string) map[string][]string {
	chains := map[string][]string{from: {from}}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, dep := range graph[p] {
			if _, seen := chains[dep]; seen || slices.Contains(exempt, dep) {
				continue
			}
			chains[dep] = append(append([]string(nil), chains[p]...), dep)
			queue = append(queue, dep)
		}
	}
	delete(chains, from)
	return chains
}

// TestImportsOnlyGoDown pins the house's floors: the node (node and its
// subpackages) sits above every other package of the module, and only
// the commands (cmd/...) sit above the node. So no package outside node/
// and cmd/ imports a package of node/, directly or through another: a
// part that several layers use (the multipath device, which config
// parses the words of and backing opens) lives below the node, not in it.
func TestImportsOnlyGoDown(t *testing.T) {
	const mod = "github.com/replvol/replvol"
	out, err := exec.Command("go", "list", mod+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var below []string
	for _, p := range strings.Fields(string(out)) {
		if p != mod+"/node" && !strings.HasPrefix(p, mod+"/node/") && !strings.HasPrefix(p, mod+"/cmd/") {
			below = append(below, p)
		}
	}
	if len(below) < 10 {
		t.Fatalf("only %d packages below the node: update this test", len(below))
	}
	graph := importGraph(t, below...)
	for _, p := range below {
		deps := reachable(graph, p, nil)
		for _, dep := range slices.Sorted(maps.Keys(deps)) {
			if dep == mod+"/node" || strings.HasPrefix(dep, mod+"/node/") {
				t.Errorf("%s imports %s: %s", p, dep, strings.Join(deps[dep], " -> "))
			}
		}
	}
}
