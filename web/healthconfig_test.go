package web

import (
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestPageWarnsWhileTheNodesFilesDisagree: a volume in some nodes'
// cluster files and not in others' is a config-differs warning naming
// both sides and the reload that ends it; a node that does not run a
// volume as its file says (a removal it refused, an addition that failed)
// is a config-not-applied warning on that node with its reason.
func TestPageWarnsWhileTheNodesFilesDisagree(t *testing.T) {
	st := healthyCluster()
	st.ConfigDiffers = []transport.ConfigDifference{
		{Volume: "vol1", In: []string{"alpha"}, NotIn: []string{"beta"}},
		{Volume: "vol2", NotApplied: map[string]string{"alpha": "keeps running it: the primary has NBD clients: 127.0.0.1:5000"}},
	}
	p := render(t, pageInput{Status: st})
	for _, tc := range []struct{ id, text, where string }{
		{"warning-config-differs-vol1", "Volume vol1 is in the cluster file of alpha but not in beta's.", "to add it, on beta; to remove it, on alpha"},
		{"warning-config-not-applied-vol2-alpha", "Node alpha does not run volume vol2 as its cluster file says.", "on alpha"},
	} {
		if got := p.text(tc.id + "-text"); !strings.Contains(got, tc.text) {
			t.Errorf("%s: text %q, want it to say %q", tc.id, got, tc.text)
		}
		if got := p.text(tc.id + "-command"); got != "systemctl reload replnode" {
			t.Errorf("%s: command %q, want the reload", tc.id, got)
		}
		if !strings.Contains(p.text(tc.id), tc.where) {
			t.Errorf("%s: %q does not say where: %q", tc.id, p.text(tc.id), tc.where)
		}
	}
	if !strings.Contains(p.text("warning-config-not-applied-vol2-alpha"), "127.0.0.1:5000") {
		t.Errorf("the refused removal does not name the client: %q", p.text("warning-config-not-applied-vol2-alpha"))
	}
	for _, w := range Warnings(st) {
		if w.Volume == "vol1" && w.Kind != transport.WarningConfigDiffers || w.Volume == "vol2" && w.Kind != transport.WarningConfigNotApplied {
			t.Errorf("warning %s has kind %q", w.ID, w.Kind)
		}
	}
}

func TestNodeLists(t *testing.T) {
	for _, tc := range []struct {
		nodes         []string
		list, filesOf string
	}{
		{[]string{"beta"}, "beta", "beta's"},
		{[]string{"beta", "gamma"}, "beta and gamma", "the files of beta and gamma"},
		{[]string{"alpha", "beta", "gamma"}, "alpha, beta and gamma", "the files of alpha, beta and gamma"},
	} {
		if got := nodeList(tc.nodes); got != tc.list {
			t.Errorf("nodeList(%q) = %q, want %q", tc.nodes, got, tc.list)
		}
		if got := filesOf(tc.nodes); got != tc.filesOf {
			t.Errorf("filesOf(%q) = %q, want %q", tc.nodes, got, tc.filesOf)
		}
	}
}

// TestAHalfAddedVolumeIsConfigDiffersAlone: vol1 was added to alpha's
// file only and alpha reloaded; its primary, beta, is alive and serves
// vol0 but its file lacks vol1. beta's replica is shown as alive without
// vol1 in its file (not unreachable), and the one warning is
// config-differs, naming the reload on beta and the witness: no
// no-primary, no "connect alpha" (neither would help).
func TestAHalfAddedVolumeIsConfigDiffersAlone(t *testing.T) {
	st := healthyCluster()
	st.Volumes = append(st.Volumes, transport.VolumeStatus{
		Name: "vol1", Size: 1 << 30, Protocol: "C", Primary: "beta", Epoch: 1,
		Replicas: []transport.ReplicaStatus{
			{Node: "alpha", Role: "Secondary", Disk: "Inconsistent", Replication: "Connecting", Reachable: true},
			{Node: "beta", Role: "Unknown", Disk: "DUnknown", Replication: "Unknown", Reachable: true,
				ReasonCode: transport.ReasonNoSuchVolume, Reason: "beta is alive, but vol1 is not in its cluster file: it runs no replica of vol1 until its file has it and it is reloaded"},
		},
	})
	st.ConfigDiffers = []transport.ConfigDifference{{Volume: "vol1", In: []string{"alpha"}, NotIn: []string{"beta", "witness"}}}
	ws := Warnings(st)
	if len(ws) != 1 || ws[0].Kind != transport.WarningConfigDiffers || ws[0].Volume != "vol1" {
		t.Fatalf("warnings %+v, want config-differs of vol1 alone", ws)
	}
	w := ws[0]
	if w.Severity != severityWarning || w.Command != "systemctl reload replnode" || !strings.Contains(w.Where, "to add it, on beta and witness") ||
		!strings.Contains(w.Detail, "Its primary beta is alive but its file lacks it, so no IO is served until beta runs it") {
		t.Errorf("config-differs %+v: want the reload on beta and witness, and that its primary beta lacks it", w)
	}
	p := render(t, pageInput{Status: st})
	if got := p.text("replica-vol1-beta-reason"); !strings.Contains(got, "beta is alive, but vol1 is not in its cluster file") || strings.Contains(got, "unreachable") {
		t.Errorf("beta's row of vol1 says %q: want alive, vol1 not in its file", got)
	}
	if cls := p.attr("replica-vol1-beta", "class"); strings.Contains(cls, "unreachable") {
		t.Errorf("beta's row of vol1 is marked %q", cls)
	}
}

// TestAFailedReloadIsAWarning: beta's last reload found its file broken.
// The warning names the node, the file and its first problems (file:line,
// as the loader words them), and the reload that clears it; beta's row
// in the node table says so. It is about the node, not its replicas: vol0
// is not marked as a problem volume.
func TestAFailedReloadIsAWarning(t *testing.T) {
	st := healthyCluster()
	nodeInfo(st, "beta").FailedReload = &transport.FailedReload{
		File: "/etc/replvol/cluster.yaml", At: testNow,
		Problems: []string{`/etc/replvol/cluster.yaml:12: volumes[0].protocl: unknown key; did you mean "protocol"?`},
		More:     2,
	}
	ws := Warnings(st)
	if len(ws) != 1 {
		t.Fatalf("warnings %+v, want one", ws)
	}
	w := ws[0]
	if w.Kind != transport.WarningReloadFailed || w.Severity != severityWarning || w.Node != "beta" || w.Volume != "" ||
		!strings.Contains(w.Text, "The last reload of beta failed at 15:09:26 UTC: its cluster file /etc/replvol/cluster.yaml does not load, so beta runs on with the config it had") ||
		!strings.Contains(w.Detail, "/etc/replvol/cluster.yaml:12: volumes[0].protocl: unknown key") || !strings.Contains(w.Detail, "and 2 more") ||
		w.Command != "systemctl reload replnode" || w.Where != "on beta, once /etc/replvol/cluster.yaml is fixed" {
		t.Errorf("warning %+v", w)
	}
	p := render(t, pageInput{Status: st})
	if got := p.text("node-beta-reload"); got != "last reload failed at 15:09:26 UTC: /etc/replvol/cluster.yaml does not load" {
		t.Errorf("beta's node row says %q", got)
	}
	if p.has("vol-vol0-severity") || strings.Contains(p.attr("replica-vol0-beta", "class"), "problem") {
		t.Errorf("a failed reload of beta marks vol0 as a problem volume")
	}
	if got := p.text("warning-reload-failed-beta-text"); !strings.Contains(got, "The last reload of beta failed") {
		t.Errorf("Needs attention says %q", got)
	}
}
