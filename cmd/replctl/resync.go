package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func newResync(g *globals) *cobra.Command {
	var (
		from          string
		pause, resume bool
		wait          bool
	)
	cmd := &cobra.Command{
		Use:   "resync VOLUME [--from NODE] [--pause | --resume] [--wait]",
		Short: "Resync a volume's secondaries in full from the primary, or pause/resume a resync",
		Long: `Without --pause or --resume, every block of VOLUME is resynced from the primary
to every secondary (DRBD's invalidate of the peers); the secondaries are
Inconsistent until it ends. --from names the node whose data wins; it must be
the primary. --wait shows progress (percent, speed, ETA) until every replica is
UpToDate again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.dial()
			if err != nil {
				return err
			}
			defer done()
			r, err := c.Resync(ctx, &transport.ResyncRequest{Volume: args[0], From: from, Pause: pause, Resume: resume})
			if err != nil {
				return g.apiError(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s: %s on %s for %s\n", args[0], r.Action, r.Primary, strings.Join(r.Peers, ", "))
			if !wait {
				return nil
			}
			wctx, cancel := context.WithTimeout(context.Background(), 24*time.Hour)
			defer cancel()
			return waitResync(wctx, c, args[0], out, isTerminal(out))
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the node whose data wins (must be the primary)")
	cmd.Flags().BoolVar(&pause, "pause", false, "pause the resync under way")
	cmd.Flags().BoolVar(&resume, "resume", false, "resume a paused resync")
	cmd.Flags().BoolVar(&wait, "wait", false, "show progress until the resync ends")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// waitResync prints progress until every replica of volume is UpToDate
// and Connected.
func waitResync(ctx context.Context, c *transport.ControlClient, volume string, out io.Writer, tty bool) error {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		st, err := c.ClusterStatus(ctx, &transport.StatusRequest{})
		if err != nil {
			return err
		}
		line, finished := resyncLine(st, volume)
		switch {
		case finished:
			if tty {
				fmt.Fprint(out, "\r\033[K")
			}
			fmt.Fprintln(out, line)
			return nil
		case tty:
			fmt.Fprintf(out, "\r\033[K%s", line)
		case line != last:
			fmt.Fprintln(out, line)
		}
		last = line
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// resyncLine renders one progress line: a bar, percent, speed and ETA of
// the slowest replica.
func resyncLine(st *transport.ClusterStatus, volume string) (string, bool) {
	for _, v := range st.Volumes {
		if v.Name != volume {
			continue
		}
		var worst *transport.ReplicaStatus
		inSync := true
		for i := range v.Replicas {
			r := &v.Replicas[i]
			if r.Disk != "UpToDate" || r.Replication != "Connected" || r.OutOfSyncBytes != 0 {
				inSync = false
			}
			if r.ResyncTotalBytes > 0 && (worst == nil || r.SyncProgress < worst.SyncProgress) {
				worst = r
			}
		}
		if inSync {
			return fmt.Sprintf("%s: in sync", volume), true
		}
		if worst == nil {
			return fmt.Sprintf("%s: waiting for the resync to start", volume), false
		}
		const width = 30
		filled := int(worst.SyncProgress / 100 * width)
		bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
		eta := "?"
		if worst.ResyncRate > 0 {
			left := worst.ResyncTotalBytes - worst.ResyncDoneBytes
			eta = time.Duration(float64(left) / float64(worst.ResyncRate) * float64(time.Second)).Round(time.Second).String()
		}
		return fmt.Sprintf("%s -> %s [%s] %5.1f%% %s/s ETA %s (%s)", volume, worst.Node, bar, worst.SyncProgress,
			humanBytes(worst.ResyncRate), eta, worst.Replication), false
	}
	return fmt.Sprintf("%s: no such volume", volume), true
}
