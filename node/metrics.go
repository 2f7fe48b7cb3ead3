package node

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// The node's /metrics: one collector on the node's own registry (never the
// global one), reading at scrape time what replctl status reads. Three
// views:
//
//   - this node's own (fresh, cheap): its volumes' IO counters, its
//     replication links (peer_*), its paths, its NBD server, its events;
//   - the cluster's as this node assembles it (replica_*, node_reachable,
//     volume_exported): every node serves every replica's state, so an
//     alert works whichever node Prometheus reaches. Assembling it asks
//     every node for its status, so it is cached for clusterViewTTL and a
//     scrape waits at most clusterViewWait for a new one (it then serves
//     the last one; cluster_status_age_seconds says how old it is);
//   - raft and gossip (cluster_*), read locally, with raft addresses only.
//
// The label node is always the node the value describes: this node for its
// own series, the replica's node for replica_*, the member for
// cluster_member_state. Series of the whole cluster have no node label;
// Prometheus's instance label says which node reported them.

// Timings of the cluster view.
const (
	// clusterViewTTL: a scrape within it reuses the last cluster view.
	clusterViewTTL = time.Second
	// clusterViewWait bounds how long a scrape waits for a new cluster view.
	clusterViewWait = time.Second
	// clusterViewTimeout bounds one assembly of the cluster view.
	clusterViewTimeout = 2 * time.Second
)

// stateValues are the values of each state label, so that a state set
// always has the same series (0 for the states a replica is not in, 1 for
// the one it is in).
var stateValues = struct {
	role, disk, replication, raft, path, member []string
}{
	role: []string{string(replication.Primary), string(replication.Secondary), "Unknown"},
	disk: []string{
		string(replication.Diskless), string(replication.Attaching), string(replication.Inconsistent),
		string(replication.Outdated), string(replication.Consistent), string(replication.UpToDate),
		string(replication.Failed), dUnknown,
	},
	replication: []string{
		string(replication.StandAlone), string(replication.Connecting), string(replication.Connected),
		string(replication.SyncSource), string(replication.SyncTarget),
		string(replication.PausedSyncS), string(replication.PausedSyncT),
		string(replication.VerifyS), string(replication.VerifyT),
		string(replication.Ahead), string(replication.Behind), "Unknown",
	},
	raft:   []string{string(replication.UpToDate), string(replication.Outdated)},
	path:   []string{multipath.Active.String(), multipath.Passive.String(), multipath.Fail.String()},
	member: []string{string(cluster.Alive), string(cluster.Dead), string(cluster.Left), string(cluster.Unknown)},
}

// metricFamily is one family: its description and its type.
type metricFamily struct {
	desc *prometheus.Desc
	kind prometheus.ValueType
}

func (m metricFamily) send(ch chan<- prometheus.Metric, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(m.desc, m.kind, v, labels...)
}

// stateSet sends one series per value of states (the state label comes
// after labels): 1 for current, 0 for the others. A current value missing
// from states is sent too, so that a new state is never hidden.
func (m metricFamily) stateSet(ch chan<- prometheus.Metric, states []string, current string, labels ...string) {
	for _, s := range states {
		m.send(ch, gaugeBool(s == current), append(labels, s)...)
	}
	if current != "" && !slices.Contains(states, current) {
		m.send(ch, 1, append(labels, current)...)
	}
}

func gaugeBool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collector is the node's prometheus.Collector.
type collector struct {
	n       *Node
	all     []*prometheus.Desc
	status  *statusCache
	events  *eventCounts
	runtime []prometheus.Collector // the Go runtime's and the process's

	// This node's volumes.
	volPrimary, volServing, volEpoch, volSize, volLocalMissing, volClients metricFamily
	reads, readBytes, writes, writeBytes, flushes, resynced                metricFamily
	alExtents, alHits, alMisses, alTransactions, alEvictions               metricFamily
	blocksRepaired, blocksUnrecoverable, badBlocks, scrubProgress          metricFamily
	requestDuration                                                        *prometheus.Desc

	// This node's replication links.
	peerConnected, peerInSync, peerOutOfSync                      metricFamily
	peerResyncDone, peerResyncTotal, peerResyncRate               metricFamily
	peerResyncSent, peerResyncSkipped                             metricFamily
	peerVerifyDone, peerVerifyTotal, peerVerifyFound              metricFamily
	peerLagBytes, peerLagSeconds                                  metricFamily
	peerFrames, peerEntries, peerPendingReads                     metricFamily
	pathState, pathIOs, pathBytes, pathErrors, pathInFlight       metricFamily
	pathP50, pathP99, pathChanged                                 metricFamily
	nbdOpen, nbdTransmitting, nbdAccepted, nbdFailedHandshakes    metricFamily
	nbdRefused, nbdStalled, nbdRequests, nbdErrors                metricFamily
	nbdReadBytes, nbdWrittenBytes, nbdInFlight, nbdPeakInFlight   metricFamily
	nbdWaiting, nbdBudget, nbdBudgetHeld, nbdPooled, nbdMaxPooled metricFamily
	nbdMaxOpen, nbdRefusedAtAccept                                metricFamily
	nbdTLS, nbdTLSFailures, nbdTLSRequired                        metricFamily
	eventsTotal                                                   metricFamily

	// Every port's connection limits (package connlimit).
	connOpen, connHandshakes, connRefused, connClosed metricFamily

	// The cluster view.
	replicaRole, replicaDisk, replicaReplication, replicaRaft metricFamily
	replicaReachable, replicaOutOfSync, replicaProgress       metricFamily
	replicaLagBytes, replicaLagSeconds, replicaReason         metricFamily
	volExported, nodeReachable, statusAge                     metricFamily

	// Raft and gossip.
	failoverAuto, quorum, voters, isLeader, memberState metricFamily
}

