package web

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
)

// The page's model: buildPage turns a status (plus the monitor's IO
// samples and events) into strings and element ids, so the template only
// prints. Everything here is a pure function of its input.

// pageInput is what one rendering of the page reads.
type pageInput struct {
	Status *transport.ClusterStatus
	// StatusError says why Status is missing or stale.
	StatusError string
	// IO holds each volume's sparklines (by volume name).
	IO map[string]volumeIO
	// Events are the cluster's recent events, newest first.
	Events []transport.Event
	Now    time.Time
}

// volumeIO is a volume's IO over the last window, drawn.
type volumeIO struct {
	IOPS, Throughput sparkView
}

type pageView struct {
	From, AsOf, AsOfFull string
	Title                string
	Cluster              clusterView
	Nodes                []nodeView
	Pools                []poolView
	Topology             topologyView
	Warnings             []Warning
	Volumes              []volumeView
	Events               []eventView
}

type clusterView struct {
	Leader, Quorum, QuorumClass, Voters, Witnesses, Failover, FailoverClass, Reason string
}

type nodeView struct {
	ID, Name, Role, State, StateClass, Control, Replication, NBD, Error string
	// Version is the release the node runs ("" when it did not answer).
	Version string
	// Reload says that the node's last reload failed ("" when not).
	Reload       string
	Leader, Self bool
}

// poolView is one storage pool of one node.
type poolView struct {
	ID, Node, Name, Size, Free, State, StateClass string
}

type volumeView struct {
	ID, Name, Size, Protocol, Primary, PrimaryClass, Epoch, Export string
	// Severity is the worst of the volume's warnings, critical or
	// warning ("" when it has none): problem volumes come first.
	Severity string
	// Failover says when and why the volume last failed over ("" when
	// it never did).
	Failover string
	// ResyncCap is the resync rate cap ("" when there is none).
	ResyncCap string
	// Mount says who mounts the volume (replctl mount's claim): the
	// host, the directory, since when, and whether it follows the
	// primary ("" when nobody does).
	Mount    string
	Replicas []replicaView
	// Paths are the multipath paths of each node that has several.
	Paths []pathGroup
	IO    volumeIO
}

type pathGroup struct {
	ID, Node string
	Paths    []pathView
}

type replicaView struct {
	ID, Node, Role, Disk, DiskClass, Replication, ReplicationClass, Raft, RaftClass string
	OutOfSync, LagBytes, LagSeconds, Reason, ReasonCode                             string
	Unreachable                                                                     bool
	// Problem: a warning names this replica, or its state is bad.
	Problem bool
	// Resync and Verify are set while one runs; VerifyResult after one;
	// LastResync describes the last resync that finished.
	Resync, Verify           *progressView
	VerifyResult, LastResync string
	// Scrub is set while a scrub runs or is paused on the replica;
	// Unrecoverable names the blocks no replica holds good.
	Scrub         *progressView
	Unrecoverable string
}

// progressView is a bar with its figures.
type progressView struct {
	Percent                  float64
	PercentText, Done, Total string
	Rate, ETA, Class, Title  string
}

type pathView struct {
	ID, Path, State, StateClass, Group, IOs, Bytes, Errors, InFlight string
	P50, P99, Since, Note                                            string
}

type eventView struct {
	ID, Time, TimeFull, Node, Volume, Kind, Class, Message, Change, Reason string
}

// buildPage is the page's model for in.
func buildPage(in pageInput) pageView {
	st := in.Status
	if st == nil {
		st = &transport.ClusterStatus{}
	}
	pv := pageView{
		From: st.From, AsOf: in.Now.Format("15:04:05"), AsOfFull: in.Now.Format(time.RFC3339),
	}
	pv.Cluster = buildCluster(st)
	for _, p := range st.Pools {
		v := poolView{ID: elementID("pool", p.Node, p.Name), Node: p.Node, Name: p.Name,
			Size: humanBytes(int64(p.Size)), Free: humanBytes(int64(p.Free)), State: "ok", StateClass: classOK}
		if p.State != "" {
			v.State, v.StateClass = p.State, classWarn
		}
		pv.Pools = append(pv.Pools, v)
	}
	for _, n := range st.Nodes {
		pv.Nodes = append(pv.Nodes, buildNode(st, n))
	}
	pv.Topology = buildTopology(st)
	pv.Warnings = healthWarnings(st)
	if in.StatusError != "" {
		pv.Warnings = append([]Warning{{ID: "warning-status", Severity: severityCritical,
			Text: "This node could not assemble the cluster's status: what follows may be stale.", Detail: in.StatusError}}, pv.Warnings...)
	}
	for i := range st.Volumes {
		pv.Volumes = append(pv.Volumes, buildVolume(&st.Volumes[i], in.IO[st.Volumes[i].Name], pv.Warnings))
	}
	// Problem volumes first, the critical ones at the top (drbdmon's
	// order); otherwise the status's order.
	slices.SortStableFunc(pv.Volumes, func(a, b volumeView) int {
		return problemRank(a.Severity) - problemRank(b.Severity)
	})
	for _, e := range in.Events {
		pv.Events = append(pv.Events, buildEvent(e))
	}
	pv.Title = pageTitle(st.From, pv.Warnings)
	return pv
}

