package main

import (
	"fmt"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newConnect builds "connect" (up) and "disconnect" (!up).
func newConnect(g *globals, up bool) *cobra.Command {
	var nodeName string
	var discard, yes bool
	use, short := "connect", "Let a node replicate a volume again (catch-up moves only what changed)"
	if !up {
		use, short = "disconnect", "Stop a node replicating a volume; the primary keeps serving and tracks what changes"
	}
	cmd := &cobra.Command{
		Use:   use + " VOLUME [--node NAME]",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if discard && !up {
				return usageErrorf("--discard-my-data goes with connect")
			}
			k, err := g.dial(cmd, "the "+use)
			if err != nil {
				return err
			}
			defer k.close()
			if err := k.precheck(args[0], nodeName); err != nil {
				return err
			}
			req := &transport.ConnectRequest{Volume: args[0], Node: nodeName, DiscardMyData: discard, Yes: yes}
			var r *transport.ConnectReply
			if up {
				r, err = k.c.Connect(k.ctx, req)
			} else {
				r, err = k.c.Disconnect(k.ctx, req)
			}
			if err != nil {
				return k.fail(err, args[0], nodeName)
			}
			if discard {
				if !r.Done {
					return fmt.Errorf("%s on %s would discard %s (%d bytes) of changes made since the split brain, and be resynced from its peer; add --yes to go ahead", args[0], r.Node, humanBytes(r.DiscardBytes), r.DiscardBytes)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: discarding %s (%d bytes) of its changes; resyncing from the peer\n", args[0], r.Node, humanBytes(r.DiscardBytes), r.DiscardBytes)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: %s\n", args[0], r.Node, r.Replication)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node to act on (default: the node at --addr)")
	if up {
		cmd.Flags().BoolVar(&discard, "discard-my-data", false, "after a split brain: --node gives up its changes since the split and is resynced from the other node")
		cmd.Flags().BoolVar(&yes, "yes", false, "confirm --discard-my-data (without it, only say how much would be discarded)")
	}
	return cmd
}
