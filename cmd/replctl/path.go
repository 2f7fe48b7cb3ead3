package main

import (
	"encoding/json"
	"fmt"
	"io"
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
	var listNode string
	list := &cobra.Command{
		Use:   "list [VOLUME] [--node NAME]",
		Short: "Per path: state, group, IOs, bytes, errors, latency p50/p99, time since the last change",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			volume := ""
			if len(args) == 1 {
				volume = args[0]
			}
			k, err := g.dial(cmd, "")
			if err != nil {
				return err
			}
			defer k.close()
			st, err := k.status()
			if err != nil {
				return k.fail(err, "", "")
			}
			if err := checkNames(st, volume, listNode); err != nil {
				return err
			}
			paths := []transport.PathStatus{}
			for _, v := range st.Volumes {
				if volume != "" && v.Name != volume {
					continue
				}
				for _, r := range v.Replicas {
					if listNode == "" || r.Node == listNode {
						paths = append(paths, r.Paths...)
					}
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(paths)
			}
			pal, err := g.paletteFor(cmd.OutOrStdout())
			if err != nil {
				return err
			}
			printPaths(cmd.OutOrStdout(), paths, pal)
			return nil
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the paths as JSON")
	list.Flags().StringVar(&listNode, "node", "", "only this node's paths")
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
			k, err := g.dial(cmd, "the path "+action)
			if err != nil {
				return err
			}
			defer k.close()
			if err := k.precheck(a[0], nodeName); err != nil {
				return err
			}
			req := &transport.PathRequest{Volume: a[0], Node: nodeName, Action: action}
			switch action {
			case "policy":
				req.Policy = a[1]
			case "fail", "restore":
				req.Path = a[1]
			}
			r, err := k.c.PathAction(k.ctx, req)
			if err != nil {
				return k.fail(err, a[0], nodeName)
			}
			pal, err := g.paletteFor(cmd.OutOrStdout())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s on %s: policy %s\n", a[0], r.Node, r.Policy)
			printPaths(cmd.OutOrStdout(), r.Paths, pal)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node whose paths to act on (default: the node at --addr)")
	return cmd
}

func printPaths(w io.Writer, paths []transport.PathStatus, pal palette) {
	if len(paths) == 0 {
		fmt.Fprintln(w, "no multipath disks (a plain disk has no paths to list)")
		return
	}
	t := &table{}
	t.add(plain("NODE"), plain("VOLUME"), plain("PATH"), plain("STATE"), plain("GROUP"), plain("IOS"), plain("BYTES"), plain("ERRORS"),
		plain("P50"), plain("P99"), plain("SINCE"), plain("NOTE"))
	for _, p := range paths {
		group := p.Group
		if group == "" {
			group = "-"
		}
		note := p.Reason
		if p.Preferred {
			note = "preferred " + note
		}
		state := cell{p.State, colorGreen}
		switch p.State {
		case transport.PathFail:
			state.color = colorRed
		case transport.PathPassive:
			state.color = colorNone
		}
		errs := plain(fmt.Sprint(p.Errors))
		if p.Errors > 0 {
			errs.color = colorYellow
		}
		t.add(plain(p.Node), plain(p.Volume), plain(p.Path), state, plain(group),
			plain(fmt.Sprint(p.IOs)), plain(humanBytes(int64(p.Bytes))), errs,
			plain((time.Duration(p.LatencyP50Micros) * time.Microsecond).String()), plain((time.Duration(p.LatencyP99Micros) * time.Microsecond).String()),
			plain((time.Duration(p.SinceChangeSeconds) * time.Second).Round(time.Second).String()), plain(note))
	}
	t.render(w, pal)
}
