package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/pki"
	"github.com/spf13/cobra"
)

func newCerts() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "The cluster's own certificate authority (mutual TLS on every link)",
	}
	cmd.AddCommand(newCertsInit())
	return cmd
}

func newCertsInit() *cobra.Command {
	var (
		configPath, dir string
		force           bool
		extra           []string
	)
	cmd := &cobra.Command{
		Use:   "init --config FILE --dir DIR",
		Short: "Make the cluster's CA and a certificate for every node, the operator and NBD clients",
		Long: `Write into DIR a new cluster CA (ca.crt, ca.key; ECDSA P-256, 10 years) and, signed by
it: NODE.crt and NODE.key for every node of the cluster file (the node's name is in its
certificate, and its names cover the hosts of the node's control, replication, nbd, raft
and gossip addresses), operator.crt and operator.key for replctl --tls-dir, gossip.key
(memberlist's 32-byte key), and nbd-client/ca-cert.pem, client-cert.pem and
client-key.pem, the layout libnbd's and QEMU's tls-certificates expect. Keys are mode
0600. An address without a host, or a wildcard (0.0.0.0, ::), cannot say how peers reach
the node: its certificate then names localhost, 127.0.0.1, ::1 and the node's name, and
--host NODE=HOST adds the names it is reached by. An existing CA is kept unless --force:
every certificate it signed would have to be replaced.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" || dir == "" {
				return usageErrorf("--config FILE and --dir DIR are required")
			}
			cfg, err := config.LoadConfig(configPath)
			if err != nil {
				return err
			}
			holders, notes, err := certHolders(cfg, extra)
			if err != nil {
				return err
			}
			files, err := pki.Init(dir, holders, force)
			if errors.Is(err, pki.ErrCAExists) {
				return err
			}
			if err != nil {
				return fmt.Errorf("replctl certs init: %w", err)
			}
			printCertsInit(cmd.OutOrStdout(), cfg, dir, holders, notes, len(files))
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "the cluster file")
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write the CA and the certificates into")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing CA (and with it every certificate)")
	cmd.Flags().StringArrayVar(&extra, "host", nil, "NODE=HOST: another name or address NODE's certificate covers (repeatable)")
	return cmd
}

// wildcardHosts are the names a node's certificate covers for an address
// without a host, or a wildcard one: the node's host itself. Peers and
// replctl must then dial it by one of these, by the node's name, or by a
// --host.
var wildcardHosts = []string{"localhost", "127.0.0.1", "::1"}

// certHolders are the nodes of cfg with the hosts their certificates
// cover: the hosts of their addresses, and extra (NODE=HOST). notes say,
// per node, what a wildcard address made it cover.
func certHolders(cfg *config.Config, extra []string) ([]pki.Holder, []string, error) {
	more := map[string][]string{}
	for _, e := range extra {
		name, host, ok := strings.Cut(e, "=")
		if _, known := cfg.Node(name); !ok || !known || host == "" {
			var names []string
			for _, n := range cfg.Nodes {
				names = append(names, n.Name)
			}
			return nil, nil, usageErrorf("--host %q: want NODE=HOST with NODE one of %s", e, strings.Join(names, ", "))
		}
		more[name] = append(more[name], host)
	}
	var holders []pki.Holder
	var notes []string
	for _, n := range cfg.Nodes {
		var hosts, wild []string
		add := func(h string) {
			if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
		for _, a := range []struct{ what, addr string }{
			{"control", n.Control}, {"replication", n.Replication}, {"nbd", n.NBD}, {"raft", n.Raft}, {"gossip", n.Gossip},
		} {
			if a.addr == "" {
				continue
			}
			host, _, err := net.SplitHostPort(a.addr)
			if err != nil {
				host = a.addr
			}
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				wild = append(wild, fmt.Sprintf("%s %s", a.what, a.addr))
				continue
			}
			add(host)
		}
		if len(wild) > 0 {
			for _, h := range wildcardHosts {
				add(h)
			}
			add(n.Name)
			notes = append(notes, fmt.Sprintf("node %s: %s listen on every address of its host, which says nothing of how peers reach it: its certificate names %s and %q; peers and replctl must dial it by one of these, or give its address with --host %s=ADDR",
				n.Name, strings.Join(wild, ", "), strings.Join(wildcardHosts, ", "), n.Name, n.Name))
		}
		for _, h := range more[n.Name] {
			add(h)
		}
		holders = append(holders, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: n.Name}, Hosts: hosts})
	}
	return holders, notes, nil
}

// printCertsInit says what was written, what goes where, and the tls:
// section the cluster file needs.
func printCertsInit(out io.Writer, cfg *config.Config, dir string, holders []pki.Holder, notes []string, files int) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	fmt.Fprintf(out, "wrote %d files to %s (keys mode 0600):\n", files, abs)
	fmt.Fprintf(out, "  ca.crt, ca.key              the cluster's CA: keep ca.key off the nodes, it signs every certificate\n")
	for _, h := range holders {
		fmt.Fprintf(out, "  %-27s node %s, for %s\n", pki.CertFile(h.Name)+", "+pki.KeyFile(h.Name), h.Name, strings.Join(h.Hosts, ", "))
	}
	fmt.Fprintf(out, "  operator.crt, operator.key  replctl --tls-dir %s (or REPLCTL_TLS_DIR)\n", abs)
	fmt.Fprintf(out, "  gossip.key                  memberlist's key\n")
	fmt.Fprintf(out, "  nbd-client/                 NBD clients: nbds://HOST:PORT/VOLUME?tls-certificates=%s\n", filepath.Join(abs, pki.NBDClientDir))
	for _, n := range notes {
		fmt.Fprintln(out, "note: "+n)
	}
	fmt.Fprintf(out, "Copy ca.crt, gossip.key and each node's NODE.crt and NODE.key to it, and give the cluster file (every node's copy) this section, with the paths where the files are on the nodes:\n")
	fmt.Fprintf(out, "tls:\n  ca: %s\n  cert: %s\n  key: %s\n", filepath.Join(abs, pki.CAFile), filepath.Join(abs, "{node}.crt"), filepath.Join(abs, "{node}.key"))
	for _, n := range cfg.Nodes {
		if n.Gossip != "" {
			fmt.Fprintf(out, "  gossip_key: %s\n", filepath.Join(abs, pki.GossipFile))
			break
		}
	}
	fmt.Fprintf(out, "  nbd: required\n")
}
