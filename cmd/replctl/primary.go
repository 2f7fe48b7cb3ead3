package main

import (
	"fmt"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newPrimary(g *globals) *cobra.Command {
	var nodeName string
	var force, yes bool
	cmd := &cobra.Command{
		Use:   "primary VOLUME --node NAME",
		Short: "Switch a volume's primary to another node (clean switchover)",
		Long: `Switch a volume's primary role to --node. The old primary stops accepting IO
(requests in flight are answered), flushes, and checks that the new primary holds
every write; only then is the new primary promoted and its NBD export started.
If anything fails, the old primary keeps the role.

With --force, --node is promoted without a handover, for when the primary is
gone: the command says what may be lost and needs --yes. If the old primary
comes back having taken writes of its own, the two refuse to sync (split brain)
until replctl connect VOLUME --discard-my-data --node VICTIM.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nodeName == "" {
				return usageErrorf("--node NAME is required: the node that should become primary")
			}
			action := "the switchover"
			if force {
				action = "the forced promotion"
			}
			k, err := g.dial(cmd, action)
			if err != nil {
				return err
			}
			defer k.close()
			r, err := k.c.Primary(k.ctx, &transport.PrimaryRequest{Volume: args[0], Node: nodeName, Force: force, Yes: yes})
			if err != nil {
				return k.fail(err, args[0], nodeName)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: primary is now %s (epoch %d), export %s\n", r.Volume, r.Primary, r.Epoch, r.NBDURI)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node to make primary")
	cmd.Flags().BoolVar(&force, "force", false, "promote without a handover from the old primary (it is gone)")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm --force")
	return cmd
}
