package web

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"golang.org/x/net/html"
)

// Hand-built statuses for the page's tests: a healthy two-node cluster
// with a witness, which each test bends into the state it is about.

var testNow = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func healthyCluster() *transport.ClusterStatus {
	return &transport.ClusterStatus{
		From: "alpha",
		Cluster: transport.ClusterInfo{Leader: "witness", Quorum: true, Voters: []string{"alpha", "beta", "witness"},
			Failover: "auto"},
		Nodes: []transport.NodeInfo{
			{Name: "alpha", Control: "10.0.0.1:7800", Replication: "10.0.0.1:7801", NBD: "10.0.0.1:7802", Alive: true, Role: "data", Membership: "alive"},
			{Name: "beta", Control: "10.0.0.2:7800", Replication: "10.0.0.2:7801", NBD: "10.0.0.2:7802", Alive: true, Role: "data", Membership: "alive"},
			{Name: "witness", Control: "10.0.0.3:7800", Alive: true, Role: "witness", Membership: "alive"},
		},
		Volumes: []transport.VolumeStatus{healthyVolume("vol0")},
	}
}

func healthyVolume(name string) transport.VolumeStatus {
	return transport.VolumeStatus{
		Name: name, Size: 1 << 30, Protocol: "C", Primary: "alpha", Epoch: 3, NBDURI: "nbd://10.0.0.1:7802/" + name,
		Replicas: []transport.ReplicaStatus{
			{Node: "alpha", Role: "Primary", Disk: "UpToDate", Replication: "Connected", Raft: "UpToDate", SyncProgress: 100, Reachable: true},
			{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "Connected", Raft: "UpToDate", SyncProgress: 100, Reachable: true},
		},
	}
}

// replica returns node's replica of the status's first volume.
func replica(st *transport.ClusterStatus, node string) *transport.ReplicaStatus {
	r := st.Volumes[0].Replica(node)
	if r == nil {
		panic("no replica " + node)
	}
	return r
}

func nodeInfo(st *transport.ClusterStatus, name string) *transport.NodeInfo {
	for i := range st.Nodes {
		if st.Nodes[i].Name == name {
			return &st.Nodes[i]
		}
	}
	panic("no node " + name)
}

// renderedPage is a rendered page, its elements by id.
type renderedPage struct {
	t    *testing.T
	src  string
	byID map[string]*html.Node
}

func render(t *testing.T, in pageInput) *renderedPage {
	t.Helper()
	if in.Now.IsZero() {
		in.Now = testNow
	}
	var buf bytes.Buffer
	if err := renderPage(&buf, buildPage(in)); err != nil {
		t.Fatalf("render: %v", err)
	}
	return parsePage(t, buf.String())
}

func parsePage(t *testing.T, src string) *renderedPage {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(src))
	if err != nil {
		t.Fatalf("parse the page: %v", err)
	}
	p := &renderedPage{t: t, src: src, byID: map[string]*html.Node{}}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			if id := attr(n, "id"); id != "" {
				if _, dup := p.byID[id]; dup {
					t.Errorf("element id %q appears twice", id)
				}
				p.byID[id] = n
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return p
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// text is the text of the element with id, failing the test when there
// is none.
func (p *renderedPage) text(id string) string {
	p.t.Helper()
	n, ok := p.byID[id]
	if !ok {
		p.t.Fatalf("no element #%s on the page", id)
	}
	return textOf(n)
}

func (p *renderedPage) attr(id, key string) string {
	p.t.Helper()
	n, ok := p.byID[id]
	if !ok {
		p.t.Fatalf("no element #%s on the page", id)
	}
	return attr(n, key)
}

func (p *renderedPage) has(id string) bool {
	_, ok := p.byID[id]
	return ok
}

// ids lists the ids that start with prefix, for failure messages.
func (p *renderedPage) ids(prefix string) []string {
	var out []string
	for id := range p.byID {
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	return out
}

// bigCluster is volumes volumes over nodes data nodes, each volume on
// every node, with two paths per replica, for the benchmark.
func bigCluster(volumes, nodes int) *transport.ClusterStatus {
	st := &transport.ClusterStatus{From: "node0",
		Cluster: transport.ClusterInfo{Leader: "node1", Quorum: true, Failover: "auto"}}
	for i := range nodes {
		name := fmt.Sprintf("node%d", i)
		st.Cluster.Voters = append(st.Cluster.Voters, name)
		st.Nodes = append(st.Nodes, transport.NodeInfo{Name: name, Control: fmt.Sprintf("10.0.0.%d:7800", i),
			Replication: fmt.Sprintf("10.0.0.%d:7801", i), NBD: fmt.Sprintf("10.0.0.%d:7802", i), Alive: true, Role: "data", Membership: "alive"})
	}
	for v := range volumes {
		vs := transport.VolumeStatus{Name: fmt.Sprintf("vol%d", v), Size: 100 << 30, Protocol: "C",
			Primary: fmt.Sprintf("node%d", v%nodes), Epoch: uint64(v + 1)}
		vs.NBDURI = "nbd://10.0.0.1:7802/" + vs.Name
		for i := range nodes {
			r := transport.ReplicaStatus{Node: fmt.Sprintf("node%d", i), Role: "Secondary", Disk: "UpToDate",
				Replication: "Connected", Raft: "UpToDate", Reachable: true, SyncProgress: 100}
			if r.Node == vs.Primary {
				r.Role = "Primary"
			}
			if (v+i)%7 == 0 && r.Role != "Primary" {
				r.Disk, r.Replication = "Inconsistent", "SyncTarget"
				r.ResyncDoneBytes, r.ResyncTotalBytes, r.ResyncRate = 3<<30, 10<<30, 200<<20
			}
			for p := range 2 {
				r.Paths = append(r.Paths, transport.PathStatus{Node: r.Node, Volume: vs.Name, Path: fmt.Sprintf("p%d", p),
					State: "ACTIVE", Group: fmt.Sprintf("g%d", p), IOs: 123456, Bytes: 1 << 33, LatencyP50Micros: 180, LatencyP99Micros: 2400})
			}
			vs.Replicas = append(vs.Replicas, r)
		}
		st.Volumes = append(st.Volumes, vs)
	}
	return st
}

// bigIO is a full five minutes of samples for every volume of st.
func bigIO(st *transport.ClusterStatus, now time.Time) map[string]volumeIO {
	var samples []ioSample
	for i := range ioCapacity {
		samples = append(samples, ioSample{At: now.Add(-ioWindow + time.Duration(i)*ioSpacing),
			IOPS: float64(1000 + i%37*10), Rate: float64(64<<20 + i%11<<20)})
	}
	out := map[string]volumeIO{}
	for _, v := range st.Volumes {
		out[v.Name] = drawIO(samples, now)
	}
	return out
}