func pageTitle(from string, ws []Warning) string {
	serious := 0
	for _, w := range ws {
		if w.Severity != severityInfo {
			serious++
		}
	}
	switch serious {
	case 0:
		return "replvol " + from + ": healthy"
	case 1:
		return "replvol " + from + ": 1 warning"
	}
	return fmt.Sprintf("replvol %s: %d warnings", from, serious)
}

func buildCluster(st *transport.ClusterStatus) clusterView {
	c := st.Cluster
	cv := clusterView{Leader: orNone(c.Leader), Failover: orNone(c.Failover), Reason: c.Reason,
		Voters: strings.Join(c.Voters, ", ")}
	switch {
	case len(c.Voters) == 0:
		cv.Quorum, cv.QuorumClass, cv.Voters = "no raft", classIdle, "none"
	case c.Quorum:
		cv.Quorum, cv.QuorumClass = "yes", classOK
	case c.Electing:
		cv.Quorum, cv.QuorumClass = "electing", classWarn
	default:
		cv.Quorum, cv.QuorumClass = "NO", classBad
	}
	cv.FailoverClass = classIdle
	if c.Failover == "auto" {
		cv.FailoverClass = classOK
	}
	var witnesses []string
	for _, n := range st.Nodes {
		if n.Role == "witness" {
			witnesses = append(witnesses, n.Name)
		}
	}
	cv.Witnesses = orNone(strings.Join(witnesses, ", "))
	return cv
}

func buildNode(st *transport.ClusterStatus, n transport.NodeInfo) nodeView {
	state := nodeState(n)
	nv := nodeView{
		ID: elementID("node", n.Name), Name: n.Name, Role: orDefault(n.Role, "data"),
		State: state, StateClass: stateClass(state),
		Control: n.Control, Replication: n.Replication, NBD: n.NBD, Error: n.Error, Version: n.Version,
		Leader: n.Name == st.Cluster.Leader, Self: n.Name == st.From,
	}
	if fr := n.FailedReload; fr != nil {
		nv.Reload = fmt.Sprintf("last reload failed at %s: %s does not load", fr.At.UTC().Format("15:04:05 UTC"), fr.File)
	}
	return nv
}

// nodeState is gossip's word for a node when there is one, else whether
// it answered.
func nodeState(n transport.NodeInfo) string {
	switch {
	case n.Membership != "" && !(n.Membership == "alive" && !n.Alive):
		return n.Membership
	case n.Alive:
		return "alive"
	}
	return "unreachable"
}

// problemRank orders volumes by their worst warning: critical, warning,
// then the others.
func problemRank(severity string) int {
	switch severity {
	case severityCritical:
		return 0
	case severityWarning:
		return 1
	}
	return 2
}

// concerns says whether w is about node's replica of volume: it names
// both, or it names the node for every volume (the node is down).
func concerns(w *Warning, volume, node string) bool {
	return w.Node == node && (w.Volume == volume || w.Kind == transport.WarningNodeDown)
}

// volumeSeverity is the worst severity (critical or warning) of the
// warnings about v or one of its replicas; "" when there is none.
func volumeSeverity(v *transport.VolumeStatus, ws []Warning) string {
	worst := ""
	for i := range ws {
		w := &ws[i]
		if w.Severity == severityInfo {
			continue
		}
		about := w.Volume == v.Name
		if w.Kind == transport.WarningNodeDown {
			// A node down: every replica it holds is.
			about = v.Replica(w.Node) != nil
		}
		if about && (worst == "" || severityRank(w.Severity) < severityRank(worst)) {
			worst = w.Severity
		}
	}
	return worst
}

