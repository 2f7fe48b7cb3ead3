package main

import (
	"fmt"
	"strings"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newNode is replctl node add|remove: runtime changes of the raft voters.
func newNode(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Add or remove a raft voter (the node must be in every node's config file)",
	}
	change := func(use, short string, remove bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NAME",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if strings.TrimSpace(args[0]) == "" {
					return usageErrorf("NAME is empty: give the node's name (replctl status lists the nodes and the voters)")
				}
				k, err := g.dial(cmd, "the membership change")
				if err != nil {
					return err
				}
				defer k.close()
				r, err := k.c.Membership(k.ctx, &transport.MembershipRequest{Node: args[0], Remove: remove})
				if err != nil {
					return k.fail(err, "", args[0])
				}
				fmt.Fprintf(cmd.OutOrStdout(), "voters: %s\n", strings.Join(r.Voters, " "))
				return nil
			},
		}
	}
	cmd.AddCommand(
		change("add", "Make NAME a raft voter (start its replnode first)", false),
		change("remove", "Remove NAME from the raft voters", true),
	)
	return cmd
}
