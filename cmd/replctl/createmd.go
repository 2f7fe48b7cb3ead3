package main

import (
	"errors"
	"fmt"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/metadata"
	"github.com/spf13/cobra"
)

func newCreateMD() *cobra.Command {
	var (
		configPath, nodeName, stateDir string
		force, yes                     bool
	)
	cmd := &cobra.Command{
		Use:   "create-md VOLUME --config FILE --node NAME",
		Short: "Initialise a volume's metadata on this host's disk (offline, like drbdadm create-md)",
		Long: `Write fresh metadata (superblock, activity log, bitmaps) for VOLUME on the disk
the config gives node NAME, internal or external as the volume says. Run it on that
node's host while replnode is stopped. A new volume does not need it: replnode
creates metadata on a disk that has none. Over existing metadata it needs --force
--yes: the disk's data then counts as Inconsistent and is resynced in full from
its peer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if configPath == "" || nodeName == "" {
				return usageErrorf("--config FILE and --node NAME are required: create-md works on this host's disk")
			}
			if force && !yes {
				return fmt.Errorf("--force discards %s's metadata on %s: what its peers miss is forgotten and this disk is resynced in full; add --yes to go ahead", args[0], nodeName)
			}
			cfg, err := config.LoadConfig(configPath)
			if err != nil {
				return err
			}
			msg, err := backing.CreateMetadata(cfg, nodeName, args[0], stateDir, force)
			if errors.Is(err, metadata.ErrMetadataExists) {
				again := fmt.Sprintf("replctl create-md %s --config %s --node %s", args[0], configPath, nodeName)
				if stateDir != "" {
					again += " --state-dir " + stateDir
				}
				return fmt.Errorf("%w; to discard it (this disk then counts as Inconsistent and is resynced in full from its peer), run %s --force --yes", err, again)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), msg)
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "cluster config file")
	cmd.Flags().StringVar(&nodeName, "node", "", "this host's node name")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "the node's state directory (default: nodes[].state_dir)")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite existing metadata")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm --force")
	return cmd
}
