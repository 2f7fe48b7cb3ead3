package main

import (
	"fmt"
	"strings"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newAdjust is replctl adjust: change a volume's replication settings
// online, on every node that holds it.
func newAdjust(g *globals) *cobra.Command {
	var r transport.AdjustRequest
	var resyncRate string
	cmd := &cobra.Command{
		Use:   "adjust VOLUME",
		Short: "Change a volume's protocol (A, B, C), congestion policy or resync rate online, with no IO error and no resync",
		Long: `Change a volume's replication settings online on every node that holds it:
  --protocol A   a write completes once written locally and queued for the peers
  --protocol B   once the peers received it
  --protocol C   once the peers wrote it (the default)
  --on-congestion block|pull-ahead|disconnect   what the primary does when a
                 peer's send buffer is full (pull-ahead needs protocol A)
  --resync-rate 50MiB   cap resync at this many bytes per second, from the
                 next run of a resync under way (0: no cap, the default; an
                 uncapped resync still yields to application writes)
The change holds until the node restarts; put it in the config file to keep it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("resync-rate") {
				rate, err := config.ParseSize(strings.TrimSuffix(resyncRate, "/s"))
				if err != nil {
					return usageErrorf("--resync-rate: %v, per second (0 lifts the cap)", err)
				}
				r.ResyncRate = &rate
			}
			if r.Protocol == "" && r.OnCongestion == "" && r.ResyncRate == nil {
				return usageErrorf("nothing to adjust: give --protocol, --on-congestion and/or --resync-rate")
			}
			r.Volume = args[0]
			k, err := g.dial(cmd, "the adjustment")
			if err != nil {
				return err
			}
			defer k.close()
			if err := k.precheck(r.Volume, r.Node); err != nil {
				return err
			}
			reply, err := k.c.Adjust(k.ctx, &r)
			if reply != nil {
				for _, n := range reply.Nodes {
					rate := "no cap"
					if n.ResyncRate > 0 {
						rate = humanBytes(n.ResyncRate) + "/s"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: protocol %s, on_congestion %s, resync rate %s\n", r.Volume, n.Node, n.Protocol, n.OnCongestion, rate)
				}
			}
			return k.fail(err, r.Volume, r.Node)
		},
	}
	cmd.Flags().StringVar(&r.Protocol, "protocol", "", "A, B or C")
	cmd.Flags().StringVar(&r.OnCongestion, "on-congestion", "", "block, pull-ahead, disconnect, or default (the protocol's own: pull-ahead under A, block under B and C; it then follows the protocol)")
	cmd.Flags().StringVar(&resyncRate, "resync-rate", "", "resync cap per second, such as 50MiB (0: no cap)")
	cmd.Flags().StringVar(&r.Node, "node", "", "adjust this node only")
	return cmd
}
