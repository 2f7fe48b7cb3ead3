package web

import (
	"fmt"
	"slices"
	"strings"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
)

// Severities of a warning, most urgent first.
const (
	severityCritical = transport.SeverityCritical
	severityWarning  = transport.SeverityWarning
	severityInfo     = transport.SeverityInfo
)

// Warning is one thing an operator should act on, and how.
type Warning = transport.Warning

// Warnings is the rule that turns a status into what an operator should
// act on, most urgent first, each with the command that fixes it: the
// page's "Needs attention", and the warnings of the status's JSON (the
// node fills them in with this). It is a pure function of the status and
// never returns nil (an empty list in JSON).
func Warnings(st *transport.ClusterStatus) []transport.Warning {
	ws := healthWarnings(st)
	if ws == nil {
		ws = []transport.Warning{}
	}
	return ws
}

// healthWarnings is Warnings, nil when there is none.
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
			detail = human.Join("gossip says dead", detail)
		}
		w := Warning{
			ID: elementID("warning", transport.WarningNodeDown, n.Name), Kind: transport.WarningNodeDown, Severity: severityWarning, Node: n.Name,
			Text:    fmt.Sprintf("Node %s is unreachable: its replicas are not protected and it cannot vote.", n.Name),
			Detail:  detail,
			Command: "systemctl start replnode", Where: "on " + n.Name,
		}
		if n.ErrorCode == transport.ReachNoAnswer {
			// Running but not answering: starting it does nothing.
			w.Text = fmt.Sprintf("Node %s is not answering (hung or paused): its replicas are not protected and it cannot vote.", n.Name)
			w.Command = "systemctl status replnode; systemctl restart replnode"
		}
		add(w)
	}
	// An election under way (a leader handing its office on, or one lost
	// moments ago) is no lost quorum yet: that is told once it lasts
	// longer than an election takes.
	if c := st.Cluster; len(c.Voters) > 0 && !c.Quorum && !c.Electing {
		var gone []string
		for _, v := range c.Voters {
			if down[v] {
				gone = append(gone, v)
			}
		}
		w := Warning{
			ID: elementID("warning", transport.WarningNoQuorum), Kind: transport.WarningNoQuorum, Severity: severityCritical,
			Text:   fmt.Sprintf("No raft quorum (%d voters: %s): no failover, and primaries serve only while their lease lasts.", len(c.Voters), strings.Join(c.Voters, ", ")),
			Detail: c.Reason,
		}
		if len(gone) > 0 {
			w.Command, w.Where = "systemctl start replnode", "on "+strings.Join(gone, " and ")
			w.Detail = human.Join(fmt.Sprintf("a majority needs %d of them up", len(c.Voters)/2+1), c.Reason)
		}
		add(w)
	}
	out = append(out, reloadWarnings(st)...)
	out = append(out, configWarnings(st)...)
	differs := filesDisagree(st)
	for i := range st.Volumes {
		if differs[st.Volumes[i].Name] {
			// Half added or half removed: a node whose file lacks it
			// runs no replica and refuses its stream, and a primary
			// whose file lacks it serves nothing. Those follow from the
			// files and end when they agree: config-differs alone says
			// what to do.
			continue
		}
		out = append(out, volumeWarnings(&st.Volumes[i], st.Cluster, down)...)
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

// volumeWarnings are one volume's warnings; c is the cluster's raft view
// and down names the nodes already warned about as unreachable (their
// replicas say nothing more).
func volumeWarnings(v *transport.VolumeStatus, c transport.ClusterInfo, down map[string]bool) []Warning {
	var out []Warning
	add := func(w Warning) {
		w.Volume = v.Name
		out = append(out, w)
	}
	vol := v.Name
	primary := v.Replica(v.Primary)

	// A split brain is one warning for the volume: the operator picks
	// the node whose changes go, suggested as the one that is not primary.
	var split []string
	for _, r := range v.Replicas {
		if r.ReasonCode == transport.ReasonSplitBrain {
			split = append(split, r.Node)
		}
	}
	if len(split) > 0 {
		victim := split[0]
		for _, r := range v.Replicas {
			if r.Node != v.Primary && r.ReasonCode == transport.ReasonSplitBrain {
				victim = r.Node
				break
			}
		}
		add(Warning{
			ID: elementID("warning", transport.WarningSplitBrain, vol), Kind: transport.WarningSplitBrain, Severity: severityCritical,
			Text:    fmt.Sprintf("Split brain on %s: both sides changed the data since they last met; neither syncs until one gives up its changes.", vol),
			Detail:  v.Replica(split[0]).Reason,
			Command: fmt.Sprintf("replctl connect %s --discard-my-data --node %s", vol, victim),
			Risk:    fmt.Sprintf("%s loses what was written to it since the split; without --yes the command only prints how much.", victim),
		})
	}

	primaryUp := false
	switch {
	case primary == nil || v.Primary == "":
		add(noPrimaryWarning(v, c, down, "has no primary"))
	case !primary.Reachable || primary.Role != transport.RolePrimary:
		if !down[v.Primary] {
			add(noPrimaryWarning(v, c, down, fmt.Sprintf("has no serving primary (%s does not answer as primary)", v.Primary)))
		} else {
			add(noPrimaryWarning(v, c, down, fmt.Sprintf("lost its primary %s", v.Primary)))
		}
	case primary.ReasonCode == transport.ReasonWaitingForPeer:
		primaryUp = true
		add(Warning{
			ID: elementID("warning", transport.WarningWaitingForPeer, vol, primary.Node), Kind: transport.WarningWaitingForPeer, Severity: severityCritical, Node: primary.Node,
			Text:    fmt.Sprintf("%s is primary of %s but serves no IO: after its restart it waits for a peer to compare data with.", primary.Node, vol),
			Detail:  primary.Reason,
			Command: fmt.Sprintf("replctl primary %s --node %s --force --yes", vol, primary.Node),
			Risk:    "Start the peer instead if you can. Forcing makes this node's data the truth: writes a peer took after this node last saw it are lost, and the peers get resynced from it.",
		})
	case primary.ReasonCode == transport.ReasonAdminDown:
		// The operator disconnected the primary itself (say, before it
		// was forced to primary): it serves alone and the returning peers
		// wait, Connecting, for a connect that only the operator gives.
		primaryUp = true
		var peers []string
		for _, r := range v.Replicas {
			if r.Node != primary.Node {
				peers = append(peers, r.Node)
			}
		}
		add(Warning{
			ID: elementID("warning", transport.WarningOneCopy, vol), Kind: transport.WarningOneCopy, Severity: severityWarning, Node: primary.Node,
			Text: fmt.Sprintf("%s runs on one copy: its primary %s is disconnected by the operator and replicates to nobody; %s will not catch up until it is connected again.",
				vol, primary.Node, orDefault(strings.Join(peers, " and "), "no peer")),
			Detail:  primary.Reason,
			Command: fmt.Sprintf("replctl connect %s --node %s", vol, primary.Node),
		})
	default:
		primaryUp = true
	}

	for i := range v.Replicas {
		r := &v.Replicas[i]
		if down[r.Node] || !r.Reachable {
			continue
		}
		for _, w := range replicaWarnings(v, r, primary, primaryUp) {
			add(w)
		}
	}
	out = append(out, settingsWarnings(v)...)
	return out
}

// noPrimaryWarning says what happens to a volume without a serving
// primary, and what fixes it: nothing while raft fails it over by itself
// (failover on, a quorum, an UpToDate replica in reach); else forcing the
// best UpToDate replica; else bringing the old primary back, naming the
// forced promotion of what is left and what it loses.
func noPrimaryWarning(v *transport.VolumeStatus, c transport.ClusterInfo, down map[string]bool, what string) Warning {
	w := Warning{
		ID: elementID("warning", transport.WarningNoPrimary, v.Name), Kind: transport.WarningNoPrimary, Severity: severityCritical, Node: v.Primary,
		Text: fmt.Sprintf("%s %s: no IO is served.", v.Name, what),
	}
	usable := func(r *transport.ReplicaStatus) bool {
		return r.Node != v.Primary && r.Reachable && r.Disk != transport.DiskDiskless && r.Disk != transport.DiskFailed && r.Disk != transport.DiskInconsistent && !isFailed(r)
	}
	// Raft fails over with a quorum, or once it elects a leader: a
	// majority of the voters is up (the old primary may have led).
	up := 0
	for _, n := range c.Voters {
		if !down[n] {
			up++
		}
	}
	if c.Failover == "auto" && (c.Quorum || 2*up > len(c.Voters)) {
		for i := range v.Replicas {
			r := &v.Replicas[i]
			if usable(r) && r.Raft == transport.DiskUpToDate {
				lost := "the old primary"
				if v.Primary != "" {
					lost = v.Primary
				}
				w.Text = fmt.Sprintf("%s %s: no IO is served until the raft leader fails it over to %s, once %s's lease has run out (seconds).", v.Name, what, r.Node, lost)
				if !c.Quorum {
					w.Text = fmt.Sprintf("%s %s: no IO is served until raft, once it has elected a leader (%d of %d voters are up), fails it over to %s (seconds).", v.Name, what, up, len(c.Voters), r.Node)
				}
				w.Detail = c.Reason
				return w
			}
		}
	}
	var best *transport.ReplicaStatus
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if !r.Reachable || r.Disk != transport.DiskUpToDate {
			continue
		}
		if best == nil || (r.Raft == transport.DiskUpToDate && best.Raft != transport.DiskUpToDate) {
			best = r
		}
	}
	if best != nil {
		w.Command = fmt.Sprintf("replctl primary %s --node %s --force --yes", v.Name, best.Node)
		w.Risk = fmt.Sprintf("With failover on, the raft leader promotes %s by itself; force only if it does not. Writes the lost primary acknowledged after %s last heard from it are gone.", best.Node, best.Node)
		return w
	}
	// No failover is possible: the old primary holds writes no replica in
	// reach has. Bring it back; forcing another replica loses them.
	w.Text = fmt.Sprintf("%s %s: no IO is served, and no replica in reach is UpToDate to take over.", v.Name, what)
	var last *transport.ReplicaStatus // the best copy left: Consistent, then Outdated
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if usable(r) && (last == nil || (r.Disk == transport.DiskConsistent && last.Disk != transport.DiskConsistent)) {
			last = r
		}
	}
	force := ""
	if last != nil {
		force = fmt.Sprintf("replctl primary %s --node %s --force --yes makes %s's copy (%s) the data of %s: the writes it missed are lost, and the old primary resyncs from it when it returns.",
			v.Name, last.Node, last.Node, orDefault(last.Disk, "state unknown"), v.Name)
	}
	switch {
	case v.Primary != "" && down[v.Primary]:
		w.Command, w.Where = "systemctl start replnode", "on "+v.Primary
		w.Detail = fmt.Sprintf("%s holds the latest data: bring it back.", v.Primary)
		if force != "" {
			w.Risk = fmt.Sprintf("If %s cannot come back: %s", v.Primary, force)
		}
	case last != nil:
		w.Command = fmt.Sprintf("replctl primary %s --node %s --force --yes", v.Name, last.Node)
		w.Risk = force
	default:
		var gone []string
		for _, r := range v.Replicas {
			if down[r.Node] {
				gone = append(gone, r.Node)
			}
		}
		if len(gone) > 0 {
			w.Command, w.Where = "systemctl start replnode", "on "+strings.Join(gone, " and ")
		}
		w.Detail = "No replica in reach holds a usable copy."
	}
	return w
}

