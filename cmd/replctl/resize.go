package main

import (
	"fmt"
	"io"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newResize is replctl resize: grow a volume online on every node that
// holds it (DRBD's drbdadm resize).
func newResize(g *globals) *cobra.Command {
	var (
		nodeName string
		check    bool
	)
	cmd := &cobra.Command{
		Use:   "resize VOLUME SIZE [--node NODE] [--check]",
		Short: "Grow a volume online on every node, while IO runs: the range gained reads as zeroes everywhere and nothing is resynced",
		Long: `Grow VOLUME to SIZE (1GiB, 512M, 1.5GiB, 10GB, or bytes) online, as DRBD's
resize does. First grow every node's backing disk (truncate -s a file, grow a
LUN and rescan it; with external metadata, the metadata file too): each node
must hold SIZE plus its metadata, which moves to the new end of a grown disk.
Every node is asked first and the resize is refused, naming the disk and what
it lacks, unless all can; then the secondaries grow and the primary last. The
range gained reads as zeroes on every node (a hole is punched; nothing is
copied or resynced). A volume only grows: a smaller SIZE is refused.

New NBD connections see SIZE; a client connected before keeps the old size
until it reconnects (NBD cannot tell it), so reconnect it, then grow the
filesystem (resize2fs, xfs_growfs).

--node grows one node alone: a node that was down during a resize (its peers
refuse it, naming both sizes, until it grows). --check asks every node
whether it can and changes nothing.

Afterwards put the new size in volumes[].size of the cluster file on every
node and reload replnode (systemctl reload replnode): until then a node that
restarts runs at the size it recorded, and warns that the file differs.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			volume := args[0]
			size, err := config.ParseVolumeSize(args[1])
			switch {
			case err != nil:
				return usageErrorf("SIZE: %v", err)
			case size == config.SizeMax:
				return usageErrorf("SIZE: give the size to grow to, such as 256MiB (max is for the config file)")
			case size <= 0 || size%4096 != 0:
				return usageErrorf("SIZE: %d bytes is not a positive multiple of 4096", size)
			}
			action := "the resize"
			if check {
				action = "the check"
			}
			k, err := g.dial(cmd, action)
			if err != nil {
				return err
			}
			defer k.close()
			if err := k.precheck(volume, nodeName); err != nil {
				return err
			}
			reply, err := k.c.Resize(k.ctx, &transport.ResizeRequest{Volume: volume, Size: int64(size), Node: nodeName, Check: check})
			if err != nil {
				return k.fail(err, volume, nodeName)
			}
			return resizeReport(cmd.OutOrStdout(), reply, volume, size, nodeName, check)
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "grow this node only (one that was down during a resize)")
	cmd.Flags().BoolVar(&check, "check", false, "ask every node whether it can grow, change nothing")
	return cmd
}

// resizeReport prints what each node did, each in its own words (they
// name the node), then, once, what the operator does next. A node that
// cannot grow (a check of one node) is a refusal: it changed nothing.
func resizeReport(out io.Writer, reply *transport.ResizeReply, volume string, size config.VolumeSize, nodeName string, check bool) error {
	for _, d := range reply.Nodes {
		if d.Action == transport.ResizeCannot {
			return fmt.Errorf("%s cannot grow to %s (%d bytes); nothing changed: %s", volume, human.Bytes(int64(size)), size, d.Text)
		}
	}
	for _, d := range reply.Nodes {
		fmt.Fprintln(out, d.Text)
	}
	where := "on every node"
	if nodeName != "" {
		where = "on " + nodeName
	}
	if check {
		fmt.Fprintf(out, "%s can grow to %s %s; nothing changed (--check)\n", volume, human.Bytes(int64(size)), where)
		return nil
	}
	fmt.Fprintf(out, "%s is %s %s. Next, put size: %s in volumes[%s] of the cluster file on every node and reload replnode there (systemctl reload replnode): until then a node that restarts runs at its recorded size and warns that the file differs.\n",
		volume, human.Bytes(int64(size)), where, human.ExactBytes(int64(size)), volume)
	return nil
}
