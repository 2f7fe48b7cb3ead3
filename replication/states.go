package replication

// Role of a node for one volume.
type Role string

// Roles.
const (
	Primary   Role = "Primary"
	Secondary Role = "Secondary"
)

// DiskState is the state of a node's copy of a volume (DRBD's names).
type DiskState string

// Disk states.
const (
	Diskless     DiskState = "Diskless"
	Attaching    DiskState = "Attaching"
	Inconsistent DiskState = "Inconsistent"
	Outdated     DiskState = "Outdated"
	Consistent   DiskState = "Consistent"
	UpToDate     DiskState = "UpToDate"
	Failed       DiskState = "Failed"
)

// ReplState is the state of the replication connection to one peer.
type ReplState string

// Replication states.
const (
	StandAlone  ReplState = "StandAlone"
	Connecting  ReplState = "Connecting"
	Connected   ReplState = "Connected"
	SyncSource  ReplState = "SyncSource"
	SyncTarget  ReplState = "SyncTarget"
	PausedSyncS ReplState = "PausedSyncS"
	PausedSyncT ReplState = "PausedSyncT"
	VerifyS     ReplState = "VerifyS"
	VerifyT     ReplState = "VerifyT"
)