// failoverLine says when and why volume last failed over.
func failoverLine(volume string, f *transport.Failover) string {
	line := fmt.Sprintf("%s failed over %s → %s at %s (epoch %d)", volume, orDefault(f.From, "?"), f.To, f.At.UTC().Format("2006-01-02 15:04:05 UTC"), f.Epoch)
	if f.Reason != "" {
		line += ": " + f.Reason
	}
	return line
}

func buildVolume(v *transport.VolumeStatus, io volumeIO, ws []Warning) volumeView {
	vv := volumeView{
		ID: elementID("vol", v.Name), Name: v.Name, Size: humanBytes(v.Size), Protocol: v.Protocol,
		Primary: orNone(v.Primary), Epoch: strconv.FormatUint(v.Epoch, 10), Export: v.NBDURI, IO: io,
		Severity: volumeSeverity(v, ws),
	}
	if v.LastFailover != nil {
		vv.Failover = failoverLine(v.Name, v.LastFailover)
	}
	if v.ResyncRate > 0 {
		vv.ResyncCap = humanBytes(v.ResyncRate) + "/s"
	}
	if m := v.Mount; m != nil {
		vv.Mount = fmt.Sprintf("mounted on host %s at %s since %s, %d NBD connection(s) open", m.Holder.Host, m.Holder.Dir,
			m.Since.UTC().Format("2006-01-02 15:04:05 UTC"), m.Connections)
		if m.Holder.Follows {
			vv.Mount += "; it follows the primary"
		}
	}
	vv.PrimaryClass = classOK
	if v.NBDURI == "" {
		vv.PrimaryClass = classBad
	}
	for i := range v.Replicas {
		r := &v.Replicas[i]
		rv := buildReplica(v, r)
		for j := range ws {
			rv.Problem = rv.Problem || (ws[j].Severity != severityInfo && concerns(&ws[j], v.Name, r.Node))
		}
		vv.Replicas = append(vv.Replicas, rv)
		if len(r.Paths) == 0 {
			continue
		}
		g := pathGroup{ID: elementID("paths", v.Name, r.Node), Node: r.Node}
		for _, p := range r.Paths {
			g.Paths = append(g.Paths, buildPath(v.Name, r.Node, p))
		}
		vv.Paths = append(vv.Paths, g)
	}
	return vv
}

func buildReplica(v *transport.VolumeStatus, r *transport.ReplicaStatus) replicaView {
	rv := replicaView{
		ID: elementID("replica", v.Name, r.Node), Node: r.Node, Role: r.Role,
		Disk: r.Disk, DiskClass: stateClass(r.Disk),
		Replication: r.Replication, ReplicationClass: stateClass(r.Replication),
		Raft: orDefault(r.Raft, "—"), RaftClass: stateClass(r.Raft),
		OutOfSync: humanBytes(r.OutOfSyncBytes), LagBytes: humanBytes(r.LagBytes), LagSeconds: humanSeconds(r.LagSeconds),
		Reason: r.Reason, ReasonCode: r.ReasonCode, Unreachable: !r.Reachable,
	}
	// A primary's replication is its peers' worst: their rows show it.
	rv.Problem = !r.Reachable || rv.DiskClass == classBad || (rv.ReplicationClass == classBad && r.Role != transport.RolePrimary)
	// The primary's replication is its peers' worst: the peers' rows
	// carry their resyncs.
	if r.ResyncTotalBytes > 0 || (transport.Syncing(r.Replication) && r.Role != transport.RolePrimary) {
		rv.Resync = resyncProgress(r)
	}
	switch {
	case r.VerifyTotalBytes > 0 && (r.VerifyDoneBytes < r.VerifyTotalBytes || transport.Verifying(r.Replication)):
		rv.Verify = bar(r.VerifyDoneBytes, r.VerifyTotalBytes, r.VerifyRate, classWarn)
		if eta, ok := etaAt(r.VerifyTotalBytes-r.VerifyDoneBytes, r.VerifyRate); ok {
			rv.Verify.ETA = humanDuration(eta)
		}
		rv.Verify.Title = fmt.Sprintf("verify: %s differ so far", humanBytes(r.VerifyFoundBytes))
	case r.VerifyTotalBytes > 0:
		rv.VerifyResult = fmt.Sprintf("last verify: %s of %s differ", humanBytes(r.VerifyFoundBytes), humanBytes(r.VerifyTotalBytes))
	}
	if in := r.Integrity; in != nil && r.Reachable {
		if in.UnrecoverableBlocks > 0 {
			rv.Problem = true
			rv.Unrecoverable = fmt.Sprintf("%d blocks unrecoverable", in.UnrecoverableBlocks)
		}
		rv.Scrub = scrubProgress(in.Scrub)
	}
	if rv.Resync == nil && !r.LastResyncEnded.IsZero() {
		rv.LastResync = fmt.Sprintf("last resync: %s in %s at %s", humanBytes(r.LastResyncBytes), humanSeconds(r.LastResyncSeconds), r.LastResyncEnded.UTC().Format("15:04:05 UTC"))
	}
	return rv
}

