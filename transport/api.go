package transport

import "time"

// The status model. replctl prints it, the web page renders it, and other
// tools read its JSON names: keep them stable, add fields freely.

// ClusterStatus is the whole cluster as one node sees it.
type ClusterStatus struct {
	// From is the node that assembled this status.
	From string `json:"from"`
	// Cluster is the raft and membership view (always present: a file
	// without raft addresses says failover off, and why).
	Cluster ClusterInfo    `json:"cluster"`
	Nodes   []NodeInfo     `json:"nodes"`
	Volumes []VolumeStatus `json:"volumes"`
	// ConfigDiffers lists the volumes the reachable nodes' cluster files
	// do not agree on, and the volumes a node does not run as its file
	// says (a removal it refused, an addition that failed).
	ConfigDiffers []ConfigDifference `json:"config_differs,omitempty"`
	// Pools are the storage pools of the reachable nodes, by node and
	// name, with their size and free space.
	Pools []PoolStatus `json:"pools,omitempty"`
	// Warnings are what an operator should act on, most urgent first,
	// each with the command that fixes it: the status page's "Needs
	// attention" and replctl status --check. The node fills them in
	// (web.Warnings, a function of the rest of the status).
	Warnings []Warning `json:"warnings"`
}

// Volume is what the status says of the named volume; false when it names
// no such volume.
func (cs *ClusterStatus) Volume(name string) (VolumeStatus, bool) {
	for _, v := range cs.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return VolumeStatus{}, false
}

// Severities of a Warning, most urgent first.
const (
	// SeverityCritical: data at risk or IO stopped.
	SeverityCritical = "critical"
	// SeverityWarning: redundancy lost or degraded.
	SeverityWarning = "warning"
	// SeverityInfo: under way, or fixes itself.
	SeverityInfo = "info"
)

// Kinds of a Warning: a fixed word per situation, for tools.
const (
	WarningNodeDown       = "node-down"
	WarningNoQuorum       = "no-quorum"
	WarningSplitBrain     = "split-brain"
	WarningNoPrimary      = "no-primary"
	WarningWaitingForPeer = "waiting-for-peer"
	WarningOneCopy        = "one-copy"
	WarningStandAlone     = "standalone"
	WarningConnecting     = "connecting"
	WarningResyncPaused   = "resync-paused"
	WarningBehind         = "behind"
	WarningDetached       = "detached"
	WarningDiskFailed     = "disk-failed"
	WarningOutdated       = "outdated"
	WarningInconsistent   = "inconsistent"
	WarningPathDown       = "path-down"
	// WarningConfigDiffers: a volume is in some nodes' cluster files and
	// not in others'.
	WarningConfigDiffers = "config-differs"
	// WarningConfigNotApplied: a node does not run a volume as its file
	// says: it keeps one its file dropped (a primary with NBD clients), or
	// could not add one.
	WarningConfigNotApplied = "config-not-applied"
	// WarningReloadFailed: a node's last reload found its cluster file
	// broken; it runs on with the config it had.
	WarningReloadFailed = "reload-failed"
	// WarningUnrecoverable: blocks of a replica are bad (checksum or read
	// error) and no replica holds a good copy: reads of them fail.
	WarningUnrecoverable = "unrecoverable"
	// WarningBadBlocks: blocks of a replica's disk could not be
	// rewritten and are on its bad-block list: they are read from a peer,
	// and the disk is detached when the list is full.
	WarningBadBlocks = "bad-blocks"
)

// Warning is one thing an operator should act on, and how.
type Warning struct {
	// ID is stable while the situation lasts (the page's element id):
	// warning-KIND-VOLUME-NODE...
	ID string `json:"id"`
	// Kind names the situation (standalone, split-brain, no-primary,
	// one-copy, node-down, ...), for tools.
	Kind     string `json:"kind"`
	Severity string `json:"severity"`
	// Volume and Node are what it is about ("" for the whole cluster, or
	// for every volume of the node).
	Volume string `json:"volume,omitempty"`
	Node   string `json:"node,omitempty"`
	// Text says what is wrong; Detail is the node's own reason.
	Text   string `json:"text"`
	Detail string `json:"detail,omitempty"`
	// Command fixes it ("" when the cluster fixes it by itself); Where
	// says where to run it when that is not replctl's --addr; Risk is
	// what it costs.
	Command string `json:"command,omitempty"`
	Where   string `json:"where,omitempty"`
	Risk    string `json:"risk,omitempty"`
}

// ClusterInfo is what decides the primary.
type ClusterInfo struct {
	// Leader is the raft leader ("" when none is known). It is not the
	// data primary: whichever node leads commits the decisions.
	Leader string `json:"leader"`
	// Quorum: a leader is in contact with a majority of the voters.
	Quorum bool `json:"quorum"`
	// Electing: no quorum, for less time than an election takes (a
	// leader handed its office on, or was lost, and the vote runs).
	// Status shows it as an election, not as a lost quorum, and warns
	// no-quorum only once it lasts longer.
	Electing bool     `json:"electing,omitempty"`
	Voters   []string `json:"voters"`
	// Failover is auto or off; Reason says why it is off, or what stops it.
	Failover string `json:"failover"`
	Reason   string `json:"reason,omitempty"`
	// Standing is set when the node asked is not a raft voter: "removed"
	// (replctl node remove took it out) or "joining" (started with --join,
	// not added yet). Voters are then the cluster's as it learned them,
	// Failover is off and Reason says it in words.
	Standing string `json:"standing,omitempty"`
}

