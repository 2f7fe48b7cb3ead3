package main

// Unit tests of replctl's operator-facing pieces (issue 11): size flags,
// name checks, errors in words, the status table's bars, warnings and
// colours, --since, and the merge order of events from several nodes.

import (
	"bytes"
	"container/heap"
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

func sampleStatus() *transport.ClusterStatus {
	return &transport.ClusterStatus{
		From:    "alpha",
		Cluster: transport.ClusterInfo{Failover: "off", Reason: "no raft"},
		Nodes: []transport.NodeInfo{
			{Name: "alpha", Control: "127.0.0.1:7800", NBD: "127.0.0.1:7802", Alive: true, Role: "data"},
			{Name: "beta", Control: "127.0.0.1:7803", NBD: "127.0.0.1:7805", Alive: true, Role: "data"},
		},
		Volumes: []transport.VolumeStatus{{
			Name: "vol0", Size: 1 << 30, Protocol: "C", Primary: "alpha", Epoch: 1, NBDURI: "nbd://127.0.0.1:7802/vol0",
			Replicas: []transport.ReplicaStatus{
				{Node: "alpha", Role: "Primary", Disk: "UpToDate", Replication: "Connected", Reachable: true, SyncProgress: 100},
				{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "Connected", Reachable: true, SyncProgress: 100},
			},
		}},
	}
}

func TestCheckNamesListsTheValidOnes(t *testing.T) {
	st := sampleStatus()
	st.Nodes = append(st.Nodes, transport.NodeInfo{Name: "witness", Role: "witness"})
	for _, tc := range []struct {
		name, volume, node string
		want               string // "" for no error
	}{
		{"known volume and node", "vol0", "beta", ""},
		{"no names", "", "", ""},
		{"a typo in the volume", "vol9", "", `no volume "vol9" in the cluster: the volumes are vol0`},
		{"a typo in the node", "", "betta", `no node "betta" in the cluster: the nodes are alpha, beta, witness`},
		{"a node that holds no disk of the volume", "vol0", "witness", "node witness holds no disk of vol0: its nodes are alpha, beta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkNames(st, tc.volume, tc.node)
			var ne *nameError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkNames: %v", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.As(err, &ne)):
				t.Fatalf("checkNames = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDialWordsAndPlainMessages(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &osSyscallError{syscall.ECONNREFUSED}}
	if got := transport.DialWords(refused); !strings.Contains(got, "connection refused") {
		t.Errorf("transport.DialWords(refused) = %q", got)
	}
	// A real refused connection, to a port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	why := probe(addr)
	if why == nil {
		t.Skipf("something listens on %s again", addr)
	}
	msg := unreachable(addr, why).Error()
	if !strings.Contains(msg, addr) || !strings.Contains(msg, "is replnode running there?") || !strings.Contains(msg, "connection refused") {
		t.Errorf("unreachable(%s) = %q", addr, msg)
	}
	raw := `rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7803: connect: connection refused"`
	if got := plainMessage(raw); got != "dial tcp 127.0.0.1:7803: connect: connection refused" {
		t.Errorf("plainMessage = %q", got)
	}
}

type osSyscallError struct{ errno syscall.Errno }

func (e *osSyscallError) Error() string { return "connect: " + e.errno.Error() }
func (e *osSyscallError) Unwrap() error { return e.errno }

// TestSyncCellNeverShowsAnIdleReplicaComplete pins the SYNC column: a bar
// with speed and ETA while a resync or verify runs, "in sync" (green)
// only for a connected UpToDate replica, never for one without a disk,
// not replicating or not reachable.
func TestSyncCellNeverShowsAnIdleReplicaComplete(t *testing.T) {
	v := &sampleStatus().Volumes[0]
	for _, tc := range []struct {
		name      string
		r         transport.ReplicaStatus
		want      string
		wantColor string
	}{
		{"connected and UpToDate", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "Connected", Reachable: true, SyncProgress: 100},
			"in sync", colorGreen},
		{"Diskless reports 100% but has no disk", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "Diskless", Replication: "Connected", Reachable: true, SyncProgress: 100},
			"no disk", colorRed},
		{"StandAlone but UpToDate", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "StandAlone", Reachable: true, SyncProgress: 100},
			"not replicating", colorRed},
		{"unreachable", transport.ReplicaStatus{Node: "beta", Role: "Unknown", Disk: "UpToDate", Replication: "Unknown", SyncProgress: 100},
			"unknown", colorDim},
		{"a resync half done", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "Inconsistent", Replication: "SyncTarget", Reachable: true,
			ResyncDoneBytes: 512 << 20, ResyncTotalBytes: 1 << 30, ResyncRate: 128 << 20, SyncProgress: 50},
			"[##########..........]  50.0% 128.0MiB/s ETA 4s", colorYellow},
		{"a paused resync", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "Inconsistent", Replication: "PausedSyncT", Reachable: true,
			ResyncDoneBytes: 256 << 20, ResyncTotalBytes: 1 << 30, SyncProgress: 25},
			"[#####...............]  25.0% paused (replctl resync vol0 --resume)", colorYellow},
		{"a verify", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "VerifyT", Reachable: true,
			VerifyDoneBytes: 1 << 29, VerifyTotalBytes: 1 << 30, VerifyFoundBytes: 4096},
			"verify [##########..........]  50.0% ?/s ETA ?, 4.0KiB differ", colorCyan},
		{"the primary of a resync", transport.ReplicaStatus{Node: "alpha", Role: "Primary", Disk: "UpToDate", Replication: "SyncSource", Reachable: true, SyncProgress: 100},
			"resync source", colorNone},
		{"a primary copying back what its disk missed", transport.ReplicaStatus{Node: "alpha", Role: "Primary", Disk: "UpToDate", Replication: "SyncTarget", Reachable: true,
			OutOfSyncBytes: 256 << 20},
			"[###############.....]  75.0% copying back from a peer", colorYellow},
		{"Outdated and connected, no resync yet", transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "Outdated", Replication: "Connected", Reachable: true, SyncProgress: 99.5},
			"99.5%", colorYellow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := syncCell(v, &tc.r, time.Now())
			if got.text != tc.want || got.color != tc.wantColor {
				t.Fatalf("syncCell = %q (colour %q), want %q (colour %q)", got.text, got.color, tc.want, tc.wantColor)
			}
		})
	}

	// A verify shows its speed and ETA.
	r := transport.ReplicaStatus{Node: "beta", Role: "Secondary", Disk: "UpToDate", Replication: "VerifyT", Reachable: true,
		VerifyDoneBytes: 100 << 20, VerifyTotalBytes: 1 << 30, VerifyRate: 100 << 20}
	got := syncCell(v, &r, time.Now())
	if !strings.Contains(got.text, "100.0MiB/s") || !strings.Contains(got.text, "ETA 9s") {
		t.Fatalf("a verify: %q, want 100.0MiB/s and ETA 9s", got.text)
	}
}

