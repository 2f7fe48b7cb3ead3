package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

// Shell completion (replctl completion bash|zsh|fish|powershell): volume
// and node names come from the cluster, as kubectl completes resources,
// through one status call to --addr bounded by completionTimeout; a node
// that does not answer completes nothing, quietly. Flags with fixed
// values complete those. create-md, offline, reads --config instead.

// completionTimeout bounds the status call of a completion: a shell waits
// for it at every Tab.
const completionTimeout = 2 * time.Second

// completer answers completions from the cluster at --addr.
type completer struct{ g *globals }

// status fetches the cluster status for a completion, or nil.
func (c completer) status() *transport.ClusterStatus {
	cl, err := c.g.dialControl(c.g.addr)
	if err != nil {
		return nil
	}
	defer cl.Close()
	wait := completionTimeout
	if c.g.timeout > 0 && c.g.timeout < wait {
		wait = c.g.timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := cl.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return nil
	}
	return st
}

// choices filters name/description pairs by prefix, in cobra's
// "name\tdescription" form.
func choices(prefix string, names []string, desc func(string) string) []string {
	sort.Strings(names)
	var out []string
	for _, n := range names {
		if !strings.HasPrefix(n, prefix) {
			continue
		}
		if d := desc(n); d != "" {
			n += "\t" + d
		}
		out = append(out, n)
	}
	return out
}

// volumes completes a volume name as the command's argument number
// position (0-based); other positions complete nothing.
func (c completer) volumes(position int) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) != position {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st := c.status()
		if st == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		byName := map[string]*transport.VolumeStatus{}
		var names []string
		for i := range st.Volumes {
			v := &st.Volumes[i]
			names = append(names, v.Name)
			byName[v.Name] = v
		}
		return choices(toComplete, names, func(n string) string {
			v := byName[n]
			primary := v.Primary
			if primary == "" {
				primary = "none"
			}
			return fmt.Sprintf("%s, protocol %s, primary %s", humanBytes(v.Size), v.Protocol, primary)
		}), cobra.ShellCompDirectiveNoFileComp
	}
}

// nodes completes a node name: the nodes with a disk of the volume given
// as the first argument, when there is one and holders is set; else
// every node.
func (c completer) nodes(holders bool) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		st := c.status()
		if st == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var holding map[string]bool
		if holders && len(args) > 0 {
			for _, v := range st.Volumes {
				if v.Name == args[0] {
					holding = map[string]bool{}
					for _, r := range v.Replicas {
						holding[r.Node] = true
					}
				}
			}
		}
		info := map[string]transport.NodeInfo{}
		var names []string
		for _, n := range st.Nodes {
			if holding != nil && !holding[n.Name] {
				continue
			}
			names = append(names, n.Name)
			info[n.Name] = n
		}
		return choices(toComplete, names, func(name string) string {
			n := info[name]
			state := "alive"
			if !n.Alive {
				state = "unreachable"
			}
			return n.Role + ", " + state
		}), cobra.ShellCompDirectiveNoFileComp
	}
}

// nodeArg completes a node name as the command's only argument.
func (c completer) nodeArg() cobra.CompletionFunc {
	all := c.nodes(false)
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) != 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return all(cmd, args, toComplete)
	}
}

// paths completes a path name of the volume given as the first argument,
// on the node nodeFlag names (every node's when it names none).
func (c completer) paths(nodeFlag func() string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) != 1 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st := c.status()
		if st == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		states := map[string]string{}
		for _, v := range st.Volumes {
			if v.Name != args[0] {
				continue
			}
			for _, r := range v.Replicas {
				if on := nodeFlag(); on != "" && r.Node != on {
					continue
				}
				for _, p := range r.Paths {
					states[p.Path] = strings.TrimPrefix(states[p.Path]+", ", ", ") + r.Node + " " + p.State
				}
			}
		}
		names := make([]string, 0, len(states))
		for p := range states {
			names = append(names, p)
		}
		return choices(toComplete, names, func(p string) string { return states[p] }), cobra.ShellCompDirectiveNoFileComp
	}
}

// fixed completes one of values (value → what it means).
func fixed(values map[string]string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		names := make([]string, 0, len(values))
		for v := range values {
			names = append(names, v)
		}
		return choices(toComplete, names, func(v string) string { return values[v] }), cobra.ShellCompDirectiveNoFileComp
	}
}

// Fixed values of flags and arguments.
var (
	protocolValues = map[string]string{
		"A": "a write completes once written locally and queued for the peers",
		"B": "once the peers received it",
		"C": "once the peers wrote it (the default)",
	}
	congestionValues = map[string]string{
		"block":      "wait for room in the send buffer",
		"pull-ahead": "go Ahead: mark the blocks, resync them later (protocol A)",
		"disconnect": "disconnect the peer",
	}
	pathPolicyValues = map[string]string{
		"failover":     "every IO on the preferred path, the others stand by",
		"round-robin":  "the active paths in turn, rr_min_io IOs each",
		"queue-length": "the active path with the fewest IOs in flight",
		"service-time": "the active path with the least bytes in flight per throughput",
		"active-read":  "reads as queue-length, every write on the preferred path",
	}
	fstypeValues = map[string]string{"ext4": "", "xfs": ""}
	viaValues    = map[string]string{
		"auto":   "kernel when /dev/nbd0 exists, else fuse",
		"kernel": "the kernel's nbd driver (/dev/nbdN)",
		"fuse":   "a FUSE file on a loop device",
	}
	colorValues     = map[string]string{"auto": "on a terminal, unless NO_COLOR is set", "always": "", "never": ""}
	metadataValues  = map[string]string{"internal": "at the end of the backing file", "external": "in a separate file"}
	nbdTLSValues    = map[string]string{"required": "nbds:// only", "optional": "nbds:// and nbd://", "off": "plain nbd://"}
	checksumsValues = map[string]string{"on": "a checksum of every block, verified at every read", "off": "metadata without the checksum area"}
)