func resyncProgress(r *transport.ReplicaStatus) *progressView {
	p := bar(r.ResyncDoneBytes, r.ResyncTotalBytes, r.ResyncRate, classWarn)
	if eta, ok := resyncETA(r); ok {
		p.ETA = humanDuration(eta)
	}
	if transport.SyncPaused(r.Replication) {
		p.Class, p.ETA = classIdle, "paused"
	}
	p.Title = fmt.Sprintf("resync %s of %s", p.Done, p.Total)
	return p
}

// scrubProgress is a replica's scrub bar: percent and ETA while it runs,
// "paused" while paused; nil when idle.
func scrubProgress(s transport.ScrubSummary) *progressView {
	var p *progressView
	switch s.State {
	case "running":
		p = &progressView{Class: classWarn, ETA: "—", Rate: "—"}
		if s.ETASeconds > 0 {
			p.ETA = humanDuration(time.Duration(s.ETASeconds * float64(time.Second)))
		}
	case "paused":
		p = &progressView{Class: classIdle, ETA: "paused", Rate: "—"}
	default:
		return nil
	}
	pct := math.Min(100, math.Max(0, s.Percent))
	p.Percent, p.PercentText = math.Round(pct*10)/10, formatPercent(pct)
	p.Title = "scrub: reads the whole disk and repairs bad blocks from a replica"
	if s.Build {
		p.Title = "checksums building: the scrub that stores the checksum of every block written before checksums were turned on; blocks past it are not verified yet"
	}
	return p
}

// bar is a progress bar for done of total bytes at rate bytes/s.
func bar(done, total, rate int64, class string) *progressView {
	pct := 0.0
	if total > 0 {
		pct = math.Min(100, math.Max(0, 100*float64(done)/float64(total)))
	}
	p := &progressView{Percent: math.Round(pct*10) / 10, PercentText: formatPercent(pct),
		Done: humanBytes(done), Total: humanBytes(total), Class: class, ETA: "—", Rate: "—"}
	if rate > 0 {
		p.Rate = humanRate(float64(rate))
	}
	return p
}

// resyncETA is the time the resync still needs at its average speed.
func resyncETA(r *transport.ReplicaStatus) (time.Duration, bool) {
	return etaAt(r.ResyncTotalBytes-r.ResyncDoneBytes, r.ResyncRate)
}

// etaAt is how long left bytes take at rate bytes per second.
func etaAt(left, rate int64) (time.Duration, bool) {
	if rate <= 0 || left <= 0 {
		return 0, false
	}
	return time.Duration(float64(left) / float64(rate) * float64(time.Second)), true
}

func buildPath(volume, node string, p transport.PathStatus) pathView {
	note := p.Reason
	if p.Preferred {
		note = human.Join("preferred", note)
	}
	return pathView{
		ID: elementID("path", volume, node, p.Path), Path: p.Path,
		State: p.State, StateClass: stateClass(p.State), Group: orDefault(p.Group, "—"),
		IOs: humanCount(float64(p.IOs)), Bytes: humanBytes(int64(p.Bytes)), Errors: strconv.FormatUint(p.Errors, 10),
		InFlight: strconv.Itoa(p.InFlight), P50: micros(p.LatencyP50Micros), P99: micros(p.LatencyP99Micros),
		Since: humanSeconds(p.SinceChangeSeconds), Note: note,
	}
}

func buildEvent(e transport.Event) eventView {
	ev := eventView{
		ID:   elementID("event", e.Node, strconv.FormatUint(e.Seq, 10)),
		Time: e.Time.Local().Format("15:04:05"), TimeFull: e.Time.Format(time.RFC3339Nano),
		Node: e.Node, Volume: e.Volume, Kind: e.Kind, Class: eventClass(e.Kind), Message: e.Message, Reason: e.Reason,
	}
	switch {
	case e.Old != "" && e.New != "":
		ev.Change = e.Old + " → " + e.New
	case e.New != "":
		ev.Change = "→ " + e.New
	case e.Old != "":
		ev.Change = e.Old + " → ?"
	}
	if ev.Change != "" && e.Peer != "" {
		ev.Change = e.Peer + ": " + ev.Change
	}
	if e.Seq == 0 {
		ev.ID = elementID("event", e.Node, strconv.FormatInt(e.Time.UnixNano(), 10))
	}
	return ev
}