// newCollector builds the node's collector. It counts the node's events
// from now on, until the node stops; call it once, from Start.
func newCollector(n *Node) *collector {
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{
		n:      n,
		status: newStatusCache(ctx, n.clock, func(ctx context.Context) (*transport.ClusterStatus, error) { return n.clusterStatus(ctx, 0) }),
		events: &eventCounts{byKind: map[string]uint64{}},
		runtime: []prometheus.Collector{
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		},
	}
	c.define()
	n.serve(func() error {
		defer cancel()
		c.events.count(n)
		return nil
	})
	return c
}

// define describes every replvol_ family.
func (c *collector) define() {
	g := func(name, help string, labels ...string) metricFamily {
		return c.family(prometheus.GaugeValue, name, help, labels)
	}
	k := func(name, help string, labels ...string) metricFamily {
		return c.family(prometheus.CounterValue, name, help, labels)
	}
	vol := []string{"volume", "node"}
	linkLabels := []string{"volume", "node", "peer"}
	path := []string{"volume", "node", "path"}
	rep := []string{"volume", "node"}
	self := []string{"node"}

	c.volPrimary = g("volume_primary", "1 if this node is the volume's primary.", vol...)
	c.volServing = g("volume_serving", "1 if this node is the volume's primary and serves IO (not waiting for a peer, fenced or in a switchover).", vol...)
	c.volEpoch = g("volume_epoch", "The volume's epoch as this node holds it (each primary has its own).", vol...)
	c.volSize = g("volume_size_bytes", "The volume's size.", "volume")
	c.volLocalMissing = g("volume_local_missing_bytes", "Bytes this node's own disk misses (written while it was detached), to be copied back from a peer.", vol...)
	c.volClients = g("volume_nbd_clients", "NBD clients connected to the volume's export on this node.", vol...)
	c.reads = k("reads_total", "Read requests served by this node.", vol...)
	c.readBytes = k("read_bytes_total", "Bytes read by clients from this node.", vol...)
	c.writes = k("writes_total", "Write requests served by this node.", vol...)
	c.writeBytes = k("write_bytes_total", "Bytes written by clients through this node.", vol...)
	c.flushes = k("flushes_total", "Flush requests served by this node.", vol...)
	c.resynced = k("resynced_bytes_total", "Bytes this node received by resync since it started.", vol...)
	c.requestDuration = c.histogram("request_duration_seconds", "Latency of the requests this node served, from admission to completion, by operation.", "volume", "node", "op")
	c.alExtents = g("activity_log_extents", "Extents the activity log holds.", vol...)
	c.alHits = k("activity_log_hits_total", "Writes to an extent already in the activity log (no metadata IO).", vol...)
	c.alMisses = k("activity_log_misses_total", "Writes to an extent not in the activity log.", vol...)
	c.alTransactions = k("activity_log_transactions_total", "Activity log transactions written (one metadata write each).", vol...)
	c.alEvictions = k("activity_log_evictions_total", "Extents evicted from the activity log.", vol...)
	c.blocksRepaired = k("blocks_repaired_total", "4 KiB blocks a read found bad on this node's disk, by cause (checksum: they did not match their checksum; read-error: the disk could not read them), and rewrote with a peer's good copy.", "volume", "node", "cause")
	c.scrubProgress = g("scrub_progress_ratio", "How far the volume's scrub on this node got (replctl scrub): the running or paused scrub's share of the disk read, 1 once one finished, 0 before any.", vol...)
	c.blocksUnrecoverable = g("blocks_unrecoverable", "4 KiB blocks a read or scrub found bad on this node's disk with no good copy on any peer, and that no write has covered since (a restart keeps them, in the bad-block list while it has room): reads of them fail with EIO (event block-unrecoverable names them).", vol...)
	c.badBlocks = g("bad_blocks", "4 KiB blocks of this node's disk on its bad-block list: their good copy could not be written over them, so they are read from a peer in sync; the disk is detached when the list would pass bad_blocks_max (docs/integrity.md).", vol...)

	c.peerConnected = g("peer_connected", "1 while a replication session with the peer exists (it may still be resyncing: see peer_in_sync). A primary has a link to each peer, a secondary to its primary.", linkLabels...)
	c.peerInSync = g("peer_in_sync", "1 while the link is connected, the peer's disk UpToDate and nothing is marked out of sync for it.", linkLabels...)
	c.peerOutOfSync = g("peer_out_of_sync_bytes", "Bytes this primary has marked out of sync for the peer (its bitmap).", linkLabels...)
	c.peerResyncDone = g("peer_resync_done_bytes", "Bytes of the running resync done (0 when none runs).", linkLabels...)
	c.peerResyncTotal = g("peer_resync_total_bytes", "Bytes the running resync covers (0 when none runs).", linkLabels...)
	c.peerResyncRate = g("peer_resync_bytes_per_second", "Average speed of the running resync.", linkLabels...)
	c.peerResyncSent = k("peer_resync_sent_bytes_total", "Resync bytes sent to the peer.", linkLabels...)
	c.peerResyncSkipped = k("peer_resync_skipped_bytes_total", "Resync bytes not sent because their checksums matched (csums).", linkLabels...)
	c.peerVerifyDone = g("peer_verify_done_bytes", "Bytes the last online verify of the peer compared so far.", linkLabels...)
	c.peerVerifyTotal = g("peer_verify_total_bytes", "Bytes the last online verify of the peer covers.", linkLabels...)
	c.peerVerifyFound = g("peer_verify_found_bytes", "Bytes the last online verify found differing (marked out of sync).", linkLabels...)
	c.peerLagBytes = g("peer_lag_bytes", "Bytes clients were told are written that the peer does not hold yet (protocols A and B, and blocks marked while Ahead).", linkLabels...)
	c.peerLagSeconds = g("peer_lag_seconds", "Age of the oldest write the peer does not hold yet.", linkLabels...)
	c.peerFrames = k("peer_frames_sent_total", "Replication frames sent to the peer.", linkLabels...)
	c.peerEntries = k("peer_entries_sent_total", "Replication entries (writes, flushes, resync runs) sent to the peer.", linkLabels...)
	c.peerPendingReads = g("peer_pending_reads", "Reads sent to the peer and not answered yet (read balancing, detached disk).", linkLabels...)

	c.pathState = g("path_state", "1 for the path's current state (ACTIVE, PASSIVE or FAIL), 0 for the others.", append(path, "state")...)
	c.pathIOs = k("path_ios_total", "IOs completed on the path, failed ones included.", path...)
	c.pathBytes = k("path_io_bytes_total", "Bytes read and written on the path.", path...)
	c.pathErrors = k("path_errors_total", "IOs that failed on the path.", path...)
	c.pathInFlight = g("path_in_flight_ios", "IOs running on the path now.", path...)
	c.pathP50 = g("path_latency_p50_seconds", "Median IO latency of the path since the node started (an upper bound).", path...)
	c.pathP99 = g("path_latency_p99_seconds", "99th percentile IO latency of the path since the node started (an upper bound).", path...)
	c.pathChanged = g("path_last_change_timestamp_seconds", "When the path last changed state (Unix time).", path...)

	c.nbdOpen = g("nbd_open_connections", "NBD connections accepted and not yet closed.", self...)
	c.nbdTransmitting = g("nbd_transmitting_connections", "NBD connections past the handshake.", self...)
	c.nbdAccepted = k("nbd_accepted_connections_total", "NBD connections accepted.", self...)
	c.nbdFailedHandshakes = k("nbd_failed_handshakes_total", "NBD connections closed before the transmission phase.", self...)
	c.nbdRefused = k("nbd_refused_connections_total", "NBD handshakes refused because the connection limit was reached.", self...)
	c.nbdStalled = k("nbd_stalled_connections_total", "NBD connections closed because their client stalled.", self...)
	c.nbdMaxOpen = g("nbd_max_open_connections", "The most NBD connections open at once, in any phase.", self...)
	c.nbdRefusedAtAccept = k("nbd_refused_at_accept_total", "NBD connections closed as they were accepted because nbd_max_open_connections were open.", self...)
	c.nbdTLS = k("nbd_tls_connections_total", "NBD connections that started TLS (NBD_OPT_STARTTLS).", self...)
	c.nbdTLSFailures = k("nbd_tls_handshake_failures_total", "NBD TLS handshakes that failed: no client certificate, one not of the cluster CA or of another role, a timeout.", self...)
	c.nbdTLSRequired = k("nbd_tls_required_refusals_total", "NBD options refused because TLS is required and the client had not started it.", self...)
	port := []string{"node", "port"}
	c.connOpen = g("connections_open", "Connections open on the port, in every phase.", port...)
	c.connHandshakes = g("connections_handshaking", "Connections on the port still in their handshake (TLS, an NBD negotiation).", port...)
	c.connRefused = k("connections_refused_total", "Connections the port refused as they were accepted, by reason: source-open and source-handshakes (the address's share was taken), port-full and handshakes-full (the port's).", "node", "port", "reason")
	c.connClosed = k("connections_closed_total", "Connections the port closed in their handshake, by reason: evicted (to make room for a new one) and slow-handshake (past its deadline).", "node", "port", "reason")
	c.nbdRequests = k("nbd_requests_total", "NBD requests received, by command.", "node", "op")
	c.nbdErrors = k("nbd_request_errors_total", "NBD error replies sent, by command.", "node", "op")
	c.nbdReadBytes = k("nbd_read_bytes_total", "READ payload sent to NBD clients.", self...)
	c.nbdWrittenBytes = k("nbd_written_bytes_total", "WRITE payload received from NBD clients.", self...)
	c.nbdInFlight = g("nbd_in_flight_bytes", "Bytes the NBD requests of all connections hold now.", self...)
	c.nbdPeakInFlight = g("nbd_peak_in_flight_bytes", "The most nbd_in_flight_bytes has been since the node started.", self...)
	c.nbdWaiting = g("nbd_waiting_requests", "NBD requests waiting for memory budget.", self...)
	c.nbdBudget = g("nbd_node_budget_bytes", "The NBD server's node-wide memory budget.", self...)
	c.nbdBudgetHeld = g("nbd_node_budget_held_bytes", "The part of nbd_in_flight_bytes charged to the node budget.", self...)
	c.nbdPooled = g("nbd_pooled_buffer_bytes", "Free NBD buffers kept for reuse.", self...)
	c.nbdMaxPooled = g("nbd_max_pooled_buffer_bytes", "The most free NBD buffer bytes kept for reuse.", self...)
	c.eventsTotal = k("events_total", "Events this node recorded since it started, by kind.", "kind")

	c.replicaRole = g("replica_role", "1 for the replica's current role, 0 for the others (cluster view).", append(rep, "state")...)
	c.replicaDisk = g("replica_disk_state", "1 for the replica's current disk state, 0 for the others (cluster view).", append(rep, "state")...)
	c.replicaReplication = g("replica_replication_state", "1 for the replica's current replication state, 0 for the others (cluster view).", append(rep, "state")...)
	c.replicaRaft = g("replica_raft_state", "1 for what raft records of the replica (UpToDate: it may be promoted; Outdated), 0 for the other (cluster view).", append(rep, "state")...)
	c.replicaReachable = g("replica_reachable", "1 if the replica's node answered the status round (cluster view).", rep...)
	c.replicaOutOfSync = g("replica_out_of_sync_bytes", "Bytes the primary has marked out of sync for the replica; for the primary, what its own disk misses (cluster view).", rep...)
	c.replicaProgress = g("replica_sync_progress_ratio", "Fraction of the replica in sync: of the running resync, or of the volume (cluster view).", rep...)
	c.replicaLagBytes = g("replica_lag_bytes", "Bytes acknowledged to clients that the replica does not hold yet (cluster view).", rep...)
	c.replicaLagSeconds = g("replica_lag_seconds", "Age of the oldest write the replica does not hold yet (cluster view).", rep...)
	c.replicaReason = g("replica_reason", "1 while a reason keeps the replica from its usual job (split-brain, fenced, detached, ...); absent otherwise (cluster view).", append(rep, "reason")...)
	c.volExported = g("volume_exported", "1 if a primary serves the volume's NBD export (cluster view).", "volume")
	c.nodeReachable = g("node_reachable", "1 if the node's control API answered the status round (cluster view).", self...)
	c.statusAge = g("cluster_status_age_seconds", "Age of the cluster view the replica_* series come from.")

	c.failoverAuto = g("cluster_failover_auto", "1 if failover is automatic (raft, three voters or more).")
	c.quorum = g("cluster_quorum", "1 if a raft leader is in contact with a majority of the voters, as this node sees it.")
	c.voters = g("cluster_voters", "Raft voters in the latest configuration.")
	c.isLeader = g("cluster_is_leader", "1 for the raft leader, 0 for the other voters, as this node sees it.", self...)
	c.memberState = g("cluster_member_state", "1 for what gossip says of the member (alive, dead, left, unknown), 0 for the others.", "node", "state")
}

