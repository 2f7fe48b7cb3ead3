package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
	"golang.org/x/term"
)

// Colours go to a terminal only: not into a pipe or a file, and not when
// NO_COLOR is set (https://no-color.org) or TERM is dumb, unless
// --color always says so.

// ANSI colours.
const (
	colorNone   = ""
	colorRed    = "31"
	colorGreen  = "32"
	colorYellow = "33"
	colorCyan   = "36"
	colorBold   = "1"
	colorDim    = "2"
)

// palette paints text when colours are on.
type palette struct{ on bool }

func (p palette) paint(color, s string) string {
	if !p.on || color == colorNone || s == "" {
		return s
	}
	return "\033[" + color + "m" + s + "\033[0m"
}

// paletteFor decides whether output to w gets colours (--color).
func (g *globals) paletteFor(w io.Writer) (palette, error) {
	switch g.color {
	case "always":
		return palette{on: true}, nil
	case "never":
		return palette{}, nil
	case "auto", "":
		if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
			return palette{}, nil
		}
		return palette{on: isTerminal(w)}, nil
	}
	return palette{}, usageErrorf("--color %q: want auto, always or never", g.color)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// cell is one table cell: its text and colour.
type cell struct {
	text  string
	color string
}

func plain(s string) cell { return cell{text: s} }

// table aligns columns by their text, then paints them (text/tabwriter
// would count the colour codes as width).
type table struct {
	indent string
	rows   [][]cell
}

func (t *table) add(cells ...cell) { t.rows = append(t.rows, cells) }

func (t *table) render(w io.Writer, p palette) {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c.text))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.WriteString(t.indent)
		for i, c := range r {
			b.WriteString(p.paint(c.color, c.text))
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c.text)+2))
			}
		}
		// No trailing blanks: the last cells may be empty.
		line := strings.TrimRight(b.String(), " ")
		fmt.Fprintln(w, line)
		b.Reset()
	}
}

// Colours of the states operators know from DRBD.

func diskColor(disk string) string {
	switch disk {
	case transport.DiskUpToDate:
		return colorGreen
	case transport.DiskDiskless, transport.DiskFailed:
		return colorRed
	case "DUnknown", "":
		return colorDim
	}
	return colorYellow // Inconsistent, Outdated, Consistent, Attaching
}

func replicationColor(repl string) string {
	switch repl {
	case transport.ReplConnected:
		return colorGreen
	case transport.ReplStandAlone:
		return colorRed
	case "Unknown", "":
		return colorDim
	}
	return colorYellow // Connecting, SyncSource/Target, Paused*, Verify*, Ahead, Behind
}

// syncing reports whether a replication state is a resync under way.
// bar is a progress bar of width characters for pct percent.
func bar(pct float64, width int) string {
	pct = min(max(pct, 0), 100)
	filled := int(pct / 100 * float64(width))
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]"
}

// eta is how long left bytes take at rate bytes per second ("?" when
// the rate is not known).
func eta(left, rate int64) string {
	if rate <= 0 {
		return "?"
	}
	return shortDuration(time.Duration(float64(left) / float64(rate) * float64(time.Second)))
}

// shortDuration prints 4s, 3m05s or 2h10m.
func shortDuration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// humanBytes is n bytes for people (the project's one formatter).
func humanBytes(n int64) string { return human.Bytes(n) }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
