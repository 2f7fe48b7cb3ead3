package web

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/replvol/replvol/transport"
)

// configWarnings warns of each volume the nodes' cluster files disagree
// on (it is in some files and not in others: the nodes whose file lacks
// it do not replicate it), and of each node that does not run a volume as
// its file says (it keeps a primary with NBD clients that its file
// dropped, or could not add one), with what ends it.
func configWarnings(st *transport.ClusterStatus) []Warning {
	var out []Warning
	for _, d := range st.ConfigDiffers {
		if len(d.In) > 0 && len(d.NotIn) > 0 {
			runs, doesNot := "runs", "does not"
			if len(d.In) > 1 {
				runs = "run"
			}
			if len(d.NotIn) > 1 {
				doesNot = "do not"
			}
			detail := fmt.Sprintf("%s %s it and %s %s: a primary's stream to a node whose file lacks it is refused (no-such-volume) and retried, and what that node misses is marked for it.",
				strings.Join(d.In, " and "), runs, strings.Join(d.NotIn, " and "), doesNot)
			if v, ok := st.Volume(d.Volume); ok && slices.Contains(d.NotIn, v.Primary) {
				detail = fmt.Sprintf("Its primary %s is alive but its file lacks it, so no IO is served until %s runs it; %s", v.Primary, v.Primary, detail)
			}
			out = append(out, Warning{
				ID: elementID("warning", transport.WarningConfigDiffers, d.Volume), Kind: transport.WarningConfigDiffers,
				Severity: severityWarning, Volume: d.Volume,
				Text:    fmt.Sprintf("Volume %s is in the cluster file of %s but not in %s.", d.Volume, nodeList(d.In), filesOf(d.NotIn)),
				Detail:  detail,
				Command: "systemctl reload replnode",
				Where:   fmt.Sprintf("on every node whose file changed, once the files agree: to add it, on %s; to remove it, on %s", strings.Join(d.NotIn, " and "), strings.Join(d.In, " and ")),
			})
		}
		for _, node := range slices.Sorted(maps.Keys(d.NotApplied)) {
			out = append(out, Warning{
				ID: elementID("warning", transport.WarningConfigNotApplied, d.Volume, node), Kind: transport.WarningConfigNotApplied,
				Severity: severityWarning, Volume: d.Volume, Node: node,
				Text:    fmt.Sprintf("Node %s does not run volume %s as its cluster file says.", node, d.Volume),
				Detail:  d.NotApplied[node],
				Command: "systemctl reload replnode", Where: "on " + node + ", once that is fixed",
			})
		}
	}
	return out
}

// filesDisagree names the volumes the reachable nodes' files disagree on.
func filesDisagree(st *transport.ClusterStatus) map[string]bool {
	out := map[string]bool{}
	for _, d := range st.ConfigDiffers {
		if len(d.In) > 0 && len(d.NotIn) > 0 {
			out[d.Volume] = true
		}
	}
	return out
}

// reloadWarnings warns of each node whose last reload failed: its file
// does not load, so the change the operator made is not in force (and a
// restart of that node would fail), with the file's first problems.
func reloadWarnings(st *transport.ClusterStatus) []Warning {
	var out []Warning
	for _, n := range st.Nodes {
		fr := n.FailedReload
		if fr == nil {
			continue
		}
		detail := strings.Join(fr.Problems, "\n")
		if fr.More > 0 {
			detail += fmt.Sprintf("\n(and %d more: see the node's log)", fr.More)
		}
		out = append(out, Warning{
			ID: elementID("warning", transport.WarningReloadFailed, n.Name), Kind: transport.WarningReloadFailed,
			Severity: severityWarning, Node: n.Name,
			Text: fmt.Sprintf("The last reload of %s failed at %s: its cluster file %s does not load, so %s runs on with the config it had (and would not start with this file).",
				n.Name, fr.At.UTC().Format("15:04:05 UTC"), fr.File, n.Name),
			Detail:  detail,
			Command: "systemctl reload replnode",
			Where:   fmt.Sprintf("on %s, once %s is fixed", n.Name, fr.File),
		})
	}
	return out
}

// nodeList lists nodes for people: "alpha", "alpha and beta", "alpha, beta and gamma".
func nodeList(nodes []string) string {
	if len(nodes) < 2 {
		return strings.Join(nodes, "")
	}
	return strings.Join(nodes[:len(nodes)-1], ", ") + " and " + nodes[len(nodes)-1]
}

// filesOf is "beta's", or "the files of beta and gamma".
func filesOf(nodes []string) string {
	if len(nodes) == 1 {
		return nodes[0] + "'s"
	}
	return "the files of " + nodeList(nodes)
}