func (c *collector) family(kind prometheus.ValueType, name, help string, labels []string) metricFamily {
	d := prometheus.NewDesc("replvol_"+name, help, labels, nil)
	c.all = append(c.all, d)
	return metricFamily{desc: d, kind: kind}
}

func (c *collector) histogram(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc("replvol_"+name, help, labels, nil)
	c.all = append(c.all, d)
	return d
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.all {
		ch <- d
	}
	for _, r := range c.runtime {
		r.Describe(ch)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.runtime {
		r.Collect(ch)
	}
	n := c.n
	vols := n.volumes()
	for _, name := range sortedNames(vols) {
		c.collectVolume(ch, vols[name])
	}
	if n.nbd != nil && !n.self.IsWitness() {
		c.collectNBD(ch)
	}
	c.events.collect(ch, c.eventsTotal)
	c.collectAdmissions(ch)
	c.collectRaft(ch)
	if st, at := c.status.get(); st != nil {
		c.collectClusterView(ch, st, at)
	}
}

// collectVolume sends this node's own series of one volume.
func (c *collector) collectVolume(ch chan<- prometheus.Metric, v *Volume) {
	self := v.self
	lv := v.status()
	c.volPrimary.send(ch, gaugeBool(lv.Role == string(replication.Primary)), v.name, self)
	c.volServing.send(ch, gaugeBool(lv.Serving), v.name, self)
	c.volEpoch.send(ch, float64(lv.Epoch), v.name, self)
	c.volSize.send(ch, float64(lv.Size), v.name)
	c.volLocalMissing.send(ch, float64(lv.LocalMissingBytes), v.name, self)
	c.volClients.send(ch, float64(len(v.node.nbdClients(v.name))), v.name, self)
	c.reads.send(ch, float64(lv.Reads), v.name, self)
	c.readBytes.send(ch, float64(lv.ReadBytes), v.name, self)
	c.writes.send(ch, float64(lv.Writes), v.name, self)
	c.writeBytes.send(ch, float64(lv.WriteBytes), v.name, self)
	c.flushes.send(ch, float64(lv.Flushes), v.name, self)
	c.resynced.send(ch, float64(lv.ResyncedBytes), v.name, self)
	v.counters.latency.send(ch, c.requestDuration, v.name, self)
	for cause := range repairCauses {
		c.blocksRepaired.send(ch, float64(v.durable.integ.repaired[cause].Load()), v.name, self, cause.String())
	}
	c.blocksUnrecoverable.send(ch, float64(v.durable.integ.unrecoverable()), v.name, self)
	c.badBlocks.send(ch, float64(v.durable.integ.badBlocks()), v.name, self)
	c.scrubProgress.send(ch, v.scrubProgress(), v.name, self)
	if al := lv.ActivityLog; al != nil {
		c.alExtents.send(ch, float64(al.Extents), v.name, self)
		c.alHits.send(ch, float64(al.Hits), v.name, self)
		c.alMisses.send(ch, float64(al.Misses), v.name, self)
		c.alTransactions.send(ch, float64(al.Transactions), v.name, self)
		c.alEvictions.send(ch, float64(al.Evictions), v.name, self)
	}
	for _, l := range replLinksOf(v, lv) {
		labels := []string{v.name, self, l.peer}
		c.peerConnected.send(ch, gaugeBool(l.connected), labels...)
		c.peerInSync.send(ch, gaugeBool(l.inSync), labels...)
		ps := l.status
		if ps == nil {
			continue // a secondary's link: the primary counts the rest
		}
		c.peerOutOfSync.send(ch, float64(ps.OutOfSyncBytes), labels...)
		c.peerResyncDone.send(ch, float64(ps.ResyncDoneBytes), labels...)
		c.peerResyncTotal.send(ch, float64(ps.ResyncTotalBytes), labels...)
		c.peerResyncRate.send(ch, float64(ps.ResyncRate), labels...)
		c.peerResyncSent.send(ch, float64(ps.ResyncSentBytes), labels...)
		c.peerResyncSkipped.send(ch, float64(ps.ResyncSkippedBytes), labels...)
		c.peerVerifyDone.send(ch, float64(ps.VerifyDoneBytes), labels...)
		c.peerVerifyTotal.send(ch, float64(ps.VerifyTotalBytes), labels...)
		c.peerVerifyFound.send(ch, float64(ps.VerifyFoundBytes), labels...)
		c.peerLagBytes.send(ch, float64(ps.LagBytes), labels...)
		c.peerLagSeconds.send(ch, ps.LagSeconds, labels...)
		c.peerFrames.send(ch, float64(ps.FramesSent), labels...)
		c.peerEntries.send(ch, float64(ps.EntriesSent), labels...)
		c.peerPendingReads.send(ch, float64(l.pendingReads), labels...)
	}
	if v.mp == nil {
		return
	}
	now := v.clock.Now()
	for _, p := range v.mp.Paths() {
		labels := []string{v.name, self, p.Name}
		c.pathState.stateSet(ch, stateValues.path, p.State.String(), labels...)
		c.pathIOs.send(ch, float64(p.IOs), labels...)
		c.pathBytes.send(ch, float64(p.Bytes), labels...)
		c.pathErrors.send(ch, float64(p.Errors), labels...)
		c.pathInFlight.send(ch, float64(p.InFlight), labels...)
		c.pathP50.send(ch, p.LatencyP50.Seconds(), labels...)
		c.pathP99.send(ch, p.LatencyP99.Seconds(), labels...)
		c.pathChanged.send(ch, float64(now.Add(-p.SinceChange).UnixNano())/1e9, labels...)
	}
}

// replLink is one replication link of this node for a volume.
type replLink struct {
	peer              string
	connected, inSync bool
	// status is the primary's view of the peer; nil on a secondary.
	status       *transport.PeerStatus
	pendingReads int64
}

// replLinksOf returns this node's replication links of v: a primary's to each
// peer (lv.Peers), a secondary's to its primary.
func replLinksOf(v *Volume, lv transport.LocalVolume) []replLink {
	v.mu.Lock()
	peers := make(map[string]*peer, len(v.peers.byName))
	for name, p := range v.peers.byName {
		peers[name] = p
	}
	in, primary, disk := v.incoming, v.st.Durable.Primary, v.st.Disk
	v.mu.Unlock()
	if lv.Role == string(replication.Primary) {
		var out []replLink
		for i := range lv.Peers {
			p, ok := peers[lv.Peers[i].Node]
			if !ok {
				continue
			}
			out = append(out, replLink{
				peer: p.name, connected: p.session() != nil, inSync: p.inSync(),
				status: &lv.Peers[i], pendingReads: p.pendingReads.Load(),
			})
		}
		return out
	}
	l := replLink{peer: primary}
	if in != nil {
		l.peer, l.connected = in.From(), true
		l.inSync = in.State() == replication.Connected && disk == replication.UpToDate
	}
	if l.peer == "" || l.peer == v.self {
		return nil
	}
	return []replLink{l}
}

func (c *collector) collectNBD(ch chan<- prometheus.Metric) {
	st := c.n.nbd.Stats()
	self := c.n.name
	c.nbdOpen.send(ch, float64(st.OpenConnections), self)
	c.nbdTransmitting.send(ch, float64(st.TransmittingConnections), self)
	c.nbdAccepted.send(ch, float64(st.AcceptedConnections), self)
	c.nbdFailedHandshakes.send(ch, float64(st.FailedHandshakes), self)
	c.nbdRefused.send(ch, float64(st.RefusedConnections), self)
	c.nbdStalled.send(ch, float64(st.StalledConnections), self)
	c.nbdMaxOpen.send(ch, float64(st.MaxOpenConnections), self)
	c.nbdRefusedAtAccept.send(ch, float64(st.RefusedAtAccept), self)
	c.nbdTLS.send(ch, float64(st.TLSConnections), self)
	c.nbdTLSFailures.send(ch, float64(st.TLSHandshakeFailures), self)
	c.nbdTLSRequired.send(ch, float64(st.TLSRequiredRefusals), self)
	for _, op := range []struct {
		name          string
		requests, err uint64
	}{
		{"read", st.Requests.Read, st.Errors.Read},
		{"write", st.Requests.Write, st.Errors.Write},
		{"flush", st.Requests.Flush, st.Errors.Flush},
		{"trim", st.Requests.Trim, st.Errors.Trim},
		{"write_zeroes", st.Requests.WriteZeroes, st.Errors.WriteZeroes},
		{"disconnect", st.Requests.Disconnect, st.Errors.Disconnect},
		{"other", st.Requests.Other, st.Errors.Other},
	} {
		c.nbdRequests.send(ch, float64(op.requests), self, op.name)
		c.nbdErrors.send(ch, float64(op.err), self, op.name)
	}
	c.nbdReadBytes.send(ch, float64(st.BytesRead), self)
	c.nbdWrittenBytes.send(ch, float64(st.BytesWritten), self)
	c.nbdInFlight.send(ch, float64(st.InFlightBytes), self)
	c.nbdPeakInFlight.send(ch, float64(st.PeakInFlightBytes), self)
	c.nbdWaiting.send(ch, float64(st.WaitingRequests), self)
	c.nbdBudget.send(ch, float64(st.NodeBudgetBytes), self)
	c.nbdBudgetHeld.send(ch, float64(st.NodeBudgetHeld), self)
	c.nbdPooled.send(ch, float64(st.PooledBytes), self)
	c.nbdMaxPooled.send(ch, float64(st.MaxPooledBytes), self)
}

// collectAdmissions sends every port's connection limits' counts.
func (c *collector) collectAdmissions(ch chan<- prometheus.Metric) {
	self := c.n.name
	for _, p := range c.n.admissions() {
		c.connOpen.send(ch, float64(p.stats.Open), self, p.port)
		c.connHandshakes.send(ch, float64(p.stats.Handshakes), self, p.port)
		for _, r := range connlimit.Reasons() {
			family := c.connClosed
			if r.Refusal() {
				family = c.connRefused
			}
			family.send(ch, float64(p.stats.Count(r)), self, p.port, r.String())
		}
	}
}

// collectRaft sends raft's and gossip's view, read locally.
func (c *collector) collectRaft(ch chan<- prometheus.Metric) {
	n := c.n
	info, membership := n.clusterInfo()
	c.failoverAuto.send(ch, gaugeBool(info.Failover == "auto"))
	if n.cl == nil {
		return // no raft: no leader, quorum or members to speak of
	}
	c.quorum.send(ch, gaugeBool(info.Quorum))
	c.voters.send(ch, float64(len(info.Voters)))
	voters := info.Voters
	if info.Leader != "" && !slices.Contains(voters, info.Leader) {
		voters = append(slices.Clone(voters), info.Leader)
	}
	for _, v := range voters {
		c.isLeader.send(ch, gaugeBool(v == info.Leader), v)
	}
	for _, nc := range n.config().Nodes {
		state := membership[nc.Name]
		if state == "" {
			state = string(cluster.Unknown)
		}
		c.memberState.stateSet(ch, stateValues.member, state, nc.Name)
	}
}

// collectClusterView sends every replica's state as st, assembled at at,
// says.
func (c *collector) collectClusterView(ch chan<- prometheus.Metric, st *transport.ClusterStatus, at time.Time) {
	c.statusAge.send(ch, c.n.clock.Since(at).Seconds())
	for _, ni := range st.Nodes {
		c.nodeReachable.send(ch, gaugeBool(ni.Alive), ni.Name)
	}
	raft := c.n.cl != nil
	for _, vs := range st.Volumes {
		c.volExported.send(ch, gaugeBool(vs.NBDURI != ""), vs.Name)
		for _, rs := range vs.Replicas {
			labels := []string{vs.Name, rs.Node}
			c.replicaRole.stateSet(ch, stateValues.role, rs.Role, labels...)
			c.replicaDisk.stateSet(ch, stateValues.disk, rs.Disk, labels...)
			c.replicaReplication.stateSet(ch, stateValues.replication, rs.Replication, labels...)
			if raft {
				c.replicaRaft.stateSet(ch, stateValues.raft, rs.Raft, labels...)
			}
			c.replicaReachable.send(ch, gaugeBool(rs.Reachable), labels...)
			c.replicaOutOfSync.send(ch, float64(rs.OutOfSyncBytes), labels...)
			c.replicaProgress.send(ch, rs.SyncProgress/100, labels...)
			c.replicaLagBytes.send(ch, float64(rs.LagBytes), labels...)
			c.replicaLagSeconds.send(ch, rs.LagSeconds, labels...)
			if rs.ReasonCode != "" {
				c.replicaReason.send(ch, 1, append(labels, rs.ReasonCode)...)
			}
		}
	}
}

// ioOp is the kind of a request, for its latency histogram.
type ioOp int

const (
	opRead ioOp = iota
	opWrite
	opWriteZeroes
	opTrim
	opFlush
	numIOOps
)

var ioOpNames = [numIOOps]string{"read", "write", "write_zeroes", "trim", "flush"}

// latencyBuckets is how many bounds the request latency histograms have:
// latencyBounds, 50 µs doubling up to 13.1 s.
const latencyBuckets = 19

var latencyBounds = prometheus.ExponentialBuckets(50e-6, 2, latencyBuckets)

// ioCounters is what a volume counts of its IO on this node since it
// started, for its status, /metrics and the resync's pace. Its zero value
// is ready; each field is updated and read without a lock.
type ioCounters struct {
	// resynced is the bytes this node received by resync.
	resynced atomic.Int64
	// lastWrite is when the last application write started (unix ns): the
	// resync controller yields while the volume is busy.
	lastWrite  atomic.Int64
	reads      atomic.Uint64
	readBytes  atomic.Uint64
	writes     atomic.Uint64
	writeBytes atomic.Uint64
	flushes    atomic.Uint64
	// latency records each request's latency for /metrics.
	latency ioLatency
}

// report puts the counts in lv (status).
func (c *ioCounters) report(lv *transport.LocalVolume) {
	lv.ResyncedBytes = c.resynced.Load()
	lv.Reads, lv.ReadBytes = c.reads.Load(), c.readBytes.Load()
	lv.Writes, lv.WriteBytes = c.writes.Load(), c.writeBytes.Load()
	lv.Flushes = c.flushes.Load()
}

// ioLatency counts a volume's request latencies per operation. Its zero
// value is ready; observe is safe for concurrent use and takes no lock.
type ioLatency [numIOOps]struct {
	counts   [latencyBuckets + 1]atomic.Uint64 // the last: above every bound
	sumNanos atomic.Int64
}

// observe records one request of kind op that began at began, by the
// volume's clock.
func (v *Volume) observe(op ioOp, began time.Time) {
	v.counters.latency.observe(op, v.clock.Since(began))
}

// observe records one request of kind op that took d.
func (l *ioLatency) observe(op ioOp, d time.Duration) {
	i, _ := slices.BinarySearch(latencyBounds, d.Seconds())
	l[op].counts[i].Add(1)
	l[op].sumNanos.Add(int64(d))
}

// send sends one histogram per operation (the op label after labels).
func (l *ioLatency) send(ch chan<- prometheus.Metric, desc *prometheus.Desc, labels ...string) {
	for op := range numIOOps {
		h := &l[op]
		var count uint64
		buckets := make(map[float64]uint64, latencyBuckets)
		for i, bound := range latencyBounds {
			count += h.counts[i].Load()
			buckets[bound] = count
		}
		count += h.counts[latencyBuckets].Load()
		ch <- prometheus.MustNewConstHistogram(desc, count, time.Duration(h.sumNanos.Load()).Seconds(), buckets, append(labels, ioOpNames[op])...)
	}
}

func sortedNames[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// eventCounts counts the node's events by kind.
type eventCounts struct {
	mu     mutex
	byKind map[string]uint64
}

// count subscribes to the node's events and counts them until the node
// stops.
func (e *eventCounts) count(n *Node) {
	live, cancel := n.subscribe()
	defer cancel()
	for {
		select {
		case <-n.stopLoop:
			return
		case ev := <-live:
			e.mu.Lock()
			e.byKind[ev.Kind]++
			e.mu.Unlock()
		}
	}
}

func (e *eventCounts) collect(ch chan<- prometheus.Metric, m metricFamily) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, kind := range sortedNames(e.byKind) {
		m.send(ch, float64(e.byKind[kind]), kind)
	}
}

// statusCache holds the last cluster view. A get within clusterViewTTL of the
// last assembly returns it; otherwise get starts a new assembly (one at a
// time, shared by concurrent gets) and waits for it at most clusterViewWait,
// returning the last view when it is slower: a peer that does not answer
// never holds a scrape for longer than that.
type statusCache struct {
	ctx   context.Context // ends when the node stops
	clock clock.Clock
	fetch func(context.Context) (*transport.ClusterStatus, error)

	mu   mutex
	last *transport.ClusterStatus
	at   time.Time
	// running is closed when the assembly under way ends; nil when none
	// runs.
	running chan struct{}
}

func newStatusCache(ctx context.Context, clk clock.Clock, fetch func(context.Context) (*transport.ClusterStatus, error)) *statusCache {
	return &statusCache{ctx: ctx, clock: clock.Or(clk), fetch: fetch}
}

// get returns the cluster view and when it was assembled; nil when none
// could be assembled yet.
func (s *statusCache) get() (*transport.ClusterStatus, time.Time) {
	s.mu.Lock()
	if s.last != nil && s.clock.Since(s.at) < clusterViewTTL {
		defer s.mu.Unlock()
		return s.last, s.at
	}
	done := s.running
	if done == nil && s.ctx.Err() == nil {
		done = make(chan struct{})
		s.running = done
		go s.refresh(done)
	}
	s.mu.Unlock()
	if done != nil {
		wait := s.clock.NewTimer(clusterViewWait)
		defer wait.Stop()
		select {
		case <-done:
		case <-wait.C():
		case <-s.ctx.Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.at
}

func (s *statusCache) refresh(done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(s.ctx, clusterViewTimeout)
	defer cancel()
	st, err := s.fetch(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = nil
	if err == nil && st != nil {
		s.last, s.at = st, s.clock.Now()
	}
}
