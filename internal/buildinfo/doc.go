// Package buildinfo describes the binary that is running: its release
// (from the module version go build stamps from the checkout's tags and
// commit, or -ldflags), the Go version it was built with and the commit
// it was built from, for --version of replnode and replctl, the .deb's
// version and each node's status. It imports nothing of the project.
package buildinfo