// TestStatusWarnsOnTheVolumeLine: a replica not UpToDate or not
// replicating and a failed path are named on the volume's line.
func TestStatusWarnsOnTheVolumeLine(t *testing.T) {
	st := sampleStatus()
	v := &st.Volumes[0]
	v.Replicas[1].Disk, v.Replicas[1].Replication = "Outdated", "StandAlone"
	v.Replicas[0].Paths = []transport.PathStatus{{Node: "alpha", Volume: "vol0", Path: "p0", State: "FAIL"}, {Node: "alpha", Volume: "vol0", Path: "p1", State: "ACTIVE"}}
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	var volLine string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "vol0 ") {
			volLine = l
		}
	}
	for _, want := range []string{"! beta Outdated StandAlone", "! alpha path p0 failed"} {
		if !strings.Contains(volLine, want) {
			t.Errorf("volume line %q lacks %q", volLine, want)
		}
	}
	if strings.Contains(volLine, "p1") || strings.Contains(volLine, "! alpha Up") {
		t.Errorf("volume line %q warns about what is fine", volLine)
	}
	if strings.Contains(out.String(), "\033[") {
		t.Errorf("colours with the palette off:\n%q", out.String())
	}
	if !strings.Contains(out.String(), "not replicating") || strings.Contains(out.String(), "beta  Secondary  Outdated  StandAlone  0B  in sync") {
		t.Errorf("status:\n%s", out.String())
	}

	out.Reset()
	printStatus(&out, st, palette{on: true}, time.Now())
	if !strings.Contains(out.String(), "\033[31m! beta Outdated StandAlone\033[0m") {
		t.Errorf("with colours, the warning is not red:\n%q", out.String())
	}
	// Columns stay aligned with colours: the same text once the codes go.
	var plainOut bytes.Buffer
	printStatus(&plainOut, st, palette{}, time.Now())
	if stripANSI(out.String()) != plainOut.String() {
		t.Errorf("coloured status is laid out differently:\n%s\nvs\n%s", stripANSI(out.String()), plainOut.String())
	}

	// Protocol A shows the lag, cluster mode raft's view.
	v.Protocol = "A"
	v.Replicas[1].LagBytes, v.Replicas[1].LagSeconds, v.Replicas[1].Raft = 3<<20, 0.25, "Outdated"
	st.Cluster.Voters = []string{"alpha", "beta", "witness"}
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{"LAG", "RAFT", "3.0MiB 0.2s", "Outdated", "no quorum"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("protocol A in cluster mode: no %q in\n%s", want, out.String())
		}
	}
	// A leader handing its office on: an election, not a lost quorum.
	st.Cluster.Electing = true
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	if first, _, _ := strings.Cut(out.String(), "\n"); !strings.Contains(first, "raft leader none, electing,") || strings.Contains(first, "no quorum") {
		t.Errorf("cluster line during an election: %q, want it to say electing", first)
	}
}

