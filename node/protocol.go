package node

import (
	"fmt"
	"time"

	"github.com/replvol/replvol/replication"
)

// settings are a volume's replication settings that replctl adjust changes
// online: they start from the config file and are replaced whole (never
// changed in place), so the IO path reads them without a lock.
type settings struct {
	// protocol is 'A' (a write completes once written locally and queued
	// for the peers), 'B' (once the peers received it) or 'C' (once the
	// peers wrote it).
	protocol   byte
	congestion replication.CongestionConfig
	maxLag     int64
	// congestionChosen: the policy was named (by the file's
	// on_congestion or replctl adjust --on-congestion); otherwise it is
	// the protocol's default and follows a change of protocol.
	congestionChosen bool
	reads            replication.ReadBalancing
	// resyncRate caps resync in bytes per second; 0: no cap.
	resyncRate int64
}

// settingsOf builds the settings a config file gives (validated already).
func settingsOf(cfg VolumeConfig) *settings {
	s := &settings{protocol: cfg.ProtocolOrDefault()[0], maxLag: int64(cfg.MaxLag), resyncRate: int64(cfg.ResyncRate)}
	policy := replication.DefaultOnCongestion(cfg.ProtocolOrDefault())
	if cfg.OnCongestion != "" {
		policy, s.congestionChosen = replication.OnCongestion(cfg.OnCongestion), true
	}
	s.congestion = replication.CongestionConfig{Policy: policy, SendBuffer: int64(cfg.SendBuffer)}.WithDefaults()
	s.reads, _ = replication.ParseReadBalancing(cfg.ReadBalancing)
	return s
}

// settings returns the volume's settings now.
func (v *Volume) settings() *settings { return v.set.Load() }

// adjust changes the settings online: protocol ("" keeps it), congestion
// policy (a policy names it; "" keeps a named one that still fits the
// protocol, and otherwise takes the protocol's default, as DefaultPolicy
// does: pull-ahead under A, block under B and C), resync rate (nil keeps
// it, 0 lifts the cap). No IO fails and nothing is resynced; streams pick
// the change up at their next write, a running resync at its next run.
func (v *Volume) adjust(protocol, onCongestion string, resyncRate *int64) (*settings, error) {
	old := v.settings()
	s := *old
	if protocol != "" {
		switch protocol {
		case "A", "B", "C":
			s.protocol = protocol[0]
		default:
			return nil, fmt.Errorf("protocol %q: want A, B or C", protocol)
		}
	}
	policy, chosen, err := congestionPolicy(s.protocol, s.congestion.Policy, s.congestionChosen, onCongestion)
	if err != nil {
		return nil, err
	}
	s.congestion.Policy, s.congestionChosen = policy, chosen
	if resyncRate != nil {
		if *resyncRate < 0 {
			return nil, fmt.Errorf("resync rate %d: want bytes per second, or 0 for no cap", *resyncRate)
		}
		s.resyncRate = *resyncRate
	}
	v.set.Store(&s)
	v.log.Info("settings adjusted", "protocol", string(s.protocol), "on_congestion", policy, "resync_rate", s.resyncRate)
	v.node.event(v.name, "adjusted", fmt.Sprintf("protocol %c, on_congestion %s, resync rate %s (was protocol %c, %s, %s)",
		s.protocol, policy, rateText(s.resyncRate), old.protocol, old.congestion.Policy, rateText(old.resyncRate)))
	if s.protocol != old.protocol {
		v.checkSettingsSoon()
	}
	return &s, nil
}

// congestionPolicy is the congestion policy in force after an adjust to
// protocol that asks for requested ("" for nothing), from current (named,
// or the old protocol's default): a named policy holds while it fits the
// protocol; an unnamed one is always the protocol's default.
func congestionPolicy(protocol byte, current replication.OnCongestion, named bool, requested string) (replication.OnCongestion, bool, error) {
	switch requested {
	case "":
		if named && replication.CheckOnCongestion(string(protocol), current) == nil {
			return current, true, nil
		}
		return replication.DefaultOnCongestion(string(protocol)), false, nil
	case DefaultPolicy:
		return replication.DefaultOnCongestion(string(protocol)), false, nil
	}
	p, err := replication.ParseOnCongestion(requested)
	if err != nil {
		return "", false, fmt.Errorf("%w, or %s (the protocol's own)", err, DefaultPolicy)
	}
	if err := replication.CheckOnCongestion(string(protocol), p); err != nil {
		return "", false, err
	}
	return p, true, nil
}

// DefaultPolicy, given to adjust as the congestion policy, goes back to
// the protocol's default, which then follows the protocol.
const DefaultPolicy = "default"

// lagOf reports a peer's lag: bytes acknowledged to clients but not yet on
// the peer (plus blocks marked while Ahead) and the age of the oldest.
func (p *peer) lagOf(now time.Time) (int64, time.Duration) {
	lv := p.lagView.Load()
	if lv == nil {
		return 0, 0
	}
	return lv.bytes, replication.AgeSince(lv.oldest, now)
}

// lagView is a snapshot of a peer's lag, published by the loop that owns
// it.
type lagView struct {
	bytes  int64
	oldest time.Time
}

// rateText is a resync rate for people: "no cap" or "50.0MiB/s".
func rateText(rate int64) string {
	if rate <= 0 {
		return "no cap"
	}
	return fmt.Sprintf("%.1fMiB/s", float64(rate)/(1<<20))
}