// NodeInfo is one node of the cluster.
type NodeInfo struct {
	Name        string `json:"name"`
	Control     string `json:"control"`
	Replication string `json:"replication"`
	NBD         string `json:"nbd"`
	Alive       bool   `json:"alive"`
	// Role is data (holds disks) or witness (votes only).
	Role string `json:"role"`
	// Membership is what gossip says of the node: alive, suspect or dead
	// ("" without raft and gossip).
	Membership string `json:"membership,omitempty"`
	// Error says why the node could not be reached; ErrorCode is the same
	// as a fixed word for tools: refused (nothing listens: replnode is not
	// running), no-answer (it accepts connections but answers nothing:
	// hung, paused or overloaded), no-connection (host down, no route) or
	// tls (the two nodes' TLS failed: a certificate of another CA, or of
	// another node, or one side without the tls: section).
	Error     string `json:"error,omitempty"`
	ErrorCode string `json:"error_code,omitempty"`
	// Version is the release the node runs (replnode --version's first
	// word: 1.4.0, 0.0.0~git20261205134441.7d6bd45); empty for a node
	// that did not answer, or an older one.
	Version string `json:"version,omitempty"`
	// FailedReload is set while the node's last reload (SIGHUP) failed:
	// its cluster file did not load, and it runs on with the config it
	// had. A reload that loads clears it.
	FailedReload *FailedReload `json:"failed_reload,omitempty"`
}

// FailedReload is a reload whose cluster file did not load.
type FailedReload struct {
	// File is the cluster file the node read.
	File string    `json:"file"`
	At   time.Time `json:"at"`
	// Problems are the first problems the file's loader found, one a
	// line as it words them ("FILE:LINE: FIELD: what is wrong"); More
	// counts those left out.
	Problems []string `json:"problems"`
	More     int      `json:"more,omitempty"`
}

// VolumeStatus is one volume across its replicas.
type VolumeStatus struct {
	Name     string          `json:"name"`
	Size     int64           `json:"size"`
	Protocol string          `json:"protocol"`
	Primary  string          `json:"primary"`
	Epoch    uint64          `json:"epoch"`
	NBDURI   string          `json:"nbd_uri"`
	Replicas []ReplicaStatus `json:"replicas"`
	// ResyncRate is the primary's resync cap in bytes per second (the
	// config's resync_rate, or as adjusted); 0: no cap.
	ResyncRate int64 `json:"resync_rate"`
	// OnCongestion is the primary's congestion policy in force (block,
	// pull-ahead or disconnect).
	OnCongestion string `json:"on_congestion"`
	// LastFailover is the volume's last promotion without a handover
	// from the old primary (automatic, or forced by the operator); nil
	// when there was none.
	LastFailover *Failover `json:"last_failover,omitempty"`
	// Mount is the volume's mount claim on its primary (replctl mount):
	// nil when nobody holds it.
	Mount *MountStatus `json:"mount,omitempty"`
	// SettingMismatches lists the settings that must agree on every node
	// of the volume and do not, as the reachable nodes report them.
	SettingMismatches []SettingMismatch `json:"setting_mismatches,omitempty"`
}

// Failover is a promotion without a handover: From was primary, To took
// over at Epoch, At (the proposer's clock), because of Reason.
type Failover struct {
	From  string    `json:"from"`
	To    string    `json:"to"`
	Epoch uint64    `json:"epoch"`
	At    time.Time `json:"at"`
	// Reason says why, in words (the old primary was lost, cut off, or
	// the operator forced it); Forced is true for the operator's
	// replctl primary --force.
	Reason string `json:"reason,omitempty"`
	Forced bool   `json:"forced,omitempty"`
}

// SettingMismatch is a setting that must agree on every node of a volume
// (protocol, after_sb, size) and does not.
type SettingMismatch struct {
	// Setting is its name in the config file.
	Setting string `json:"setting"`
	// Values maps each reachable node that holds the volume to its
	// value there.
	Values map[string]string `json:"values"`
	// Primary is the primary's value ("" when no primary reported one).
	Primary string `json:"primary,omitempty"`
}

// ConfigDifference is one volume the nodes' cluster files, or what the
// nodes run of them, do not agree on.
type ConfigDifference struct {
	Volume string `json:"volume"`
	// In and NotIn name the reachable nodes whose file lists the volume
	// and those whose file does not (both set when the files disagree).
	In    []string `json:"in,omitempty"`
	NotIn []string `json:"not_in,omitempty"`
	// NotApplied maps a node that does not run the volume as its file
	// says to why: it keeps running one its file dropped, or could not
	// add one its file lists.
	NotApplied map[string]string `json:"not_applied,omitempty"`
}

// Replica returns node's replica of v, or nil when node holds none.
func (v *VolumeStatus) Replica(node string) *ReplicaStatus {
	for i := range v.Replicas {
		if v.Replicas[i].Node == node {
			return &v.Replicas[i]
		}
	}
	return nil
}

