package web

import (
	"fmt"
	"slices"
	"strings"

	"github.com/replvol/replvol/transport"
)

// The states the page reads, in DRBD's words (the replication package's
// names; web imports only transport's status types).
const (
	rolePrimary = "Primary"

	diskUpToDate     = "UpToDate"
	diskOutdated     = "Outdated"
	diskInconsistent = "Inconsistent"
	diskDiskless     = "Diskless"
	diskFailed       = "Failed"

	replStandAlone  = "StandAlone"
	replConnecting  = "Connecting"
	replConnected   = "Connected"
	replSyncSource  = "SyncSource"
	replSyncTarget  = "SyncTarget"
	replPausedSyncS = "PausedSyncS"
	replPausedSyncT = "PausedSyncT"
	replVerifyS     = "VerifyS"
	replVerifyT     = "VerifyT"
	replBehind      = "Behind"

	pathFailed = "FAIL"

	// reason codes (node.Cause)
	causeWaitingForPeer = "waiting-for-peer"
	causeSplitBrain     = "split-brain"
	causeDetached       = "detached"
	causeAdminDown      = "disconnected-by-operator"
	causeDiskFailed     = "disk-failed"
	causeStateWrite     = "state-write-failed"
)

// Severities of a warning, most urgent first.
const (
	severityCritical = "critical" // data at risk or IO stopped
	severityWarning  = "warning"  // redundancy lost or degraded
	severityInfo     = "info"     // under way, or fixes itself
)

// Warning is one thing an operator should act on, and how.
type Warning struct {
	// ID is the element id: warning-KIND-VOLUME-NODE...
	ID       string
	Severity string
	// Text says what is wrong; Detail is the node's own reason.
	Text   string
	Detail string
	// Command fixes it ("" when the cluster fixes it by itself); Where
	// says where to run it when that is not replctl's --addr; Risk is
	// what it costs.
	Command string
	Where   string
	Risk    string
}

// healthWarnings is the rule that turns a status into the warnings the
// page shows, most urgent first. It is a pure function of the status.
func healthWarnings(st *transport.ClusterStatus) []Warning {
	var out []Warning
	add := func(w Warning) { out = append(out, w) }
	down := map[string]bool{}
	for _, n := range st.Nodes {
		if n.Alive && n.Membership != "dead" {
			continue
		}
		down[n.Name] = true
		detail := n.Error
		if n.Membership == "dead" {
			detail = joinWords("gossip says dead", detail)
		}
		add(Warning{
			ID: elementID("warning", "node-down", n.Name), Severity: severityWarning,
			Text:    fmt.Sprintf("Node %s is unreachable: its replicas are not protected and it cannot vote.", n.Name),
			Detail:  detail,
			Command: "systemctl start replnode", Where: "on " + n.Name,
		})
	}
	if c := st.Cluster; len(c.Voters) > 0 && !c.Quorum {
		var gone []string
		for _, v := range c.Voters {
			if down[v] {
				gone = append(gone, v)
			}
		}
		w := Warning{
			ID: elementID("warning", "no-quorum"), Severity: severityCritical,
			Text:   fmt.Sprintf("No raft quorum (%d voters: %s): no failover, and primaries serve only while their lease lasts.", len(c.Voters), strings.Join(c.Voters, ", ")),
			Detail: c.Reason,
		}
		if len(gone) > 0 {
			w.Command, w.Where = "systemctl start replnode", "on "+strings.Join(gone, " and ")
			w.Detail = joinWords(fmt.Sprintf("a majority needs %d of them up", len(c.Voters)/2+1), c.Reason)
		}
		add(w)
	}
	for i := range st.Volumes {
		out = append(out, volumeWarnings(&st.Volumes[i], down)...)
	}
	slices.SortStableFunc(out, func(a, b Warning) int { return severityRank(a.Severity) - severityRank(b.Severity) })
	return out
}

func severityRank(s string) int {
	switch s {
	case severityCritical:
		return 0
	case severityWarning:
		return 1
	}
	return 2
}

