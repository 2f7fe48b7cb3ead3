package placement

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestPlace pins the rule of autoplace: the data nodes with the most
// free space in the pool, ties by name, the first the primary; refusals
// say why, naming the free space per node.
func TestPlace(t *testing.T) {
	const GiB = 1 << 30
	node := func(name string, free uint64) Node { return Node{Name: name, HasPool: true, Free: free} }
	for _, c := range []struct {
		name     string
		nodes    []Node
		need     uint64
		replicas int
		want     []string
		err      error
		says     []string
	}{
		{name: "the most free first", nodes: []Node{node("alpha", 2*GiB), node("beta", 5*GiB), node("gamma", 3*GiB)},
			need: GiB, replicas: 2, want: []string{"beta", "gamma"}},
		{name: "ties by name", nodes: []Node{node("gamma", 3*GiB), node("beta", 3*GiB), node("alpha", 3*GiB)},
			need: GiB, replicas: 2, want: []string{"alpha", "beta"}},
		{name: "exactly the room needed fits", nodes: []Node{node("alpha", GiB), node("beta", GiB)},
			need: GiB, replicas: 2, want: []string{"alpha", "beta"}},
		{name: "a node without room is passed over", nodes: []Node{node("alpha", GiB/2), node("beta", 2*GiB), node("gamma", 2*GiB)},
			need: GiB, replicas: 2, want: []string{"beta", "gamma"}},
		{name: "a node without the pool is passed over", nodes: []Node{{Name: "alpha"}, node("beta", 2*GiB), node("gamma", GiB)},
			need: GiB, replicas: 2, want: []string{"beta", "gamma"}},
		{name: "an unreachable node is passed over", nodes: []Node{{Name: "alpha", Unreachable: "connection refused"}, node("beta", 2*GiB), node("gamma", GiB)},
			need: GiB, replicas: 2, want: []string{"beta", "gamma"}},
		{name: "an lvm pool is never chosen", nodes: []Node{{Name: "alpha", HasPool: true, Unavailable: "lvm not available", Free: 9 * GiB}, node("beta", GiB), node("gamma", GiB)},
			need: GiB, replicas: 2, want: []string{"beta", "gamma"}},
		{name: "more replicas than data nodes", nodes: []Node{node("alpha", 9*GiB), node("beta", 9*GiB)},
			need: GiB, replicas: 3, err: ErrTooFewNodes, says: []string{"3 replicas need 3 data nodes, and the cluster has 2 (alpha, beta)"}},
		{name: "too few nodes with the pool", nodes: []Node{node("alpha", 9*GiB), {Name: "beta"}},
			need: GiB, replicas: 2, err: ErrTooFewNodes, says: []string{"beta: no pool default"}},
		{name: "no room", nodes: []Node{node("alpha", 3*GiB), node("beta", GiB/2), {Name: "gamma", Unreachable: "timeout"}},
			need: GiB, replicas: 2, err: ErrNoRoom,
			says: []string{"alpha: 3.0GiB (3221225472 bytes) free", "beta: 512.0MiB (536870912 bytes) free", "gamma: not reachable (timeout)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Place(c.nodes, "default", c.need, c.replicas)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("got %v, %v; want %v", got, err, c.err)
				}
				for _, s := range c.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("%q does not say %q", err, s)
					}
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
