package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/replvol/replvol/internal/human"
)

// Node is what the leader knows of one data node's pool of the name
// asked for.
type Node struct {
	Name string
	// Unreachable says why the node did not answer ("" when it did).
	Unreachable string
	// HasPool: the node's config names the pool.
	HasPool bool
	// Unavailable says why the pool takes no volume ("lvm not
	// available"); "" when it does.
	Unavailable string
	// Free is the pool's free space in bytes.
	Free uint64
}

// Errors of Place, checked with errors.Is; each comes wrapped with the
// details in words.
var (
	// ErrTooFewNodes: fewer data nodes (with the pool) than replicas.
	ErrTooFewNodes = errors.New("too few nodes")
	// ErrNoRoom: enough nodes have the pool, but fewer than replicas
	// have the room.
	ErrNoRoom = errors.New("no pool with room")
)

// Place chooses replicas nodes of nodes (the cluster's data nodes) for a
// volume that needs need bytes of pool on each: those with the most free
// space, ties by name; the first is the primary. It refuses with
// ErrTooFewNodes when fewer than replicas data nodes have the pool, and
// with ErrNoRoom, naming the free space per node, when fewer have the
// room.
func Place(nodes []Node, pool string, need uint64, replicas int) ([]string, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("%w: %d replicas", ErrTooFewNodes, replicas)
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	if len(nodes) < replicas {
		return nil, fmt.Errorf("%w: %d replicas need %d data nodes, and the cluster has %d (%s): create the volume with --replicas %d, or add data nodes",
			ErrTooFewNodes, replicas, replicas, len(nodes), strings.Join(names, ", "), len(nodes))
	}
	var fit []Node
	possible := 0 // nodes that have the pool, or may (unreachable)
	for _, n := range nodes {
		if n.Unreachable != "" || n.HasPool && n.Unavailable == "" {
			possible++
		}
		if n.Unreachable == "" && n.HasPool && n.Unavailable == "" && n.Free >= need {
			fit = append(fit, n)
		}
	}
	if possible < replicas {
		return nil, fmt.Errorf("%w: %d replicas need %d data nodes with pool %s: %s", ErrTooFewNodes, replicas, replicas, pool, where(nodes, pool))
	}
	if len(fit) < replicas {
		return nil, fmt.Errorf("%w: %d replicas of %s (%d bytes) each in pool %s need %d nodes with that much free, and %d have it: %s",
			ErrNoRoom, replicas, human.Bytes(int64(need)), need, pool, replicas, len(fit), where(nodes, pool))
	}
	slices.SortFunc(fit, func(a, b Node) int {
		switch {
		case a.Free > b.Free:
			return -1
		case a.Free < b.Free:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	chosen := make([]string, 0, replicas)
	for _, n := range fit[:replicas] {
		chosen = append(chosen, n.Name)
	}
	return chosen, nil
}

// where says, node by node in name order, what each has of pool.
func where(nodes []Node, pool string) string {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	var parts []string
	for _, n := range nodes {
		switch {
		case n.Unreachable != "":
			parts = append(parts, fmt.Sprintf("%s: not reachable (%s)", n.Name, n.Unreachable))
		case !n.HasPool:
			parts = append(parts, fmt.Sprintf("%s: no pool %s", n.Name, pool))
		case n.Unavailable != "":
			parts = append(parts, fmt.Sprintf("%s: pool %s: %s", n.Name, pool, n.Unavailable))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s (%d bytes) free", n.Name, human.Bytes(int64(n.Free)), n.Free))
		}
	}
	return strings.Join(parts, "; ")
}
