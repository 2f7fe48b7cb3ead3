package web

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// The page states the key facts of each situation an operator meets in an
// incident under a stable element id, and for each thing to act on shows
// a warning with the command that fixes it. Each case bends a healthy
// cluster (alpha primary, beta secondary, a witness) into one situation
// and checks the facts by id.

// want is what a case expects: element id → a substring of its text
// ("" only requires the element), and ids that must be absent.
type want struct {
	text   map[string]string
	absent []string
	// class: element id → a class it must carry.
	class map[string]string
}

func TestPageStates(t *testing.T) {
	cases := []struct {
		name  string
		bend  func(st *transport.ClusterStatus)
		check want
	}{
		{
			name: "healthy: every replica UpToDate and connected",
			bend: func(*transport.ClusterStatus) {},
			check: want{
				text: map[string]string{
					"vol-vol0-primary": "alpha", "vol-vol0-epoch": "3", "vol-vol0-protocol": "C", "vol-vol0-export": "nbd://10.0.0.1:7802/vol0",
					"replica-vol0-alpha-role": "Primary", "replica-vol0-beta-role": "Secondary",
					"replica-vol0-beta-disk": "UpToDate", "replica-vol0-beta-replication": "Connected", "replica-vol0-beta-raft": "UpToDate",
					"replica-vol0-beta-oos": "0 B", "warnings-none": "Nothing",
					"cluster-leader": "witness", "cluster-quorum": "yes", "cluster-failover": "auto", "cluster-witness": "witness",
					"cluster-voters": "alpha, beta, witness", "node-alpha-state": "alive", "node-witness-role": "witness",
					"node-witness-leader": "leader",
				},
				absent: []string{"warning-count", "replica-vol0-beta-resync", "vol-vol0-resync-cap"},
				class:  map[string]string{"topo-link-alpha-beta": "ok", "topo-node-witness": "witness", "replica-vol0-beta-replication": "ok"},
			},
		},
		{
			name: "storage pools: each node's size and free space, an lvm pool that takes no volume",
			bend: func(st *transport.ClusterStatus) {
				st.Pools = []transport.PoolStatus{
					{Node: "alpha", Name: "default", Size: 100 << 30, Free: 40 << 30},
					{Node: "alpha", Name: "fast", State: "lvm not available"},
					{Node: "beta", Name: "default", Size: 100 << 30, Free: 60 << 30},
				}
			},
			check: want{
				text: map[string]string{
					"pool-alpha-default-free": "40.0 GiB", "pool-beta-default-free": "60.0 GiB", "pool-alpha-fast": "fastalpha0 B0 Blvm not available",
				},
			},
		},
		{
			name: "beta resyncing: a bar with speed and ETA",
			bend: func(st *transport.ClusterStatus) {
				b := replica(st, "beta")
				b.Disk, b.Replication, b.Raft = "Inconsistent", "SyncTarget", "Outdated"
				b.OutOfSyncBytes, b.ResyncDoneBytes, b.ResyncTotalBytes, b.ResyncRate = 192<<20, 64<<20, 256<<20, 32<<20
				replica(st, "alpha").Replication = "SyncSource"
			},
			check: want{
				text: map[string]string{
					"replica-vol0-beta-replication": "SyncTarget", "replica-vol0-beta-disk": "Inconsistent",
					"replica-vol0-beta-resync-percent": "25.0%", "replica-vol0-beta-resync-rate": "32.0 MiB/s",
					"replica-vol0-beta-resync-eta": "6 s", "replica-vol0-beta-oos": "192.0 MiB",
					"warning-inconsistent-vol0-beta-text": "until its resync ends, in about 6 s; until then vol0 runs on one good copy, alpha's.",
				},
				absent: []string{"warning-inconsistent-vol0-beta-command", "replica-vol0-alpha-resync"},
				class:  map[string]string{"warning-inconsistent-vol0-beta": "warning", "topo-link-alpha-beta": "warn", "replica-vol0-beta-disk": "warn"},
			},
		},
		{
			name: "beta disconnected by the operator: StandAlone",
			bend: func(st *transport.ClusterStatus) {
				b := replica(st, "beta")
				b.Replication, b.Disk = "StandAlone", "Consistent"
				b.Reason, b.ReasonCode = "beta is disconnected from vol0 by the operator", "disconnected-by-operator"
				replica(st, "alpha").Replication = "Connecting"
			},
			check: want{
				text: map[string]string{
					"replica-vol0-beta-replication":        "StandAlone",
					"replica-vol0-beta-reason":             "disconnected from vol0 by the operator",
					"warning-standalone-vol0-beta-text":    "beta is StandAlone on vol0",
					"warning-standalone-vol0-beta-command": "replctl connect vol0 --node beta",
					"warning-count":                        "1",
				},
				absent: []string{"warning-standalone-vol0-alpha", "warning-connecting-vol0-alpha"},
				class:  map[string]string{"replica-vol0-beta-replication": "bad", "topo-link-alpha-beta": "bad", "warning-standalone-vol0-beta": "warning"},
			},
		},
		{
			name: "split brain: one warning naming the node that gives up its changes",
			bend: func(st *transport.ClusterStatus) {
				for _, n := range []string{"alpha", "beta"} {
					r := replica(st, n)
					r.Replication, r.ReasonCode = "StandAlone", "split-brain"
					r.Reason = "split brain: alpha changed 12 MiB and beta 4 MiB since generation 1234"
				}
				replica(st, "beta").Role = "Primary"
			},
			check: want{
				text: map[string]string{
					"warning-split-brain-vol0-command": "replctl connect vol0 --discard-my-data --node beta",
					"warning-split-brain-vol0-risk":    "without --yes the command only prints how much",
				},
				absent: []string{"warning-standalone-vol0-beta", "warning-standalone-vol0-alpha"},
				class:  map[string]string{"warning-split-brain-vol0": "critical"},
			},
		},
		{
			name: "a path of beta's disk failed",
			bend: func(st *transport.ClusterStatus) {
				b := replica(st, "beta")
				b.Paths = []transport.PathStatus{
					{Node: "beta", Volume: "vol0", Path: "p0", State: "FAIL", Group: "hba0", IOs: 1200, Errors: 3, Reason: "read: input/output error", LatencyP50Micros: 210, LatencyP99Micros: 15400},
					{Node: "beta", Volume: "vol0", Path: "p1", State: "ACTIVE", Group: "hba1", IOs: 98000, InFlight: 4, LatencyP50Micros: 190, LatencyP99Micros: 900, Preferred: true},
				}
			},
			check: want{
				text: map[string]string{
					"paths-vol0-beta":         "paths of beta",
					"path-vol0-beta-p0-state": "FAIL", "path-vol0-beta-p0-group": "hba0", "path-vol0-beta-p0-errors": "3",
					"path-vol0-beta-p0-ios": "1.2k", "path-vol0-beta-p0-p50": "210 µs", "path-vol0-beta-p0-p99": "15.4 ms",
					"path-vol0-beta-p1-state": "ACTIVE", "path-vol0-beta-p1-inflight": "4", "path-vol0-beta-p1-ios": "98k",
					"warning-path-down-vol0-beta-p0-command": "replctl path restore vol0 p0 --node beta",
				},
				absent: []string{"warning-path-down-vol0-beta-p1"},
				class:  map[string]string{"path-vol0-beta-p0-state": "bad", "path-vol0-beta-p1-state": "ok"},
			},
		},
		{
			name: "alpha's disk detached (Diskless) after all its paths failed",
			bend: func(st *transport.ClusterStatus) {
				a := replica(st, "alpha")
				a.Disk, a.Reason, a.ReasonCode = "Diskless", "alpha detached its disk: no path left", "detached"
				a.OutOfSyncBytes = 8 << 20
				a.Paths = []transport.PathStatus{
					{Node: "alpha", Volume: "vol0", Path: "p0", State: "FAIL"},
					{Node: "alpha", Volume: "vol0", Path: "p1", State: "FAIL"},
				}
			},
			check: want{
				text: map[string]string{
					"replica-vol0-alpha-disk":                 "Diskless",
					"replica-vol0-alpha-oos":                  "8.0 MiB",
					"warning-detached-vol0-alpha-command":     "replctl path restore vol0 p0 --node alpha",
					"warning-path-down-vol0-alpha-p1-command": "replctl path restore vol0 p1 --node alpha",
				},
				class: map[string]string{"replica-vol0-alpha-disk": "bad", "warning-detached-vol0-alpha": "critical"},
			},
		},
		{
			name: "a scrub running on alpha, and blocks of beta no replica holds good",
			bend: func(st *transport.ClusterStatus) {
				replica(st, "alpha").Integrity = &transport.ReplicaIntegrity{Checksums: true, Scrub: transport.ScrubSummary{State: "running", Percent: 42.5, ETASeconds: 90}}
				replica(st, "beta").Integrity = &transport.ReplicaIntegrity{Checksums: true, UnrecoverableBlocks: 2, Scrub: transport.ScrubSummary{State: "idle"}}
			},
			check: want{
				text: map[string]string{
					"replica-vol0-alpha-scrub-percent":        "42.5%",
					"replica-vol0-alpha-scrub-eta":            "1 min 30 s",
					"replica-vol0-beta-unrecoverable":         "2 blocks unrecoverable",
					"warning-unrecoverable-vol0-beta-text":    "2 blocks of vol0 on beta are bad and no replica holds a good copy: reads of them fail with EIO",
					"warning-unrecoverable-vol0-beta-command": "replctl events --node beta",
				},
				absent: []string{"replica-vol0-beta-scrub", "replica-vol0-alpha-unrecoverable", "warning-unrecoverable-vol0-alpha", "warnings-none"},
				class: map[string]string{"warning-unrecoverable-vol0-beta": "critical", "replica-vol0-beta": "problem",
					"replica-vol0-alpha-scrub-bar": "warn", "vol-vol0": "critical"},
			},
		},
		{
			name: "blocks of alpha's disk on its bad-block list",
			bend: func(st *transport.ClusterStatus) {
				replica(st, "alpha").Integrity = &transport.ReplicaIntegrity{Checksums: true, BadBlocks: 3, Scrub: transport.ScrubSummary{State: "idle"}}
			},
			check: want{
				text: map[string]string{
					"warning-bad-blocks-vol0-alpha-text":    "3 blocks of alpha's disk of vol0 could not be rewritten and are on its bad-block list: reads of them go to a peer in sync.",
					"warning-bad-blocks-vol0-alpha-command": "replctl events --node alpha",
				},
				absent: []string{"warning-bad-blocks-vol0-beta", "warning-unrecoverable-vol0-alpha", "warnings-none"},
				class:  map[string]string{"warning-bad-blocks-vol0-alpha": "warning"},
			},
		},
		{
			name: "a scrub paused on beta",
			bend: func(st *transport.ClusterStatus) {
				replica(st, "beta").Integrity = &transport.ReplicaIntegrity{Checksums: true, Scrub: transport.ScrubSummary{State: "paused", Percent: 10}}
			},
			check: want{
				text:   map[string]string{"replica-vol0-beta-scrub-percent": "10.0%", "replica-vol0-beta-scrub-eta": "paused", "warnings-none": "Nothing"},
				absent: []string{"replica-vol0-alpha-scrub", "warning-unrecoverable-vol0-beta"},
			},
		},
		{
			name: "no quorum: the witness and beta are gone",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster.Quorum, st.Cluster.Leader = false, ""
				st.Cluster.Reason = "no raft leader: 1 of 3 voters reachable"
				for _, n := range []string{"witness", "beta"} {
					ni := nodeInfo(st, n)
					ni.Alive, ni.Membership, ni.Error = false, "dead", "connection refused"
				}
				b := replica(st, "beta")
				b.Reachable, b.Role, b.Disk, b.Replication = false, "Unknown", "DUnknown", "Unknown"
				replica(st, "alpha").Replication = "Connecting"
			},
			check: want{
				text: map[string]string{
					"cluster-quorum": "NO", "cluster-leader": "none", "cluster-reason": "1 of 3 voters reachable",
					"node-witness-state": "dead", "node-beta-state": "dead", "node-beta-error": "connection refused",
					"warning-no-quorum-text":    "No raft quorum (3 voters",
					"warning-no-quorum-command": "systemctl start replnode",
					"warning-node-down-beta":    "on beta",
					"replica-vol0-beta-reason":  "node unreachable",
				},
				absent: []string{"warning-connecting-vol0-beta", "warning-standalone-vol0-alpha"},
				class:  map[string]string{"cluster-quorum": "bad", "warning-no-quorum": "critical", "topo-node-beta": "bad", "topo-link-alpha-beta": "bad"},
			},
		},
		{
			name: "a leader hands its office on: an election, no lost quorum",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster.Quorum, st.Cluster.Electing, st.Cluster.Leader = false, true, ""
				st.Cluster.Reason = "electing a raft leader: the last one handed its office on or was lost moments ago"
			},
			check: want{
				text:   map[string]string{"cluster-quorum": "electing", "cluster-leader": "none", "cluster-reason": "electing a raft leader", "warnings-none": "Nothing"},
				absent: []string{"warning-no-quorum"},
				class:  map[string]string{"cluster-quorum": "warn"},
			},
		},
		{
			name: "protocol A: beta Behind with lag",
			bend: func(st *transport.ClusterStatus) {
				st.Volumes[0].Protocol = "A"
				replica(st, "alpha").Replication = "Ahead"
				b := replica(st, "beta")
				b.Replication, b.Disk, b.LagBytes, b.LagSeconds, b.OutOfSyncBytes = "Behind", "Outdated", 12<<20, 3.5, 40<<20
			},
			check: want{
				text: map[string]string{
					"vol-vol0-protocol": "A", "replica-vol0-beta-replication": "Behind",
					"replica-vol0-beta-lag-bytes": "12.0 MiB", "replica-vol0-beta-lag-seconds": "3.5 s",
					"warning-behind-vol0-beta-command": "replctl adjust vol0 --on-congestion block",
					"warning-behind-vol0-beta-risk":    "writes slow down",
					"warning-outdated-vol0-beta-text":  "Outdated",
				},
				absent: []string{"warning-outdated-vol0-beta-command"},
			},
		},
		{
			name: "resync paused by the operator",
			bend: func(st *transport.ClusterStatus) {
				b := replica(st, "beta")
				b.Disk, b.Replication = "Inconsistent", "PausedSyncT"
				b.ResyncDoneBytes, b.ResyncTotalBytes, b.ResyncRate = 1<<30, 4<<30, 100<<20
				st.Volumes[0].ResyncRate = 200 << 20 // replctl adjust vol0 --resync-rate 200MiB
			},
			check: want{
				text: map[string]string{
					"vol-vol0-resync-cap":                     "200.0 MiB/s",
					"warning-resync-paused-vol0-beta-command": "replctl resync vol0 --resume",
					"replica-vol0-beta-resync-eta":            "paused",
					"replica-vol0-beta-resync-percent":        "25.0%",
				},
				class: map[string]string{"replica-vol0-beta-resync-bar": "idle"},
			},
		},
		{
			name: "alpha restarted as primary and waits for its peer",
			bend: func(st *transport.ClusterStatus) {
				st.Volumes[0].NBDURI = ""
				a := replica(st, "alpha")
				a.Reason, a.ReasonCode = "alpha restarted as primary: serving no IO until a peer connects", "waiting-for-peer"
				a.Replication = "Connecting"
				ni := nodeInfo(st, "beta")
				ni.Alive, ni.Error = false, "connection refused"
				b := replica(st, "beta")
				b.Reachable, b.Role, b.Disk, b.Replication = false, "Unknown", "DUnknown", "Unknown"
			},
			check: want{
				text: map[string]string{
					"warning-waiting-for-peer-vol0-alpha-command": "replctl primary vol0 --node alpha --force --yes",
					"warning-waiting-for-peer-vol0-alpha-risk":    "writes a peer took after this node last saw it are lost",
					"vol-vol0-export": "not served",
				},
				class: map[string]string{"vol-vol0-primary": "bad"},
			},
		},
		{
			name: "primary lost with failover off: force the UpToDate peer",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster = transport.ClusterInfo{Failover: "off", Reason: "no raft: two data nodes and no witness"}
				st.Nodes = st.Nodes[:2]
				st.Volumes[0].NBDURI = ""
				ni := nodeInfo(st, "alpha")
				ni.Alive, ni.Error = false, "dial tcp 10.0.0.1:7800: connect: connection refused"
				a := replica(st, "alpha")
				a.Reachable, a.Role, a.Disk, a.Replication = false, "Unknown", "DUnknown", "Unknown"
				replica(st, "beta").Replication = "Connecting"
			},
			check: want{
				text: map[string]string{
					"warning-no-primary-vol0-command": "replctl primary vol0 --node beta --force --yes",
					"warning-no-primary-vol0-text":    "lost its primary alpha",
					"cluster-failover":                "off", "cluster-quorum": "no raft", "cluster-witness": "none",
				},
				absent: []string{"warning-no-quorum", "warning-connecting-vol0-beta"},
			},
		},
		{
			name: "online verify under way, and a finished one",
			bend: func(st *transport.ClusterStatus) {
				st.Volumes = append(st.Volumes, healthyVolume("vol1"))
				b := replica(st, "beta")
				b.Replication, b.VerifyDoneBytes, b.VerifyTotalBytes, b.VerifyFoundBytes, b.VerifyRate = "VerifyT", 512<<20, 1<<30, 4096, 64<<20
				b1 := st.Volumes[1].Replica("beta")
				b1.VerifyDoneBytes, b1.VerifyTotalBytes, b1.VerifyFoundBytes = 1<<30, 1<<30, 0
				b1.LastResyncBytes, b1.LastResyncSeconds, b1.LastResyncEnded = 96<<20, 3, time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
			},
			check: want{
				text: map[string]string{
					"replica-vol0-beta-verify-percent": "50.0%",
					"replica-vol0-beta-verify-rate":    "64.0 MiB/s",
					"replica-vol0-beta-verify-eta":     "8 s",
					"replica-vol1-beta-last-resync":    "last resync: 96.0 MiB in 3.0 s at 07:00:00 UTC",
					"replica-vol1-beta-verify-result":  "last verify: 0 B of 1.0 GiB differ",
					"vol-vol1-primary":                 "alpha",
				},
				absent: []string{"replica-vol1-beta-verify"},
			},
		},
		{
			name: "the second before a failover: raft is about to promote beta, nothing to run",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster.Reason = "primary alpha is lost: promoting beta once its lease has run out"
				st.Volumes[0].NBDURI = ""
				ni := nodeInfo(st, "alpha")
				ni.Alive, ni.Membership, ni.Error = false, "suspect", "connection refused"
				a := replica(st, "alpha")
				a.Reachable, a.Role, a.Disk, a.Replication = false, "Unknown", "DUnknown", "Unknown"
				b := replica(st, "beta")
				b.Disk, b.Replication = "Consistent", "Connecting"
			},
			check: want{
				text: map[string]string{
					"warning-no-primary-vol0-text": "no IO is served until the raft leader fails it over to beta",
					"warning-no-primary-vol0":      "promoting beta once its lease has run out",
				},
				absent: []string{"warning-no-primary-vol0-command", "warning-no-primary-vol0-risk", "warning-connecting-vol0-beta"},
				class:  map[string]string{"warning-no-primary-vol0": "critical"},
			},
		},
		{
			name: "the primary led raft: a failover once the others elect a leader, nothing to run",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster.Quorum, st.Cluster.Leader = false, ""
				st.Cluster.Reason = "no quorum: no raft leader with a majority is in reach"
				st.Volumes[0].NBDURI = ""
				ni := nodeInfo(st, "alpha")
				ni.Alive, ni.Membership, ni.Error = false, "suspect", "connection refused"
				a := replica(st, "alpha")
				a.Reachable, a.Role, a.Disk, a.Replication = false, "Unknown", "DUnknown", "Unknown"
				b := replica(st, "beta")
				b.Disk, b.Replication = "Consistent", "Connecting"
			},
			check: want{
				text: map[string]string{
					"warning-no-primary-vol0-text": "no IO is served until raft, once it has elected a leader (2 of 3 voters are up), fails it over to beta",
				},
				absent: []string{"warning-no-primary-vol0-command", "warning-no-primary-vol0-risk"},
			},
		},
		{
			name: "no failover possible: bring the old primary back, or force what is left",
			bend: func(st *transport.ClusterStatus) {
				st.Cluster.Reason = "primary alpha is lost and no node can take over: no UpToDate node alive; beta alive but Outdated"
				st.Volumes[0].NBDURI = ""
				ni := nodeInfo(st, "alpha")
				ni.Alive, ni.Membership = false, "dead"
				a := replica(st, "alpha")
				a.Reachable, a.Role, a.Disk, a.Replication = false, "Unknown", "DUnknown", "Unknown"
				b := replica(st, "beta")
				b.Disk, b.Raft, b.Replication = "Outdated", "Outdated", "Connecting"
			},
			check: want{
				text: map[string]string{
					"warning-no-primary-vol0-text":    "no replica in reach is UpToDate to take over",
					"warning-no-primary-vol0-command": "systemctl start replnode",
					"warning-no-primary-vol0":         "on alpha",
					"warning-no-primary-vol0-risk":    "If alpha cannot come back: replctl primary vol0 --node beta --force --yes makes beta's copy (Outdated) the data of vol0: the writes it missed are lost",
				},
			},
		},
		{
			name: "after a failover: the volume says from where to where, when and why",
			bend: func(st *transport.ClusterStatus) {
				v := &st.Volumes[0]
				v.Primary, v.Epoch, v.NBDURI = "beta", 4, "nbd://10.0.0.2:7802/vol0"
				v.LastFailover = &transport.Failover{From: "alpha", To: "beta", Epoch: 4, At: testNow.Add(-5 * time.Second), Reason: "alpha lost"}
				ni := nodeInfo(st, "alpha")
				ni.Alive, ni.Membership = false, "dead"
				a := replica(st, "alpha")
				a.Reachable, a.Role, a.Disk, a.Replication = false, "Unknown", "Outdated", "Unknown"
				b := replica(st, "beta")
				b.Role, b.Replication = "Primary", "Connecting"
			},
			check: want{
				text: map[string]string{
					"vol-vol0-failover":       "vol0 failed over alpha → beta at 2026-03-14 15:09:21 UTC (epoch 4): alpha lost",
					"vol-vol0-primary":        "beta",
					"warning-node-down-alpha": "Node alpha is unreachable",
					"vol-vol0-severity":       "warning",
				},
				absent: []string{"warning-no-primary-vol0"},
				class:  map[string]string{"vol-vol0": "warning", "replica-vol0-alpha": "problem", "warning-node-down-alpha": "warning"},
			},
		},
		{
			name: "mounted by a mount that follows the primary: the volume says where, since when, and that it follows",
			bend: func(st *transport.ClusterStatus) {
				st.Volumes[0].Mount = &transport.MountStatus{Holder: transport.MountHolder{Host: "client1", Dir: "/srv/data", ID: "c0ffee", Follows: true},
					Since: testNow.Add(-time.Minute), Connections: 1}
			},
			check: want{
				text: map[string]string{
					"vol-vol0-mount": "mounted on host client1 at /srv/data since 2026-03-14 15:08:26 UTC, 1 NBD connection(s) open; it follows the primary",
				},
			},
		},
		{
			name: "forced to primary while disconnected by the operator: the volume runs on one copy",
			bend: func(st *transport.ClusterStatus) {
				v := &st.Volumes[0]
				v.Primary, v.Epoch, v.NBDURI = "beta", 4, "nbd://10.0.0.2:7802/vol0"
				b := replica(st, "beta")
				b.Role, b.Replication, b.Raft = "Primary", "StandAlone", "UpToDate"
				b.Reason, b.ReasonCode = "disconnected by operator", "disconnected-by-operator"
				a := replica(st, "alpha")
				a.Role, a.Disk, a.Replication, a.Raft = "Secondary", "Consistent", "Connecting", "Outdated"
				a.Reason, a.ReasonCode = "disconnected by operator", "disconnected-by-operator" // the primary's view of it
			},
			check: want{
				text: map[string]string{
					"warning-one-copy-vol0-text":    "vol0 runs on one copy: its primary beta is disconnected by the operator",
					"warning-one-copy-vol0-command": "replctl connect vol0 --node beta",
					"warning-count":                 "1",
				},
				absent: []string{"warning-connecting-vol0-alpha", "warning-standalone-vol0-beta", "warning-standalone-vol0-alpha"},
				class:  map[string]string{"warning-one-copy-vol0": "warning", "vol-vol0": "warning", "replica-vol0-beta": "problem"},
			},
		},
		{
			name: "Outdated and StandAlone after a failure: reconnect it",
			bend: func(st *transport.ClusterStatus) {
				b := replica(st, "beta")
				b.Disk, b.Replication, b.Raft, b.Reason = "Outdated", "StandAlone", "Outdated", "refused (unrelated-data)"
			},
			check: want{
				text: map[string]string{
					"warning-outdated-vol0-beta-command":   "replctl connect vol0 --node beta",
					"warning-standalone-vol0-beta-command": "replctl connect vol0 --node beta",
					"replica-vol0-beta-raft":               "Outdated",
				},
				class: map[string]string{"replica-vol0-beta-raft": "bad", "replica-vol0-beta-disk": "bad"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := healthyCluster()
			tc.bend(st)
			p := render(t, pageInput{Status: st})
			for id, sub := range tc.check.text {
				if !p.has(id) {
					t.Errorf("no #%s; ids with its prefix: %v", id, p.ids(strings.SplitN(id, "-", 2)[0]))
					continue
				}
				if got := p.text(id); !strings.Contains(got, sub) {
					t.Errorf("#%s = %q, want it to contain %q", id, got, sub)
				}
			}
			for _, id := range tc.check.absent {
				if p.has(id) {
					t.Errorf("#%s present (%q), want none", id, p.text(id))
				}
			}
			for id, class := range tc.check.class {
				if !p.has(id) {
					t.Errorf("no #%s", id)
					continue
				}
				if got := strings.Fields(p.attr(id, "class")); !contains(got, class) {
					t.Errorf("#%s has classes %v, want %q", id, got, class)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestPageProblemVolumesFirst: a volume with a critical warning comes
// first, then one with a warning, then the healthy ones in the status's
// order; the volumes come before the cluster overview, so that the
// problem's replica table is on the first screen; a problem replica's row
// is marked, a healthy one's is not.
func TestPageProblemVolumesFirst(t *testing.T) {
	st := healthyCluster()
	st.Volumes = append(st.Volumes, healthyVolume("vol1"), healthyVolume("vol2"), healthyVolume("vol3"))
	st.Volumes[1].Replica("beta").Replication = "StandAlone" // vol1: a warning
	st.Volumes[3].Replica("beta").Disk = "Failed"            // vol3: critical
	p := render(t, pageInput{Status: st})
	var order []int
	for _, id := range []string{"vol-vol3", "vol-vol1", "vol-vol0", "vol-vol2", "cluster"} {
		i := strings.Index(p.src, `id="`+id+`"`)
		if i < 0 {
			t.Fatalf("no #%s", id)
		}
		order = append(order, i)
	}
	if !slices.IsSorted(order) {
		t.Errorf("page order of vol3 (critical), vol1 (warning), vol0, vol2, the cluster: at %v, want increasing", order)
	}
	for id, want := range map[string]string{"vol-vol3": "critical", "vol-vol1": "warning"} {
		if got := strings.Fields(p.attr(id, "class")); !contains(got, want) {
			t.Errorf("#%s classes %v, want %q", id, got, want)
		}
	}
	if got := p.attr("vol-vol0", "class"); got != "volume" {
		t.Errorf("healthy #vol-vol0 classes %q, want only volume", got)
	}
	if !contains(strings.Fields(p.attr("replica-vol3-beta", "class")), "problem") {
		t.Errorf("the failed replica's row is not marked: %q", p.attr("replica-vol3-beta", "class"))
	}
	for _, id := range []string{"replica-vol3-alpha", "replica-vol0-beta"} {
		if contains(strings.Fields(p.attr(id, "class")), "problem") {
			t.Errorf("healthy #%s marked as a problem", id)
		}
	}
}

// TestWarningsJSON: the warnings the page shows are in the status's JSON,
// with every field a tool needs, and an empty list (not null) when all is
// well.
func TestWarningsJSON(t *testing.T) {
	healthy, err := json.Marshal(Warnings(healthyCluster()))
	if err != nil || string(healthy) != "[]" {
		t.Fatalf("a healthy cluster's warnings: %s (%v), want []", healthy, err)
	}
	st := healthyCluster()
	replica(st, "beta").Replication = "StandAlone"
	st.Warnings = Warnings(st)
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Warnings []map[string]string `json:"warnings"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"id": "warning-standalone-vol0-beta", "kind": "standalone", "severity": "warning", "volume": "vol0", "node": "beta",
		"command": "replctl connect vol0 --node beta"}
	if len(doc.Warnings) != 1 {
		t.Fatalf("warnings in JSON: %s", raw)
	}
	for k, v := range want {
		if doc.Warnings[0][k] != v {
			t.Errorf("warning's %q = %q, want %q", k, doc.Warnings[0][k], v)
		}
	}
	if !strings.Contains(doc.Warnings[0]["text"], "beta is StandAlone on vol0") {
		t.Errorf("warning's text %q", doc.Warnings[0]["text"])
	}
}

func TestPageResyncBarValue(t *testing.T) {
	st := healthyCluster()
	b := replica(st, "beta")
	b.Disk, b.Replication, b.ResyncDoneBytes, b.ResyncTotalBytes = "Inconsistent", "SyncTarget", 3, 4
	p := render(t, pageInput{Status: st})
	if v := p.attr("replica-vol0-beta-resync-bar", "value"); v != "75" {
		t.Errorf("resync bar value %q, want 75", v)
	}
	if v := p.attr("replica-vol0-beta-resync-bar", "max"); v != "100" {
		t.Errorf("resync bar max %q, want 100", v)
	}
	if eta := p.text("replica-vol0-beta-resync-eta"); eta != "—" {
		t.Errorf("ETA without a rate %q, want —", eta)
	}
}

func TestPageWarningsMostUrgentFirst(t *testing.T) {
	st := healthyCluster()
	b := replica(st, "beta")
	b.Replication = "StandAlone"
	b.Paths = []transport.PathStatus{{Path: "p0", State: "FAIL"}}
	st.Cluster.Quorum = false
	ws := healthWarnings(st)
	var got []string
	for _, w := range ws {
		got = append(got, w.Severity)
	}
	for i := 1; i < len(ws); i++ {
		if severityRank(ws[i-1].Severity) > severityRank(ws[i].Severity) {
			t.Fatalf("warnings out of order: %v", got)
		}
	}
	if len(ws) == 0 || ws[0].ID != "warning-no-quorum" {
		t.Fatalf("first warning %v, want warning-no-quorum", ws)
	}
}

func TestPageEventsNewestFirstWithReason(t *testing.T) {
	st := healthyCluster()
	events := []transport.Event{
		{Seq: 9, Time: testNow.Add(-time.Second), Node: "beta", Volume: "vol0", Kind: "disconnected", Message: "beta disconnected by the operator"},
		{Seq: 41, Time: testNow.Add(-time.Minute), Node: "alpha", Volume: "vol0", Kind: "connected", Message: "beta connected",
			Peer: "beta", Old: "Connecting", New: "SyncSource", Reason: "bitmap-self"},
	}
	p := render(t, pageInput{Status: st, Events: events})
	if got := p.text("event-beta-9-kind"); got != "disconnected" {
		t.Errorf("event kind %q", got)
	}
	if got := p.text("event-alpha-41"); !strings.Contains(got, "beta: Connecting → SyncSource") || !strings.Contains(got, "(bitmap-self)") {
		t.Errorf("event text %q: want the change and the reason", got)
	}
	if !strings.Contains(p.attr("event-beta-9", "class"), "bad") {
		t.Errorf("a disconnect is not marked bad: %q", p.attr("event-beta-9", "class"))
	}
	if i, j := strings.Index(p.src, `id="event-beta-9"`), strings.Index(p.src, `id="event-alpha-41"`); i > j {
		t.Errorf("events not in the order given (newest first)")
	}
	if p.has("events-none") {
		t.Errorf("events-none with events")
	}
}

func TestPageWithoutStatus(t *testing.T) {
	p := render(t, pageInput{StatusError: "context deadline exceeded"})
	if got := p.text("warning-status"); !strings.Contains(got, "context deadline exceeded") {
		t.Errorf("warning-status %q", got)
	}
}

func TestPageNamesAreEscapedIntoIDs(t *testing.T) {
	st := healthyCluster()
	st.Volumes[0].Name = `db "main"/1`
	p := render(t, pageInput{Status: st})
	if !p.has("vol-db__main__1-primary") {
		t.Errorf("no #vol-db__main__1-primary; vol ids: %v", p.ids("vol-"))
	}
}

func TestPageLoadsNothingFromAnotherHost(t *testing.T) {
	p := render(t, pageInput{Status: healthyCluster(), IO: bigIO(healthyCluster(), testNow)})
	for _, bad := range []string{"http://", "https://", "//", "url("} {
		for _, line := range strings.Split(p.src, "\n") {
			if strings.Contains(line, "src=\""+bad) || strings.Contains(line, "href=\""+bad) {
				t.Errorf("the page refers to another host: %s", line)
			}
		}
	}
	if strings.Contains(p.src, "style=") {
		t.Errorf("inline style attribute: the Content-Security-Policy forbids it")
	}
}

func TestSparkline(t *testing.T) {
	now := testNow
	samples := []ioSample{
		{At: now.Add(-10 * time.Minute), IOPS: 1e9}, // outside the window: ignored
		{At: now.Add(-ioWindow), IOPS: 0, Rate: 0},
		{At: now.Add(-ioWindow / 2), IOPS: 500, Rate: 1 << 20},
		{At: now, IOPS: 250, Rate: 2 << 20},
	}
	s := sparkline(samples, now, func(s ioSample) float64 { return s.IOPS }, humanCount)
	if s.Points != "0,27.0 80,1.0 160,14.0" {
		t.Errorf("points %q", s.Points)
	}
	// Samples closer than a point's width: one point at their highest.
	burst := []ioSample{{At: now.Add(-time.Second), IOPS: 10}, {At: now.Add(-time.Second / 2), IOPS: 90}, {At: now, IOPS: 20}}
	if b := sparkline(burst, now, func(s ioSample) float64 { return s.IOPS }, humanCount); b.Points != "158,1.0 160,21.2" {
		t.Errorf("burst points %q, want the 90 kept", b.Points)
	}
	if s.Latest != "250" || s.Max != "500" {
		t.Errorf("latest %q max %q", s.Latest, s.Max)
	}
	if e := sparkline(nil, now, func(s ioSample) float64 { return s.IOPS }, humanCount); !e.Empty {
		t.Errorf("no samples: want Empty")
	}
	p := render(t, pageInput{Status: healthyCluster(), IO: map[string]volumeIO{"vol0": drawIO(samples, now)}})
	if got := p.text("vol-vol0-throughput-now"); got != "2.0 MiB/s" {
		t.Errorf("throughput now %q", got)
	}
	if got := p.text("vol-vol0-iops-now"); got != "250" {
		t.Errorf("IOPS now %q", got)
	}
}

// TestAChecksumBuildIsNamedOnThePage: the bar of a scrub that is the
// build of checksums just turned on says so in its title (the cluster's
// status marks it scrub.build); an ordinary scrub's says what a scrub
// does.
func TestAChecksumBuildIsNamedOnThePage(t *testing.T) {
	p := scrubProgress(transport.ScrubSummary{State: "running", Percent: 37, Build: true})
	if p == nil || !strings.HasPrefix(p.Title, "checksums building") || p.PercentText != "37.0%" {
		t.Fatalf("the build's bar: %+v", p)
	}
	if p := scrubProgress(transport.ScrubSummary{State: "running", Percent: 37}); p == nil || !strings.HasPrefix(p.Title, "scrub:") {
		t.Fatalf("a scrub's bar: %+v", p)
	}
}