// ReplicaStatus is one node's copy of a volume.
type ReplicaStatus struct {
	Node        string `json:"node"`
	Role        string `json:"role"`
	Disk        string `json:"disk"`
	Replication string `json:"replication"`
	// LagBytes and LagSeconds: what the primary acknowledged to clients
	// that this replica does not hold yet (protocols A and B), and how old
	// the oldest of it is.
	LagBytes   int64   `json:"lag_bytes"`
	LagSeconds float64 `json:"lag_seconds"`
	// Raft is what the cluster's state machine records of this replica:
	// UpToDate (it may be promoted), Outdated (it misses writes), or ""
	// (not known, or no raft).
	Raft string `json:"raft,omitempty"`
	// OutOfSyncBytes is what the primary has marked out of sync for this
	// replica (0 for the primary itself).
	OutOfSyncBytes int64 `json:"out_of_sync_bytes"`
	// ResyncDoneBytes and ResyncTotalBytes describe the resync under way.
	ResyncDoneBytes  int64 `json:"resync_done_bytes"`
	ResyncTotalBytes int64 `json:"resync_total_bytes"`
	// ResyncRate is the resync's average speed in bytes per second.
	ResyncRate int64 `json:"resync_rate"`
	// Verify*: the last online verify of this replica against the primary.
	VerifyDoneBytes  int64 `json:"verify_done_bytes,omitempty"`
	VerifyTotalBytes int64 `json:"verify_total_bytes,omitempty"`
	VerifyFoundBytes int64 `json:"verify_found_bytes,omitempty"`
	VerifyRate       int64 `json:"verify_rate,omitempty"`
	// LastResync*: the last resync of this replica that finished since
	// the primary started: bytes, seconds and when it ended (resynced_bytes
	// is a lifetime count).
	LastResyncBytes   int64     `json:"last_resync_bytes"`
	LastResyncSeconds float64   `json:"last_resync_seconds,omitempty"`
	LastResyncEnded   time.Time `json:"last_resync_ended,omitzero"`
	// SyncProgress is the resync's percent done (100 when in sync).
	SyncProgress float64 `json:"sync_progress"`
	// ResyncedBytes counts every byte this replica has received by resync
	// since its node started (counted by the node itself).
	ResyncedBytes int64  `json:"resynced_bytes"`
	Generation    string `json:"generation,omitempty"`
	// Metadata is where the node keeps the volume's metadata (internal or
	// external); UsableBytes what the backing device holds for data.
	Metadata    string `json:"metadata,omitempty"`
	UsableBytes int64  `json:"usable_bytes,omitempty"`
	// Size is the volume's size on this replica, as its node reports it
	// (0 when it did not answer): one left behind by a resize is smaller
	// than the volume's, and refused by its peers until it grows.
	Size int64 `json:"size,omitempty"`
	// Reason explains a StandAlone or refused connection, or why a
	// primary holds its IO; ReasonCode is the same as a fixed word
	// (waiting-for-peer, fenced, split-brain, ...) for tools.
	Reason     string `json:"reason,omitempty"`
	ReasonCode string `json:"reason_code,omitempty"`
	// SyncRule and SyncDecision: the generation rule that decided the
	// replica's last connection, and what it decided (DRBD's words).
	SyncRule string `json:"sync_rule,omitempty"`
	// SplitBrainRule: while the replica's node is in a split brain, the
	// generation rule that found it (bitmap-both, history-both); Reason
	// says it in words.
	SplitBrainRule string `json:"split_brain_rule,omitempty"`
	SyncDecision   string `json:"sync_decision,omitempty"`
	// Reachable is false when the node did not answer; the fields then come
	// from its peer's view.
	Reachable bool `json:"reachable"`
	// Paths are the node's paths to its backing LUN (multipath disks only).
	Paths []PathStatus `json:"paths,omitempty"`
	// Integrity is the replica's checksums at rest and scrub as its node
	// reports them (docs/integrity.md); nil when the node did not answer,
	// or is older.
	Integrity *ReplicaIntegrity `json:"integrity,omitempty"`
}

// ReplicaIntegrity is a replica's IntegrityStatus in the cluster's
// status: its figures, and of its scrub what an operator watches (state,
// percent, ETA, what the last one repaired). The node's own status and
// replctl scrub have the rest; the cluster's status, a thousand volumes
// of three replicas, stays small (TestTheLargestStatusFitsTheReplyLimit).
type ReplicaIntegrity struct {
	Checksums           bool         `json:"checksums"`
	RepairedBlocks      int64        `json:"repaired_blocks"`
	UnrecoverableBlocks int64        `json:"unrecoverable_blocks"`
	BadBlocks           int64        `json:"bad_blocks"`
	Scrub               ScrubSummary `json:"scrub"`
}

// ChecksumBuild is the pass that builds the checksums of a volume whose
// checksums were just turned on (docs/integrity.md): a scrub that stores
// the sum of every block that has none. Until it ends, the blocks past
// Percent are not verified.
type ChecksumBuild struct {
	// State is running or paused.
	State   string  `json:"state"`
	Percent float64 `json:"percent"`
}

