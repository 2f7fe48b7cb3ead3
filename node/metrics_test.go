package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/replvol/replvol/transport"
)

// The metrics tests pin what an alert may rely on: "connected" means a
// session exists, not "in sync"; out-of-sync bytes grow while a peer is
// away and writes happen; every node serves every replica's state; a
// scrape never waits long for a peer; and every scrape passes
// `promtool check metrics`.

// metricValue returns the value of the series of family name whose labels
// include want ("key=value" each), and whether there is one.
func metricValue(t testing.TB, n *Node, name string, want ...string) (float64, bool) {
	t.Helper()
	mfs, err := n.registry.Gather()
	if err != nil {
		t.Fatalf("gather %s: %v", n.name, err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for _, kv := range want {
				k, v, _ := strings.Cut(kv, "=")
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// waitMetric waits until the series has a value cond accepts.
func waitMetric(t *testing.T, n *Node, what string, cond func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	var got float64
	var ok bool
	if !within(15*time.Second, 20*time.Millisecond, func() bool {
		got, ok = metricValue(t, n, name, labels...)
		return ok && cond(got)
	}) {
		t.Fatalf("%s: %s%v on %s is %v (present: %v)", what, name, labels, n.name, got, ok)
	}
	return got
}

// scrapeFamily returns the lines of a scrape about one family.
func scrapeFamily(scrape, name string) string {
	var lines []string
	for _, l := range strings.Split(scrape, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, "# HELP "+name+" ") || strings.HasPrefix(l, "# TYPE "+name+" ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func metricIs(want float64) func(float64) bool     { return func(v float64) bool { return v == want } }
func metricAtLeast(min float64) func(float64) bool { return func(v float64) bool { return v >= min } }

// promtoolPath returns the path of promtool, or "" when it is missing: the
// caller skips what needs it, except under CI=true, where that fails.
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	const msg = "promtool not found: install the Debian package prometheus (./deploy/install-test-deps.sh)"
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: " + msg)
	}
	t.Log(msg)
	return ""
}

// checkScrape fetches the node's /metrics as Prometheus would and lints it
// with `promtool check metrics`.
func checkScrape(t *testing.T, n *Node) string {
	t.Helper()
	resp, err := http.Get("http://" + n.ControlAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics of %s: %s %v", n.name, resp.Status, err)
	}
	pt := promtoolPath(t)
	if pt == "" {
		return string(body)
	}
	cmd := exec.Command(pt, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics on %s's /metrics: %v\n%s", n.name, err, out)
	}
	return string(body)
}

// TestMetricsTellConnectedFromInSync: while alpha is disconnected, its
// link to beta is not connected (not merely "not in sync"), and the blocks
// written meanwhile show up as out of sync, on alpha and on beta; once
// reconnected, beta resyncs and both are in sync again.
func TestMetricsTellConnectedFromInSync(t *testing.T) {
	beside(t)
	c := newSyncedCluster(t, 8<<20)
	alpha, beta := c.nodes["alpha"], c.nodes["beta"]
	ctx := context.Background()
	toBeta := []string{"volume=vol0", "node=alpha", "peer=beta"}

	waitMetric(t, alpha, "alpha's link to beta", metricIs(1), "replvol_peer_connected", toBeta...)
	waitMetric(t, alpha, "beta in sync", metricIs(1), "replvol_peer_in_sync", toBeta...)
	waitMetric(t, beta, "beta's link to its primary", metricIs(1), "replvol_peer_connected", "volume=vol0", "node=beta", "peer=alpha")
	for _, n := range []*Node{alpha, beta} {
		waitMetric(t, n, "beta UpToDate, as every node says", metricIs(1), "replvol_replica_disk_state", "volume=vol0", "node=beta", "state=UpToDate")
		waitMetric(t, n, "alpha's role, as every node says", metricIs(1), "replvol_replica_role", "volume=vol0", "node=alpha", "state=Primary")
		waitMetric(t, n, "the export is served", metricIs(1), "replvol_volume_exported", "volume=vol0")
	}
	// A state set: one series per role, 1 for the current one.
	const roles = `
# HELP replvol_replica_role 1 for the replica's current role, 0 for the others (cluster view).
# TYPE replvol_replica_role gauge
replvol_replica_role{node="alpha",state="Primary",volume="vol0"} 1
replvol_replica_role{node="alpha",state="Secondary",volume="vol0"} 0
replvol_replica_role{node="alpha",state="Unknown",volume="vol0"} 0
replvol_replica_role{node="beta",state="Primary",volume="vol0"} 0
replvol_replica_role{node="beta",state="Secondary",volume="vol0"} 1
replvol_replica_role{node="beta",state="Unknown",volume="vol0"} 0
`
	if got := scrapeFamily(checkScrape(t, beta), "replvol_replica_role"); got != strings.TrimSpace(roles) {
		t.Fatalf("beta's scrape says\n%s\nwant\n%s", got, strings.TrimSpace(roles))
	}
	checkScrape(t, alpha)

	ctl := alpha.api
	if _, err := ctl.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, alpha, "disconnected link", metricIs(0), "replvol_peer_connected", toBeta...)
	waitMetric(t, alpha, "disconnected peer not in sync", metricIs(0), "replvol_peer_in_sync", toBeta...)
	const written = 1 << 20
	for off := int64(0); off < written; off += 64 << 10 {
		if err := c.vol("alpha").WriteAt(ctx, pattern(byte(off>>16), 64<<10), off, false); err != nil {
			t.Fatal(err)
		}
	}
	waitMetric(t, alpha, "alpha marks beta's blocks", metricIs(written), "replvol_peer_out_of_sync_bytes", toBeta...)
	waitMetric(t, beta, "beta serves the out-of-sync bytes too", metricIs(written), "replvol_replica_out_of_sync_bytes", "volume=vol0", "node=beta")
	waitMetric(t, beta, "alpha StandAlone", metricIs(1), "replvol_replica_replication_state", "volume=vol0", "node=alpha", "state=StandAlone")
	waitMetric(t, alpha, "writes counted", metricAtLeast(16), "replvol_writes_total", "volume=vol0", "node=alpha")
	waitMetric(t, alpha, "written bytes counted", metricAtLeast(written), "replvol_write_bytes_total", "volume=vol0", "node=alpha")
	waitMetric(t, alpha, "the disconnect counted", metricIs(1), "replvol_events_total", "kind=disconnected")
	if got := scrapeFamily(checkScrape(t, alpha), "replvol_request_duration_seconds_count"); !strings.Contains(got, `op="write",volume="vol0"} 16`) {
		t.Errorf("16 writes, but their latency histogram says:\n%s", got)
	}
	checkScrape(t, alpha)

	if _, err := ctl.Connect(ctx, &transport.ConnectRequest{Volume: "vol0"}); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, alpha, "reconnected", metricIs(1), "replvol_peer_connected", toBeta...)
	waitMetric(t, alpha, "in sync after the resync", metricIs(1), "replvol_peer_in_sync", toBeta...)
	waitMetric(t, alpha, "nothing out of sync", metricIs(0), "replvol_peer_out_of_sync_bytes", toBeta...)
	waitMetric(t, alpha, "resync sent", metricAtLeast(written), "replvol_peer_resync_sent_bytes_total", toBeta...)
	waitMetric(t, beta, "beta received the resync", metricAtLeast(written), "replvol_resynced_bytes_total", "volume=vol0", "node=beta")
	waitMetric(t, alpha, "beta UpToDate again", metricIs(1), "replvol_replica_disk_state", "volume=vol0", "node=beta", "state=UpToDate")
	checkScrape(t, alpha)
	checkScrape(t, beta)
}

// TestMetricsOfPaths: each path's state, IOs and latency; a failed path is
// FAIL and the IO goes to the other.
func TestMetricsOfPaths(t *testing.T) {
	c, _ := multipathCluster(t, 16<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	alpha := c.nodes["alpha"]
	p := func(name string) []string { return []string{"volume=vol0", "node=alpha", "path=" + name} }
	if _, err := alpha.api.PathAction(context.Background(), &transport.PathRequest{Volume: "vol0", Action: "fail", Path: "p0"}); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, alpha, "p0 failed", metricIs(1), "replvol_path_state", append(p("p0"), "state=FAIL")...)
	waitMetric(t, alpha, "p0 not active", metricIs(0), "replvol_path_state", append(p("p0"), "state=ACTIVE")...)
	waitMetric(t, alpha, "p1 active", metricIs(1), "replvol_path_state", append(p("p1"), "state=ACTIVE")...)
	before, _ := metricValue(t, alpha, "replvol_path_ios_total", p("p1")...)
	buf := make([]byte, 64<<10)
	for i := range 8 {
		if err := c.vol("alpha").WriteAt(context.Background(), pattern(byte(i), len(buf)), int64(i)*int64(len(buf)), false); err != nil {
			t.Fatal(err)
		}
	}
	waitMetric(t, alpha, "IO on p1", metricAtLeast(before+8), "replvol_path_ios_total", p("p1")...)
	waitMetric(t, alpha, "p1's latency measured", metricAtLeast(1e-9), "replvol_path_latency_p99_seconds", p("p1")...)
	if _, ok := metricValue(t, c.nodes["beta"], "replvol_path_state"); ok {
		t.Error("beta, with a single-path disk, reports paths")
	}
	checkScrape(t, alpha)
}

// TestMetricsOfRaftAndGossip: with raft, every node (the witness too)
// reports the leader, the quorum, the members and what raft records of
// each replica; a crashed node is dead and unreachable.
func TestMetricsOfRaftAndGossip(t *testing.T) {
	c := newRaftCluster(t, 4<<20)
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	alpha, wit := c.nodes["alpha"], c.nodes["wit"]
	for _, n := range []*Node{wit, alpha} {
		waitMetric(t, n, "quorum", metricIs(1), "replvol_cluster_quorum")
		waitMetric(t, n, "voters", metricIs(3), "replvol_cluster_voters")
		waitMetric(t, n, "failover auto", metricIs(1), "replvol_cluster_failover_auto")
		for _, m := range []string{"alpha", "beta", "wit"} {
			waitMetric(t, n, m+" alive", metricIs(1), "replvol_cluster_member_state", "node="+m, "state=alive")
		}
		waitMetric(t, n, "raft records beta UpToDate", metricIs(1), "replvol_replica_raft_state", "volume=vol0", "node=beta", "state=UpToDate")
		// Leadership may be moving (off a primary, to the witness).
		eventually(t, func() bool {
			leaders := 0.0
			for _, m := range []string{"alpha", "beta", "wit"} {
				v, _ := metricValue(t, n, "replvol_cluster_is_leader", "node="+m)
				leaders += v
			}
			return leaders == 1
		}, n.name+" sees one raft leader")
	}
	if _, ok := metricValue(t, wit, "replvol_nbd_open_connections"); ok {
		t.Error("the witness reports an NBD server")
	}
	checkScrape(t, wit)
	checkScrape(t, alpha)

	c.crash("beta")
	waitMetric(t, wit, "beta dead", metricIs(1), "replvol_cluster_member_state", "node=beta", "state=dead")
	waitMetric(t, wit, "beta unreachable", metricIs(0), "replvol_node_reachable", "node=beta")
	waitMetric(t, alpha, "beta's replica unreachable", metricIs(0), "replvol_replica_reachable", "volume=vol0", "node=beta")
	waitMetric(t, alpha, "alpha's link down", metricIs(0), "replvol_peer_connected", "volume=vol0", "node=alpha", "peer=beta")
	checkScrape(t, alpha)
}

// TestAScrapeWaitsBrieflyForASlowClusterView: the cluster view is
// assembled once per clusterViewTTL, by one assembly however many scrapes ask,
// and a scrape waits for a slow one at most clusterViewWait, then serves the
// last view.
func TestAScrapeWaitsBrieflyForASlowClusterView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		answers := make(chan *transport.ClusterStatus)
		var fetches atomic.Int32
		s := newStatusCache(t.Context(), nil, func(ctx context.Context) (*transport.ClusterStatus, error) {
			fetches.Add(1)
			select {
			case st := <-answers:
				return st, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		get := func(wantFrom string, wantWait time.Duration) {
			t.Helper()
			began := time.Now()
			st, _ := s.get()
			from := ""
			if st != nil {
				from = st.From
			}
			if from != wantFrom || time.Since(began) != wantWait {
				t.Fatalf("get: view from %q after %v, want %q after %v", from, time.Since(began), wantFrom, wantWait)
			}
		}

		// The peers do not answer: the first scrape has no view after clusterViewWait.
		get("", clusterViewWait)
		// The assembly ends later: the next scrape has the view at once, and
		// so does every scrape within clusterViewTTL.
		answers <- &transport.ClusterStatus{From: "first"}
		synctest.Wait()
		get("first", 0)
		time.Sleep(clusterViewTTL / 2)
		get("first", 0)
		if fetches.Load() != 1 {
			t.Fatalf("%d assemblies within clusterViewTTL, want 1", fetches.Load())
		}

		// Past clusterViewTTL, concurrent scrapes share one new assembly; it is
		// slow, so they serve the last view after clusterViewWait.
		time.Sleep(clusterViewTTL)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { get("first", clusterViewWait) })
		}
		wg.Wait()
		if fetches.Load() != 2 {
			t.Fatalf("%d assemblies, want 2: concurrent scrapes share one", fetches.Load())
		}
		// That assembly is given up after clusterViewTimeout; the next scrape
		// starts another, which answers.
		time.Sleep(clusterViewTimeout)
		synctest.Wait()
		go func() { answers <- &transport.ClusterStatus{From: "second"} }()
		get("second", 0)
		if fetches.Load() != 3 {
			t.Fatalf("%d assemblies, want 3", fetches.Load())
		}
	})
}

