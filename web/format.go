package web

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/human"
)

// humanBytes is n bytes for people, with a space before the unit (the
// project's one formatter).
func humanBytes(n int64) string { return human.SpacedBytes(n) }

func formatPercent(f float64) string { return fmt.Sprintf("%.1f%%", f) }

// humanRate is a speed in bytes per second.
func humanRate(bytesPerSecond float64) string {
	return humanBytes(int64(math.Round(bytesPerSecond))) + "/s"
}

// humanCount is a count with k and M for thousands and millions.
func humanCount(f float64) string {
	switch {
	case f >= 1e6:
		return fmt.Sprintf("%.1fM", f/1e6)
	case f >= 1e4:
		return fmt.Sprintf("%.0fk", f/1e3)
	case f >= 1e3:
		return fmt.Sprintf("%.1fk", f/1e3)
	case f >= 10 || f == 0:
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}

// humanDuration is a duration the way an operator reads an ETA: "45 s",
// "3 min 20 s", "2 h 5 min".
func humanDuration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
		if s == 0 {
			return fmt.Sprintf("%d min", m)
		}
		return fmt.Sprintf("%d min %d s", m, s)
	}
	h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
	if m == 0 {
		return fmt.Sprintf("%d h", h)
	}
	return fmt.Sprintf("%d h %d min", h, m)
}

// humanSeconds is a lag or age given in seconds.
func humanSeconds(s float64) string {
	if s < 10 {
		return fmt.Sprintf("%.1f s", s)
	}
	return humanDuration(time.Duration(s * float64(time.Second)))
}

// micros is a latency given in microseconds.
func micros(us int64) string {
	if us >= 10000 {
		return fmt.Sprintf("%.1f ms", float64(us)/1000)
	}
	return fmt.Sprintf("%d µs", us)
}

// elementID joins parts into an element id: "replica", "vol0", "beta"
// gives "replica-vol0-beta". Characters other than letters, digits, '-',
// '_' and '.' become '_', so an id is one token that CSS selectors and
// getElementById take as it is.
func elementID(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('-')
		}
		for _, r := range p {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
				b.WriteRune(r)
			default:
				b.WriteByte('_')
			}
		}
	}
	return b.String()
}