// volumeWarnings are one volume's warnings; down names the nodes already
// warned about as unreachable (their replicas say nothing more).
func volumeWarnings(v *transport.VolumeStatus, down map[string]bool) []Warning {
	var out []Warning
	add := func(w Warning) { out = append(out, w) }
	vol := v.Name
	primary := v.Replica(v.Primary)

	// A split brain is one warning for the volume: the operator picks
	// the node whose changes go, suggested as the one that is not primary.
	var split []string
	for _, r := range v.Replicas {
		if r.ReasonCode == causeSplitBrain {
			split = append(split, r.Node)
		}
	}
	if len(split) > 0 {
		victim := split[0]
		for _, r := range v.Replicas {
			if r.Node != v.Primary && r.ReasonCode == causeSplitBrain {
				victim = r.Node
				break
			}
		}
		add(Warning{
			ID: elementID("warning", "split-brain", vol), Severity: severityCritical,
			Text:    fmt.Sprintf("Split brain on %s: both sides changed the data since they last met; neither syncs until one gives up its changes.", vol),
			Detail:  v.Replica(split[0]).Reason,
			Command: fmt.Sprintf("replctl connect %s --discard-my-data --node %s", vol, victim),
			Risk:    fmt.Sprintf("%s loses what was written to it since the split; without --yes the command only prints how much.", victim),
		})
	}

	primaryUp := false
	switch {
	case primary == nil || v.Primary == "":
		add(noPrimaryWarning(v, "has no primary"))
	case !primary.Reachable || primary.Role != rolePrimary:
		if !down[v.Primary] {
			add(noPrimaryWarning(v, fmt.Sprintf("has no serving primary (%s does not answer as primary)", v.Primary)))
		} else {
			add(noPrimaryWarning(v, fmt.Sprintf("lost its primary %s", v.Primary)))
		}
	case primary.ReasonCode == causeWaitingForPeer:
		primaryUp = true
		add(Warning{
			ID: elementID("warning", "waiting-for-peer", vol, primary.Node), Severity: severityCritical,
			Text:    fmt.Sprintf("%s is primary of %s but serves no IO: after its restart it waits for a peer to compare data with.", primary.Node, vol),
			Detail:  primary.Reason,
			Command: fmt.Sprintf("replctl primary %s --node %s --force --yes", vol, primary.Node),
			Risk:    "Start the peer instead if you can. Forcing makes this node's data the truth: writes a peer took after this node last saw it are lost, and the peers get resynced from it.",
		})
	default:
		primaryUp = true
	}

	for i := range v.Replicas {
		r := &v.Replicas[i]
		if down[r.Node] || !r.Reachable {
			continue
		}
		out = append(out, replicaWarnings(v, r, primaryUp)...)
	}
	out = append(out, settingsWarnings(v)...)
	return out
}

// noPrimaryWarning suggests forcing the best candidate: an UpToDate,
// reachable replica (raft's UpToDate first).
func noPrimaryWarning(v *transport.VolumeStatus, what string) Warning {
	w := Warning{
		ID: elementID("warning", "no-primary", v.Name), Severity: severityCritical,
		Text: fmt.Sprintf("%s %s: no IO is served.", v.Name, what),
	}
	var best *transport.ReplicaStatus
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if !r.Reachable || r.Disk != diskUpToDate {
			continue
		}
		if best == nil || (r.Raft == diskUpToDate && best.Raft != diskUpToDate) {
			best = r
		}
	}
	if best == nil {
		w.Detail = "No reachable replica is UpToDate: bring the old primary back."
		return w
	}
	w.Command = fmt.Sprintf("replctl primary %s --node %s --force --yes", v.Name, best.Node)
	w.Risk = fmt.Sprintf("With failover on, the raft leader promotes %s by itself; force only if it does not. Writes the lost primary acknowledged after %s last heard from it are gone.", best.Node, best.Node)
	return w
}

