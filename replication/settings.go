package replication

import "strconv"

// Settings are the settings of a volume that must agree on every node
// that holds it. The protocol is the primary's alone, but a failover
// hands writes to another node's; the split-brain policy is applied by
// both sides of a split, which must pick the same victim; the size must
// be the same for the nodes to replicate at all. Nodes send theirs in the
// handshake (Hello, HelloReply); an older node sends none.
type Settings struct {
	Protocol string          `json:"protocol,omitempty"`
	AfterSB  AfterSplitBrain `json:"after_sb,omitempty"`
	Size     int64           `json:"size,omitempty"`
}

// Setting names one of the settings that must agree, as the config file
// spells it.
type Setting string

// The settings that must agree.
const (
	SettingProtocol Setting = "protocol"
	SettingAfterSB  Setting = "after_sb"
	SettingSize     Setting = "size"
)

// SettingValue is one setting's value as the config file would write it;
// "" when not known (an older node did not send it).
type SettingValue struct {
	Setting Setting
	Value   string
}

// Values lists s's settings, in a fixed order.
func (s Settings) Values() []SettingValue {
	size := ""
	if s.Size > 0 {
		size = strconv.FormatInt(s.Size, 10)
	}
	return []SettingValue{{SettingProtocol, s.Protocol}, {SettingAfterSB, string(s.AfterSB)}, {SettingSize, size}}
}

// SettingDiff is a setting on which two nodes disagree.
type SettingDiff struct {
	Setting      Setting
	Mine, Theirs string
}

// Diff lists the settings on which s and the peer's disagree. A setting
// either side does not know is not compared.
func (s Settings) Diff(peer Settings) []SettingDiff {
	var out []SettingDiff
	theirs := peer.Values()
	for i, mine := range s.Values() {
		if mine.Value != "" && theirs[i].Value != "" && mine.Value != theirs[i].Value {
			out = append(out, SettingDiff{Setting: mine.Setting, Mine: mine.Value, Theirs: theirs[i].Value})
		}
	}
	return out
}