// TestStatusCheckVerdict pins status --check's exit codes: 0 with nothing
// to warn about, 4 when the worst is a warning (a StandAlone replica; a
// resync under way, while the volume runs on one good copy), 5 when one
// is critical (a split brain), and the warnings listed with their fixes.
func TestStatusCheckVerdict(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bend     func(v *transport.VolumeStatus)
		code     int
		listed   []string // in the printed warnings
		summary  string
		unlisted []string
	}{
		{"healthy", func(*transport.VolumeStatus) {}, 0, []string{"warnings: none"}, "", nil},
		{"a resync under way: one good copy until it ends", func(v *transport.VolumeStatus) {
			v.Replicas[1].Disk, v.Replicas[1].Replication = "Inconsistent", "SyncTarget"
		}, exitWarning, []string{"warnings: 1 warning", "WARNING beta's copy of vol0 is Inconsistent until its resync ends; until then vol0 runs on one good copy, alpha's."},
			"1 warning", []string{"fix:"}},
		{"a StandAlone replica", func(v *transport.VolumeStatus) {
			v.Replicas[1].Replication = "StandAlone"
		}, exitWarning, []string{"warnings: 1 warning", "WARNING beta is StandAlone on vol0", "fix: replctl connect vol0 --node beta"}, "1 warning", nil},
		{"a split brain", func(v *transport.VolumeStatus) {
			for i := range v.Replicas {
				v.Replicas[i].Replication, v.Replicas[i].ReasonCode = "StandAlone", "split-brain"
			}
			v.Replicas[0].Paths = []transport.PathStatus{{Path: "p0", State: "FAIL"}}
		}, exitCritical, []string{"warnings: 1 critical, 1 warning", "CRITICAL Split brain on vol0", "fix: replctl connect vol0 --discard-my-data --node beta",
			"risk: beta loses what was written to it since the split", "fix: replctl path restore vol0 p0 --node alpha"}, "1 critical, 1 warning", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sampleStatus()
			tc.bend(&st.Volumes[0])
			ws := warningsOf(st, "")
			err := verdict(ws)
			code := 0
			var cf *checkFailed
			if errors.As(err, &cf) {
				code = cf.ExitCode()
			}
			if code != tc.code || (err != nil) != (tc.code != 0) {
				t.Fatalf("verdict %v (code %d), want code %d", err, code, tc.code)
			}
			if err != nil && err.Error() != "status --check: "+tc.summary {
				t.Errorf("verdict says %q, want the summary %q", err, tc.summary)
			}
			var out bytes.Buffer
			printWarnings(&out, ws, palette{})
			for _, want := range tc.listed {
				if !strings.Contains(out.String(), want) {
					t.Errorf("no %q in\n%s", want, out.String())
				}
			}
			for _, bad := range tc.unlisted {
				if strings.Contains(out.String(), bad) {
					t.Errorf("%q in\n%s", bad, out.String())
				}
			}
		})
	}
}

