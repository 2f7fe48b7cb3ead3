package replication

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestSettingsDiff: two nodes' settings are compared setting by setting;
// a setting one side does not send (an older node) is not a difference.
func TestSettingsDiff(t *testing.T) {
	c := Settings{Protocol: "C", AfterSB: SBDisconnect, Size: 1 << 30}
	for _, tc := range []struct {
		name   string
		theirs Settings
		want   []SettingDiff
	}{
		{"the same", c, nil},
		{"protocol B on the peer", Settings{Protocol: "B", AfterSB: SBDisconnect, Size: 1 << 30},
			[]SettingDiff{{SettingProtocol, "C", "B"}}},
		{"another split-brain policy and size", Settings{Protocol: "C", AfterSB: SBDiscardZeroChanges, Size: 1 << 20},
			[]SettingDiff{{SettingAfterSB, "disconnect", "discard-zero-changes"}, {SettingSize, "1073741824", "1048576"}}},
		{"an older node sends nothing", Settings{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.Diff(tc.theirs); !slices.Equal(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestHelloWithoutSettings: a Hello or HelloReply of an older node, which
// has no settings, decodes with none (nothing to compare), and one with
// settings decodes them.
func TestHelloWithoutSettings(t *testing.T) {
	var h Hello
	if err := json.Unmarshal([]byte(`{"volume":"vol0","from":"alpha","to":"beta","epoch":1,"size":4096}`), &h); err != nil || h.Settings != nil {
		t.Fatalf("old hello: settings %+v, %v", h.Settings, err)
	}
	b, _ := json.Marshal(HelloReply{Accepted: true, Settings: &Settings{Protocol: "B", AfterSB: SBDisconnect, Size: 4096}})
	var r HelloReply
	if err := json.Unmarshal(b, &r); err != nil || r.Settings == nil || *r.Settings != (Settings{Protocol: "B", AfterSB: SBDisconnect, Size: 4096}) {
		t.Fatalf("reply settings %+v, %v (%s)", r.Settings, err, b)
	}
}
