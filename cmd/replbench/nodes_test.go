package main

// The cluster of replnode processes with a list of data nodes: the
// status check that says every replica is in sync before a run, and the
// cluster file, for two data nodes (replvol-nodes, the failover phase)
// and for three (replvol-nodes3).

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
)

// syncedReplicas is a status of vol0 with a replica of each node, every
// one UpToDate, Connected and in sync (raft: what raft records of it).
func syncedReplicas(raft string, nodes ...string) *transport.VolumeStatus {
	v := &transport.VolumeStatus{Name: fvVol, Primary: nodes[0], NBDURI: "nbd://127.0.0.1:1/vol0"}
	for i, n := range nodes {
		role := "Secondary"
		if i == 0 {
			role = "Primary"
		}
		v.Replicas = append(v.Replicas, transport.ReplicaStatus{Node: n, Role: role, Disk: "UpToDate", Replication: "Connected", Raft: raft})
	}
	return v
}

func TestInSyncWaitsForEveryDataNodeOfTheCluster(t *testing.T) {
	three := &fvCluster{dataNodes: nodesLayouts[tReplvolNodes3].nodes}
	if !three.inSync(syncedReplicas("", "alpha", "beta", "gamma")) {
		t.Fatal("three replicas UpToDate, Connected, in sync: not in sync")
	}
	// gamma not in the status yet: the two replicas there are in sync,
	// and a run would measure two replicas.
	if three.inSync(syncedReplicas("", "alpha", "beta")) {
		t.Error("in sync without gamma's replica")
	}
	if three.inSync(syncedReplicas("", "alpha", "beta", "delta")) {
		t.Error("in sync with delta's replica in place of gamma's")
	}
	for name, change := range map[string]func(*transport.ReplicaStatus){
		"gamma Inconsistent":       func(r *transport.ReplicaStatus) { r.Disk = "Inconsistent" },
		"gamma Connecting":         func(r *transport.ReplicaStatus) { r.Replication = "Connecting" },
		"gamma SyncTarget":         func(r *transport.ReplicaStatus) { r.Replication = "SyncTarget" },
		"gamma 4 KiB out of sync":  func(r *transport.ReplicaStatus) { r.OutOfSyncBytes = 4096 },
		"gamma Outdated":           func(r *transport.ReplicaStatus) { r.Disk = "Outdated" },
		"gamma Connected, no disk": func(r *transport.ReplicaStatus) { r.Disk = "Diskless" },
	} {
		v := syncedReplicas("", "alpha", "beta", "gamma")
		change(v.Replica("gamma"))
		if three.inSync(v) {
			t.Errorf("%s: in sync", name)
		}
	}

	// A cluster that names no data nodes has fvDataNodes: alpha and beta,
	// as the failover phase always had; with raft, raft must record each
	// UpToDate.
	two := &fvCluster{raft: true}
	if !two.inSync(syncedReplicas("UpToDate", "alpha", "beta")) {
		t.Error("the failover cluster: alpha and beta in sync and UpToDate in raft: not in sync")
	}
	if two.inSync(syncedReplicas("UpToDate", "alpha")) {
		t.Error("the failover cluster: in sync without beta")
	}
	v := syncedReplicas("UpToDate", "alpha", "beta")
	v.Replica("beta").Raft = "Outdated"
	if two.inSync(v) {
		t.Error("the failover cluster: in sync with beta Outdated in raft")
	}
}

func TestTheClusterFileNamesEveryDataNodeAndItsDisk(t *testing.T) {
	for _, tc := range []struct {
		target string
		nodes  []string
	}{
		{tReplvolNodes, []string{"alpha", "beta"}},
		{tReplvolNodes3, []string{"alpha", "beta", "gamma"}},
	} {
		t.Run(tc.target, func(t *testing.T) {
			l := nodesLayouts[tc.target]
			c := &fvCluster{dir: t.TempDir(), size: 64 << 20, dataNodes: l.nodes, order: l.nodes}
			if err := c.allocate(); err != nil {
				t.Fatal(err)
			}
			if err := c.dataDisks(1<<20, true); err != nil {
				t.Fatal(err)
			}
			if err := c.writeConfig(); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(c.cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			cfg := string(data)
			if n := strings.Count(cfg, "  - {name: "); n != len(tc.nodes) {
				t.Errorf("%d nodes in the cluster file, want %d:\n%s", n, len(tc.nodes), cfg)
			}
			for _, n := range tc.nodes {
				disk := filepath.Join(c.dir, n+".img")
				if fi, err := os.Stat(disk); err != nil || fi.Size() != 1<<20 {
					t.Errorf("%s's disk: %v, %v; want 1 MiB", n, fi, err)
				}
				for _, want := range []string{"{name: " + n + ", control: ", "      " + n + ": \"" + disk + "\"\n"} {
					if !strings.Contains(cfg, want) {
						t.Errorf("the cluster file lacks %q:\n%s", want, cfg)
					}
				}
			}
			for _, want := range []string{"protocol: C\n", "primary: alpha\n"} {
				if !strings.Contains(cfg, want) {
					t.Errorf("the cluster file lacks %q:\n%s", want, cfg)
				}
			}
			if strings.Contains(cfg, "checksums: off") || strings.Contains(cfg, "failover:") || strings.Contains(cfg, "witness") {
				t.Errorf("checksums off, failover or a witness in the cluster file:\n%s", cfg)
			}
		})
	}
}

func TestNodesRolesNamesThePrimaryFirst(t *testing.T) {
	for nodes, want := range map[string]string{
		"alpha":            "alpha (primary)",
		"alpha,beta":       "alpha (primary) and beta",
		"alpha,beta,gamma": "alpha (primary), beta and gamma",
	} {
		if got := nodesRoles(strings.Split(nodes, ",")); got != want {
			t.Errorf("nodesRoles(%s) = %q, want %q", nodes, got, want)
		}
	}
}
