// Package buildinfo describes the binary that is running: its release, the
// Go version it was built with and the commit it was built from, for the
// --version flag of replnode and replctl.
package buildinfo
