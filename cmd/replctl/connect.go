package main

import (
	"fmt"
	"strings"

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
			if !up {
				// What the volume runs on now, and the way back.
				if st, err := k.status(); err == nil {
					for _, line := range disconnectedWords(st, args[0], r.Node, nodeName == "") {
						fmt.Fprintln(cmd.OutOrStdout(), line)
					}
				}
			}
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

// disconnectedWords says what a disconnect of volume on node left, from
// the status after it (defaulted: no --node was given, so it was the node
// at --addr): which copies still hold every write, which node misses
// them, and the command that reconnects it.
func disconnectedWords(st *transport.ClusterStatus, volume, node string, defaulted bool) []string {
	v, ok := st.Volume(volume)
	if !ok {
		return nil
	}
	var out []string
	if defaulted {
		out = append(out, fmt.Sprintf("(no --node given: %s is the node at --addr)", node))
	}
	var others []string
	for _, r := range v.Replicas {
		if r.Node != node {
			others = append(others, r.Node)
		}
	}
	missing := strings.Join(others, " and ")
	if missing == "" {
		missing = "no other node"
	}
	switch {
	case v.Primary == "":
		out = append(out, fmt.Sprintf("%s no longer replicates %s, which has no primary now.", node, volume))
	case node == v.Primary:
		out = append(out, fmt.Sprintf("%s is the primary of %s and now replicates it to nobody: %s runs on one copy, %s's. %s gets none of its writes until it is connected again (%s marks them, to resync only those).",
			node, volume, volume, node, missing, node))
	default:
		good := []string{v.Primary + "'s"}
		for _, r := range v.Replicas {
			if r.Node != node && r.Node != v.Primary && r.Reachable && r.Disk == transport.DiskUpToDate && r.Replication == transport.ReplConnected {
				good = append(good, r.Node+"'s")
			}
		}
		copies := "one copy, " + good[0]
		if len(good) > 1 {
			copies = fmt.Sprintf("%d copies, %s", len(good), strings.Join(good, " and "))
		}
		out = append(out, fmt.Sprintf("%s no longer replicates %s and misses its writes from now on (%s, the primary, marks them, to resync only those): %s runs on %s.",
			node, volume, v.Primary, volume, copies))
	}
	return append(out, fmt.Sprintf("reconnect: replctl connect %s --node %s", volume, node))
}
