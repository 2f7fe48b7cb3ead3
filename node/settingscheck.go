package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// The settings that must agree on every node of a volume
// (replication.Settings: protocol, after_sb, size) are compared whenever
// two nodes meet: by both sides of every handshake, and, a moment after a
// node changed its own online (SIGHUP, replctl adjust), by that node
// against each peer's status. A node that finds a difference records an
// event (settings-mismatch, once per difference; settings-agree once it
// is gone). Status shows the differences from every node's own values
// (VolumeStatus.SettingMismatches), whichever node is asked.

// settingsSettle is how long after an online change the node compares
// its settings with its peers': an adjust of every node reaches them all
// meanwhile, so a change under way is not reported as a difference.
const settingsSettle = time.Second

// agreedSettings are this node's settings of the volume that must agree.
func (v *Volume) agreedSettings() *replication.Settings {
	sb, _ := replication.ParseAfterSplitBrain(v.cfg.AfterSB)
	return &replication.Settings{Protocol: string(v.settings().protocol), AfterSB: sb, Size: v.size.Load()}
}

// settingsOfStatus are the settings a node reports in its status.
func settingsOfStatus(lv transport.LocalVolume) replication.Settings {
	return replication.Settings{Protocol: lv.Protocol, AfterSB: replication.AfterSplitBrain(lv.AfterSB), Size: lv.Size}
}

// compareSettings compares this node's settings with a peer's (nil: an
// older peer sent none) and records an event when the difference changed.
func (v *Volume) compareSettings(peer string, theirs *replication.Settings) {
	if theirs == nil {
		return
	}
	diffs := v.agreedSettings().Diff(*theirs)
	v.mu.Lock()
	primaryHere, peerPrimary := v.roleLocked() == replication.Primary, v.st.Durable.Primary == peer
	var parts, fixes []string
	for _, d := range diffs {
		parts = append(parts, fmt.Sprintf("%s is %s on %s but %s on %s", d.Setting, d.Mine, v.self, d.Theirs, peer))
		want := d.Mine // the primary's value, when one of the two is primary
		if peerPrimary && !primaryHere {
			want = d.Theirs
		}
		fixes = append(fixes, settingFix(v.name, d.Setting, want))
	}
	text := strings.Join(parts, "; ")
	if v.settingDiffs == nil {
		v.settingDiffs = map[string]string{}
	}
	if v.settingDiffs[peer] == text {
		v.mu.Unlock()
		return
	}
	if text == "" {
		delete(v.settingDiffs, peer)
	} else {
		v.settingDiffs[peer] = text
	}
	v.mu.Unlock()
	if text == "" {
		v.log.Info("settings agree with the peer again", "peer", peer)
		v.node.emit(statefile.Event{Volume: v.name, Kind: "settings-agree", Peer: peer,
			Message: fmt.Sprintf("the settings that must agree (protocol, after_sb, size) agree with %s again", peer)})
		return
	}
	v.log.Warn("settings differ from the peer's", "peer", peer, "differences", text)
	var names []string
	for _, d := range diffs {
		names = append(names, string(d.Setting))
	}
	v.node.emit(statefile.Event{Volume: v.name, Kind: "settings-mismatch", Peer: peer, Reason: strings.Join(names, ","),
		Message: text + ". " + strings.Join(fixes, " ")})
}

// settingFix says why a difference matters and what ends it.
func settingFix(volume string, s replication.Setting, want string) string {
	switch s {
	case replication.SettingProtocol:
		return fmt.Sprintf("A failover would change how writes complete: make the config files agree, then replctl adjust %s --protocol %s (or SIGHUP the node whose file changed).", volume, want)
	case replication.SettingAfterSB:
		return "After a split brain the two would not pick the same victim: make volumes[].after_sb agree in the config files and restart replnode where it changed."
	case replication.SettingSize:
		return "The nodes do not replicate until the sizes agree (see the refusal)."
	}
	return ""
}

// checkSettingsSoon compares this node's settings with every peer's
// once an online change has settled.
func (v *Volume) checkSettingsSoon() {
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		ctx, cancel := v.untilStopping(context.Background())
		defer cancel()
		if !waitOut(ctx, v.clock, settingsSettle) {
			return
		}
		for _, peer := range slices.Sorted(maps.Keys(v.cfg.Disks)) {
			if peer == v.self {
				continue
			}
			ns, err := v.node.askStatus(ctx, peer, 0)
			if err != nil {
				continue // unreachable: the handshake compares when it connects
			}
			for _, lv := range ns.Volumes {
				if lv.Name == v.name {
					theirs := settingsOfStatus(lv)
					v.compareSettings(peer, &theirs)
				}
			}
		}
		v.settingsChecks.Add(1)
	}()
}

// settingMismatches lists the settings that must agree and do not, from
// each reachable node's own report of volume (byNode: node → its volumes);
// primary names the primary, whose value is the one to keep.
func settingMismatches(volume, primary string, byNode map[string]map[string]transport.LocalVolume) []transport.SettingMismatch {
	var out []transport.SettingMismatch
	nodes := slices.Sorted(maps.Keys(byNode))
	for i, s := range (replication.Settings{}).Values() {
		m := transport.SettingMismatch{Setting: string(s.Setting), Values: map[string]string{}}
		distinct := map[string]bool{}
		for _, node := range nodes {
			lv, ok := byNode[node][volume]
			if !ok {
				continue
			}
			val := settingsOfStatus(lv).Values()[i].Value
			if val == "" {
				continue // not reported: an older node
			}
			m.Values[node] = val
			distinct[val] = true
			if node == primary {
				m.Primary = val
			}
		}
		if len(distinct) > 1 {
			out = append(out, m)
		}
	}
	return out
}
