package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// newVolume is replctl volume: create, delete and list the volumes made at
// run time from the nodes' storage pools (LINSTOR's resource-definition
// and autoplace), recorded in raft.
func newVolume(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Create, delete and list volumes made at run time from the nodes' storage pools",
		Long: `Volumes made at run time need no edit of the cluster file: the raft leader
places the replicas on the data nodes with the most free space in the pool
(nodes[].pools of the cluster file), each chosen node makes a sparse file
POOL_DIR/NAME.img with the volume's metadata, and the first chosen node
becomes its primary. raft records the volume, so every node agrees on it.
Volumes of the cluster file keep working as before; a name in both is
refused.`,
	}
	cmd.AddCommand(newVolumeCreate(g), newVolumeDelete(g), newVolumeList(g))
	return cmd
}

func newVolumeCreate(g *globals) *cobra.Command {
	var (
		size     string
		replicas int
		pool     string
		protocol string
	)
	cmd := &cobra.Command{
		Use:   "create NAME --size SIZE [--replicas N] [--pool POOL] [--protocol C]",
		Short: "Create a volume in a storage pool, placed on the nodes with the most free space",
		Long: `Create volume NAME of SIZE (1GiB, 512M, 10GB or bytes; rounded up to a whole
4 KiB) with N replicas (default 2) in POOL (default "default"), replicated
with PROTOCOL (A, B or C, the default). The raft leader places the replicas
on the data nodes with the most free space in the pool; the first is the
primary. A create of a name that exists with the same definition succeeds and
changes nothing; with another definition it is refused. Refused too, naming
why: no N nodes with the room (the free space of each node is listed), fewer
data nodes than N replicas.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if size == "" {
				return usageErrorf("--size: give the volume's size, such as 10GiB")
			}
			n, err := config.ParseVolumeSize(size)
			switch {
			case err != nil:
				return usageErrorf("--size: %v", err)
			case n == config.SizeMax || n <= 0:
				return usageErrorf("--size: give the volume's size, such as 10GiB")
			}
			if replicas < 0 {
				return usageErrorf("--replicas %d: give 1 or more", replicas)
			}
			k, err := g.dial(cmd, "the create")
			if err != nil {
				return err
			}
			defer k.close()
			// The request ID is chosen once: the node that takes the call
			// asks again under it when a raft leader change cuts the create
			// off, and the record it finds then is known for this one's.
			reply, err := k.c.VolumeCreate(k.ctx, &transport.VolumeCreateRequest{Name: args[0], Size: uint64(n), Replicas: replicas, Pool: pool, Protocol: protocol,
				RequestID: transport.NewRequestID()})
			if err != nil {
				return k.fail(err, "", "")
			}
			v := reply.Volume
			if !reply.Created {
				fmt.Fprintf(cmd.OutOrStdout(), "%s exists already as asked: %s in pool %s on %s, protocol %s; nothing changed\n",
					v.Name, human.Bytes(int64(v.Size)), v.Pool, strings.Join(v.Replicas, ", "), v.Protocol)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s: %s (%d bytes) in pool %s on %s, protocol %s; %s is its primary (replctl status shows when it serves)\n",
				v.Name, human.Bytes(int64(v.Size)), v.Size, v.Pool, strings.Join(v.Replicas, ", "), v.Protocol, v.Replicas[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&size, "size", "", "the volume's size (1GiB, 512M, 10GB, bytes)")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "how many nodes hold a copy (default 2)")
	cmd.Flags().StringVar(&pool, "pool", "", `the storage pool (default "default")`)
	cmd.Flags().StringVar(&protocol, "protocol", "", "replication protocol: A, B or C (default C)")
	return cmd
}

func newVolumeDelete(g *globals) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "delete NAME --yes",
		Short: "Delete a volume made with volume create: every node stops it and removes its backing file",
		Long: `Delete volume NAME, made with replctl volume create: every node that holds it
stops it and removes its backing file and metadata; its data is gone. A node
that is down does so when it is back. Refused for a volume of the cluster
file (remove it from the file instead) and for one that is mounted (unmount
it first). A name that does not exist is not an error. --yes is required.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return usageErrorf("deleting %s destroys its data on every node: add --yes to delete it", args[0])
			}
			k, err := g.dial(cmd, "the delete")
			if err != nil {
				return err
			}
			defer k.close()
			reply, err := k.c.VolumeDelete(k.ctx, &transport.VolumeDeleteRequest{Name: args[0]})
			if err != nil {
				return k.fail(err, "", "")
			}
			if !reply.Deleted {
				fmt.Fprintf(cmd.OutOrStdout(), "no volume %s was created at run time; nothing deleted\n", args[0])
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s: every node that holds it stops it and removes its backing file\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "delete the volume and its data")
	return cmd
}

func newVolumeList(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the volumes of the cluster file and those made at run time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.dial(cmd, "the list")
			if err != nil {
				return err
			}
			defer k.close()
			reply, err := k.c.VolumeList(k.ctx, &transport.VolumeListRequest{})
			if err != nil {
				return k.fail(err, "", "")
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(reply)
			}
			pal, err := g.paletteFor(cmd.OutOrStdout())
			if err != nil {
				return err
			}
			printVolumes(cmd.OutOrStdout(), reply.Volumes, pal)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the volumes as JSON")
	return cmd
}

// printVolumes prints one volume a line.
func printVolumes(w io.Writer, vols []transport.VolumeInfo, p palette) {
	if len(vols) == 0 {
		fmt.Fprintln(w, "no volumes")
		return
	}
	t := &table{}
	t.add(plain("NAME"), plain("SIZE"), plain("POOL"), plain("PROTOCOL"), plain("REPLICAS"), plain("PRIMARY"), plain("SOURCE"))
	for _, v := range vols {
		pool, primary := v.Pool, v.Primary
		if pool == "" {
			pool = "-"
		}
		if primary == "" {
			primary = "-"
		}
		t.add(plain(v.Name), plain(human.Bytes(int64(v.Size))), plain(pool), plain(v.Protocol), plain(strings.Join(v.Replicas, ",")), plain(primary), plain(v.Source))
	}
	t.render(w, p)
}
