package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newScrub(g *globals) *cobra.Command {
	var r transport.ScrubRequest
	var rate string
	var wait bool
	cmd := &cobra.Command{
		Use:   "scrub VOLUME [--node NAME] [--rate RATE] [--pause | --resume | --stop] [--wait]",
		Short: "Read a volume's whole disk on each node, verify every checksum and repair bad blocks from a replica",
		Long: `Each node that holds a disk of the volume (--node: that one) reads it in order,
checks every block that has a checksum, and rewrites a block that fails (or
that the disk cannot read) with a good copy from a replica in sync, as a
verified read does: the primary takes it from a peer, a secondary from its
primary. A block no replica holds good is counted unrecoverable (event
block-unrecoverable names it; a write to it clears it).
  --rate 50MiB   read at most this many bytes per second (default: a quarter
                 of the volume's resync_rate, or 64MiB/s when resync is
                 uncapped)
  --pause, --resume, --stop   the scrub under way; a restart of a node
                 resumes its running scrub where it was
  --wait         show progress until every node's scrub ends; exit 0 when
                 nothing unrecoverable was found, 6 when something was
Status shows it per replica (integrity.scrub: state, percent, ETA).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rate != "" {
				n, err := config.ParseSize(strings.TrimSuffix(rate, "/s"))
				if err != nil || n <= 0 {
					return usageErrorf("--rate %q: give bytes per second above 0, such as 50MiB", rate)
				}
				r.Rate = n
			}
			if (r.Pause && (r.Resume || r.Stop)) || (r.Resume && r.Stop) {
				return usageErrorf("give one of --pause, --resume and --stop")
			}
			if r.Rate != 0 && (r.Pause || r.Resume || r.Stop) {
				return usageErrorf("--rate goes with the start of a scrub")
			}
			if wait && (r.Pause || r.Stop) {
				return usageErrorf("--wait follows a scrub that runs: not with --pause or --stop")
			}
			r.Volume = args[0]
			k, err := g.dial(cmd, "the scrub")
			if err != nil {
				return err
			}
			defer k.close()
			if err := k.precheck(r.Volume, r.Node); err != nil {
				return err
			}
			reply, err := k.c.Scrub(k.ctx, &r)
			out := cmd.OutOrStdout()
			var took []transport.ScrubbedNode
			if reply != nil {
				for _, n := range reply.Nodes {
					if n.Refused != "" {
						fmt.Fprintf(out, "%s on %s: %s\n", r.Volume, n.Node, n.Refused)
						continue
					}
					took = append(took, n)
					fmt.Fprintf(out, "%s on %s: scrub %s, %.1f%%\n", r.Volume, n.Node, n.Scrub.State, n.Scrub.Percent)
				}
			}
			if err != nil {
				return k.fail(err, r.Volume, r.Node)
			}
			if !wait {
				return nil
			}
			pal, err := g.paletteFor(out)
			if err != nil {
				return err
			}
			return waitScrub(cmd.Context(), k.c, r, took, out, pal)
		},
	}
	cmd.Flags().StringVar(&r.Node, "node", "", "scrub this node's disk only")
	cmd.Flags().StringVar(&rate, "rate", "", "bytes per second to read at, such as 50MiB")
	cmd.Flags().BoolVar(&r.Pause, "pause", false, "pause the scrub under way")
	cmd.Flags().BoolVar(&r.Resume, "resume", false, "resume a paused scrub")
	cmd.Flags().BoolVar(&r.Stop, "stop", false, "stop the scrub under way")
	cmd.Flags().BoolVar(&wait, "wait", false, "show progress until the scrub ends; exit 6 when it found blocks no replica holds good")
	return cmd
}

// errUnrecoverableFound is scrub --wait's verdict when blocks remain bad.
var errUnrecoverableFound = errors.New("the scrub found blocks that no replica holds good")

// waitScrub follows the scrub of the nodes that took it (asking them
// where it is, as a query of the same command) until each one has
// finished (its last_finished moved on from what it was at the start);
// an exit code 6 error when one found unrecoverable blocks.
func waitScrub(ctx context.Context, c *transport.ControlClient, r transport.ScrubRequest, nodes []transport.ScrubbedNode, out io.Writer, pal palette) error {
	before := map[string]*time.Time{}
	var names []string
	for _, n := range nodes {
		before[n.Node] = n.Scrub.LastFinished
		names = append(names, n.Node)
	}
	tty := isTerminal(out)
	query := transport.ScrubRequest{Volume: r.Volume, Node: r.Node, Query: true}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		reply, err := c.Scrub(qctx, &query)
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("stopped waiting; the scrub goes on (replctl status shows it)")
		}
		if err != nil && reply == nil {
			return unreachableError(fmt.Errorf("lost the node while waiting (the scrub goes on): %s", plainMessage(err.Error())))
		}
		var unrecoverable, repaired int64
		var stopped, parts []string
		var pct, eta float64
		done := 0
		for _, n := range reply.Nodes {
			if !slices.Contains(names, n.Node) || n.Refused != "" {
				continue
			}
			sc := n.Scrub
			finished := sc.State == "idle" && sc.LastFinished != nil && (before[n.Node] == nil || sc.LastFinished.After(*before[n.Node]))
			switch {
			case finished:
				done++
				pct += 100
				unrecoverable += sc.LastUnrecoverable
				repaired += sc.LastRepaired
				parts = append(parts, fmt.Sprintf("%s done", n.Node))
			case sc.State == "idle":
				done++
				stopped = append(stopped, n.Node)
				parts = append(parts, n.Node+" stopped")
			default:
				pct += sc.Percent
				unrecoverable += sc.UnrecoverableBlocks
				repaired += sc.RepairedBlocks
				eta = max(eta, sc.ETASeconds)
				parts = append(parts, fmt.Sprintf("%s %s %.1f%%", n.Node, sc.State, sc.Percent))
			}
		}
		if len(names) > 0 {
			pct /= float64(len(names))
		}
		line := fmt.Sprintf("%s: scrub %5.1f%%, %d repaired, %d unrecoverable (%s)", r.Volume, pct, repaired, unrecoverable, strings.Join(parts, ", "))
		if done == len(names) {
			if tty {
				fmt.Fprint(out, "\r\033[K")
			}
			fmt.Fprintln(out, line)
			switch {
			case len(stopped) > 0:
				return fmt.Errorf("the scrub of %s on %s stopped before it finished (replctl events says why)", r.Volume, strings.Join(stopped, ", "))
			case unrecoverable > 0:
				return &exitError{code: exitUnrecoverable, err: fmt.Errorf("%w: %d blocks of %s (the block-unrecoverable events name them; write those ranges again, from a backup or what the application knows, to clear them)", errUnrecoverableFound, unrecoverable, r.Volume)}
			}
			return nil
		}
		switch {
		case tty:
			fmt.Fprintf(out, "\r\033[K%s", pal.paint(colorCyan, fmt.Sprintf("%s %s ETA %s", line, bar(pct, 30), time.Duration(eta*float64(time.Second)).Round(time.Second))))
		case line != last:
			fmt.Fprintln(out, line)
		}
		last = line
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}
