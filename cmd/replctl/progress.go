package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/replvol/replvol/transport"
)

// progressPoll is how one of the --wait loops (resync, verify) shows its
// progress: what it waits on, for the messages, how often it reads the
// cluster's status, the color of the live line on a terminal, and whether
// a pipe is shown each line that changed (or only the last).
type progressPoll struct {
	what    string
	every   time.Duration
	color   string
	changes bool
}

// waitResync prints progress until every replica of volume is UpToDate
// and Connected, or ctx ends (Ctrl-C: the resync goes on).
func waitResync(ctx context.Context, c *transport.ControlClient, volume string, out io.Writer, tty bool, pal palette) error {
	poll := progressPoll{what: "resync", every: 500 * time.Millisecond, color: colorYellow, changes: true}
	return waitProgress(ctx, c, out, tty, pal, poll, func(st *transport.ClusterStatus) (string, string, bool) {
		line, finished := resyncLine(st, volume)
		return line, line, finished
	})
}

// waitProgress reads the cluster's status every p.every and renders it
// until render says it has finished, or ctx ends (Ctrl-C: the work goes
// on). line is the line a pipe is shown, and the last line; live is what
// a terminal shows in its place while the work runs.
func waitProgress(ctx context.Context, c *transport.ControlClient, out io.Writer, tty bool, pal palette, p progressPoll,
	render func(*transport.ClusterStatus) (line, live string, finished bool)) error {
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	var last string
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := c.ClusterStatus(sctx, &transport.StatusRequest{})
		cancel()
		if ctx.Err() != nil {
			if tty {
				fmt.Fprintln(out)
			}
			return fmt.Errorf("stopped waiting; the %s goes on (replctl status shows it)", p.what)
		}
		if err != nil {
			return unreachableError(fmt.Errorf("lost the node while waiting (the %s goes on): %s", p.what, plainMessage(err.Error())))
		}
		line, live, finished := render(st)
		switch {
		case finished:
			if tty {
				fmt.Fprint(out, "\r\033[K")
			}
			fmt.Fprintln(out, line)
			return nil
		case tty:
			fmt.Fprintf(out, "\r\033[K%s", pal.paint(p.color, live))
		case p.changes && line != last:
			fmt.Fprintln(out, line)
		}
		last = line
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}
