package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

func newPath(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "path",
		Short: "Show and steer each node's paths to its backing LUN (multipath)",
	}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [VOLUME]",
		Short: "Per path: state, group, IOs, bytes, errors, latency p50/p99, time since the last change",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.dial()
			if err != nil {
				return err
			}
			defer done()
			st, err := c.ClusterStatus(ctx, &transport.StatusRequest{})
			if err != nil {
				return g.apiError(err)
			}
			paths := []transport.PathStatus{}
			for _, v := range st.Volumes {
				if len(args) == 1 && v.Name != args[0] {
					continue
				}
				for _, r := range v.Replicas {
					paths = append(paths, r.Paths...)
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(paths)
			}
			printPaths(cmd.OutOrStdout(), paths)
			return nil
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the paths as JSON")
	cmd.AddCommand(list,
		pathAction(g, "fail", "VOLUME PATH", "Mark a path failed; IO moves to the other paths", 2),
		pathAction(g, "restore", "VOLUME PATH", "Put a failed path back in service", 2),
		pathAction(g, "rotate", "VOLUME", "Make the next path the active one (gmultipath rotate)", 1),
		pathAction(g, "policy", "VOLUME POLICY", "Change the path policy online: failover, round-robin, queue-length, service-time, active-read", 2),
	)
	return cmd
}

func pathAction(g *globals, action, args, short string, nargs int) *cobra.Command {
	var nodeName string
	cmd := &cobra.Command{
		Use:   action + " " + args + " [--node NAME]",
		Short: short,
		Args:  cobra.ExactArgs(nargs),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, ctx, done, err := g.dial()
			if err != nil {
				return err
			}
			defer done()
			req := &transport.PathRequest{Volume: a[0], Node: nodeName, Action: action}
			switch action {
			case "policy":
				req.Policy = a[1]
			case "fail", "restore":
				req.Path = a[1]
			}
			r, err := c.PathAction(ctx, req)
			if err != nil {
				return g.apiError(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: policy %s\n", a[0], r.Node, r.Policy)
			printPaths(cmd.OutOrStdout(), r.Paths)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node whose paths to act on (default: the node at --addr)")
	return cmd
}

func printPaths(w io.Writer, paths []transport.PathStatus) {
	if len(paths) == 0 {
		fmt.Fprintln(w, "no multipath disks (a plain disk has no paths to list)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVOLUME\tPATH\tSTATE\tGROUP\tIOS\tBYTES\tERRORS\tP50\tP99\tSINCE\tNOTE")
	for _, p := range paths {
		group := p.Group
		if group == "" {
			group = "-"
		}
		note := p.Reason
		if p.Preferred {
			note = "preferred " + note
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", p.Node, p.Volume, p.Path, p.State, group,
			p.IOs, humanBytes(int64(p.Bytes)), p.Errors,
			time.Duration(p.LatencyP50Micros)*time.Microsecond, time.Duration(p.LatencyP99Micros)*time.Microsecond,
			(time.Duration(p.SinceChangeSeconds) * time.Second).Round(time.Second), note)
	}
	tw.Flush()
}
