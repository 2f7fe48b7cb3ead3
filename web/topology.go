package web

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/replvol/replvol/transport"
)

// The topology drawing: the nodes on a ring, a line from each volume's
// primary to each of its replicas (one line per pair of nodes, coloured by
// the worst of its volumes' links), and dashed raft links to witnesses.

const (
	topoWidth  = 360
	topoHeight = 220
	topoRadius = 18
)

type topologyView struct {
	Width, Height int
	Nodes         []topoNode
	Links         []topoLink
}

type topoNode struct {
	ID, Name, Class, Role, Label string
	X, Y, R                      int
	Witness, Leader              bool
}

type topoLink struct {
	ID, Class, Title     string
	X1, Y1, X2, Y2       int
	Dashed               bool
	LabelX, LabelY, Vols int
}

// buildTopology lays the cluster out in a topoWidth × topoHeight box.
func buildTopology(st *transport.ClusterStatus) topologyView {
	tv := topologyView{Width: topoWidth, Height: topoHeight}
	pos := map[string][2]int{}
	n := len(st.Nodes)
	cx, cy := topoWidth/2, topoHeight/2
	rx, ry := float64(topoWidth/2-2*topoRadius-20), float64(topoHeight/2-topoRadius-22)
	primaries := map[string]int{}
	for _, v := range st.Volumes {
		primaries[v.Primary]++
	}
	for i, ni := range st.Nodes {
		// Start on the left and go round clockwise: two nodes face each other.
		angle := math.Pi + 2*math.Pi*float64(i)/float64(max(n, 1))
		x, y := cx, cy
		if n > 1 {
			x, y = cx+int(math.Round(rx*math.Cos(angle))), cy+int(math.Round(ry*math.Sin(angle)))
		}
		pos[ni.Name] = [2]int{x, y}
		state := nodeState(ni)
		role := orDefault(ni.Role, "data")
		label := role
		if c := primaries[ni.Name]; c > 0 {
			label = fmt.Sprintf("primary ×%d", c)
		}
		tv.Nodes = append(tv.Nodes, topoNode{
			ID: elementID("topo-node", ni.Name), Name: ni.Name, Class: stateClass(state), Role: role, Label: label,
			X: x, Y: y, R: topoRadius, Witness: role == "witness", Leader: ni.Name == st.Cluster.Leader,
		})
	}

	type pair struct{ a, b string }
	type agg struct {
		class string
		lines []string
	}
	links := map[pair]*agg{}
	for _, v := range st.Volumes {
		for _, r := range v.Replicas {
			if r.Node == v.Primary || v.Primary == "" {
				continue
			}
			p := pair{v.Primary, r.Node}
			if p.b < p.a {
				p.a, p.b = p.b, p.a
			}
			l := links[p]
			if l == nil {
				l = &agg{class: classOK}
				links[p] = l
			}
			l.class = worseClass(l.class, linkClass(&r))
			l.lines = append(l.lines, fmt.Sprintf("%s: %s → %s %s/%s", v.Name, v.Primary, r.Node, r.Replication, r.Disk))
		}
	}
	pairs := make([]pair, 0, len(links))
	for p := range links {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(x, y pair) int { return strings.Compare(x.a+"\x00"+x.b, y.a+"\x00"+y.b) })
	for _, p := range pairs {
		a, okA := pos[p.a]
		b, okB := pos[p.b]
		if !okA || !okB {
			continue
		}
		l := links[p]
		tv.Links = append(tv.Links, topoLink{
			ID: elementID("topo-link", p.a, p.b), Class: l.class, Title: strings.Join(l.lines, "\n"),
			X1: a[0], Y1: a[1], X2: b[0], Y2: b[1], Vols: len(l.lines),
			LabelX: (a[0] + b[0]) / 2, LabelY: (a[1]+b[1])/2 - 4,
		})
	}
	// A witness holds no data: dashed lines show it votes with the others.
	for _, w := range tv.Nodes {
		if !w.Witness {
			continue
		}
		for _, o := range tv.Nodes {
			if o.Witness {
				continue
			}
			tv.Links = append(tv.Links, topoLink{
				ID: elementID("topo-raft", w.Name, o.Name), Class: worseClass(w.Class, o.Class), Dashed: true,
				Title: fmt.Sprintf("raft: %s and %s", w.Name, o.Name), X1: w.X, Y1: w.Y, X2: o.X, Y2: o.Y,
			})
		}
	}
	return tv
}

// linkClass colours the link from a volume's primary to replica r.
func linkClass(r *transport.ReplicaStatus) string {
	if !r.Reachable {
		return classBad
	}
	switch c := stateClass(r.Replication); c {
	case classOK:
		return stateClass(r.Disk)
	case classIdle:
		return classBad // Unknown and the like: not replicating
	default:
		return c
	}
}

func worseClass(a, b string) string {
	rank := func(c string) int {
		switch c {
		case classBad:
			return 3
		case classWarn:
			return 2
		case classIdle:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}
