package main

import (
	"fmt"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newConnect builds "connect" (up) and "disconnect" (!up).
func newConnect(g *globals, up bool) *cobra.Command {
	var nodeName string
	use, short := "connect", "Let a node replicate a volume again (catch-up moves only what changed)"
	if !up {
		use, short = "disconnect", "Stop a node replicating a volume; the primary keeps serving and tracks what changes"
	}
	cmd := &cobra.Command{
		Use:   use + " VOLUME [--node NAME]",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.dial()
			if err != nil {
				return err
			}
			defer done()
			req := &transport.ConnectRequest{Volume: args[0], Node: nodeName}
			var r *transport.ConnectReply
			if up {
				r, err = c.Connect(ctx, req)
			} else {
				r, err = c.Disconnect(ctx, req)
			}
			if err != nil {
				return g.apiError(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: %s\n", args[0], r.Node, r.Replication)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node to act on (default: the node at --addr)")
	return cmd
}
