package web

import (
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestPageWarnsOfSettingsThatDisagree: a setting that must agree on every
// node of a volume and does not is a warning on the page naming each
// node's value and the command that ends it: for the protocol, an adjust
// to the primary's; for after_sb, a restart where the file differs; for
// the size (a node a resize left behind), a resize to the largest.
func TestPageWarnsOfSettingsThatDisagree(t *testing.T) {
	st := healthyCluster()
	st.Volumes[0].SettingMismatches = []transport.SettingMismatch{
		{Setting: "protocol", Values: map[string]string{"alpha": "C", "beta": "B"}, Primary: "C"},
		{Setting: "after_sb", Values: map[string]string{"alpha": "disconnect", "beta": "discard-zero-changes"}, Primary: "disconnect"},
		{Setting: "size", Values: map[string]string{"alpha": "268435456", "beta": "67108864"}, Primary: "268435456"},
	}
	p := render(t, pageInput{Status: st})
	for _, tc := range []struct{ id, text, command, where string }{
		{"warning-settings-mismatch-vol0-protocol", "disagree on protocol: alpha C, beta B", "replctl adjust vol0 --protocol C", ""},
		{"warning-settings-mismatch-vol0-after_sb", "disagree on after_sb: alpha disconnect, beta discard-zero-changes", "systemctl restart replnode", "on beta"},
		{"warning-settings-mismatch-vol0-size", "disagree on size: alpha 268435456, beta 67108864", "replctl resize vol0 268435456", ""},
	} {
		if got := p.text(tc.id + "-text"); !strings.Contains(got, tc.text) {
			t.Errorf("%s: text %q, want it to say %q", tc.id, got, tc.text)
		}
		if got := p.text(tc.id + "-command"); got != tc.command {
			t.Errorf("%s: command %q, want %q", tc.id, got, tc.command)
		}
		if !strings.Contains(p.text(tc.id), tc.where) {
			t.Errorf("%s: %q does not say where: %q", tc.id, p.text(tc.id), tc.where)
		}
	}
	if ws := healthWarnings(healthyCluster()); len(ws) != 0 {
		t.Fatalf("a healthy cluster has warnings: %+v", ws)
	}
}