// Colour classes of a state.
const (
	classOK   = "ok"
	classWarn = "warn"
	classBad  = "bad"
	classIdle = "idle"
)

// stateClass colours a state: ok (green) only for a state that needs
// nothing; a Diskless or StandAlone replica is never green.
func stateClass(s string) string {
	switch s {
	case transport.DiskUpToDate, transport.ReplConnected, "alive", transport.PathActive, "yes":
		return classOK
	case transport.ReplSyncSource, transport.ReplSyncTarget, transport.ReplVerifyS, transport.ReplVerifyT, transport.ReplBehind, transport.ReplAhead,
		transport.DiskInconsistent, transport.DiskConsistent, transport.DiskAttaching, "suspect", transport.ReplConnecting, transport.ReplPausedSyncS, transport.ReplPausedSyncT:
		return classWarn
	case transport.ReplStandAlone, transport.DiskOutdated, transport.DiskDiskless, transport.DiskFailed, "dead", "unreachable", transport.PathFail, "NO":
		return classBad
	}
	return classIdle
}

func eventClass(kind string) string {
	switch kind {
	case "split-brain", "fenced", "detached", "state-write-failed", "apply-failed", "hook-failed",
		"unrelated-data", "promotion-refused", "path-fail", "disconnected", "refused", "peer-lost", "reload-failed",
		"block-unrecoverable", "scrub-stopped":
		return classBad
	case "connected", "resync-done", "attached", "pull-done", "verify-done", "split-brain-resolved", "path-restore", "reloaded",
		"scrub-finished":
		return classOK
	}
	return classIdle
}

func orNone(s string) string { return orDefault(s, "none") }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// sparkView is a sparkline: an SVG polyline's points in a box of
// sparkWidth × sparkHeight, the latest value and the window's maximum.
type sparkView struct {
	Points, Latest, Max string
	Empty               bool
}

const (
	sparkWidth  = 160
	sparkHeight = 28
	// sparkStep is the pixels between two points of a sparkline.
	sparkStep = 2
	// ioWindow is how far back the sparklines reach.
	ioWindow = 5 * time.Minute
)

// ioSample is one measurement of a volume's IO rates.
type ioSample struct {
	At         time.Time
	IOPS, Rate float64 // operations and bytes per second
}

// sparkline draws value over the samples of the window ending at now;
// format prints a value.
func sparkline(samples []ioSample, now time.Time, value func(ioSample) float64, format func(float64) string) sparkView {
	start := now.Add(-ioWindow)
	i := 0
	for i < len(samples) && samples[i].At.Before(start) {
		i++
	}
	samples = samples[i:]
	if len(samples) == 0 {
		return sparkView{Empty: true, Latest: "—", Max: "—"}
	}
	peak := 0.0
	for _, s := range samples {
		peak = math.Max(peak, value(s))
	}
	// One point per sparkStep pixels, the highest value of its samples:
	// a burst never disappears between two points.
	var b strings.Builder
	bucket, high := -1, 0.0
	flush := func() {
		if bucket < 0 {
			return
		}
		y := float64(sparkHeight - 1)
		if peak > 0 {
			y = 1 + float64(sparkHeight-2)*(1-high/peak)
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(bucket * sparkStep))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	for _, s := range samples {
		x := int(float64(sparkWidth) * float64(s.At.Sub(start)) / float64(ioWindow))
		if x/sparkStep != bucket {
			flush()
			bucket, high = x/sparkStep, 0
		}
		high = math.Max(high, value(s))
	}
	flush()
	return sparkView{Points: b.String(), Latest: format(value(samples[len(samples)-1])), Max: format(peak)}
}

// drawIO is a volume's two sparklines.
func drawIO(samples []ioSample, now time.Time) volumeIO {
	return volumeIO{
		IOPS:       sparkline(samples, now, func(s ioSample) float64 { return s.IOPS }, humanCount),
		Throughput: sparkline(samples, now, func(s ioSample) float64 { return s.Rate }, humanRate),
	}
}

// sortEvents orders events newest first.
func sortEvents(es []transport.Event) {
	slices.SortStableFunc(es, func(a, b transport.Event) int { return b.Time.Compare(a.Time) })
}