// replicaWarnings are r's warnings; primary is the volume's primary's
// replica (nil when none) and primaryUp says it answers (without it, a
// secondary's lost link is no news).
func replicaWarnings(v *transport.VolumeStatus, r, primary *transport.ReplicaStatus, primaryUp bool) []Warning {
	var out []Warning
	vol, n := v.Name, r.Node
	add := func(kind, severity, text, command, risk string) {
		out = append(out, Warning{ID: elementID("warning", kind, vol, n), Kind: kind, Severity: severity, Node: n,
			Text: text, Detail: r.Reason, Command: command, Risk: risk})
	}
	connect := fmt.Sprintf("replctl connect %s --node %s", vol, n)
	isPrimary := r.Role == transport.RolePrimary
	// The operator disconnected the primary: the volume's one-copy
	// warning names the fix, for the primary and for its waiting peers.
	primaryDown := primaryUp && primary != nil && primary.ReasonCode == transport.ReasonAdminDown
	// The primary's replication is the worst of its peers': the peers'
	// rows carry the link warnings, unless the operator disconnected the
	// primary itself.
	linkOwner := !isPrimary || r.ReasonCode == transport.ReasonAdminDown

	switch {
	case r.ReasonCode == transport.ReasonSplitBrain:
		// one warning for the volume above
	case primaryDown && (r.Node == primary.Node || r.Replication == transport.ReplConnecting):
		// the volume's one-copy warning above
	case r.Replication == transport.ReplStandAlone && linkOwner:
		add(transport.WarningStandAlone, severityWarning,
			fmt.Sprintf("%s is StandAlone on %s: it does not replicate and will not retry by itself.", n, vol),
			connect, "")
	case r.Replication == transport.ReplConnecting && !isPrimary && primaryUp:
		add(transport.WarningConnecting, severityWarning,
			fmt.Sprintf("%s is not connected to the primary of %s (Connecting): it retries by itself; the primary tracks what changes.", n, vol),
			"", "")
	case transport.SyncPaused(r.Replication):
		add(transport.WarningResyncPaused, severityWarning,
			fmt.Sprintf("The resync of %s to %s is paused: %s stays Inconsistent.", vol, n, n),
			fmt.Sprintf("replctl resync %s --resume", vol), "")
	case r.Replication == transport.ReplBehind:
		add(transport.WarningBehind, severityWarning,
			fmt.Sprintf("%s is Behind on %s: the primary pulled ahead under congestion; %s (%s) of acknowledged writes are only on the primary until the catch-up resync.",
				n, vol, humanBytes(r.LagBytes), humanSeconds(r.LagSeconds)),
			fmt.Sprintf("replctl adjust %s --on-congestion block", vol),
			"The primary then waits for the link when its buffer fills: writes slow down instead of leaving the peer behind.")
	}

	switch {
	case r.ReasonCode == transport.ReasonDetached || (r.Disk == transport.DiskDiskless && !isFailed(r)):
		cmd, risk := "", ""
		if p := firstFailedPath(r); p != "" {
			cmd = fmt.Sprintf("replctl path restore %s %s --node %s", vol, p, n)
		} else {
			risk = "Replace the disk, then: replctl create-md " + vol + " --config FILE --node " + n + " --force --yes (a full resync follows)."
		}
		add(transport.WarningDetached, severityCritical,
			fmt.Sprintf("%s's disk of %s is detached (Diskless): its IO goes to the peer; one more failure stops %s.", n, vol, vol),
			cmd, risk)
	case isFailed(r):
		add(transport.WarningDiskFailed, severityCritical,
			fmt.Sprintf("%s's disk of %s failed (%s): it holds no usable copy.", n, vol, r.Disk),
			"", "")
	case r.Disk == transport.DiskOutdated && !isPrimary:
		cmd := ""
		if r.Replication == transport.ReplStandAlone {
			cmd = connect
		}
		add(transport.WarningOutdated, severityWarning,
			fmt.Sprintf("%s's copy of %s is Outdated: it misses writes and cannot be promoted; it catches up by resync once connected.", n, vol),
			cmd, "")
	case r.Disk == transport.DiskInconsistent && !isPrimary:
		if transport.Syncing(r.Replication) {
			// Redundancy is not back until the resync ends: an
			// Inconsistent copy cannot take over (it fixes itself, so
			// no command).
			text := fmt.Sprintf("%s's copy of %s is Inconsistent until its resync ends%s; until then %s runs on %s.",
				n, vol, etaWords(r), vol, goodCopies(v))
			add(transport.WarningInconsistent, severityWarning, text, "", "")
			break
		}
		cmd := connect
		if r.Replication == transport.ReplConnected {
			cmd = fmt.Sprintf("replctl resync %s", vol)
		}
		add(transport.WarningInconsistent, severityWarning,
			fmt.Sprintf("%s's copy of %s is Inconsistent and no resync is running: it cannot be promoted.", n, vol),
			cmd, "")
	}

	if in := r.Integrity; in != nil && r.Reachable && in.UnrecoverableBlocks > 0 {
		add(transport.WarningUnrecoverable, severityCritical,
			fmt.Sprintf("%d blocks of %s on %s are bad and no replica holds a good copy: reads of them fail with EIO (never wrong data). The block-unrecoverable events name their byte ranges; write those ranges again, from a backup or what the application knows: a write clears them.", in.UnrecoverableBlocks, vol, n),
			fmt.Sprintf("replctl events --node %s", n), "")
	}

	if in := r.Integrity; in != nil && r.Reachable && in.BadBlocks > 0 {
		add(transport.WarningBadBlocks, severityWarning,
			fmt.Sprintf("%d blocks of %s's disk of %s could not be rewritten and are on its bad-block list: reads of them go to a peer in sync. The disk is failing: the list reaching bad_blocks_max detaches it; plan to replace it (the bad-block events name the blocks).", in.BadBlocks, n, vol),
			fmt.Sprintf("replctl events --node %s", n), "")
	}

	for _, p := range r.Paths {
		if p.State != transport.PathFail {
			continue
		}
		out = append(out, Warning{
			ID: elementID("warning", transport.WarningPathDown, vol, n, p.Path), Kind: transport.WarningPathDown, Severity: severityWarning, Node: n,
			Text:    fmt.Sprintf("Path %s of %s's disk of %s failed: IO uses the other paths.", p.Path, n, vol),
			Detail:  p.Reason,
			Command: fmt.Sprintf("replctl path restore %s %s --node %s", vol, p.Path, n),
		})
	}
	return out
}

// goodCopies says, in words, which copies of v hold all its data and can
// take over: the primary's and every other UpToDate one it replicates to.
func goodCopies(v *transport.VolumeStatus) string {
	var good []string
	for _, r := range v.Replicas {
		if !r.Reachable || r.Disk != transport.DiskUpToDate {
			continue
		}
		if r.Node == v.Primary || r.Replication == transport.ReplConnected {
			good = append(good, r.Node+"'s")
		}
	}
	switch len(good) {
	case 0:
		return "no UpToDate copy"
	case 1:
		return "one good copy, " + good[0]
	}
	return fmt.Sprintf("%d good copies, %s", len(good), nodeList(good))
}

func isFailed(r *transport.ReplicaStatus) bool {
	return r.Disk == transport.DiskFailed || r.ReasonCode == transport.ReasonDiskFailed || r.ReasonCode == transport.ReasonStateWrite
}

func etaWords(r *transport.ReplicaStatus) string {
	if eta, ok := resyncETA(r); ok {
		return ", in about " + humanDuration(eta)
	}
	return ""
}

func firstFailedPath(r *transport.ReplicaStatus) string {
	for _, p := range r.Paths {
		if p.State == transport.PathFail {
			return p.Path
		}
	}
	return ""
}
