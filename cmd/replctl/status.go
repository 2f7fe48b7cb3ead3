package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	var events int
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every volume's replicas: role, disk, replication, out-of-sync, sync progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := g.dial()
			if err != nil {
				return err
			}
			defer done()
			st, err := c.ClusterStatus(ctx, &transport.StatusRequest{})
			if err != nil {
				return g.apiError(err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(out, st)
			if events > 0 {
				ns, err := c.NodeStatus(ctx, &transport.StatusRequest{Events: events})
				if err != nil {
					return g.apiError(err)
				}
				fmt.Fprintf(out, "\nrecent events on %s:\n", ns.Node.Name)
				for _, e := range ns.Events {
					fmt.Fprintf(out, "  %s  %-14s %-6s %s\n", e.Time.Format("2006-01-02 15:04:05"), e.Kind, e.Volume, e.Message)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().IntVar(&events, "events", 0, "also print this many recent events of the node at --addr")
	return cmd
}

// printStatus prints the cluster the way drbdadm status reads: a line per
// volume, then one per replica.
func printStatus(w io.Writer, st *transport.ClusterStatus) {
	cl := st.Cluster
	line := "cluster: failover " + cl.Failover
	if len(cl.Voters) > 0 {
		leader := cl.Leader
		if leader == "" {
			leader = "none"
		}
		quorum := "no quorum"
		if cl.Quorum {
			quorum = "quorum"
		}
		line += fmt.Sprintf(", raft leader %s, %s, voters %s", leader, quorum, strings.Join(cl.Voters, " "))
	}
	if cl.Reason != "" {
		line += " (" + cl.Reason + ")"
	}
	fmt.Fprintln(w, line)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tSTATE\tCONTROL\tNBD")
	for _, n := range st.Nodes {
		state := "alive"
		if !n.Alive {
			state = "unreachable"
			if n.Error != "" {
				state += " (" + firstLine(n.Error) + ")"
			}
		}
		if n.Membership != "" && n.Membership != "alive" {
			state += ", gossip: " + n.Membership
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, state, n.Control, n.NBD)
	}
	tw.Flush()
	for _, v := range st.Volumes {
		primary := v.Primary
		if primary == "" {
			primary = "none"
		}
		fmt.Fprintf(w, "\n%s  size:%s protocol:%s primary:%s epoch:%d", v.Name, humanBytes(v.Size), v.Protocol, primary, v.Epoch)
		if v.NBDURI != "" {
			fmt.Fprintf(w, "  %s", v.NBDURI)
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tROLE\tDISK\tREPLICATION\tOUT-OF-SYNC\tSYNC\tNOTE")
		for _, r := range v.Replicas {
			note := r.Reason
			if note == "" && r.SyncDecision != "" && r.SyncDecision != "no-sync" {
				note = "last connect: " + r.SyncDecision + " by rule=" + r.SyncRule
			}
			if !r.Reachable {
				note = strings.TrimSpace("unreachable " + note)
			}
			syncCol := fmt.Sprintf("%.1f%%", r.SyncProgress)
			if r.ResyncTotalBytes > 0 {
				syncCol += fmt.Sprintf(" (%s of %s)", humanBytes(r.ResyncDoneBytes), humanBytes(r.ResyncTotalBytes))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.Role, r.Disk, r.Replication, humanBytes(r.OutOfSyncBytes), syncCol, firstLine(note))
		}
		tw.Flush()
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
