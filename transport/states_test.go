package transport

import "testing"

// TestReplicationStatePredicates: a resync runs in SyncSource/SyncTarget
// and is paused in PausedSyncS/PausedSyncT (still syncing); a verify runs
// in VerifyS/VerifyT; Connected and StandAlone are none of these.
func TestReplicationStatePredicates(t *testing.T) {
	for _, tc := range []struct {
		repl                       string
		syncing, paused, verifying bool
	}{
		{ReplSyncSource, true, false, false},
		{ReplSyncTarget, true, false, false},
		{ReplPausedSyncS, true, true, false},
		{ReplPausedSyncT, true, true, false},
		{ReplVerifyS, false, false, true},
		{ReplVerifyT, false, false, true},
		{ReplConnected, false, false, false},
		{ReplStandAlone, false, false, false},
	} {
		if got := Syncing(tc.repl); got != tc.syncing {
			t.Errorf("Syncing(%s) = %v", tc.repl, got)
		}
		if got := SyncPaused(tc.repl); got != tc.paused {
			t.Errorf("SyncPaused(%s) = %v", tc.repl, got)
		}
		if got := Verifying(tc.repl); got != tc.verifying {
			t.Errorf("Verifying(%s) = %v", tc.repl, got)
		}
	}
}
