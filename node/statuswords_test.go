package node

import (
	"testing"

	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// TestStatusWordsAreTheStatesTheNodeReports pins transport's state words,
// which the web page and tools compare the status with, to the states the
// replication rules, multipath and the node put in it: a state renamed on
// one side and not the other fails here instead of never matching.
func TestStatusWordsAreTheStatesTheNodeReports(t *testing.T) {
	for _, tc := range []struct {
		word, state string
	}{
		{transport.RolePrimary, string(replication.Primary)},
		{transport.RoleSecondary, string(replication.Secondary)},
		{transport.DiskDiskless, string(replication.Diskless)},
		{transport.DiskAttaching, string(replication.Attaching)},
		{transport.DiskInconsistent, string(replication.Inconsistent)},
		{transport.DiskOutdated, string(replication.Outdated)},
		{transport.DiskConsistent, string(replication.Consistent)},
		{transport.DiskUpToDate, string(replication.UpToDate)},
		{transport.DiskFailed, string(replication.Failed)},
		{transport.ReplStandAlone, string(replication.StandAlone)},
		{transport.ReplConnecting, string(replication.Connecting)},
		{transport.ReplConnected, string(replication.Connected)},
		{transport.ReplSyncSource, string(replication.SyncSource)},
		{transport.ReplSyncTarget, string(replication.SyncTarget)},
		{transport.ReplPausedSyncS, string(replication.PausedSyncS)},
		{transport.ReplPausedSyncT, string(replication.PausedSyncT)},
		{transport.ReplVerifyS, string(replication.VerifyS)},
		{transport.ReplVerifyT, string(replication.VerifyT)},
		{transport.ReplAhead, string(replication.Ahead)},
		{transport.ReplBehind, string(replication.Behind)},
		{transport.PathActive, multipath.Active.String()},
		{transport.PathPassive, multipath.Passive.String()},
		{transport.PathFail, multipath.Fail.String()},
		{transport.ReasonWaitingForPeer, string(CauseWaitingForPeer)},
		{transport.ReasonSplitBrain, string(CauseSplitBrain)},
		{transport.ReasonDetached, string(CauseDetached)},
		{transport.ReasonAdminDown, string(CauseAdminDown)},
		{transport.ReasonDiskFailed, string(CauseDiskFailed)},
		{transport.ReasonStateWrite, string(CauseStateWriteFailed)},
		{transport.ReasonNoSuchVolume, string(CauseNoVolume)},
	} {
		if tc.word != tc.state {
			t.Errorf("transport's word %q stands for the state %q", tc.word, tc.state)
		}
	}
}
