package main

import (
	"fmt"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newAdjust is replctl adjust: change a volume's replication settings
// online, on every node that holds it.
func newAdjust(g *globals) *cobra.Command {
	var r transport.AdjustRequest
	cmd := &cobra.Command{
		Use:   "adjust VOLUME",
		Short: "Change a volume's protocol (A, B, C) or congestion policy online, with no IO error and no resync",
		Long: `Change a volume's replication settings online on every node that holds it:
  --protocol A   a write completes once written locally and queued for the peers
  --protocol B   once the peers received it
  --protocol C   once the peers wrote it (the default)
  --on-congestion block|pull-ahead|disconnect   what the primary does when a
                 peer's send buffer is full (pull-ahead needs protocol A)
The change holds until the node restarts; put it in the config file to keep it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if r.Protocol == "" && r.OnCongestion == "" {
				return fmt.Errorf("nothing to adjust: give --protocol and/or --on-congestion")
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
					fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: protocol %s, on_congestion %s\n", r.Volume, n.Node, n.Protocol, n.OnCongestion)
				}
			}
			return k.fail(err, r.Volume, r.Node)
		},
	}
	cmd.Flags().StringVar(&r.Protocol, "protocol", "", "A, B or C")
	cmd.Flags().StringVar(&r.OnCongestion, "on-congestion", "", "block, pull-ahead or disconnect")
	cmd.Flags().StringVar(&r.Node, "node", "", "adjust this node only")
	return cmd
}
