package main

import (
	"context"
	"os/signal"
	"syscall"

	// demo is the test harness's type in this package.
	nodedemo "github.com/replvol/replvol/cmd/replctl/internal/demo"
	"github.com/replvol/replvol/config"
	"github.com/spf13/cobra"
)

func newDemo() *cobra.Command {
	var (
		dir      string
		basePort int
		size     string
		paths    int
		mdPlace  string
		withTLS  bool
		nbdTLS   string
		sums     string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a two-node replicated volume (alpha primary, beta secondary) on this machine",
		Long: `Start nodes alpha and beta in this process, with file-backed disks under --dir,
and volume vol0 replicated between them with protocol C, alpha primary.
alpha's control API listens on --base-port, its replication port on +1 and its NBD
port on +2; beta's on +3, +4 and +5 (--base-port 0 picks free ports).
It prints the NBD URI, then "ready". Ctrl-C or SIGTERM stops both nodes cleanly.
With --tls every link is mutual TLS with a fresh CA (replctl certs init's files in
DIR/tls): the export is nbds:// with the NBD client's certificates, and replctl
takes --tls-dir DIR/tls (or talks to DIR/alpha/control.sock).
--checksums off lays out each node's metadata without the checksum area, as a
volume with checksums: off has it: no block is checksummed, verified or scrubbed
(replctl status --json says "checksums": false), to compare with the default, on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bytes, err := config.ParseSize(size)
			if err != nil {
				return usageErrorf("--size: %w", err)
			}
			if bytes < 1<<20 || bytes%4096 != 0 {
				return usageErrorf("--size %s: want at least 1MiB and a multiple of 4KiB", size)
			}
			if mdPlace != "internal" && mdPlace != "external" {
				return usageErrorf("--metadata %q: want internal or external", mdPlace)
			}
			if sums != "on" && sums != "off" {
				return usageErrorf("--checksums %q: want on or off", sums)
			}
			if paths < 0 || paths > 16 {
				return usageErrorf("--paths %d: want 0 (a plain disk) to 16", paths)
			}
			if basePort < 0 || basePort > 65535-5 {
				return usageErrorf("--base-port %d: want 0 (free ports) or 1-65530", basePort)
			}
			switch {
			case nbdTLS != config.NBDTLSRequired && nbdTLS != config.NBDTLSOptional && nbdTLS != config.NBDTLSOff:
				return usageErrorf("--nbd-tls %q: want required, optional or off", nbdTLS)
			case cmd.Flags().Changed("nbd-tls") && !withTLS:
				return usageErrorf("--nbd-tls needs --tls: without it no link is TLS")
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return nodedemo.Run(ctx, cmd.OutOrStdout(), nodedemo.Options{Dir: dir, BasePort: basePort, Size: bytes, Paths: paths, Metadata: mdPlace, TLS: withTLS, NBDTLS: nbdTLS, NoChecksums: sums == "off"})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the disks, state and logs (default: a fresh temp dir, removed at exit)")
	cmd.Flags().IntVar(&basePort, "base-port", 7800, "alpha's control port; the other five ports follow it (0: free ports)")
	cmd.Flags().StringVar(&size, "size", "1GiB", "volume size (sparse files), such as 1.5GiB or 512MiB")
	cmd.Flags().StringVar(&mdPlace, "metadata", "internal", "where each node keeps the volume's metadata: internal (end of the backing file) or external (a separate file)")
	cmd.Flags().IntVar(&paths, "paths", 0, "give each node this many multipath paths (p0, p1, ...) to its backing file")
	cmd.Flags().BoolVar(&withTLS, "tls", false, "mutual TLS on every link, with a fresh CA in DIR/tls (NBD over TLS: nbds://)")
	cmd.Flags().StringVar(&nbdTLS, "nbd-tls", config.NBDTLSRequired, "with --tls, the NBD export's TLS: required (nbds:// only), optional or off (plain nbd://, the other links still TLS)")
	cmd.Flags().StringVar(&sums, "checksums", "on", "on: a checksum of every 4 KiB block, verified at every read and by replctl scrub; off: metadata without the checksum area")
	return cmd
}
