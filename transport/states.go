package transport

// The words of the status's states, in DRBD's names: what a
// ReplicaStatus's Role, Disk, PeerDisk and Replication, a PathStatus's
// State and a ReasonCode hold. The replication rules (replication.Role,
// DiskState, ReplState), node/multipath (PathState) and the node (Cause)
// produce them; readers of the status (the web page, tools) compare with
// these. The node's tests pin each one to the value it stands for, so a
// renamed state cannot silently diverge.
const (
	RolePrimary   = "Primary"
	RoleSecondary = "Secondary"

	DiskDiskless     = "Diskless"
	DiskAttaching    = "Attaching"
	DiskInconsistent = "Inconsistent"
	DiskOutdated     = "Outdated"
	DiskConsistent   = "Consistent"
	DiskUpToDate     = "UpToDate"
	DiskFailed       = "Failed"

	ReplStandAlone  = "StandAlone"
	ReplConnecting  = "Connecting"
	ReplConnected   = "Connected"
	ReplSyncSource  = "SyncSource"
	ReplSyncTarget  = "SyncTarget"
	ReplPausedSyncS = "PausedSyncS"
	ReplPausedSyncT = "PausedSyncT"
	ReplVerifyS     = "VerifyS"
	ReplVerifyT     = "VerifyT"
	ReplAhead       = "Ahead"
	ReplBehind      = "Behind"

	PathActive  = "ACTIVE"
	PathPassive = "PASSIVE"
	PathFail    = "FAIL"
)

// Syncing says whether a replication state is a resync's, running or
// paused.
func Syncing(repl string) bool {
	switch repl {
	case ReplSyncSource, ReplSyncTarget, ReplPausedSyncS, ReplPausedSyncT:
		return true
	}
	return false
}

// SyncPaused says whether a replication state is a paused resync's.
func SyncPaused(repl string) bool { return repl == ReplPausedSyncS || repl == ReplPausedSyncT }

// Verifying says whether a replication state is an online verify's.
func Verifying(repl string) bool { return repl == ReplVerifyS || repl == ReplVerifyT }

// Reason codes the status's readers act on (a ReasonCode; the node's
// Cause).
const (
	ReasonWaitingForPeer = "waiting-for-peer"
	ReasonSplitBrain     = "split-brain"
	ReasonDetached       = "detached"
	ReasonAdminDown      = "disconnected-by-operator"
	ReasonDiskFailed     = "disk-failed"
	ReasonStateWrite     = "state-write-failed"
	// ReasonNoSuchVolume: the replica's node is alive, but its cluster
	// file does not list the volume (it was not reloaded since the
	// volume was added, or its file dropped it): it runs no replica, and
	// refuses the primary's stream.
	ReasonNoSuchVolume = "no-such-volume"
)