// TestStatusWarningsAreThePages: the status's own warnings (from the
// node) are the ones used; a node too old to send them gets the page's
// rule; a volume's status keeps that volume's and the cluster's.
func TestStatusWarningsAreThePages(t *testing.T) {
	st := sampleStatus()
	st.Volumes[0].Replicas[1].Replication = "StandAlone"
	if ws := warningsOf(st, ""); len(ws) != 1 || ws[0].ID != "warning-standalone-vol0-beta" {
		t.Fatalf("no warnings from the node: %+v, want the page's", ws)
	}
	st.Warnings = []transport.Warning{
		{ID: "warning-node-down-beta", Kind: transport.WarningNodeDown, Severity: transport.SeverityWarning, Node: "beta"},
		{ID: "warning-x-vol9", Severity: transport.SeverityCritical, Volume: "vol9"},
	}
	if ws := warningsOf(st, "vol0"); len(ws) != 1 || ws[0].ID != "warning-node-down-beta" {
		t.Fatalf("vol0's warnings: %+v, want the node's own, without vol9's", ws)
	}
}

// TestStatusShowsTheFailoverAndOneCopy: the volume's line says it runs on
// one copy and names the command when its primary is disconnected by the
// operator, and a line under it says when and why it last failed over.
func TestStatusShowsTheFailoverAndOneCopy(t *testing.T) {
	st := sampleStatus()
	v := &st.Volumes[0]
	now := time.Date(2026, 3, 14, 15, 10, 0, 0, time.UTC)
	v.Primary, v.Epoch = "beta", 4
	v.LastFailover = &transport.Failover{From: "alpha", To: "beta", Epoch: 4, At: now.Add(-90 * time.Second), Reason: "forced by the operator (replctl primary --force)", Forced: true}
	v.Replicas[0].Role, v.Replicas[0].Disk, v.Replicas[0].Replication = "Secondary", "Consistent", "Connecting"
	v.Replicas[1].Role, v.Replicas[1].Replication = "Primary", "StandAlone"
	v.Replicas[1].Reason, v.Replicas[1].ReasonCode = "disconnected by operator", "disconnected-by-operator"
	var out bytes.Buffer
	printStatus(&out, st, palette{}, now)
	lines := strings.Split(out.String(), "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "vol0 ") })
	if i < 0 || i+1 >= len(lines) {
		t.Fatalf("no volume line in\n%s", out.String())
	}
	if want := "! runs on one copy: beta is disconnected by the operator (replctl connect vol0 --node beta)"; !strings.Contains(lines[i], want) {
		t.Errorf("volume line %q lacks %q", lines[i], want)
	}
	if want := "  failed over alpha → beta 1m30s ago (2026-03-14 15:08:30 UTC, epoch 4): forced by the operator (replctl primary --force)"; lines[i+1] != want {
		t.Errorf("line under the volume's:\n%q\nwant\n%q", lines[i+1], want)
	}
}

// TestStatusWarnsOfSettingsThatDiffer: a setting that must agree on every
// node and does not is named on the volume's line with each node's value.
func TestStatusWarnsOfSettingsThatDiffer(t *testing.T) {
	st := sampleStatus()
	st.Volumes[0].SettingMismatches = []transport.SettingMismatch{{Setting: "protocol", Values: map[string]string{"beta": "B", "alpha": "C"}, Primary: "C"}}
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	if !strings.Contains(out.String(), "! protocol differs: alpha C, beta B") {
		t.Fatalf("status does not name the protocol that differs:\n%s", out.String())
	}
}

// TestStatusNamesWhyANodeIsUnreachable: an unreachable node shows the
// error of asking it, unless gossip reports it gone and it was not asked.
func TestStatusNamesWhyANodeIsUnreachable(t *testing.T) {
	st := sampleStatus()
	st.Cluster.Voters = []string{"alpha", "beta", "witness"}
	st.Nodes = append(st.Nodes, transport.NodeInfo{Name: "witness", Role: "witness"})
	st.Nodes[1].Alive, st.Nodes[1].Error = false, "connection refused"
	st.Nodes[2].Alive, st.Nodes[2].Membership, st.Nodes[2].Error = false, "dead", "not asked while gossip reports witness dead"
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{"unreachable (connection refused)", "unreachable, gossip: dead"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "not asked") {
		t.Errorf("status repeats what gossip: dead says:\n%s", out.String())
	}
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\033' {
			for i < len(s) && s[i] != 'm' {
				i++
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func TestParseSince(t *testing.T) {
	now := time.Date(2025, 3, 4, 0, 10, 0, 0, time.Local)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"10m", now.Add(-10 * time.Minute)},
		{"2h", now.Add(-2 * time.Hour)},
		{"2025-03-03 22:00", time.Date(2025, 3, 3, 22, 0, 0, 0, time.Local)},
		{"2025-03-03 22:00:05", time.Date(2025, 3, 3, 22, 0, 5, 0, time.Local)},
		{"00:05", time.Date(2025, 3, 4, 0, 5, 0, 0, time.Local)},
		{"23:50", time.Date(2025, 3, 3, 23, 50, 0, 0, time.Local)}, // yesterday's
		{"2025-03-03T21:00:00Z", time.Date(2025, 3, 3, 21, 0, 0, 0, time.UTC)},
	} {
		got, err := parseSince(tc.in, now)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"yesterday", "-5m", "25:00"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q): no error", bad)
		}
	}
}

