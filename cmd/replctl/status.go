package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/web"
	"github.com/spf13/cobra"
)

func newStatus(g *globals) *cobra.Command {
	var (
		asJSON bool
		events int
		watch  bool
		check  bool
	)
	cmd := &cobra.Command{
		Use:   "status [VOLUME]",
		Short: "Show every volume's replicas: role, disk, replication, out-of-sync, sync progress",
		Long: `Show the cluster as the node at --addr sees it: the nodes, then per volume its
primary and a line per replica (role, disk, replication, out-of-sync bytes,
resync or verify progress with speed and ETA, lag under protocols A and B,
what raft records in cluster mode). The volume's line ends with a warning for
each replica that is not UpToDate or not replicating and each failed path.
VOLUME shows that volume only. --watch redraws every second until Ctrl-C.
Colours on a terminal only (--color, NO_COLOR).

--check, for scripts and monitoring, also lists what the status page's
"Needs attention" shows (each warning with the command that fixes it) and
exits 0 when there is nothing to warn about, 4 when the worst is a warning
(redundancy lost or degraded: a StandAlone replica, a node down, a replica
still resyncing while the volume runs on one good copy, a node whose last
reload failed) and 5 when it is critical (IO stopped or data at risk: a
split brain, no primary, no quorum). With --json the warnings are in the
JSON's "warnings".`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			volume := ""
			if len(args) == 1 {
				volume = args[0]
			}
			out := cmd.OutOrStdout()
			pal, err := g.paletteFor(out)
			if err != nil {
				return err
			}
			s := &statusView{g: g, volume: volume, asJSON: asJSON, events: events, check: check, pal: pal}
			switch {
			case watch && check:
				return errors.New("--check and --watch do not go together: --check exits with the status's verdict")
			case !watch:
				return s.once(cmd, out)
			}
			return s.watch(cmd, out)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().BoolVar(&check, "check", false, "list the warnings and exit 4 when the worst is a warning, 5 when critical (0: nothing to warn about)")
	cmd.Flags().IntVar(&events, "events", 0, "also print this many recent events of the node at --addr")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every second until Ctrl-C")
	return cmd
}

// statusView renders status frames; across frames of --watch it keeps the
// verify progress it saw, to show a verify's speed and ETA.
type statusView struct {
	g      *globals
	volume string
	asJSON bool
	events int
	// check adds the warnings with their fixes and makes once exit with
	// the worst one's code.
	check bool
	pal   palette
	// frameTimeout bounds each frame of --watch, so that a hung node
	// shows as such every few seconds.
	frameTimeout time.Duration
}

// Exit codes of replctl status --check (1, 2 and 3 are the errors').
const (
	// exitWarning: the worst warning is a warning (redundancy lost or
	// degraded).
	exitWarning = 4
	// exitCritical: a warning is critical (IO stopped or data at risk).
	exitCritical = 5
)

// checkFailed is status --check's verdict when there is something to
// warn about: main exits with its code.
type checkFailed struct {
	code    int
	summary string
}

func (e *checkFailed) Error() string { return "status --check: " + e.summary }

// ExitCode is the process's exit code.
func (e *checkFailed) ExitCode() int { return e.code }

// verdict is --check's answer for warnings: nil when none is a warning or
// critical.
func verdict(ws []transport.Warning) error {
	counts := map[string]int{}
	for _, w := range ws {
		counts[w.Severity]++
	}
	var parts []string
	for _, sev := range []string{transport.SeverityCritical, transport.SeverityWarning} {
		switch n := counts[sev]; {
		case n == 1:
			parts = append(parts, "1 "+sev)
		case n > 1:
			parts = append(parts, fmt.Sprintf("%d %ss", n, sev))
		}
	}
	switch {
	case counts[transport.SeverityCritical] > 0:
		return &checkFailed{code: exitCritical, summary: strings.Join(parts, ", ")}
	case counts[transport.SeverityWarning] > 0:
		return &checkFailed{code: exitWarning, summary: strings.Join(parts, ", ")}
	}
	return nil
}

// warningsOf returns the status's warnings (of volume only, when set):
// those the node filled in, or, from a node too old to, the same rule's.
func warningsOf(st *transport.ClusterStatus, volume string) []transport.Warning {
	ws := st.Warnings
	if ws == nil {
		ws = web.Warnings(st)
	}
	if volume == "" {
		return ws
	}
	var out []transport.Warning
	for _, w := range ws {
		if w.Volume == volume || w.Volume == "" {
			out = append(out, w)
		}
	}
	return out
}

// printWarnings lists warnings the way the page's "Needs attention" does:
// severity, what is wrong, the fix and where to run it, the risk.
func printWarnings(w io.Writer, ws []transport.Warning, pal palette) {
	var serious []transport.Warning
	for _, x := range ws {
		if x.Severity != transport.SeverityInfo {
			serious = append(serious, x)
		}
	}
	if len(serious) == 0 {
		fmt.Fprintln(w, "\nwarnings: none")
		return
	}
	fmt.Fprintf(w, "\nwarnings: %s\n", verdict(serious).(*checkFailed).summary)
	for _, x := range serious {
		color := colorYellow
		if x.Severity == transport.SeverityCritical {
			color = colorRed
		}
		fmt.Fprintf(w, "  %s %s\n", pal.paint(color, strings.ToUpper(x.Severity)), x.Text)
		if x.Detail != "" {
			fmt.Fprintf(w, "    %s\n", pal.paint(colorDim, plainMessage(firstLine(x.Detail))))
		}
		if x.Command != "" {
			fix := "    fix: " + pal.paint(colorBold, x.Command)
			if x.Where != "" {
				fix += "  (" + x.Where + ")"
			}
			fmt.Fprintln(w, fix)
		}
		if x.Risk != "" {
			fmt.Fprintf(w, "    risk: %s\n", x.Risk)
		}
	}
}

// frame fetches the status and renders it into a buffer; it returns the
// status's warnings too.
func (s *statusView) frame(cmd *cobra.Command) ([]byte, []transport.Warning, error) {
	g := s.g
	if s.frameTimeout > 0 && s.frameTimeout < g.timeout {
		short := *g
		short.timeout = s.frameTimeout
		g = &short
	}
	k, err := g.dial(cmd, "")
	if err != nil {
		return nil, nil, err
	}
	defer k.close()
	st, err := k.status()
	if err != nil {
		return nil, nil, k.fail(err, "", "")
	}
	if s.volume != "" {
		if err := checkNames(st, s.volume, ""); err != nil {
			return nil, nil, err
		}
		if v, ok := st.Volume(s.volume); ok {
			st.Volumes = []transport.VolumeStatus{v}
		}
	}
	st.Warnings = warningsOf(st, s.volume)
	var buf bytes.Buffer
	if s.asJSON {
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return nil, nil, err
		}
		return buf.Bytes(), st.Warnings, nil
	}
	printStatus(&buf, st, s.pal, time.Now())
	if s.check {
		printWarnings(&buf, st.Warnings, s.pal)
	}
	if s.events > 0 {
		ns, err := k.c.NodeStatus(k.ctx, &transport.StatusRequest{Events: s.events})
		if err != nil {
			return nil, nil, k.fail(err, "", "")
		}
		fmt.Fprintf(&buf, "\nrecent events on %s:\n", ns.Node.Name)
		for _, e := range ns.Events {
			if s.volume == "" || e.Volume == s.volume || e.Volume == "" {
				fmt.Fprintln(&buf, "  "+formatEvent(&e, s.pal))
			}
		}
	}
	return buf.Bytes(), st.Warnings, nil
}

