package main

import (
	"fmt"

	"github.com/replvol/replvol/internal/buildinfo"
	"github.com/spf13/cobra"
)

// version is the release when it is set at build time, for a build
// outside a git checkout:
//
//	go build -ldflags "-X main.version=1.4.0" ./cmd/replctl
//
// Otherwise the release comes from the module version go build stamps
// from the checkout's tags and commit (internal/buildinfo).
var version string

// versionString is the release, the Go version and, when the binary was
// built from a checkout, the commit it was built from and its time.
func versionString() string { return buildinfo.String(version) }

// release is the release alone: 1.4.0, 0.0.0~git20261205134441.7d6bd45.
func release() string { return buildinfo.Read(version).Release }

// newVersion is the hidden `replctl version [--release]`: --version's
// line, or with --release the release alone, a valid Debian version,
// which make deb gives the package.
func newVersion() *cobra.Command {
	var releaseOnly bool
	cmd := &cobra.Command{
		Use:    "version [--release]",
		Short:  "Print the version (--release: the release alone, as the .deb's version)",
		Hidden: true,
		Args:   cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			if releaseOnly {
				fmt.Fprintln(cmd.OutOrStdout(), release())
				return
			}
			fmt.Fprintln(cmd.OutOrStdout(), "replctl "+versionString())
		},
	}
	cmd.Flags().BoolVar(&releaseOnly, "release", false, "print the release alone")
	return cmd
}
