package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newMan is the hidden `replctl man --dir DIR`: one man page (section 1)
// per command, replctl.1, replctl-status.1, ..., generated from the
// commands' own help, which make install and the .deb install. The date
// is SOURCE_DATE_EPOCH's when it is set (a reproducible package).
func newMan() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:    "man --dir DIR",
		Short:  "Write replctl's man pages (section 1) into DIR",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usageErrorf("--dir DIR is required")
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			// No Title: each page is titled by its command (REPLCTL-MOUNT
			// for replctl mount), as man prints it in its header.
			header := &doc.GenManHeader{
				Section: "1",
				Source:  "replvol " + release(),
				Manual:  "replvol manual",
			}
			if err := doc.GenManTree(root, header, dir); err != nil {
				return fmt.Errorf("man pages into %s: %w", dir, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write the pages into (created)")
	return cmd
}