// TestAlertRules: deploy/alerts.yaml passes `promtool check rules`, names
// only series the node exports, and its key alerts fire (and stay quiet)
// as intended (`promtool test rules`).
func TestAlertRules(t *testing.T) {
	rules, err := filepath.Abs(filepath.Join("..", "deploy", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var c collector
	c.define()
	var exported []string
	for _, d := range c.all {
		m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())
		exported = append(exported, m[1])
	}
	var rulesOnly []string // without the comments
	for _, l := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			rulesOnly = append(rulesOnly, l)
		}
	}
	for _, name := range regexp.MustCompile(`replvol_[a-z0-9_]*[a-z0-9]`).FindAllString(strings.Join(rulesOnly, "\n"), -1) {
		if !slices.Contains(exported, name) {
			t.Errorf("deploy/alerts.yaml names %s, which the node does not export", name)
		}
	}

	pt := promtoolPath(t)
	if pt == "" {
		t.Skip("promtool missing")
	}
	if out, err := exec.Command(pt, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	unit := filepath.Join(t.TempDir(), "alerts_test.yaml")
	if err := os.WriteFile(unit, fmt.Appendf(nil, alertsUnitTest, rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(pt, "test", "rules", unit).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// alertsUnitTest is a `promtool test rules` file (%s: the rules): two
// nodes, a and b, both report the cluster view.
const alertsUnitTest = `
rule_files: [%q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Both nodes report beta's split brain: one alert.
      - series: 'replvol_replica_reason{instance="a",job="replvol",volume="vol0",node="beta",reason="split-brain"}'
        values: '1x5'
      - series: 'replvol_replica_reason{instance="b",job="replvol",volume="vol0",node="beta",reason="split-brain"}'
        values: '1x5'
      # alpha, the primary, lost its session with beta; beta lost it too:
      # the primary's side alerts.
      - series: 'replvol_peer_connected{instance="a",job="replvol",volume="vol1",node="alpha",peer="beta"}'
        values: '0x5'
      - series: 'replvol_peer_connected{instance="b",job="replvol",volume="vol1",node="beta",peer="alpha"}'
        values: '0x5'
      - series: 'replvol_volume_primary{instance="a",job="replvol",volume="vol1",node="alpha"}'
        values: '1x5'
      - series: 'replvol_volume_primary{instance="b",job="replvol",volume="vol1",node="beta"}'
        values: '0x5'
      # vol2: gamma resyncs (no alert), delta is Outdated and idle (alert).
      - series: 'replvol_replica_disk_state{instance="a",job="replvol",volume="vol2",node="gamma",state="UpToDate"}'
        values: '0x15'
      - series: 'replvol_replica_replication_state{instance="a",job="replvol",volume="vol2",node="gamma",state="SyncTarget"}'
        values: '1x15'
      - series: 'replvol_replica_disk_state{instance="a",job="replvol",volume="vol2",node="delta",state="UpToDate"}'
        values: '0x15'
      - series: 'replvol_replica_replication_state{instance="a",job="replvol",volume="vol2",node="delta",state="SyncTarget"}'
        values: '0x15'
      # vol3: alpha found 2 blocks no replica holds good; they are
      # written again at 3m. beta found none.
      - series: 'replvol_blocks_unrecoverable{instance="a",job="replvol",volume="vol3",node="alpha"}'
        values: '0 2 2 0 0'
      - series: 'replvol_blocks_unrecoverable{instance="b",job="replvol",volume="vol3",node="beta"}'
        values: '0x4'
    alert_rule_test:
      - eval_time: 0m
        alertname: ReplvolBlocksUnrecoverable
        exp_alerts: []
      - eval_time: 1m
        alertname: ReplvolBlocksUnrecoverable
        exp_alerts:
          - exp_labels: {severity: critical, volume: vol3, node: alpha}
            exp_annotations:
              summary: "2 blocks of vol3 on alpha have no good copy on any replica"
              description: "Reads of them fail with EIO (never wrong data). replctl events --node alpha names their byte ranges (block-unrecoverable); write those ranges again, from a backup or what the application knows: a write clears them."
      - eval_time: 3m
        alertname: ReplvolBlocksUnrecoverable
        exp_alerts: []
      - eval_time: 2m
        alertname: ReplvolSplitBrain
        exp_alerts:
          - exp_labels: {severity: critical, volume: vol0, node: beta}
            exp_annotations:
              summary: "Split brain on vol0 (beta)"
              description: "Two nodes took writes since their last common generation; neither syncs. Choose the node whose changes go: replctl connect vol0 --discard-my-data --node VICTIM"
      - eval_time: 2m
        alertname: ReplvolReplicationDisconnected
        exp_alerts:
          - exp_labels: {severity: warning, instance: a, job: replvol, volume: vol1, node: alpha, peer: beta}
            exp_annotations:
              summary: "alpha does not replicate vol1 to beta"
              description: "Writes are tracked in beta's bitmap and it falls behind; replctl status vol1 gives the reason. If an operator disconnected it: replctl connect vol1 --node beta"
      - eval_time: 5m
        alertname: ReplvolReplicaNotUpToDate
        exp_alerts: []
      - eval_time: 12m
        alertname: ReplvolReplicaNotUpToDate
        exp_alerts:
          - exp_labels: {severity: warning, volume: vol2, node: delta}
            exp_annotations:
              summary: "vol2 on delta is not UpToDate and not resyncing"
              description: "A failover to delta would lose writes. replctl status vol2 gives the reason; reconnect it with replctl connect vol2 --node delta"
`
