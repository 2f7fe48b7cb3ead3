package connlimit

import (
	"fmt"
	"strings"
	"time"
)

// sourceLog lets a line about a source through at most once per interval,
// with the counts of what happened since its last line: the first
// refusal from a source is logged at once, a flood from it a line per
// interval. Beyond maxLoggedSources sources, one line speaks for all the
// others. Guarded by the Limiter's mutex.
type sourceLog struct {
	interval time.Duration
	entries  map[Source]*logEntry
	others   logEntry
}

type logEntry struct {
	next   time.Time // no line before
	counts [numReasons]uint64
}

// logLine is a line to log: what happened with source (others: the
// sources beyond maxLoggedSources) since its last line.
type logLine struct {
	source Source
	others bool
	counts [numReasons]uint64
}

// note counts r for src at now, and appends a line to lines if one is due.
func (sl *sourceLog) note(src Source, r Reason, now time.Time, lines []logLine) []logLine {
	e, others := sl.entries[src], false
	if e == nil {
		if len(sl.entries) >= maxLoggedSources {
			for s, old := range sl.entries {
				if !now.Before(old.next) {
					delete(sl.entries, s) // quiet for an interval: what it owes is in Stats
				}
			}
		}
		if len(sl.entries) < maxLoggedSources {
			e = &logEntry{}
			sl.entries[src] = e
		} else {
			e, others = &sl.others, true
		}
	}
	e.counts[r]++
	if now.Before(e.next) {
		return lines
	}
	line := logLine{source: src, others: others, counts: e.counts}
	e.counts = [numReasons]uint64{}
	e.next = now.Add(sl.interval)
	return append(lines, line)
}

// emit logs line in words.
func (l *Limiter) emit(line logLine) {
	cfg := l.cfg
	from := line.source.String()
	if line.others {
		from = fmt.Sprintf("more than %d addresses (the last %s)", maxLoggedSources, from)
	}
	var refused, closed uint64
	var why []string
	for _, r := range Reasons() {
		n := line.counts[r]
		if n == 0 {
			continue
		}
		if r.Refusal() {
			refused += n
		} else {
			closed += n
		}
		switch r {
		case SourceOpen:
			why = append(why, fmt.Sprintf("%d refused: %d connections from that address are open, the most one address may hold", n, cfg.PerSourceOpen))
		case SourceHandshakes:
			why = append(why, fmt.Sprintf("%d refused: %d handshakes from that address are in progress, the most one address may have", n, cfg.PerSourceHandshakes))
		case PortFull:
			why = append(why, fmt.Sprintf("%d refused: the port's connections are taken (%d in all, %d for addresses outside the cluster)", n, cfg.MaxOpen, cfg.StrangerOpen))
		case HandshakesFull:
			why = append(why, fmt.Sprintf("%d refused: the port's handshakes are taken (%d in all, %d for addresses outside the cluster)", n, cfg.MaxHandshakes, cfg.StrangerHandshakes))
		case Evicted:
			why = append(why, fmt.Sprintf("%d unfinished handshake(s) closed to make room for new connections", n))
		case SlowHandshake:
			why = append(why, fmt.Sprintf("%d handshake(s) closed unfinished after %v (%v while the port is busy)", n, cfg.HandshakeTimeout, cfg.PressureTimeout))
		}
	}
	var did []string
	if refused > 0 {
		did = append(did, fmt.Sprintf("refused %d new connection(s)", refused))
	}
	if closed > 0 {
		did = append(did, fmt.Sprintf("closed %d unfinished handshake(s)", closed))
	}
	l.log.Warn(fmt.Sprintf("%s: from %s, %s: %s; the port goes on serving the others",
		cfg.Port, from, strings.Join(did, " and "), strings.Join(why, "; ")),
		"port", cfg.Port, "from", from, "refused", refused, "closed", closed, "interval", cfg.LogInterval)
}