// ScrubSummary is a replica's scrub in the cluster's status; its fields
// mean what ScrubStatus's of the same names do. The blocks a scrub found
// unrecoverable are in ReplicaIntegrity.UnrecoverableBlocks.
type ScrubSummary struct {
	State        string     `json:"state"`
	Percent      float64    `json:"percent"`
	LastFinished *time.Time `json:"last_finished"`
	LastRepaired int64      `json:"last_repaired"`
	ETASeconds   float64    `json:"eta_seconds,omitempty"`
	// Build: the scrub running or paused is the build of checksums just
	// turned on (IntegrityStatus.Build; a flag here, so that the
	// cluster's status of many volumes stays small).
	Build bool `json:"build,omitempty"`
}

// Replica is is's part in the cluster's status (nil for nil).
func (is *IntegrityStatus) Replica() *ReplicaIntegrity {
	if is == nil {
		return nil
	}
	s := is.Scrub
	return &ReplicaIntegrity{
		Checksums: is.Checksums, RepairedBlocks: is.RepairedBlocks, UnrecoverableBlocks: is.UnrecoverableBlocks, BadBlocks: is.BadBlocks,
		Scrub: ScrubSummary{State: s.State, Percent: s.Percent, LastFinished: s.LastFinished, LastRepaired: s.LastRepaired, ETASeconds: s.ETASeconds,
			Build: is.Build != nil},
	}
}

// PathStatus is one path to a node's backing LUN.
type PathStatus struct {
	Node               string  `json:"node"`
	Volume             string  `json:"volume"`
	Path               string  `json:"path"`
	State              string  `json:"state"` // ACTIVE, PASSIVE or FAIL
	Group              string  `json:"group"`
	Preferred          bool    `json:"preferred"`
	Reason             string  `json:"reason,omitempty"`
	IOs                uint64  `json:"ios"`
	Bytes              uint64  `json:"bytes"`
	Errors             uint64  `json:"errors"`
	InFlight           int     `json:"in_flight"`
	LatencyP50Micros   int64   `json:"latency_p50_us"`
	LatencyP99Micros   int64   `json:"latency_p99_us"`
	SinceChangeSeconds float64 `json:"since_change_s"`
}

// PathRequest is an operator's command on one node's paths.
type PathRequest struct {
	Volume string `json:"volume"`
	// Node owns the paths; empty means the node that receives it.
	Node string `json:"node,omitempty"`
	// Action is fail, restore, rotate or policy.
	Action string `json:"action"`
	Path   string `json:"path,omitempty"`
	Policy string `json:"policy,omitempty"`
}

// PathReply shows the paths after the command.
type PathReply struct {
	Node   string       `json:"node"`
	Policy string       `json:"policy"`
	Paths  []PathStatus `json:"paths"`
}

// NodeStatus is one node's own view of itself and its volumes.
type NodeStatus struct {
	Node    NodeInfo      `json:"node"`
	Volumes []LocalVolume `json:"volumes"`
	Events  []Event       `json:"events,omitempty"`
	// Failover is, on the raft leader, why it does not fail a volume over
	// now (empty elsewhere).
	Failover string `json:"failover,omitempty"`
	// Config is what the node's cluster file lists, as the node applied
	// it (nil from an older node).
	Config *NodeConfigStatus `json:"config,omitempty"`
	// Pools are the node's storage pools.
	Pools []PoolStatus `json:"pools,omitempty"`
}

// NodeConfigStatus is the node's cluster file as it runs it: the volumes
// the file lists (every node's file should list the same), and where the
// node does not run what the file says.
type NodeConfigStatus struct {
	// Volumes the node's file lists, sorted, whether it holds a disk of
	// them or not.
	Volumes []string `json:"volumes"`
	// Kept maps a volume the file no longer lists, which the node keeps
	// running, to why (a primary with NBD clients is not stopped).
	Kept map[string]string `json:"kept,omitempty"`
	// NotAdded maps a volume the file lists, which the node could not
	// add at its last reload, to why.
	NotAdded map[string]string `json:"not_added,omitempty"`
}

// LocalVolume is one volume as the node holding it sees it.
type LocalVolume struct {
	Name          string       `json:"name"`
	Size          int64        `json:"size"`
	Protocol      string       `json:"protocol"`
	OnCongestion  string       `json:"on_congestion"`
	ResyncRate    int64        `json:"resync_rate"`
	AfterSB       string       `json:"after_sb,omitempty"`
	Metadata      string       `json:"metadata"`
	UsableBytes   int64        `json:"usable_bytes"`
	Role          string       `json:"role"`
	Disk          string       `json:"disk"`
	Epoch         uint64       `json:"epoch"`
	Primary       string       `json:"primary"`
	Generation    string       `json:"generation"`
	ResyncedBytes int64        `json:"resynced_bytes"`
	Peers         []PeerStatus `json:"peers"`
	// Replication is this node's own link state: for a secondary its link
	// to the primary, for the primary the worst of its peers.
	Replication string `json:"replication"`
	// SplitBrainPeer and SplitBrainRule: while this node is in a split
	// brain, the peer it found it with and the generation rule that found
	// it (bitmap-both, history-both); Reason says it in words.
	SplitBrainPeer string `json:"split_brain_peer,omitempty"`
	SplitBrainRule string `json:"split_brain_rule,omitempty"`
	// Mount is the volume's mount claim this node holds as its primary
	// (nil: none).
	Mount      *MountStatus `json:"mount,omitempty"`
	Reason     string       `json:"reason,omitempty"`
	ReasonCode string       `json:"reason_code,omitempty"`
	// Serving: this node is primary and serves IO (not waiting for a
	// peer, fenced or in a switchover).
	Serving    bool         `json:"serving,omitempty"`
	Paths      []PathStatus `json:"paths,omitempty"`
	PathPolicy string       `json:"path_policy,omitempty"`
	// ActivityLog counts the activity log's work on this node.
	ActivityLog *ActivityLogStatus `json:"activity_log,omitempty"`
	// LastFailover is this node's last forced promotion over another
	// primary, as the node remembers it (since it started); the cluster's
	// status takes raft's record when it is newer.
	LastFailover *Failover `json:"last_failover,omitempty"`
	// LocalMissingBytes is what this node's own disk misses (written while
	// it was detached), to be copied back from a peer.
	LocalMissingBytes int64  `json:"local_missing_bytes,omitempty"`
	Writes            uint64 `json:"writes"`
	WriteBytes        uint64 `json:"write_bytes"`
	Reads             uint64 `json:"reads"`
	ReadBytes         uint64 `json:"read_bytes"`
	Flushes           uint64 `json:"flushes"`
	// Integrity is the volume's block checksums at rest on this node
	// (docs/integrity.md); nil from an older node.
	Integrity *IntegrityStatus `json:"integrity,omitempty"`
}

