package web

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/replvol/replvol/transport"
)

// Settings that must agree on every node of a volume, by their names in
// the config file (replication.Setting; web reads only transport).
const (
	settingProtocol = "protocol"
	settingAfterSB  = "after_sb"
	settingSize     = "size"
)

// settingsWarnings warns of each setting that must agree on every node of
// v and does not, naming each node's value and what ends the difference.
func settingsWarnings(v *transport.VolumeStatus) []Warning {
	var out []Warning
	for _, m := range v.SettingMismatches {
		nodes := slices.Sorted(maps.Keys(m.Values))
		var values, differ []string
		for _, n := range nodes {
			values = append(values, n+" "+m.Values[n])
			if m.Primary != "" && m.Values[n] != m.Primary {
				differ = append(differ, n)
			}
		}
		w := Warning{
			ID: elementID("warning", "settings-mismatch", v.Name, m.Setting), Severity: severityWarning,
			Text: fmt.Sprintf("The nodes of %s disagree on %s: %s.", v.Name, m.Setting, strings.Join(values, ", ")),
		}
		where := "on the nodes whose file differs"
		if len(differ) > 0 {
			where = "on " + strings.Join(differ, " and ")
		}
		switch m.Setting {
		case settingProtocol:
			w.Detail = "A failover to a node with another protocol changes how writes complete."
			if m.Primary != "" {
				w.Command = fmt.Sprintf("replctl adjust %s --protocol %s", v.Name, m.Primary)
				w.Risk = "Make the config files agree too, or a SIGHUP or restart brings the difference back."
			} else {
				w.Detail += " Make the config files agree and send replnode SIGHUP (systemctl reload replnode) where they changed."
			}
		case settingAfterSB:
			w.Detail = "After a split brain both sides must pick the same victim. Make volumes[].after_sb agree in the config files first."
			w.Command, w.Where = "systemctl restart replnode", where
		case settingSize:
			w.Detail = "The nodes do not replicate until the sizes agree: the secondary's refusal says how to fix it."
			// Most likely a resize left a node behind (it was down, or
			// the resize stopped half-way): grow the smaller ones.
			var largest int64
			for _, val := range m.Values {
				if n, err := strconv.ParseInt(val, 10, 64); err == nil && n > largest {
					largest = n
				}
			}
			if largest > 0 {
				w.Command = fmt.Sprintf("replctl resize %s %d", v.Name, largest)
				w.Risk = "Every node's disk must hold that size with its metadata first (the command names one that does not, and changes nothing then); the range gained reads as zeroes, nothing is resynced. A volume only grows."
			}
		}
		out = append(out, w)
	}
	return out
}
