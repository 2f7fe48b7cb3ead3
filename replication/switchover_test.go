package replication

import (
	"strings"
	"testing"
	"time"
)

// A switchover waits only while the target moves toward UpToDate by
// itself (a resync under way, a first connection attempt); a target that
// nothing will bring in sync is refused at once, naming why and what to
// do.
func TestJudgeSwitchover(t *testing.T) {
	cases := []struct {
		name   string
		peer   SwitchoverPeer
		waited time.Duration
		want   SwitchoverVerdict
		words  []string // in the refusal
	}{
		{"connected and UpToDate", SwitchoverPeer{Replication: Connected, Disk: "UpToDate"}, 0, SwitchoverReady, nil},
		{"verifying, UpToDate", SwitchoverPeer{Replication: VerifyS, Disk: "UpToDate"}, 0, SwitchoverReady, nil},
		{"connected, a resync about to start", SwitchoverPeer{Replication: Connected, Disk: "Outdated", OutOfSyncBytes: 4096}, 0, SwitchoverWait, nil},
		{"a resync under way", SwitchoverPeer{Replication: SyncSource, Disk: "Inconsistent", OutOfSyncBytes: 1 << 20}, 5 * time.Second, SwitchoverWait, nil},
		{"ahead, catching up later", SwitchoverPeer{Replication: Ahead, Disk: "Outdated", OutOfSyncBytes: 1 << 20}, 0, SwitchoverWait, nil},
		{"the first connection attempt under way", SwitchoverPeer{Replication: Connecting, Disk: "DUnknown"}, 5 * time.Second, SwitchoverWait, nil},
		{"disconnected by the operator: Outdated, Connecting, refused by the peer",
			SwitchoverPeer{Replication: Connecting, Disk: "Outdated", OutOfSyncBytes: 8192, Down: "beta is disconnected by the operator", ByOperator: true}, 0,
			SwitchoverRefused, []string{"beta is not in sync with alpha", "not connected (Connecting: beta is disconnected by the operator", "disk Outdated, 8192 bytes out of sync", "replctl connect vol0 --node beta"}},
		{"the link failed a moment ago: a reconnection may come", SwitchoverPeer{Replication: Connecting, Disk: "Outdated", Down: "connection refused"}, time.Second, SwitchoverWait, nil},
		{"the link has failed for longer than a reconnection takes", SwitchoverPeer{Replication: Connecting, Disk: "Outdated", Down: "connection refused"}, SwitchoverLinkGrace,
			SwitchoverRefused, []string{"not connected (Connecting: connection refused", "mend the link"}},
		{"this primary disconnected by the operator", SwitchoverPeer{Replication: StandAlone, Disk: "DUnknown", Down: "disconnected by operator", ByOperator: true}, 0,
			SwitchoverRefused, []string{"not connected (StandAlone: disconnected by operator"}},
		{"StandAlone after a split brain", SwitchoverPeer{Replication: StandAlone, Disk: "Outdated"}, 0,
			SwitchoverRefused, []string{"not connected (StandAlone; disk Outdated"}},
		{"its resync paused", SwitchoverPeer{Replication: PausedSyncS, Disk: "Inconsistent", OutOfSyncBytes: 1 << 20}, 0,
			SwitchoverRefused, []string{"resync is paused", "replctl resync vol0 --node beta --resume"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.peer.Name = "beta"
			got, why := JudgeSwitchover("vol0", "alpha", c.peer, c.waited)
			if got != c.want {
				t.Fatalf("JudgeSwitchover(%+v) = %v (%s), want %v", c.peer, got, why, c.want)
			}
			if (why != "") != (c.want == SwitchoverRefused) {
				t.Fatalf("verdict %v with reason %q", got, why)
			}
			for _, w := range c.words {
				if !strings.Contains(why, w) {
					t.Errorf("refusal %q lacks %q", why, w)
				}
			}
		})
	}
}
