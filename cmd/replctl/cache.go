package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/replvol/replvol/transport"
)

// The last known clusters: every status replctl fetches records which
// node listens on which control address (in the user's cache directory,
// $XDG_CACHE_HOME/replctl/clusters.json), so that when --addr does not
// answer, the error names the node and the other nodes to try.

type knownCluster struct {
	Nodes []knownNodeEntry `json:"nodes"`
}

type knownNodeEntry struct {
	Name    string `json:"name"`
	Control string `json:"control"`
}

// maxKnownClusters bounds the file.
const maxKnownClusters = 16

func knownClustersPath() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "replctl", "clusters.json")
}

func loadKnownClusters() []knownCluster {
	path := knownClustersPath()
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var cs []knownCluster
	if json.Unmarshal(data, &cs) != nil {
		return nil
	}
	return cs
}

// rememberNodes records st's nodes as the newest known cluster, replacing
// any cluster that shares an address with it. Failures are ignored: the
// file only improves error messages.
func rememberNodes(st *transport.ClusterStatus) {
	path := knownClustersPath()
	if path == "" || st == nil || len(st.Nodes) == 0 {
		return
	}
	var now knownCluster
	for _, n := range st.Nodes {
		now.Nodes = append(now.Nodes, knownNodeEntry{Name: n.Name, Control: n.Control})
	}
	known := loadKnownClusters()
	if len(known) > 0 && slices.Equal(known[0].Nodes, now.Nodes) {
		return // already the newest: no write per status --watch frame
	}
	cs := []knownCluster{now}
	for _, old := range known {
		overlaps := slices.ContainsFunc(old.Nodes, func(o knownNodeEntry) bool {
			return slices.ContainsFunc(now.Nodes, func(n knownNodeEntry) bool { return n.Control == o.Control })
		})
		if !overlaps && len(cs) < maxKnownClusters {
			cs = append(cs, old)
		}
	}
	data, err := json.Marshal(cs)
	if err != nil {
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
	}
}

// knownNode returns the name of the node last seen at addr ("" if none).
func knownNode(addr string) string {
	for _, c := range loadKnownClusters() {
		for _, n := range c.Nodes {
			if n.Control == addr {
				return n.Name
			}
		}
	}
	return ""
}

// otherNodes lists "name (control)" for the other nodes of the cluster
// last seen at addr.
func otherNodes(addr string) []string {
	for _, c := range loadKnownClusters() {
		if !slices.ContainsFunc(c.Nodes, func(n knownNodeEntry) bool { return n.Control == addr }) {
			continue
		}
		var others []string
		for _, n := range c.Nodes {
			if n.Control != addr {
				others = append(others, fmt.Sprintf("%s (%s)", n.Name, n.Control))
			}
		}
		return others
	}
	return nil
}