func TestDialable(t *testing.T) {
	for _, tc := range []struct{ listen, via, want string }{
		{"10.0.0.2:7800", "10.0.0.1:7800", "10.0.0.2:7800"},
		{"0.0.0.0:7803", "10.0.0.1:7800", "10.0.0.1:7803"},
		{"[::]:7803", "host1:7800", "host1:7803"},
		{":7803", "10.0.0.1:7800", "10.0.0.1:7803"},
		{"node2.example:7803", "10.0.0.1:7800", "node2.example:7803"},
	} {
		if got := dialable(tc.listen, tc.via); got != tc.want {
			t.Errorf("dialable(%q, %q) = %q, want %q", tc.listen, tc.via, got, tc.want)
		}
	}
}

// TestEventsMergeByTime: events of several nodes come out in time order
// once they waited out the merge window, whatever order they arrived in.
func TestEventsMergeByTime(t *testing.T) {
	var out, errOut bytes.Buffer
	f := &eventFollower{out: &out, errOut: &errOut, asJSON: true}
	base := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var h eventHeap
	arrived := time.Now()
	for _, e := range []*transport.Event{
		{Node: "beta", Seq: 7, Time: base.Add(2 * time.Second), Kind: "connected"},
		{Node: "alpha", Seq: 3, Time: base.Add(time.Second), Kind: "disconnected"},
		{Node: "beta", Seq: 6, Time: base, Kind: "started"},
	} {
		heap.Push(&h, pendingEvent{e: e, arrived: arrived})
	}
	f.drain(make(chan *transport.Event), &h)
	var kinds []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		for _, k := range []string{"started", "disconnected", "connected"} {
			if strings.Contains(l, `"kind":"`+k+`"`) {
				kinds = append(kinds, k)
			}
		}
		for _, key := range []string{`"time":`, `"node":`, `"seq":`, `"volume":`, `"kind":`, `"peer":`, `"old":`, `"new":`, `"reason":`, `"message":`} {
			if !strings.Contains(l, key) {
				t.Errorf("JSON line %s lacks %s", l, key)
			}
		}
	}
	if strings.Join(kinds, " ") != "started disconnected connected" {
		t.Fatalf("merged order %v, want started disconnected connected:\n%s", kinds, out.String())
	}
}

// TestDisconnectSaysWhatIsLeft: after a disconnect, replctl says which
// copies still hold every write, who misses them and how to reconnect;
// with three replicas a secondary's disconnect leaves two copies.
func TestDisconnectSaysWhatIsLeft(t *testing.T) {
	st := sampleStatus()
	st.Volumes[0].Replicas[1].Replication = "StandAlone"
	got := strings.Join(disconnectedWords(st, "vol0", "alpha", true), "\n")
	for _, want := range []string{"(no --node given: alpha is the node at --addr)", "vol0 runs on one copy, alpha's", "beta gets none of its writes",
		"reconnect: replctl connect vol0 --node alpha"} {
		if !strings.Contains(got, want) {
			t.Errorf("the primary disconnected:\n%s\nwant %q", got, want)
		}
	}
	three := sampleStatus()
	three.Volumes[0].Replicas = append(three.Volumes[0].Replicas,
		transport.ReplicaStatus{Node: "gamma", Role: "Secondary", Disk: "UpToDate", Replication: "Connected", Reachable: true})
	three.Volumes[0].Replicas[1].Replication = "StandAlone"
	got = strings.Join(disconnectedWords(three, "vol0", "beta", false), "\n")
	for _, want := range []string{"beta no longer replicates vol0", "vol0 runs on 2 copies, alpha's and gamma's.", "reconnect: replctl connect vol0 --node beta"} {
		if !strings.Contains(got, want) {
			t.Errorf("a secondary of three disconnected:\n%s\nwant %q", got, want)
		}
	}
	if strings.Contains(got, "--addr") {
		t.Errorf("with --node given it says the node at --addr:\n%s", got)
	}
}

