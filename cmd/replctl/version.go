package main

import "github.com/replvol/replvol/internal/buildinfo"

// version is the release, set at build time:
//
//	go build -ldflags "-X main.version=1.4.0" ./cmd/replctl
var version = "dev"

// versionString is the version, the Go version and, when the binary was
// built from a checkout, the commit it was built from.
func versionString() string { return buildinfo.String(version) }
