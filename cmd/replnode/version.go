package main

import "github.com/replvol/replvol/internal/buildinfo"

// version is the release when it is set at build time, for a build
// outside a git checkout:
//
//	go build -ldflags "-X main.version=1.4.0" ./cmd/replnode
//
// Otherwise the release comes from the module version go build stamps
// from the checkout's tags and commit (internal/buildinfo).
var version string

// versionString is the release, the Go version and, when the binary was
// built from a checkout, the commit it was built from and its time.
func versionString() string { return buildinfo.String(version) }

// release is the release alone, which the node's status shows.
func release() string { return buildinfo.Read(version).Release }