func (s *statusView) once(cmd *cobra.Command, out io.Writer) error {
	b, ws, err := s.frame(cmd)
	if err != nil {
		return err
	}
	if _, err := out.Write(b); err != nil {
		return err
	}
	if s.check {
		return verdict(ws)
	}
	return nil
}

// watch redraws every second: on a terminal over the previous frame, in
// a pipe after a separator line. A failing node is shown, not fatal: the
// watch goes on until Ctrl-C. An unknown volume ends it at once.
func (s *statusView) watch(cmd *cobra.Command, out io.Writer) error {
	ctx := cmd.Context()
	tty := isTerminal(out)
	s.frameTimeout = 5 * time.Second
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for first := true; ; first = false {
		b, _, err := s.frame(cmd)
		if ctx.Err() != nil {
			return nil
		}
		var unknown *nameError
		if first && errors.As(err, &unknown) {
			return err
		}
		if err != nil {
			b = []byte(s.pal.paint(colorRed, "replctl: "+err.Error()) + "\n")
		}
		now := time.Now().Format("2006-01-02 15:04:05")
		switch {
		case s.asJSON && err != nil:
			fmt.Fprintf(cmd.ErrOrStderr(), "%s replctl: %s\n", now, err)
		case s.asJSON:
			// One document per line for tools.
			var compact bytes.Buffer
			if json.Compact(&compact, b) == nil {
				b = append(compact.Bytes(), '\n')
			}
			out.Write(b)
		case tty:
			fmt.Fprintf(out, "\033[H\033[2J%s   %s\n\n%s", s.pal.paint(colorDim, "every 1s: replctl status via "+s.g.addr+" (Ctrl-C to stop)"), now, b)
		default:
			fmt.Fprintf(out, "--- %s ---\n%s", now, b)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// printStatus prints the cluster the way drbdadm status reads: the
// cluster and its nodes, then a line per volume (with its warnings) and
// one per replica.
func printStatus(w io.Writer, st *transport.ClusterStatus, pal palette, now time.Time) {
	cl := st.Cluster
	line := "cluster: failover " + cl.Failover
	if len(cl.Voters) > 0 {
		leader := cl.Leader
		if leader == "" {
			leader = pal.paint(colorRed, "none")
		}
		quorum := pal.paint(colorRed, "no quorum")
		switch {
		case cl.Quorum:
			quorum = pal.paint(colorGreen, "quorum")
		case cl.Electing:
			quorum = pal.paint(colorYellow, "electing")
		}
		line += fmt.Sprintf(", raft leader %s, %s, voters %s", leader, quorum, strings.Join(cl.Voters, " "))
	}
	if cl.Reason != "" {
		line += " (" + cl.Reason + ")"
	}
	fmt.Fprintln(w, line)
	nodes := &table{}
	nodes.add(plain("NODE"), plain("ROLE"), plain("STATE"), plain("CONTROL"), plain("NBD"))
	for _, n := range st.Nodes {
		state := cell{"alive", colorGreen}
		if !n.Alive {
			state = cell{"unreachable", colorRed}
			switch {
			case n.ErrorCode == transport.ReachRefused:
				state.text += " (not running: nothing listens)"
			case n.ErrorCode == transport.ReachNoAnswer:
				state.text += " (not answering: hung or paused?)"
			case n.Error != "" && n.Membership != "dead" && n.Membership != "left":
				// A node gossip reports gone is not asked: "gossip: dead" says why.
				state.text += " (" + plainMessage(firstLine(n.Error)) + ")"
			}
		}
		switch n.Membership {
		case "", "alive":
		case "suspect":
			state.text += ", gossip: suspect"
			if state.color == colorGreen {
				state.color = colorYellow
			}
		default:
			state.text += ", gossip: " + n.Membership
			state.color = colorRed
		}
		if n.FailedReload != nil {
			state.text += ", last reload failed"
			if state.color == colorGreen {
				state.color = colorYellow
			}
		}
		nbd := n.NBD
		if nbd == "" {
			nbd = "-"
		}
		nodes.add(plain(n.Name), plain(n.Role), state, plain(n.Control), plain(nbd))
	}
	nodes.render(w, pal)
	printPools(w, st.Pools, pal)
	// A node's last reload failed, the nodes' files disagree on a volume,
	// or a node does not run one as its file says: the volume lines below
	// are one node's file.
	for _, x := range warningsOf(st, "") {
		switch x.Kind {
		case transport.WarningReloadFailed:
			fmt.Fprintln(w, pal.paint(colorYellow, "! "+x.Text))
			for _, problem := range strings.Split(x.Detail, "\n") {
				fmt.Fprintf(w, "    %s\n", problem)
			}
			fmt.Fprintf(w, "  fix: %s (%s)\n", x.Command, x.Where)
		case transport.WarningConfigDiffers, transport.WarningConfigNotApplied:
			line := "! " + x.Text
			if x.Kind == transport.WarningConfigNotApplied && x.Detail != "" {
				line += " " + plainMessage(firstLine(x.Detail))
			}
			fmt.Fprintln(w, pal.paint(colorYellow, line))
			fmt.Fprintf(w, "  fix: %s (%s)\n", x.Command, x.Where)
		}
	}
	cluster := len(cl.Voters) > 0
	for i := range st.Volumes {
		printVolume(w, &st.Volumes[i], warningsOf(st, st.Volumes[i].Name), cluster, pal, now)
	}
}

// printPools prints the nodes' storage pools, when they have any.
func printPools(w io.Writer, pools []transport.PoolStatus, pal palette) {
	if len(pools) == 0 {
		return
	}
	t := &table{}
	t.add(plain("POOL"), plain("NODE"), plain("SIZE"), plain("FREE"), plain("STATE"))
	for _, p := range pools {
		state := cell{"ok", colorGreen}
		if p.State != "" {
			state = cell{p.State, colorYellow}
		}
		t.add(plain(p.Name), plain(p.Node), plain(human.Bytes(int64(p.Size))), plain(human.Bytes(int64(p.Free))), state)
	}
	t.render(w, pal)
}

// printVolume prints v's line (with its warnings: ws are the status's
// warnings about it), its last failover and a line per replica.
func printVolume(w io.Writer, v *transport.VolumeStatus, ws []transport.Warning, cluster bool, pal palette, now time.Time) {
	primary := v.Primary
	if primary == "" {
		primary = "none"
	}
	fmt.Fprintf(w, "\n%s  size %s  protocol %s  primary %s  epoch %d", pal.paint(colorBold, v.Name), humanBytes(v.Size), v.Protocol, primary, v.Epoch)
	if v.OnCongestion != "" && (v.Protocol != "C" || v.OnCongestion != "block") {
		fmt.Fprintf(w, "  on congestion %s", v.OnCongestion)
	}
	if v.ResyncRate > 0 {
		fmt.Fprintf(w, "  resync cap %s/s", humanBytes(v.ResyncRate))
	}
	if v.NBDURI != "" {
		fmt.Fprintf(w, "  %s", v.NBDURI)
	}
	for _, warn := range volumeWarnings(v, ws) {
		fmt.Fprint(w, "  "+pal.paint(warn.color, warn.text))
	}
	fmt.Fprintln(w)
	if m := v.Mount; m != nil {
		how := "replctl mount"
		if m.Holder.Follows {
			how = "replctl mount --follow (it follows the primary)"
		}
		fmt.Fprintf(w, "  mounted on host %s at %s by %s, since %s (%d NBD connection(s) open); replctl umount %s, on %s, gives it back\n",
			m.Holder.Host, m.Holder.Dir, how, m.Since.UTC().Format("2006-01-02 15:04:05 UTC"), m.Connections, m.Holder.Dir, m.Holder.Host)
	}
	if f := v.LastFailover; f != nil {
		line := fmt.Sprintf("  failed over %s → %s %s ago (%s, epoch %d)", f.From, f.To, shortDuration(now.Sub(f.At)), f.At.UTC().Format("2006-01-02 15:04:05 UTC"), f.Epoch)
		if f.Reason != "" {
			line += ": " + f.Reason
		}
		fmt.Fprintln(w, line)
	}

	async := v.Protocol == "A" || v.Protocol == "B"
	for _, r := range v.Replicas {
		async = async || r.LagBytes > 0
	}
	t := &table{indent: "  "}
	head := []cell{plain("NODE"), plain("ROLE"), plain("DISK"), plain("REPLICATION"), plain("OUT-OF-SYNC"), plain("SYNC")}
	if async {
		head = append(head, plain("LAG"))
	}
	if cluster {
		head = append(head, plain("RAFT"))
	}
	head = append(head, plain("LAST RESYNC"), plain("NOTE"))
	t.add(head...)
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if r.Reachable && r.ReasonCode == transport.ReasonNoSuchVolume {
			// Alive, but the volume is not in its file: nothing to show
			// but why.
			row := []cell{plain(r.Node), {"-", colorDim}, {"-", colorDim}, {"-", colorDim}, plain("-"), {"not in its file", colorYellow}}
			if async {
				row = append(row, plain("-"))
			}
			if cluster {
				row = append(row, plain("-"))
			}
			t.add(append(row, plain("-"), plain(fmt.Sprintf("alive, does not have %s in its cluster file", v.Name)))...)
			continue
		}
		role := plain(r.Role)
		switch r.Role {
		case transport.RolePrimary:
			role.color = colorBold
		case "Unknown", "":
			role.color = colorDim
		}
		oos := plain(humanBytes(r.OutOfSyncBytes))
		if r.OutOfSyncBytes > 0 {
			oos.color = colorYellow
		}
		row := []cell{plain(r.Node), role, {r.Disk, diskColor(r.Disk)}, {r.Replication, replicationColor(r.Replication)}, oos,
			syncCell(v, r, now)}
		if async {
			row = append(row, lagCell(v, r))
		}
		if cluster {
			raft := cell{r.Raft, colorNone}
			switch r.Raft {
			case "":
				raft.text = "-"
			case transport.DiskUpToDate:
				raft.color = colorGreen
			default:
				raft.color = colorYellow
			}
			row = append(row, raft)
		}
		note := r.Reason
		if note == "" && r.SyncDecision != "" && r.SyncDecision != "no-sync" {
			// Words; the rule's name is in --json (sync_rule).
			note = "last connect: " + replication.ConnectWords(r.SyncDecision, r.SyncRule)
		}
		if !r.Reachable {
			note = strings.TrimSpace("unreachable (shown as its peer sees it) " + note)
		}
		row = append(row, lastResyncCell(v, r, now), plain(plainMessage(firstLine(note))))
		t.add(row...)
	}
	t.render(w, pal)
	for i := range v.Replicas {
		if line := scrubLine(v, &v.Replicas[i]); line.text != "" {
			fmt.Fprintln(w, "  "+pal.paint(line.color, line.text))
		}
	}
}

// scrubLine is a line under the volume's table for r's integrity: the
// blocks no replica holds good, those on its bad-block list, and the
// scrub while one runs or is paused (percent and ETA), shown as
// "checksums: building" when it is the build of checksums just turned
// on; empty when there is nothing to say.
func scrubLine(v *transport.VolumeStatus, r *transport.ReplicaStatus) cell {
	in := r.Integrity
	if in == nil || !r.Reachable {
		return cell{}
	}
	var parts []string
	color := colorCyan
	switch s := in.Scrub; {
	case s.Build && s.State == "paused":
		// The build of checksums just turned on is a scrub: its
		// commands pause and resume it.
		parts = append(parts, fmt.Sprintf("checksums on %s: building, paused at %.1f%% (replctl scrub %s --node %s --resume)", r.Node, s.Percent, v.Name, r.Node))
	case s.Build && s.State == "running":
		left := ""
		if s.ETASeconds > 0 {
			left = " ETA " + shortDuration(time.Duration(s.ETASeconds*float64(time.Second)))
		}
		parts = append(parts, fmt.Sprintf("checksums on %s: building %s %.0f%%%s (blocks past it are not verified yet)", r.Node, bar(s.Percent, 20), s.Percent, left))
	case s.State == "running":
		left := "?"
		if s.ETASeconds > 0 {
			left = shortDuration(time.Duration(s.ETASeconds * float64(time.Second)))
		}
		parts = append(parts, fmt.Sprintf("scrub on %s %s %5.1f%% ETA %s", r.Node, bar(s.Percent, 20), s.Percent, left))
	case s.State == "paused":
		parts = append(parts, fmt.Sprintf("scrub on %s paused at %.1f%% (replctl scrub %s --node %s --resume)", r.Node, s.Percent, v.Name, r.Node))
	}
	if in.BadBlocks > 0 {
		color = colorYellow
		parts = append(parts, fmt.Sprintf("%s: %d bad blocks (could not be rewritten; read from a peer in sync; the disk is detached when the list is full): replctl events --node %s names them (bad-block); plan to replace the disk", r.Node, in.BadBlocks, r.Node))
	}
	if in.UnrecoverableBlocks > 0 {
		color = colorRed
		parts = append(parts, fmt.Sprintf("%s: %d blocks unrecoverable (bad here, no good copy on any replica; reads of them fail): replctl events --node %s names their ranges (block-unrecoverable); write them again", r.Node, in.UnrecoverableBlocks, r.Node))
	}
	return cell{strings.Join(parts, "; "), color}
}

// syncCell shows where a replica's data stands: a bar with speed and ETA
// while a resync or a verify runs, "in sync" only for a connected UpToDate
// replica. A replica with no disk, not replicating or not reachable never
// shows as complete.
func syncCell(v *transport.VolumeStatus, r *transport.ReplicaStatus, now time.Time) cell {
	const width = 20
	switch {
	case !r.Reachable:
		return cell{"unknown", colorDim}
	case r.Disk == transport.DiskDiskless || r.Disk == transport.DiskFailed || r.Disk == "DUnknown":
		return cell{"no disk", colorRed}
	case r.Role == transport.RolePrimary && r.OutOfSyncBytes > 0 && v.Size > 0:
		// A primary whose disk missed writes copies them back from a peer.
		pct := 100 * (1 - float64(r.OutOfSyncBytes)/float64(v.Size))
		return cell{fmt.Sprintf("%s %5.1f%% copying back from a peer", bar(pct, width), pct), colorYellow}
	case r.Role == transport.RolePrimary && transport.Syncing(r.Replication):
		return cell{"resync source", colorNone} // the peers' rows show the progress
	case r.Role == transport.RolePrimary && transport.Verifying(r.Replication):
		return cell{"verify source", colorNone}
	case transport.Syncing(r.Replication) && r.ResyncTotalBytes > 0:
		pct := 100 * float64(r.ResyncDoneBytes) / float64(r.ResyncTotalBytes)
		text := fmt.Sprintf("%s %5.1f%% %s/s ETA %s", bar(pct, width), pct, humanBytes(r.ResyncRate), eta(r.ResyncTotalBytes-r.ResyncDoneBytes, r.ResyncRate))
		if transport.SyncPaused(r.Replication) {
			text = fmt.Sprintf("%s %5.1f%% paused (replctl resync %s --resume)", bar(pct, width), pct, v.Name)
		}
		return cell{text, colorYellow}
	case transport.Syncing(r.Replication):
		return cell{"resync starting", colorYellow}
	case transport.Verifying(r.Replication) && r.VerifyTotalBytes > 0:
		pct := 100 * float64(r.VerifyDoneBytes) / float64(r.VerifyTotalBytes)
		rate := r.VerifyRate
		speed := "?"
		if rate > 0 {
			speed = humanBytes(rate)
		}
		text := fmt.Sprintf("verify %s %5.1f%% %s/s ETA %s", bar(pct, width), pct, speed, eta(r.VerifyTotalBytes-r.VerifyDoneBytes, rate))
		if r.VerifyFoundBytes > 0 {
			text += fmt.Sprintf(", %s differ", humanBytes(r.VerifyFoundBytes))
		}
		return cell{text, colorCyan}
	case r.Replication == transport.ReplStandAlone:
		return cell{"not replicating", colorRed}
	case r.Replication == transport.ReplConnecting || r.Replication == "Unknown":
		return cell{"not connected", colorYellow}
	case r.Disk == transport.DiskUpToDate && r.Replication == transport.ReplConnected && r.OutOfSyncBytes == 0:
		return cell{"in sync", colorGreen}
	case r.Disk == transport.DiskUpToDate:
		return cell{fmt.Sprintf("UpToDate, %s", r.Replication), colorYellow}
	}
	return cell{fmt.Sprintf("%.1f%%", r.SyncProgress), colorYellow}
}

// lastResyncCell is the last finished resync of a secondary: how much,
// how long and how long ago ("-" for the primary or none since the
// primary started).
func lastResyncCell(v *transport.VolumeStatus, r *transport.ReplicaStatus, now time.Time) cell {
	if r.Node == v.Primary || r.LastResyncEnded.IsZero() {
		return plain("-")
	}
	return plain(fmt.Sprintf("%s in %s, %s ago", humanBytes(r.LastResyncBytes), shortDuration(time.Duration(r.LastResyncSeconds*float64(time.Second))),
		shortDuration(now.Sub(r.LastResyncEnded))))
}

// lagCell is what a secondary misses of the acknowledged writes
// (protocols A and B), bytes and the age of the oldest.
func lagCell(v *transport.VolumeStatus, r *transport.ReplicaStatus) cell {
	if r.Node == v.Primary {
		return plain("-")
	}
	c := plain(fmt.Sprintf("%s %.1fs", humanBytes(r.LagBytes), r.LagSeconds))
	if r.LagBytes > 0 {
		c.color = colorYellow
	}
	return c
}

// volumeWarnings are what the volume's line warns about: a replica not
// UpToDate or not replicating, a failed path, no primary serving, a
// setting that differs between the nodes, and (from the status's warnings
// ws) a volume that runs on one copy.
func volumeWarnings(v *transport.VolumeStatus, ws []transport.Warning) []cell {
	var warns []cell
	switch p := v.Replica(v.Primary); {
	case v.NBDURI == "" && p != nil && p.Reachable && p.ReasonCode == transport.ReasonNoSuchVolume:
		warns = append(warns, cell{fmt.Sprintf("! not served: its primary %s does not have it in its cluster file", p.Node), colorYellow})
	case v.NBDURI == "":
		warns = append(warns, cell{"! no primary serving IO", colorRed})
	}
	for _, x := range ws {
		if x.Kind == transport.WarningOneCopy && x.Volume == v.Name {
			warns = append(warns, cell{fmt.Sprintf("! runs on one copy: %s is disconnected by the operator (%s)", x.Node, x.Command), colorRed})
		}
	}
	for _, r := range v.Replicas {
		if !r.Reachable {
			warns = append(warns, cell{"! " + r.Node + " unreachable", colorRed})
			continue
		}
		if r.ReasonCode == transport.ReasonNoSuchVolume {
			if r.Node != v.Primary {
				warns = append(warns, cell{fmt.Sprintf("! %s alive, %s not in its cluster file", r.Node, v.Name), colorYellow})
			}
			continue
		}
		var what []string
		color := colorYellow
		if r.Disk != transport.DiskUpToDate {
			what = append(what, r.Disk)
			if r.Disk == transport.DiskDiskless || r.Disk == transport.DiskFailed {
				color = colorRed
			}
		}
		// A primary's replication is the worst of its peers': their own
		// entries say it.
		if r.Role != transport.RolePrimary && (r.Replication == transport.ReplStandAlone || r.Replication == transport.ReplConnecting) {
			what = append(what, r.Replication)
			if r.Replication == transport.ReplStandAlone {
				color = colorRed
			}
		}
		if len(what) > 0 {
			warns = append(warns, cell{"! " + r.Node + " " + strings.Join(what, " "), color})
		}
		for _, p := range r.Paths {
			if p.State == transport.PathFail {
				warns = append(warns, cell{fmt.Sprintf("! %s path %s failed", r.Node, p.Path), colorRed})
			}
		}
		if in := r.Integrity; in != nil && in.UnrecoverableBlocks > 0 {
			warns = append(warns, cell{fmt.Sprintf("! %s %d blocks unrecoverable", r.Node, in.UnrecoverableBlocks), colorRed})
		}
		if in := r.Integrity; in != nil && in.BadBlocks > 0 {
			warns = append(warns, cell{fmt.Sprintf("! %s %d bad blocks", r.Node, in.BadBlocks), colorYellow})
		}
	}
	for _, m := range v.SettingMismatches {
		var values []string
		for _, n := range slices.Sorted(maps.Keys(m.Values)) {
			values = append(values, n+" "+m.Values[n])
		}
		warns = append(warns, cell{fmt.Sprintf("! %s differs: %s", m.Setting, strings.Join(values, ", ")), colorYellow})
	}
	return warns
}