// replicaWarnings are r's warnings; primaryUp says the volume's primary
// answers (without it, a secondary's lost link is no news).
func replicaWarnings(v *transport.VolumeStatus, r *transport.ReplicaStatus, primaryUp bool) []Warning {
	var out []Warning
	vol, n := v.Name, r.Node
	add := func(kind, severity, text, command, risk string) {
		out = append(out, Warning{ID: elementID("warning", kind, vol, n), Severity: severity,
			Text: text, Detail: r.Reason, Command: command, Risk: risk})
	}
	connect := fmt.Sprintf("replctl connect %s --node %s", vol, n)
	isPrimary := r.Role == rolePrimary
	// The primary's replication is the worst of its peers': the peers'
	// rows carry the link warnings, unless the operator disconnected the
	// primary itself.
	linkOwner := !isPrimary || r.ReasonCode == causeAdminDown

	switch {
	case r.ReasonCode == causeSplitBrain:
		// one warning for the volume above
	case r.Replication == replStandAlone && linkOwner:
		add("standalone", severityWarning,
			fmt.Sprintf("%s is StandAlone on %s: it does not replicate and will not retry by itself.", n, vol),
			connect, "")
	case r.Replication == replConnecting && !isPrimary && primaryUp:
		add("connecting", severityWarning,
			fmt.Sprintf("%s is not connected to the primary of %s (Connecting): it retries by itself; the primary tracks what changes.", n, vol),
			"", "")
	case r.Replication == replPausedSyncS || r.Replication == replPausedSyncT:
		add("resync-paused", severityWarning,
			fmt.Sprintf("The resync of %s to %s is paused: %s stays Inconsistent.", vol, n, n),
			fmt.Sprintf("replctl resync %s --resume", vol), "")
	case r.Replication == replBehind:
		add("behind", severityWarning,
			fmt.Sprintf("%s is Behind on %s: the primary pulled ahead under congestion; %s (%s) of acknowledged writes are only on the primary until the catch-up resync.",
				n, vol, humanBytes(r.LagBytes), humanSeconds(r.LagSeconds)),
			fmt.Sprintf("replctl adjust %s --on-congestion block", vol),
			"The primary then waits for the link when its buffer fills: writes slow down instead of leaving the peer behind.")
	}

	switch {
	case r.ReasonCode == causeDetached || (r.Disk == diskDiskless && !isFailed(r)):
		cmd, risk := "", ""
		if p := firstFailedPath(r); p != "" {
			cmd = fmt.Sprintf("replctl path restore %s %s --node %s", vol, p, n)
		} else {
			risk = "Replace the disk, then: replctl create-md " + vol + " --config FILE --node " + n + " --force --yes (a full resync follows)."
		}
		add("detached", severityCritical,
			fmt.Sprintf("%s's disk of %s is detached (Diskless): its IO goes to the peer; one more failure stops %s.", n, vol, vol),
			cmd, risk)
	case isFailed(r):
		add("disk-failed", severityCritical,
			fmt.Sprintf("%s's disk of %s failed (%s): it holds no usable copy.", n, vol, r.Disk),
			"", "")
	case r.Disk == diskOutdated && !isPrimary:
		cmd := ""
		if r.Replication == replStandAlone {
			cmd = connect
		}
		add("outdated", severityWarning,
			fmt.Sprintf("%s's copy of %s is Outdated: it misses writes and cannot be promoted; it catches up by resync once connected.", n, vol),
			cmd, "")
	case r.Disk == diskInconsistent && !isPrimary:
		if syncing(r) {
			add("inconsistent", severityInfo,
				fmt.Sprintf("%s's copy of %s is Inconsistent until its resync ends%s.", n, vol, etaWords(r)),
				"", "")
			break
		}
		cmd := connect
		if r.Replication == replConnected {
			cmd = fmt.Sprintf("replctl resync %s", vol)
		}
		add("inconsistent", severityWarning,
			fmt.Sprintf("%s's copy of %s is Inconsistent and no resync is running: it cannot be promoted.", n, vol),
			cmd, "")
	}

	for _, p := range r.Paths {
		if p.State != pathFailed {
			continue
		}
		out = append(out, Warning{
			ID: elementID("warning", "path-down", vol, n, p.Path), Severity: severityWarning,
			Text:    fmt.Sprintf("Path %s of %s's disk of %s failed: IO uses the other paths.", p.Path, n, vol),
			Detail:  p.Reason,
			Command: fmt.Sprintf("replctl path restore %s %s --node %s", vol, p.Path, n),
		})
	}
	return out
}

func isFailed(r *transport.ReplicaStatus) bool {
	return r.Disk == diskFailed || r.ReasonCode == causeDiskFailed || r.ReasonCode == causeStateWrite
}

func syncing(r *transport.ReplicaStatus) bool {
	switch r.Replication {
	case replSyncSource, replSyncTarget, replPausedSyncS, replPausedSyncT:
		return true
	}
	return false
}

func etaWords(r *transport.ReplicaStatus) string {
	if eta, ok := resyncETA(r); ok {
		return ", in about " + humanDuration(eta)
	}
	return ""
}

func firstFailedPath(r *transport.ReplicaStatus) string {
	for _, p := range r.Paths {
		if p.State == pathFailed {
			return p.Path
		}
	}
	return ""
}

func joinWords(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
