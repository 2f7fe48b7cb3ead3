package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newVerify(g *globals) *cobra.Command {
	var repair, wait bool
	cmd := &cobra.Command{
		Use:   "verify VOLUME [--repair] [--wait]",
		Short: "Compare every block of the secondaries with the primary, online, while IO goes on",
		Long: `The primary sends a checksum of every 4 KiB block to each secondary that is in
sync, in order with the writes; blocks that differ are marked out of sync
(out_of_sync_bytes in status, and the event history). With --repair they are
resynced as soon as the verify ends (one command, where DRBD needs two).
--wait shows progress until it ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.dial(cmd, "the start of the verify")
			if err != nil {
				return err
			}
			defer k.close()
			r, err := k.c.Verify(k.ctx, &transport.VerifyRequest{Volume: args[0], Repair: repair})
			if err != nil {
				return k.fail(err, args[0], "")
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s: verify started on %s against %s\n", args[0], r.Primary, strings.Join(r.Peers, ", "))
			if !wait {
				return nil
			}
			pal, err := g.paletteFor(out)
			if err != nil {
				return err
			}
			return waitVerify(cmd.Context(), k.c, args[0], out, repair, pal)
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "resync the blocks found out of sync when the verify ends")
	cmd.Flags().BoolVar(&wait, "wait", false, "show progress until the verify (and, with --repair, the resync) ends")
	return cmd
}

func waitVerify(ctx context.Context, c *transport.ControlClient, volume string, out io.Writer, repair bool, pal palette) error {
	tty := isTerminal(out)
	var found int64
	poll := progressPoll{what: "verify", every: 300 * time.Millisecond, color: colorCyan}
	err := waitProgress(ctx, c, out, tty, pal, poll, func(st *transport.ClusterStatus) (string, string, bool) {
		running, done, total, rate := false, int64(0), int64(0), int64(0)
		found = 0
		for _, v := range st.Volumes {
			if v.Name != volume {
				continue
			}
			for _, r := range v.Replicas {
				running = running || transport.Verifying(r.Replication)
				found += r.VerifyFoundBytes
				done += r.VerifyDoneBytes
				total += r.VerifyTotalBytes
				rate += r.VerifyRate
			}
		}
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(done) / float64(total)
		}
		line := fmt.Sprintf("%s: verify %5.1f%%, %s out of sync", volume, pct, humanBytes(found))
		if !running && total > 0 && done >= total {
			return line, line, true
		}
		speed := "?"
		if rate > 0 {
			speed = humanBytes(rate)
		}
		return line, fmt.Sprintf("%s %s %s/s ETA %s", line, bar(pct, 30), speed, eta(total-done, rate)), false
	})
	if err != nil {
		return err
	}
	if repair && found > 0 {
		return waitResync(ctx, c, volume, out, tty, pal)
	}
	return nil
}
