package web

import (
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestPageAHungNodeIsNotToldToStart: a node that accepts connections but
// answers nothing (hung, or SIGSTOPped) is running: the page says it is
// not answering and to check and restart it there, not "systemctl start
// replnode", which is for a stopped node.
func TestPageAHungNodeIsNotToldToStart(t *testing.T) {
	for _, tc := range []struct {
		name, code, text, command string
	}{
		{"hung", transport.ReachNoAnswer, "Node beta is not answering (hung or paused)", "systemctl status replnode; systemctl restart replnode"},
		{"stopped", transport.ReachRefused, "Node beta is unreachable", "systemctl start replnode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := healthyCluster()
			ni := nodeInfo(st, "beta")
			ni.Alive, ni.Membership, ni.ErrorCode = false, "dead", tc.code
			ni.Error = "not asked while gossip reports beta dead"
			b := replica(st, "beta")
			b.Reachable, b.Role, b.Disk, b.Replication = false, "Unknown", "DUnknown", "Unknown"
			p := render(t, pageInput{Status: st})
			if got := p.text("warning-node-down-beta-text"); !strings.Contains(got, tc.text) {
				t.Errorf("warning text %q, want %q", got, tc.text)
			}
			if got := p.text("warning-node-down-beta-command"); got != tc.command {
				t.Errorf("warning command %q, want %q", got, tc.command)
			}
		})
	}
}