// IntegrityStatus is what a node's checksums at rest found and did for
// one volume.
type IntegrityStatus struct {
	// Checksums: the node keeps a checksum of every block it writes and
	// verifies what it reads. False for metadata made without a checksum
	// area (before checksums, or with checksums: off).
	Checksums bool `json:"checksums"`
	// RepairedBlocks are the 4 KiB blocks that failed their checksum or
	// could not be read here and were rewritten with a peer's good copy,
	// since the node started.
	RepairedBlocks int64 `json:"repaired_blocks"`
	// UnrecoverableBlocks are blocks a read or scrub found bad here with
	// no good copy on any peer (reads of them fail with EIO), and that no
	// write has covered since; a restart keeps them (the bad-block list,
	// while it has room).
	UnrecoverableBlocks int64 `json:"unrecoverable_blocks"`
	// BadBlocks is the length of the replica's bad-block list: blocks
	// whose good copy could not be written over them, read from a peer
	// in sync instead (docs/integrity.md). It survives a restart.
	BadBlocks int64       `json:"bad_blocks"`
	Scrub     ScrubStatus `json:"scrub"`
	// Build, while checksums just turned on are being built here (a
	// running or paused scrub that began as their build), says how far
	// it got; absent otherwise.
	Build *ChecksumBuild `json:"build,omitempty"`
}

// ScrubStatus is a volume's scrub on one node (replctl scrub).
type ScrubStatus struct {
	// State is idle, running or paused.
	State   string  `json:"state"`
	Percent float64 `json:"percent"`
	// LastFinished is when the last scrub ended (null: never);
	// LastRepaired the blocks it repaired.
	LastFinished *time.Time `json:"last_finished"`
	LastRepaired int64      `json:"last_repaired"`
	// LastUnrecoverable are the blocks the last scrub found bad with no
	// good copy anywhere.
	LastUnrecoverable int64 `json:"last_unrecoverable,omitempty"`
	// CheckedBlocks, RepairedBlocks and UnrecoverableBlocks are the
	// running (or paused) scrub's so far: the blocks it verified against
	// a known sum, repaired from a replica, and found bad everywhere.
	CheckedBlocks       int64 `json:"checked_blocks,omitempty"`
	RepairedBlocks      int64 `json:"repaired_blocks,omitempty"`
	UnrecoverableBlocks int64 `json:"unrecoverable_blocks,omitempty"`
	// RateBytes is the rate the scrub reads at (bytes per second), and
	// ETASeconds when it should end at that rate.
	RateBytes  int64   `json:"rate_bytes,omitempty"`
	ETASeconds float64 `json:"eta_seconds,omitempty"`
	// BuiltBlocks are the blocks the running (or paused) scrub stored a
	// sum for, which had none (checksums turned on for an existing
	// volume, or create-md over existing data).
	BuiltBlocks int64 `json:"built_blocks,omitempty"`
	// NextScheduled is when the volume's scrub_interval starts the next
	// scrub here (absent without one).
	NextScheduled *time.Time `json:"next_scheduled,omitempty"`
}

// ScrubRequest starts a scrub of Volume (every node that holds a disk of
// it; Node set: that node alone) at Rate bytes per second (0: the
// default, a share of the volume's resync rate), or pauses, resumes or
// stops the one running; with Query, it only says where each node's scrub
// is.
type ScrubRequest struct {
	Volume string `json:"volume"`
	Node   string `json:"node,omitempty"`
	Rate   int64  `json:"rate,omitempty"`
	Pause  bool   `json:"pause,omitempty"`
	Resume bool   `json:"resume,omitempty"`
	Stop   bool   `json:"stop,omitempty"`
	Query  bool   `json:"query,omitempty"`
}

// ScrubReply is each node's scrub after the request.
type ScrubReply struct {
	Nodes []ScrubbedNode `json:"nodes"`
}

// ScrubbedNode is one node's scrub of the volume.
type ScrubbedNode struct {
	Node  string      `json:"node"`
	Scrub ScrubStatus `json:"scrub"`
	// Refused says why the node did not take the command (nothing to
	// pause there, a scrub running already), when it did not.
	Refused string `json:"refused,omitempty"`
}

