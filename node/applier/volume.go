package applier

import "github.com/replvol/replvol/node/applier/apply"

// The volume a stream is applied to, and its seams, are apply's: the
// step that Run drives (and the simulation, which links no transport)
// is defined over them. See apply.Volume and the interfaces for what
// each holds and in which order the applier calls them.
type (
	Volume      = apply.Volume
	Disk        = apply.Disk
	ActivityLog = apply.ActivityLog
	State       = apply.State
	Checksums   = apply.Checksums
)
