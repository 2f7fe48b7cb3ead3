package main

import (
	"fmt"
	"strings"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newResync(g *globals) *cobra.Command {
	var (
		from, node    string
		pause, resume bool
		wait          bool
	)
	cmd := &cobra.Command{
		Use:   "resync VOLUME [--node NODE] [--from NODE] [--pause | --resume] [--wait]",
		Short: "Resync a volume's secondaries in full from the primary, or pause/resume a resync",
		Long: `Without --pause or --resume, every block of VOLUME is resynced from the primary
to every secondary (DRBD's invalidate-remote); the secondaries are
Inconsistent until it ends. --node limits it, or the pause or resume, to one
secondary (DRBD's invalidate on that node, after its disk was replaced or is
suspect), and the others keep streaming. --from names the node whose data wins; it must be
the primary. --wait shows progress (percent, speed, ETA) until every replica is
UpToDate again. --pause with no resync running says so and changes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			volume := args[0]
			if pause && resume {
				return usageErrorf("--pause and --resume exclude each other")
			}
			action := "the resync"
			switch {
			case pause:
				action = "the pause"
			case resume:
				action = "the resume"
			}
			k, err := g.dial(cmd, action)
			if err != nil {
				return err
			}
			defer k.close()
			out := cmd.OutOrStdout()
			wasPaused := false
			if pause || resume || node != "" {
				// The node pauses (or resumes) whatever runs, and says
				// "paused" even when nothing does: look first.
				st, err := k.status()
				if err != nil {
					return k.fail(err, volume, node)
				}
				if err := checkNames(st, volume, node); err != nil {
					return err
				}
				running, isPaused := resyncState(st, volume, node)
				switch {
				case pause && isPaused && !running:
					fmt.Fprintf(out, "the resync of %s is already paused (resume it with replctl resync %s --resume)\n", volume, volume)
					return nil
				case pause && !running && node != "":
					return fmt.Errorf("no resync of %s to %s is running: nothing to pause", volume, node)
				case pause && !running:
					return fmt.Errorf("no resync of %s is running: nothing to pause", volume)
				}
				wasPaused = isPaused
			}
			r, err := k.c.Resync(k.ctx, &transport.ResyncRequest{Volume: volume, From: from, Node: node, Pause: pause, Resume: resume})
			if err != nil {
				return k.fail(err, volume, from)
			}
			note := ""
			if resume && !wasPaused {
				note = " (no resync was paused)"
			}
			fmt.Fprintf(out, "%s: %s on %s for %s%s\n", volume, r.Action, r.Primary, strings.Join(r.Peers, ", "), note)
			if !wait || pause {
				return nil
			}
			pal, err := g.paletteFor(out)
			if err != nil {
				return err
			}
			return waitResync(cmd.Context(), k.c, volume, out, isTerminal(out), pal)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only this secondary (default: every secondary)")
	cmd.Flags().StringVar(&from, "from", "", "the node whose data wins (must be the primary)")
	cmd.Flags().BoolVar(&pause, "pause", false, "pause the resync under way")
	cmd.Flags().BoolVar(&resume, "resume", false, "resume a paused resync")
	cmd.Flags().BoolVar(&wait, "wait", false, "show progress until the resync ends")
	return cmd
}

// resyncState says whether a resync of volume (to node, or to any replica)
// runs, and whether one is paused, by the replicas' replication states.
func resyncState(st *transport.ClusterStatus, volume, node string) (running, isPaused bool) {
	for _, v := range st.Volumes {
		if v.Name != volume {
			continue
		}
		for _, r := range v.Replicas {
			switch {
			case node != "" && r.Node != node:
			case transport.SyncPaused(r.Replication):
				isPaused = true
			case transport.Syncing(r.Replication):
				running = true
			}
		}
	}
	return running, isPaused
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
			if r.Disk != transport.DiskUpToDate || r.Replication != transport.ReplConnected || r.OutOfSyncBytes != 0 {
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
		return fmt.Sprintf("%s -> %s %s %5.1f%% %s/s ETA %s (%s)", volume, worst.Node, bar(worst.SyncProgress, 30), worst.SyncProgress,
			humanBytes(worst.ResyncRate), eta(worst.ResyncTotalBytes-worst.ResyncDoneBytes, worst.ResyncRate), worst.Replication), false
	}
	return fmt.Sprintf("%s: no such volume", volume), true
}