// ReadBlocksRequest reads Length bytes at Offset of Volume on its
// primary (whole 4 KiB blocks, at most MaxReadBlocks bytes).
type ReadBlocksRequest struct {
	Volume string `json:"volume"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
}

// MaxReadBlocks bounds a ReadBlocks request.
const MaxReadBlocks = 64 << 10

// ReadBlocksReply holds the range's data.
type ReadBlocksReply struct {
	Data []byte `json:"data"`
}

// PeerStatus is the primary's view of one peer.
type PeerStatus struct {
	Node             string `json:"node"`
	Replication      string `json:"replication"`
	PeerDisk         string `json:"peer_disk"`
	OutOfSyncBytes   int64  `json:"out_of_sync_bytes"`
	ResyncDoneBytes  int64  `json:"resync_done_bytes"`
	ResyncTotalBytes int64  `json:"resync_total_bytes"`
	ResyncSentBytes  int64  `json:"resync_sent_bytes"`
	ResyncRate       int64  `json:"resync_rate"`
	// ResyncSkippedBytes: resync bytes not sent because their checksums
	// matched (csums).
	ResyncSkippedBytes int64 `json:"resync_skipped_bytes"`
	// LagBytes and LagSeconds: what clients were told is written but the
	// peer does not hold yet (protocols A and B; plus blocks marked while
	// Ahead), and the age of the oldest of it.
	LagBytes         int64   `json:"lag_bytes"`
	LagSeconds       float64 `json:"lag_seconds"`
	VerifyDoneBytes  int64   `json:"verify_done_bytes"`
	VerifyTotalBytes int64   `json:"verify_total_bytes"`
	VerifyFoundBytes int64   `json:"verify_found_bytes"`
	// VerifyRate is the running verify's average speed in bytes per second.
	VerifyRate int64 `json:"verify_rate"`
	// LastResync*: the last resync to (or copy from) the peer that
	// finished: its bytes, how long it took and when it ended.
	LastResyncBytes   int64     `json:"last_resync_bytes"`
	LastResyncSeconds float64   `json:"last_resync_seconds"`
	LastResyncEnded   time.Time `json:"last_resync_ended,omitzero"`
	FramesSent        uint64    `json:"frames_sent"`
	EntriesSent       uint64    `json:"entries_sent"`
	SyncRule          string    `json:"sync_rule,omitempty"`
	SyncDecision      string    `json:"sync_decision,omitempty"`
	Reason            string    `json:"reason,omitempty"`
	ReasonCode        string    `json:"reason_code,omitempty"`
}

// Event is one line of a node's history.
type Event struct {
	// Seq numbers the events of one node; a gap means some were missed.
	Seq     uint64    `json:"seq,omitempty"`
	Time    time.Time `json:"time"`
	Node    string    `json:"node,omitempty"`
	Volume  string    `json:"volume,omitempty"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
	// Peer, Old, New and Reason describe a state change: the peer it
	// concerns, the state before and after, and why.
	Peer   string `json:"peer,omitempty"`
	Old    string `json:"old,omitempty"`
	New    string `json:"new,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Offset and Length name the byte range an event is about
	// (block-repaired, block-unrecoverable).
	Offset int64 `json:"offset,omitempty"`
	Length int64 `json:"length,omitempty"`
}

// EventsRequest asks for a node's events: the last History (those since
// Since, when set) first, then, with State, the node's current state as
// events of kind exists (the node, each volume, each peer) closed by one
// of kind exists-end, then each new one as it happens.
type EventsRequest struct {
	History int       `json:"history,omitempty"`
	Since   time.Time `json:"since,omitzero"`
	State   bool      `json:"state,omitempty"`
}

// Kinds of the events that describe the current state (EventsRequest's
// State), as drbdsetup events2 prints "exists" lines and "exists -".
const (
	EventExists    = "exists"
	EventExistsEnd = "exists-end"
)

// Requests and replies of the control API.

// StatusRequest asks for status.
type StatusRequest struct {
	// Events is how many recent events to include.
	Events int `json:"events,omitempty"`
}

// PrimaryRequest asks for a switchover of Volume to Node.
type PrimaryRequest struct {
	Volume  string        `json:"volume"`
	Node    string        `json:"node"`
	Timeout time.Duration `json:"timeout,omitempty"`
	// Force promotes Node without a handover from the old primary (which
	// is unreachable). Writes the old primary acknowledged after it lost
	// Node are not on Node: Yes confirms that.
	Force bool `json:"force,omitempty"`
	Yes   bool `json:"yes,omitempty"`
}

// PrimaryReply reports a finished switchover.
type PrimaryReply struct {
	Volume  string `json:"volume"`
	Primary string `json:"primary"`
	Epoch   uint64 `json:"epoch"`
	NBDURI  string `json:"nbd_uri"`
}

// DemoteRequest asks a primary to hand over: stop IO, flush, check its
// peers are in sync, become Secondary.
type DemoteRequest struct {
	Volume  string        `json:"volume"`
	To      string        `json:"to"`
	Timeout time.Duration `json:"timeout,omitempty"`
}

// DemoteReply carries what the new primary must match.
type DemoteReply struct {
	Epoch      uint64 `json:"epoch"`
	Generation string `json:"generation"`
}

// PromoteRequest makes a node primary at Epoch; it must hold Generation.
type PromoteRequest struct {
	Volume     string `json:"volume"`
	Epoch      uint64 `json:"epoch"`
	Generation string `json:"generation"`
	// Force promotes without a handover: the node starts a new generation
	// and takes the epoch after the highest it knows.
	Force bool `json:"force,omitempty"`
	// Retake: the node that just handed the volume over takes it back at
	// its own epoch, because raft did not record the new primary.
	Retake bool `json:"retake,omitempty"`
}

// PromoteReply reports the new primary's export.
type PromoteReply struct {
	NBDURI string `json:"nbd_uri"`
}

// AwaitServingRequest asks a node to answer once it serves Volume as its
// primary at Epoch or a later one (a switchover's coordinator waits on it
// for the new primary). The call's deadline bounds the wait.
type AwaitServingRequest struct {
	Volume string `json:"volume"`
	Epoch  uint64 `json:"epoch,omitempty"`
}

// AwaitServingReply says the node serves the volume: at Epoch, on its
// export NBDURI.
type AwaitServingReply struct {
	Epoch  uint64 `json:"epoch"`
	NBDURI string `json:"nbd_uri"`
}

// ConnectRequest changes whether Node replicates Volume.
type ConnectRequest struct {
	Volume string `json:"volume"`
	// Node is the node to act on; empty means the node that receives it.
	Node string `json:"node,omitempty"`
	// DiscardMyData resolves a split brain: Node gives up the writes it
	// took since the split and is resynced from the other node. Without
	// Yes the reply only says how much would be discarded.
	DiscardMyData bool `json:"discard_my_data,omitempty"`
	Yes           bool `json:"yes,omitempty"`
}

// ConnectReply reports the new state.
type ConnectReply struct {
	Node        string `json:"node"`
	Replication string `json:"replication"`
	// DiscardBytes is what --discard-my-data rolls back on Node.
	DiscardBytes int64 `json:"discard_bytes,omitempty"`
	// Done is false when the reply only reports what would happen.
	Done bool `json:"done"`
}

// ResyncRequest starts, pauses or resumes a resync of Volume.
type ResyncRequest struct {
	Volume string `json:"volume"`
	// From is the node whose data wins; it must be the primary. Empty
	// means the current primary.
	From string `json:"from,omitempty"`
	// Node limits the command to that secondary (DRBD's invalidate on
	// one node, or pause-sync/resume-sync of one peer); empty: every one.
	Node   string `json:"node,omitempty"`
	Pause  bool   `json:"pause,omitempty"`
	Resume bool   `json:"resume,omitempty"`
}

// ResyncReply names the primary that runs the resync.
type ResyncReply struct {
	Primary string   `json:"primary"`
	Peers   []string `json:"peers"`
	Action  string   `json:"action"`
}

// ActivityLogStatus is what the activity log has done: hits cost no
// metadata IO, each transaction one write.
type ActivityLogStatus struct {
	Extents      int   `json:"extents"`
	Hits         int64 `json:"hits"`
	Misses       int64 `json:"misses"`
	Transactions int64 `json:"transactions"`
	Evictions    int64 `json:"evictions"`
}

// VerifyRequest starts an online verify of Volume's secondaries against
// the primary; Repair resyncs what it finds when it ends.
type VerifyRequest struct {
	Volume string `json:"volume"`
	Repair bool   `json:"repair,omitempty"`
}

// VerifyReply names the primary that runs the verify.
type VerifyReply struct {
	Primary string   `json:"primary"`
	Peers   []string `json:"peers"`
}

// ClusterMessage is an opaque cluster message (JSON of node/cluster's
// forwarding types).
type ClusterMessage struct {
	Body []byte `json:"body"`
}

// MembershipRequest adds (Remove false) or removes a raft voter.
type MembershipRequest struct {
	Node   string `json:"node"`
	Remove bool   `json:"remove,omitempty"`
}

// MembershipReply lists the voters after the change.
type MembershipReply struct {
	Voters []string `json:"voters"`
}

// AdjustRequest changes a volume's settings online on every node that
// holds it (Node set: on that node only). Empty fields are kept, but for a
// congestion policy that the file did not name and no adjust named: that
// one follows the protocol. OnCongestion "default" goes back to that.
type AdjustRequest struct {
	Volume       string `json:"volume"`
	Node         string `json:"node,omitempty"`
	Protocol     string `json:"protocol,omitempty"`
	OnCongestion string `json:"on_congestion,omitempty"`
	// ResyncRate caps resync in bytes per second; 0 lifts the cap, nil
	// keeps it.
	ResyncRate *int64 `json:"resync_rate,omitempty"`
}

// AdjustReply lists the settings now in force, per node.
type AdjustReply struct {
	Nodes []AdjustedNode `json:"nodes"`
}

// AdjustedNode is one node's settings after an adjust.
type AdjustedNode struct {
	Node         string `json:"node"`
	Protocol     string `json:"protocol"`
	OnCongestion string `json:"on_congestion"`
	ResyncRate   int64  `json:"resync_rate"` // bytes per second; 0: no cap
}

// ResizeRequest grows a volume online to Size bytes (a multiple of 4096):
// on every node that holds it, the secondaries first and the primary last
// (only then do new NBD connections see the new size), after every node
// said it can; or, with Node, on that node alone (one that was down during
// a resize catches up so). Check only asks each node whether it can.
type ResizeRequest struct {
	Volume string `json:"volume"`
	Size   int64  `json:"size"`
	Node   string `json:"node,omitempty"`
	Check  bool   `json:"check,omitempty"`
}

// ResizeReply says what each node did, in the order it did it.
type ResizeReply struct {
	Volume string        `json:"volume"`
	Size   int64         `json:"size"`
	Nodes  []ResizedNode `json:"nodes"`
}

// Actions of a ResizedNode.
const (
	// ResizeGrew: the node grew its copy.
	ResizeGrew = "grew"
	// ResizeAlready: the node's copy was that size already.
	ResizeAlready = "already"
	// ResizeCan: (Check) the node can grow its copy.
	ResizeCan = "can-grow"
	// ResizeCannot: (Check) the node cannot grow its copy; Text says
	// why and what to do, MaxSize the largest size it can grow to now.
	ResizeCannot = "cannot-grow"
)

// ResizedNode is one node's part of a resize.
type ResizedNode struct {
	Node string `json:"node"`
	// Role is the node's role for the volume (Primary, Secondary).
	Role string `json:"role"`
	// Action is ResizeGrew, ResizeAlready, ResizeCan or ResizeCannot.
	Action  string `json:"action"`
	OldSize int64  `json:"old_size"`
	Size    int64  `json:"size"`
	// MaxSize is the largest size the node's disk (and external metadata
	// file) holds the volume at now, with its metadata (0: unknown).
	MaxSize int64 `json:"max_size,omitempty"`
	// ZeroedBytes is the range gained, made to read as zeroes on this
	// node's disk (punched where it can be) instead of being copied.
	ZeroedBytes int64 `json:"zeroed_bytes,omitempty"`
	// MetadataMoved: the metadata moved (internal: from offset
	// MetadataFrom to MetadataTo of the grown disk).
	MetadataMoved bool  `json:"metadata_moved,omitempty"`
	MetadataFrom  int64 `json:"metadata_from,omitempty"`
	MetadataTo    int64 `json:"metadata_to,omitempty"`
	// Text is the node's own account, in words.
	Text string `json:"text"`
}

// MountHolder names one mount of replctl mount: the host it runs on (its
// host name), its mount point there, and the claim's ID, a random word kept
// in the mount's record on that host, which only that mount presents.
type MountHolder struct {
	Host string `json:"host"`
	Dir  string `json:"dir"`
	ID   string `json:"id"`
	// Follows: the mount follows the primary (replctl mount --follow): a
	// switchover drains its connections instead of being refused for
	// them, and its helper takes the claim again at the new primary.
	Follows bool `json:"follows,omitempty"`
}

// MountStatus is a volume's mount claim in force on its primary: who
// mounted it (replctl mount), since when, and how many of the mount's NBD
// connections are open.
type MountStatus struct {
	Holder      MountHolder `json:"holder"`
	Since       time.Time   `json:"since"`
	Connections int         `json:"connections"`
}

// The actions of a ClaimRequest.
const (
	// ClaimTake takes the volume's claim for the holder, BEFORE the mount
	// connects to the export: refused while another holder's claim lasts.
	// Taking it again with the same ID renews it (a mount made again from
	// its record).
	ClaimTake = "take"
	// ClaimConfirm says the holder's NBD connections are made, BEFORE its
	// file system is made or mounted: refused when the claim is no longer
	// the holder's (it lapsed and was taken, or the primary restarted or
	// changed since it was taken).
	ClaimConfirm = "confirm"
	// ClaimRelease gives the claim back (replctl umount): a claim of
	// another ID is left as it is.
	ClaimRelease = "release"
)

// ClaimRequest takes, confirms or gives back the mount claim of Volume on
// its primary, the node that receives it (it is not forwarded: the claim
// is the primary's, as the export the mount connects to). A volume is
// mounted at most once: while a claim lasts, another holder's take is
// refused, naming the holder. A confirmed claim lasts while NBD
// connections made to the export since it was taken are open, and Grace
// after the last one closed; one not confirmed yet, Grace or two minutes
// after it was taken, whichever is longer. It ends with the primary's
// term: a switchover is refused while it lasts, and a failover or a
// restart of the primary ends the connections it covers for good (the
// mount's client does not reconnect).
type ClaimRequest struct {
	Volume string      `json:"volume"`
	Action string      `json:"action"`
	Holder MountHolder `json:"holder"`
	// Grace is the mount's --io-timeout (0: one minute).
	Grace time.Duration `json:"grace,omitempty"`
}

// ClaimReply is the volume's claim after the request: Held is false when
// it has none (a release that was done, or found none).
type ClaimReply struct {
	Volume string `json:"volume"`
	// Node is the primary that keeps the claim, Epoch its term.
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch,omitempty"`
	Held  bool   `json:"held"`
	// Holder, Taken and Connections describe the claim that is held:
	// Connections is how many NBD connections made since Taken are open.
	Holder      MountHolder `json:"holder,omitzero"`
	Taken       time.Time   `json:"taken,omitzero"`
	Connections int         `json:"connections,omitempty"`
}
