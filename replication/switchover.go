package replication

import (
	"fmt"
	"time"
)

// A planned switchover hands the primary role to a peer that holds every
// write. The old primary may wait for the peer to catch up (a resync under
// way, a connection being made), but waiting is pointless when nothing
// moves the peer toward UpToDate: the operator disconnected it (on either
// side), it is StandAlone, its resync is paused, or its link has failed
// for longer than a reconnection takes. Then the switchover is refused,
// saying why and what to do, instead of running into the caller's
// timeout.

// SwitchoverPeer is what the primary knows of the peer a switchover would
// hand the volume to.
type SwitchoverPeer struct {
	Name        string
	Replication ReplState
	// Disk is the peer's disk state as the primary sees it (a DiskState,
	// or DUnknown while not connected).
	Disk           string
	OutOfSyncBytes int64
	// Down says why the last connection attempt failed, or why the
	// replication is down ("" when nothing failed since it started).
	Down string
	// ByOperator: it is down because an operator disconnected it (on
	// either side): only replctl connect brings it back.
	ByOperator bool
}

// SwitchoverLinkGrace is how long a switchover waits for a peer whose
// connection attempts fail to reconnect (a blip: the retries come within
// it) before it is refused.
const SwitchoverLinkGrace = 2 * time.Second

// SwitchoverVerdict is JudgeSwitchover's answer.
type SwitchoverVerdict int

// Switchover verdicts.
const (
	// SwitchoverReady: the peer holds every write; hand over.
	SwitchoverReady SwitchoverVerdict = iota
	// SwitchoverWait: the peer is catching up (or connecting); look again.
	SwitchoverWait
	// SwitchoverRefused: waiting cannot help; refuse now.
	SwitchoverRefused
)

// JudgeSwitchover says whether a switchover of volume from primary to the
// peer p, after waiting for it for waited, can go ahead, must wait, or is
// refused; a refusal comes with the words an operator needs (why, and
// what to do).
func JudgeSwitchover(volume, primary string, p SwitchoverPeer, waited time.Duration) (SwitchoverVerdict, string) {
	inSync := p.OutOfSyncBytes == 0 && p.Disk == string(UpToDate)
	switch p.Replication {
	case Connected, VerifyS, VerifyT:
		if inSync {
			return SwitchoverReady, ""
		}
		return SwitchoverWait, "" // a resync starts
	case SyncSource, SyncTarget, Ahead, Behind:
		return SwitchoverWait, ""
	case PausedSyncS, PausedSyncT:
		return SwitchoverRefused, fmt.Sprintf("%s is not in sync with %s (disk %s, %d bytes out of sync) and its resync is paused: resume it (replctl resync %s --node %s --resume), let it finish, then switch over",
			p.Name, primary, p.Disk, p.OutOfSyncBytes, volume, p.Name)
	case Connecting:
		if p.Down == "" || (!p.ByOperator && waited < SwitchoverLinkGrace) {
			return SwitchoverWait, "" // an attempt is under way
		}
	}
	connect := fmt.Sprintf("mend the link, or replctl connect %s --node %s if it was disconnected", volume, p.Name)
	if p.ByOperator {
		connect = fmt.Sprintf("replctl connect %s --node %s", volume, p.Name)
	}
	return SwitchoverRefused, fmt.Sprintf("%s is not in sync with %s and cannot catch up: it is not connected (%s%s; disk %s, %d bytes out of sync). Connect it (%s), let its resync finish (replctl status %s), then switch over",
		p.Name, primary, p.Replication, reasonText(p.Down), p.Disk, p.OutOfSyncBytes, connect, volume)
}

func reasonText(why string) string {
	if why == "" {
		return ""
	}
	return ": " + why
}