// dirs completes a directory (the shell's own completion, directories only).
func dirs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// knownAddrs completes --addr from the clusters replctl has seen.
func knownAddrs(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	names := map[string]string{}
	for _, kc := range loadKnownClusters() {
		for _, n := range kc.Nodes {
			names[n.Control] = "node " + n.Name
		}
	}
	addrs := make([]string, 0, len(names))
	for a := range names {
		addrs = append(addrs, a)
	}
	return choices(toComplete, addrs, func(a string) string { return names[a] }), cobra.ShellCompDirectiveNoFileComp
}

// configNames completes, for create-md, the volumes (what != "node") or
// the nodes of the config file configPath names (--config).
func configNames(configPath func() string, what string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if configPath() == "" || (what != "node" && len(args) != 0) {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		cfg, err := config.LoadConfig(configPath())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		if what == "node" {
			for _, n := range cfg.Nodes {
				names = append(names, n.Name)
			}
		} else {
			for _, v := range cfg.Volumes {
				names = append(names, v.Name)
			}
		}
		return choices(toComplete, names, func(string) string { return "" }), cobra.ShellCompDirectiveNoFileComp
	}
}

// registerCompletions wires the completions into the command tree.
func registerCompletions(root *cobra.Command, g *globals) {
	c := completer{g: g}
	flag := func(cmd *cobra.Command, name string, f cobra.CompletionFunc) {
		if cmd.Flags().Lookup(name) == nil && cmd.PersistentFlags().Lookup(name) == nil {
			panic(fmt.Sprintf("completion for a flag %s does not have: --%s", cmd.CommandPath(), name))
		}
		if err := cmd.RegisterFlagCompletionFunc(name, f); err != nil {
			panic(err)
		}
	}
	flag(root, "addr", knownAddrs)
	flag(root, "color", fixed(colorValues))
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		switch cmd.CommandPath() {
		case "replctl status", "replctl verify", "replctl path list", "replctl path rotate":
			cmd.ValidArgsFunction = c.volumes(0)
		case "replctl primary", "replctl connect", "replctl disconnect", "replctl resync", "replctl adjust", "replctl resize":
			cmd.ValidArgsFunction = c.volumes(0)
		case "replctl path fail", "replctl path restore":
			vol, path := c.volumes(0), c.paths(cmd.Flags().Lookup("node").Value.String)
			cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if len(args) == 0 {
					return vol(cmd, args, toComplete)
				}
				return path(cmd, args, toComplete)
			}
		case "replctl path policy":
			vol, policy := c.volumes(0), fixed(pathPolicyValues)
			cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				switch len(args) {
				case 0:
					return vol(cmd, args, toComplete)
				case 1:
					return policy(cmd, args, toComplete)
				}
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
		case "replctl node add", "replctl node remove":
			cmd.ValidArgsFunction = c.nodeArg()
		case "replctl mount":
			vol := c.volumes(0)
			cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if len(args) == 0 {
					return vol(cmd, args, toComplete)
				}
				return dirs(cmd, args, toComplete)
			}
		case "replctl umount":
			cmd.ValidArgsFunction = dirs
		case "replctl events", "replctl demo", "replctl node", "replctl path":
			cmd.ValidArgsFunction = cobra.NoFileCompletions
		}
		if cmd.Flags().Lookup("node") != nil && cmd.Name() != "create-md" {
			flag(cmd, "node", c.nodes(true))
		}
		switch cmd.CommandPath() {
		case "replctl resync":
			flag(cmd, "from", c.nodes(true))
		case "replctl adjust":
			flag(cmd, "protocol", fixed(protocolValues))
			flag(cmd, "on-congestion", fixed(congestionValues))
			flag(cmd, "resync-rate", cobra.NoFileCompletions)
		case "replctl mount":
			flag(cmd, "fstype", fixed(fstypeValues))
			flag(cmd, "via", fixed(viaValues))
			flag(cmd, "run-dir", dirs)
		case "replctl umount":
			flag(cmd, "run-dir", dirs)
		case "replctl demo":
			flag(cmd, "metadata", fixed(metadataValues))
			flag(cmd, "nbd-tls", fixed(nbdTLSValues))
			flag(cmd, "checksums", fixed(checksumsValues))
			flag(cmd, "size", cobra.NoFileCompletions)
		case "replctl create-md":
			configPath := cmd.Flags().Lookup("config").Value.String
			cmd.ValidArgsFunction = configNames(configPath, "volume")
			flag(cmd, "node", configNames(configPath, "node"))
			flag(cmd, "state-dir", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return nil, cobra.ShellCompDirectiveFilterDirs
			})
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