// TestStatusWordsOfAReplicaOutsideItsNodesFile: a node that is alive and
// does not have the volume in its file shows as such, not as
// unreachable, and its last connection reads in words, not rule names.
func TestStatusWordsOfAReplicaOutsideItsNodesFile(t *testing.T) {
	st := sampleStatus()
	v := &st.Volumes[0]
	v.Primary, v.NBDURI = "beta", ""
	v.Replicas[0].Role, v.Replicas[0].Disk, v.Replicas[0].Replication = "Secondary", "Inconsistent", "Connecting"
	b := &v.Replicas[1]
	b.Role, b.Disk, b.Replication, b.ReasonCode, b.Reason = "Unknown", "DUnknown", "Unknown", transport.ReasonNoSuchVolume, "beta is alive, but vol0 is not in its cluster file"
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{"alive, does not have vol0 in its cluster file", "! not served: its primary beta does not have it in its cluster file"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	for _, wrong := range []string{"unreachable", "DUnknown", "no primary serving IO"} {
		if strings.Contains(out.String(), wrong) {
			t.Errorf("status says %q:\n%s", wrong, out.String())
		}
	}

	st = sampleStatus()
	st.Volumes[0].Replicas[1].SyncRule, st.Volumes[0].Replicas[1].SyncDecision = "just-created-peer", "source-set-bitmap"
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	if !strings.Contains(out.String(), "last connect: resynced all of it, as its copy was new") || strings.Contains(out.String(), "rule") {
		t.Errorf("the note of beta's last connect is not in words:\n%s", out.String())
	}
}

// TestStatusShowsTheScrubAndUnrecoverableBlocks: under the volume's table
// a running scrub shows its percent and ETA, a paused one how to resume
// it (the build of checksums just turned on as "checksums: building"), and blocks no replica holds good are named on the volume's line and
// under the table with what to do; an idle scrub with nothing lost adds
// nothing.
func TestStatusShowsTheScrubAndUnrecoverableBlocks(t *testing.T) {
	st := sampleStatus()
	v := &st.Volumes[0]
	for i := range v.Replicas {
		v.Replicas[i].Integrity = &transport.ReplicaIntegrity{Checksums: true, Scrub: transport.ScrubSummary{State: "idle"}}
	}
	var out bytes.Buffer
	printStatus(&out, st, palette{}, time.Now())
	if strings.Contains(out.String(), "scrub") || strings.Contains(out.String(), "unrecoverable") {
		t.Fatalf("an idle scrub with nothing lost shows:\n%s", out.String())
	}
	v.Replicas[0].Integrity.Scrub = transport.ScrubSummary{State: "running", Percent: 42, ETASeconds: 90}
	v.Replicas[1].Integrity.Scrub = transport.ScrubSummary{State: "paused", Percent: 10}
	v.Replicas[1].Integrity.UnrecoverableBlocks = 2
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{
		"  scrub on alpha [########............]  42.0% ETA 1m30s\n",
		"  scrub on beta paused at 10.0% (replctl scrub vol0 --node beta --resume); beta: 2 blocks unrecoverable (bad here, no good copy on any replica; reads of them fail): replctl events --node beta names their ranges (block-unrecoverable); write them again\n",
		"! beta 2 blocks unrecoverable",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	printStatus(&out, st, palette{on: true}, time.Now())
	if !strings.Contains(out.String(), "\033[31mscrub on beta paused") {
		t.Errorf("with colours, unrecoverable blocks are not red:\n%q", out.String())
	}
	// The build of checksums just turned on shows as such.
	v.Replicas[0].Integrity.Scrub = transport.ScrubSummary{State: "running", Percent: 37, ETASeconds: 90, Build: true}
	v.Replicas[1].Integrity.Scrub = transport.ScrubSummary{State: "paused", Percent: 5, Build: true}
	v.Replicas[1].Integrity.UnrecoverableBlocks = 0
	out.Reset()
	printStatus(&out, st, palette{}, time.Now())
	for _, want := range []string{
		"  checksums on alpha: building [#######.............] 37% ETA 1m30s (blocks past it are not verified yet)\n",
		"  checksums on beta: building, paused at 5.0% (replctl scrub vol0 --node beta --resume)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}
